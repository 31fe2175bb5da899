/**
 * Host-DRAM KV of every open sequence in ONE SharedArrayBuffer, so any stage worker reads it with
 * no copy and no handle lookup. Allocated once at open for `maxSequences x maxTokens`: that size is
 * the hard memory limit (E_NOMEM at open when it exceeds the caller's byte cap; E_BUDGET when a
 * sequence would grow past maxTokens).
 *
 * Layout (f32 elements): sequence s, layer l, kind c (0 = K, 1 = V), token t, kv head h, dim i at
 *   ((((s * L + l) * 2 + c) * maxTokens + t) * Hkv + h) * D + i
 * i.e. every (s, l, c) is a 'thd' KvTensor of maxTokens tokens (the trace layout).
 */
import { KvdriveError, fail } from '../errors.js';
import type { KvTensor, ModelShape } from '../types.js';

export interface SequenceStoreLayout {
  shape: ModelShape;
  maxSequences: number;
  maxTokens: number;
}

/** Bytes a store of this layout takes. */
export function sequenceStoreBytes(l: SequenceStoreLayout): number {
  const { layers, kvHeads, headDim } = l.shape;
  return l.maxSequences * layers * 2 * l.maxTokens * kvHeads * headDim * 4;
}

export class SequenceStore {
  readonly buffer: SharedArrayBuffer;
  readonly layout: SequenceStoreLayout;
  private readonly data: Float32Array;
  /** Elements of one (sequence, layer, kind) tensor. */
  private readonly tensorElems: number;
  private readonly rowElems: number;

  private constructor(buffer: SharedArrayBuffer, layout: SequenceStoreLayout) {
    this.buffer = buffer;
    this.layout = layout;
    this.data = new Float32Array(buffer);
    this.rowElems = layout.shape.kvHeads * layout.shape.headDim;
    this.tensorElems = layout.maxTokens * this.rowElems;
  }

  /** Allocates the store; E_NOMEM when it would exceed `maxBytes`. */
  static create(layout: SequenceStoreLayout, maxBytes: number): SequenceStore {
    const bytes = sequenceStoreBytes(layout);
    if (bytes > maxBytes)
      throw new KvdriveError(
        'E_NOMEM',
        `KV store: expected at most kvMemoryBytes = ${maxBytes} bytes, got maxSequences ${layout.maxSequences} x layers ${layout.shape.layers} x 2 x maxTokens ${layout.maxTokens} x kvHeads ${layout.shape.kvHeads} x headDim ${layout.shape.headDim} x 4 = ${bytes} bytes`,
      );
    return new SequenceStore(new SharedArrayBuffer(bytes), layout);
  }

  /** Views a store created in another thread. */
  static attach(buffer: SharedArrayBuffer, layout: SequenceStoreLayout): SequenceStore {
    if (!(buffer instanceof SharedArrayBuffer) || buffer.byteLength !== sequenceStoreBytes(layout))
      fail('E_SHAPE', 'KV store buffer', `a SharedArrayBuffer of ${sequenceStoreBytes(layout)} bytes`, buffer);
    return new SequenceStore(buffer, layout);
  }

  /** The K (kind 0) or V (kind 1) tensor of (seq, layer), viewing its first `tokens` tokens. */
  tensor(seq: number, layer: number, kind: 0 | 1, tokens: number): KvTensor {
    const at = ((seq * this.layout.shape.layers + layer) * 2 + kind) * this.tensorElems;
    return {
      data: this.data.subarray(at, at + tokens * this.rowElems),
      dtype: 'f32',
      tokens,
      heads: this.layout.shape.kvHeads,
      dim: this.layout.shape.headDim,
    };
  }

  /** Copies `rows` (tokens x Hkv x D, 'thd') into (seq, layer, kind) starting at token `at`. */
  write(seq: number, layer: number, kind: 0 | 1, at: number, rows: Float32Array): void {
    const base = ((seq * this.layout.shape.layers + layer) * 2 + kind) * this.tensorElems + at * this.rowElems;
    this.data.set(rows, base);
  }
}
