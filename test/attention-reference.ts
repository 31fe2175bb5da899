/**
 * Test support for the attention kernels: dtype encoding in plain TS, random KV tensors, an
 * all-chunks Selection builder, and a float64 reference attention written independently of the
 * native code (straight from the definition: softmax(q·k * scale) · v).
 */
import type { Dtype, KvTensor } from '../src/types.js';
import type { Selection } from '../src/index/selection.js';
import { randn } from './helpers.js';

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** f32 -> bfloat16 bits, round to nearest even. */
export function toBf16(x: number): number {
  f32[0] = x;
  const u = u32[0]!;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

export function fromBf16(h: number): number {
  u32[0] = h << 16;
  return f32[0]!;
}

/** f32 -> IEEE binary16 bits for values in the normal f16 range (tests use |x| < 100), round to nearest even. */
export function toF16(x: number): number {
  f32[0] = x;
  const u = u32[0]!;
  const sign = (u >>> 16) & 0x8000;
  const abs = u & 0x7fffffff;
  if (abs < 0x38800000) return sign; // below the normal f16 range: flush (tests avoid it)
  let r = abs - 0x38000000;
  r += 0xfff + ((r >>> 13) & 1);
  return sign | (r >>> 13);
}

export function fromF16(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >>> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24;
  if (e === 31) return m ? NaN : sign * Infinity;
  return sign * (1 + m / 1024) * 2 ** (e - 15);
}

/** A KV tensor in `dtype` plus its exact f32 values (what the kernels compute with). */
export interface TestKv {
  tensor: KvTensor;
  values: Float32Array; // token-major [t][h][d], dequantized
}

export function encode(values: Float32Array, dtype: Dtype): { data: Float32Array | Uint16Array; exact: Float32Array } {
  if (dtype === 'f32') return { data: values.slice(), exact: values.slice() };
  const enc = dtype === 'f16' ? toF16 : toBf16;
  const dec = dtype === 'f16' ? fromF16 : fromBf16;
  const data = new Uint16Array(values.length);
  const exact = new Float32Array(values.length);
  for (let i = 0; i < values.length; i++) {
    data[i] = enc(values[i]!);
    exact[i] = dec(data[i]!);
  }
  return { data, exact };
}

/** Random KV tensor (token-major 'thd'); `scale` spreads the logits so softmax is not flat. */
export function randomKv(tokens: number, heads: number, dim: number, dtype: Dtype, seed: number, scale = 1): TestKv {
  const raw = randn(tokens * heads * dim, seed);
  for (let i = 0; i < raw.length; i++) raw[i] = raw[i]! * scale;
  const { data, exact } = encode(raw, dtype);
  return { tensor: { data, dtype, tokens, heads, dim }, values: exact };
}

/** Re-lays a token-major tensor as head-major ('htd'). */
export function toHtd(kv: KvTensor): KvTensor {
  const { tokens, heads, dim } = kv;
  const src = kv.data;
  const dst = src instanceof Float32Array ? new Float32Array(src.length) : new Uint16Array(src.length);
  for (let t = 0; t < tokens; t++)
    for (let h = 0; h < heads; h++)
      for (let d = 0; d < dim; d++) dst[(h * tokens + t) * dim + d] = src[(t * heads + h) * dim + d]!;
  return { ...kv, data: dst, layout: 'htd' };
}

/** A Selection choosing every chunk of every kv head. */
export function allChunks(tokens: number, kvHeads: number, chunkSize: number, sinkEnd: number, tailStart: number): Selection {
  const n = Math.ceil(tokens / chunkSize);
  const offsets = new Int32Array(kvHeads + 1);
  const chunkIds = new Int32Array(n * kvHeads);
  for (let h = 0; h < kvHeads; h++) {
    offsets[h + 1] = (h + 1) * n;
    for (let c = 0; c < n; c++) chunkIds[h * n + c] = c;
  }
  return { chunkSize, tokens, sinkEnd, tailStart, offsets, chunkIds };
}

/** Per-kv-head chunk lists -> Selection. */
export function selectionOf(
  perHead: number[][],
  tokens: number,
  chunkSize: number,
  sinkEnd: number,
  tailStart: number,
): Selection {
  const offsets = new Int32Array(perHead.length + 1);
  perHead.forEach((ids, h) => (offsets[h + 1] = offsets[h]! + ids.length));
  return { chunkSize, tokens, sinkEnd, tailStart, offsets, chunkIds: Int32Array.from(perHead.flat()) };
}

/** The token list kv head h attends under a selection (sinks, clipped chunks, tail; token order). */
export function selectedTokens(sel: Selection, h: number): number[] {
  const out: number[] = [];
  for (let t = 0; t < sel.sinkEnd; t++) out.push(t);
  for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) {
    const c = sel.chunkIds[i]!;
    for (let t = Math.max(c * sel.chunkSize, sel.sinkEnd); t < Math.min((c + 1) * sel.chunkSize, sel.tailStart); t++) out.push(t);
  }
  for (let t = sel.tailStart; t < sel.tokens; t++) out.push(t);
  return out;
}

export interface Reference {
  out: Float64Array;
  lse: Float64Array;
  /** probs[qh] maps token -> probability (only attended tokens). */
  probs: Map<number, number>[];
}

/** float64 attention straight from the definition; `tokensOf(h)` lists kv head h's tokens. */
export function referenceAttention(
  q: Float32Array,
  qHeads: number,
  k: TestKv,
  v: TestKv,
  tokensOf: (kvHead: number) => number[],
  scale = 1 / Math.sqrt(k.tensor.dim),
): Reference {
  const { heads: kvHeads, dim } = k.tensor;
  const group = qHeads / kvHeads;
  const out = new Float64Array(qHeads * dim);
  const lse = new Float64Array(qHeads);
  const probs: Map<number, number>[] = [];
  for (let qh = 0; qh < qHeads; qh++) {
    const h = Math.floor(qh / group);
    const toks = tokensOf(h);
    const logits = toks.map((t) => {
      let s = 0;
      for (let d = 0; d < dim; d++) s += q[qh * dim + d]! * k.values[(t * kvHeads + h) * dim + d]!;
      return s * scale;
    });
    const m = Math.max(...logits);
    const e = logits.map((l) => Math.exp(l - m));
    const sum = e.reduce((a, b) => a + b, 0);
    const p = new Map<number, number>();
    toks.forEach((t, i) => {
      const w = e[i]! / sum;
      p.set(t, w);
      for (let d = 0; d < dim; d++) out[qh * dim + d]! += w * v.values[(t * kvHeads + h) * dim + d]!;
    });
    probs.push(p);
    lse[qh] = m + Math.log(sum);
  }
  return { out, lse, probs };
}

/** max |a - b| / max |b| (relative to the reference's scale). */
export function relErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < b.length; i++) {
    num = Math.max(num, Math.abs(a[i]! - b[i]!));
    den = Math.max(den, Math.abs(b[i]!));
  }
  return den === 0 ? num : num / den;
}

export const range = (n: number): number[] => Array.from({ length: n }, (_, i) => i);
