/**
 * Exact softmax attention kernels (native, SIMD): dense over a token range, sparse over a
 * {@link Selection}, attention probabilities for evaluation, and the merge of partial results.
 *
 * Conventions shared by every function here:
 * - `q` is `Float32Array(qHeads * dim)`, query head h at `q[h*dim .. (h+1)*dim)`; `k`/`v` are
 *   {@link KvTensor}s of one layer (f32, f16 or bf16 bits; same shape and dtype for k and v).
 * - GQA: `qHeads` must be a multiple of `k.heads`; query head h uses kv head
 *   `floor(h / (qHeads / k.heads))`.
 * - `scale` defaults to `1/sqrt(dim)`; `lse` is the natural-log log-sum-exp of the scaled logits,
 *   so partial results over disjoint token sets merge exactly ({@link mergeAttention}).
 * - Inputs are viewed without copies. Bad input raises a {@link KvdriveError}: E_TYPE (not an
 *   object / TypedArray), E_DTYPE (wrong TypedArray or dtype), E_SHAPE (lengths, heads),
 *   E_RANGE (tokens, selection ids, threads, scale), E_NONFINITE (NaN/Inf in q, or in an attended
 *   k/v row — the message names the kv head and token), E_CONFIG (unknown option).
 * - Results are deterministic: the same tokens in the same order give bit-identical outputs for
 *   any `threads`, and a selection covering every chunk reproduces dense attention.
 */
import { KvdriveError, describe } from '../errors.js';
import { native } from '../native.js';
import type { KvTensor } from '../types.js';
import type { Selection } from '../index/selection.js';

/** Options of {@link attendDense} / {@link attendDenseAsync}. */
export interface AttendDenseOptions {
  /** Queries, `Float32Array(qHeads * dim)`, finite. */
  q: Float32Array;
  /** Number of query heads; a multiple of `k.heads`. */
  qHeads: number;
  /** Keys of one layer. */
  k: KvTensor;
  /** Values of one layer, same shape and dtype as `k`. */
  v: KvTensor;
  /** Attend tokens `[0, tokens)`; integer in `[0, k.tokens]`, default `k.tokens`. With 0 tokens `out` is 0 and `lse` is -Infinity. */
  tokens?: number;
  /** Softmax scale, finite and > 0; default `1/sqrt(dim)`. */
  scale?: number;
  /**
   * Threads the kv heads are split across, integer in `[1, 8]`, default 1. Results do not depend on
   * it. Scales best on head-major (`'htd'`) tensors; on token-major ones every thread streams a part
   * of every token row.
   */
  threads?: number;
}

/** Options of {@link attendSparse} / {@link attendSparseAsync}. */
export interface AttendSparseOptions {
  /** Queries, `Float32Array(qHeads * dim)`, finite. */
  q: Float32Array;
  /** Number of query heads; a multiple of `k.heads`. */
  qHeads: number;
  /** Keys of one layer (at least `selection.tokens` tokens). */
  k: KvTensor;
  /** Values of one layer, same shape and dtype as `k`. */
  v: KvTensor;
  /**
   * Which tokens each kv head attends: sinks `[0, sinkEnd)`, the chosen chunks clipped to
   * `[sinkEnd, tailStart)`, and the tail `[tailStart, tokens)`, walked in token order. Validated:
   * `offsets` has `k.heads + 1` non-decreasing entries from 0 to `chunkIds.length`; chunk ids are
   * ascending, unique and `< ceil(tokens / chunkSize)`; `0 <= sinkEnd <= tailStart <= tokens <= k.tokens`.
   */
  selection: Selection;
  /** Softmax scale, finite and > 0; default `1/sqrt(dim)`. */
  scale?: number;
  /** Threads the kv heads are split across, integer in `[1, 8]`, default 1. Results do not depend on it. */
  threads?: number;
}

/** Attention output of every query head. */
export interface AttentionResult {
  /** `Float32Array(qHeads * dim)`: softmax(q·k * scale) · v per query head. */
  out: Float32Array;
  /** `Float32Array(qHeads)`: natural-log log-sum-exp of the scaled logits per query head. */
  lse: Float32Array;
}

/** Sparse attention output plus the attention mass of every selected chunk. */
export interface SparseAttentionResult extends AttentionResult {
  /**
   * `Float32Array(selection.chunkIds.length)`: entry i is the attention probability mass of chunk
   * `selection.chunkIds[i]` (its clipped tokens), averaged over the kv head's GQA group.
   */
  chunkMass: Float32Array;
}

/** Options of {@link attentionWeights}. */
export interface AttentionWeightsOptions {
  /** Queries, `Float32Array(qHeads * dim)`, finite. */
  q: Float32Array;
  /** Number of query heads; a multiple of `k.heads`. */
  qHeads: number;
  /** Keys of one layer. */
  k: KvTensor;
  /** Tokens `[0, tokens)`; integer in `[0, k.tokens]`, default `k.tokens`. */
  tokens?: number;
  /** Softmax scale, finite and > 0; default `1/sqrt(dim)`. */
  scale?: number;
  /**
   * Where to write the probabilities: a `Float32Array` of exactly `qHeads * tokens` elements,
   * returned (E_SHAPE for another length; E_CONFIG when it shares memory with `q` or `k.data`,
   * which are still read while it is written). Default: a new array. An eval that scores every decode
   * step reuses one, so that no 16 MiB array per step (at 128K) is left for a timed step's GC.
   */
  into?: Float32Array;
}

const DENSE_KEYS = ['q', 'qHeads', 'k', 'v', 'tokens', 'scale', 'threads'] as const;
const SPARSE_KEYS = ['q', 'qHeads', 'k', 'v', 'selection', 'scale', 'threads'] as const;
const WEIGHTS_KEYS = ['q', 'qHeads', 'k', 'tokens', 'scale', 'into'] as const;

