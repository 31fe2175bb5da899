/** Storage dtype of KV data. Compute is always f32. */
export type Dtype = 'f32' | 'f16' | 'bf16';

/** Element storage for a dtype: f32 as Float32Array, f16/bf16 as their 16-bit patterns. */
export type DtypeArray<D extends Dtype = Dtype> = D extends 'f32' ? Float32Array : Uint16Array;

/**
 * A KV tensor of one layer, viewed without copies by the native kernels.
 * Element (t, h, i) is `data[t*heads*dim + h*dim + i]` for layout 'thd' (the trace layout, default)
 * or `data[h*tokens*dim + t*dim + i]` for 'htd'.
 */
export interface KvTensor {
  data: Float32Array | Uint16Array;
  dtype: Dtype;
  tokens: number;
  heads: number;
  dim: number;
  layout?: 'thd' | 'htd';
}

/** Model shape as kvdrive sees it (DESIGN.md §2). */
export interface ModelShape {
  layers: number;
  qHeads: number;
  kvHeads: number;
  headDim: number;
}