/**
 * Rejects non-objects and unknown option names (a misspelt `threads` must not silently run with
 * the default). Values themselves are validated natively, where they are used.
 */
function checkOptions(what: string, o: unknown, allowed: readonly string[]): void {
  if (o === null || typeof o !== 'object' || Array.isArray(o) || ArrayBuffer.isView(o))
    throw new KvdriveError('E_TYPE', `${what}: expected an options object { ${allowed.join(', ')} }, got ${describe(o)}`);
  for (const key of Object.keys(o))
    if (!allowed.includes(key))
      throw new KvdriveError('E_CONFIG', `${what}: expected options among ${allowed.join(', ')}, got unknown option ${JSON.stringify(key)}`);
}

/** Exact attention of every query head over tokens `[0, tokens)` of one layer, on the calling thread. */
export function attendDense(options: AttendDenseOptions): AttentionResult {
  checkOptions('attendDense', options, DENSE_KEYS);
  return native.attendDense(options) as AttentionResult;
}

/** {@link attendDense} on the libuv thread pool; rejects with the same typed errors. Do not mutate the inputs until it settles. */
export function attendDenseAsync(options: AttendDenseOptions): Promise<AttentionResult> {
  try {
    checkOptions('attendDenseAsync', options, DENSE_KEYS);
  } catch (e) {
    return Promise.reject(e);
  }
  return native.attendDenseAsync(options) as Promise<AttentionResult>;
}

/** Exact attention over the tokens a {@link Selection} picks per kv head, on the calling thread. */
export function attendSparse(options: AttendSparseOptions): SparseAttentionResult {
  checkOptions('attendSparse', options, SPARSE_KEYS);
  return native.attendSparse(options) as SparseAttentionResult;
}

/** {@link attendSparse} on the libuv thread pool; rejects with the same typed errors. Do not mutate the inputs until it settles. */
export function attendSparseAsync(options: AttendSparseOptions): Promise<SparseAttentionResult> {
  try {
    checkOptions('attendSparseAsync', options, SPARSE_KEYS);
  } catch (e) {
    return Promise.reject(e);
  }
  return native.attendSparseAsync(options) as Promise<SparseAttentionResult>;
}

/**
 * Softmax probabilities of every query head over tokens `[0, tokens)`: `Float32Array(qHeads *
 * tokens)`, row h (`[h*tokens, (h+1)*tokens)`) sums to 1. For evaluation (recall of dense attention
 * mass, oracle top-K), not for the decode path.
 */
export function attentionWeights(options: AttentionWeightsOptions): Float32Array {
  checkOptions('attentionWeights', options, WEIGHTS_KEYS);
  return native.attentionWeights(options) as Float32Array;
}

/**
 * Merges partial attention B into A in place: afterwards (outA, lseA) is the attention over the
 * union of A's and B's token sets, which must be disjoint. `out*` are `Float32Array(heads * dim)`,
 * `lse*` `Float32Array(heads)`; an lse of -Infinity marks a partial over no tokens.
 */
export function mergeAttention(
  outA: Float32Array,
  lseA: Float32Array,
  outB: Float32Array,
  lseB: Float32Array,
  heads: number,
  dim: number,
): void {
  native.mergeAttention(outA, lseA, outB, lseB, heads, dim);
}

/**
 * Memory-read baseline for benchmarks: streams every byte of `buffer` once (SIMD integer sum at the
 * active SIMD level, split over `threads` in `[1, 8]`) and returns the wrapped 32-bit sum, so the
 * read cannot be optimised away. Kernel throughput is reported as a ratio to this.
 */
export function memoryRead(buffer: Float32Array | Uint16Array | Uint8Array, threads = 1): number {
  return native.memoryRead(buffer, threads) as number;
}

/**
 * Scattered-read baseline for benchmarks, the counterpart of {@link memoryRead} for rows at random
 * places: reads the `rowBytes` bytes of row `rows[i]` (at byte `rows[i] * rowBytes` of `buffer`) for
 * every i in list order, each row requested 4 KiB of rows before it is summed (16 rows of 256
 * bytes), `rows` split into contiguous parts over `threads` in `[1, 8]`; returns the wrapped 32-bit
 * sum. A sparse kernel that reads the same rows cannot be faster than this on the same threads:
 * its roofline. `rowBytes` is
 * an integer in `[1, 2^20]`; every index must lie in `[0, floor(buffer bytes / rowBytes))` (E_RANGE,
 * checked before any row is read).
 */
export function memoryGather(buffer: Float32Array | Uint16Array | Uint8Array, rowBytes: number, rows: Int32Array, threads = 1): number {
  return native.memoryGather(buffer, rowBytes, rows, threads) as number;
}

/** What {@link computePeak} did: multiply-adds counted as 2 flops, and their sum (kept so the work cannot be optimised away). */
export interface ComputePeakResult {
  flops: number;
  sum: number;
}

/**
 * Arithmetic baseline for benchmarks, the counterpart of {@link memoryRead}: `iterations` rounds of
 * twelve independent f32 multiply-add chains at the active SIMD level on each of `threads` threads
 * (`iterations` an integer in `[1, 1e8]`, at most ~0.4 s per thread here; `threads` in `[1, 8]`).
 * flops / time is the cores' multiply-add throughput: the roofline of a kernel bound by its
 * arithmetic (dense attention on one thread), as the read is that of a kernel bound by memory.
 */
export function computePeak(iterations: number, threads = 1): ComputePeakResult {
  return native.computePeak(iterations, threads) as ComputePeakResult;
}
