/**
 * Typed access to the index kernels on their own (tests, benchmarks, tools): k-means over points,
 * chunk means of a KV tensor, centroid scoring of a GQA group, and the index kernels' SIMD level.
 * Policies use the same kernels through the native SelectionIndex (src/index/policy.ts).
 */
import { native } from '../native.js';
import type { KvTensor } from '../types.js';

/** Result of {@link kmeans}: centroids (k x dim), per-point cluster, CSR membership, inertia. */
export interface KMeansResult {
  centroids: Float32Array;
  assignments: Int32Array;
  /** k + 1 offsets into members. */
  offsets: Int32Array;
  /** Point ids grouped by cluster, ascending within a cluster. */
  members: Int32Array;
  /** Sum of squared Euclidean distances of points to their centroid. */
  inertia: number;
  /** Lloyd iterations run. */
  iterations: number;
}

/**
 * Seeded, deterministic k-means (greedy k-means++ init with `trials` draws per centre, default
 * 2 + ln k; Lloyd iterations until stable or `iters`).
 * points: n x dim row-major f32. Same seed + data give an identical result at every SIMD level.
 */
export function kmeans(points: Float32Array, dim: number, opts: { k: number; iters?: number; seed?: number; trials?: number }): KMeansResult {
  return native.kmeans(points, dim, opts) as KMeansResult;
}

/**
 * Mean key of every `chunkSize` consecutive tokens of [start, end) per kv head (or one `head`):
 * Float32Array [heads][chunks][dim]. (end - start) must be a multiple of chunkSize.
 */
export function chunkMeans(k: KvTensor, opts: { start?: number; end?: number; chunkSize?: number; head?: number } = {}): Float32Array {
  return native.chunkMeans(k, opts) as Float32Array;
}

/** Centroids as int8 tiles and one scale per centroid (see {@link centroidTiles}). */
export interface CentroidTilesI8 {
  /** ceil(n/16) tiles of 16 centroids x ceil(dim/4)*4 codes, zero-padded: in [-63, 63] from {@link centroidTiles} (7-bit codes); any int8 is scored exactly. */
  tiles: Int8Array;
  /** ceil(n/16)*16 scales: centroid i ~= code_i x scales[i] (0 for padding lanes). */
  scales: Float32Array;
}

/** Centroids as the index stores them: 4-bit tiles and one scale per centroid (see {@link centroidTiles}). */
export interface CentroidTiles4 {
  /**
   * ceil(n/16) tiles of 16 centroids, each ceil(ceil(dim/4)/2) blocks of 64 bytes: block b holds the
   * int8 layout's quads 2b and 2b+1 in the low and high nibbles of the same bytes, each code in
   * [-7, 7] stored as code + 8 (8 = code 0 for padding); any nibble is scored exactly.
   */
  tiles: Uint8Array;
  /** ceil(n/16)*16 scales: centroid i ~= code_i x scales[i] (0 for padding lanes). */
  scales: Float32Array;
}

/**
 * Scores n centroids for one GQA group: out[i] = max over the group's query heads (q: groupSize x
 * dim) of q·centroid_i. layout 'rows' (default): centroids n x dim row-major, transposed into the
 * index's tile layout inside the call; 'tiles': f32 tiles from {@link centroidTiles} (the kernel
 * alone); 'tiles8': int8 tiles from `centroidTiles(.., 'i8')`; 'tiles4': 4-bit tiles from
 * `centroidTiles(.., 'u4')` — what the index stores and scores. For both the query is quantized to
 * int8 per head inside the call, the dot products are exact integers, then scaled by both scales,
 * so scores are bit-identical at every SIMD level (and between the two layouts over the same codes)
 * and approximate the f32 scores within the two quantizations' rounding. `spread` (tiles8 and
 * tiles4 only): the select's level-1 spread term, out[i] = max_j (q_j·centroid_i + coef[j] * var[i]);
 * var: n, coef: groupSize.
 */
export function scoreCentroids(
  q: Float32Array,
  groupSize: number,
  centroids: Float32Array | CentroidTilesI8 | CentroidTiles4,
  n: number,
  dim: number,
  layout: 'rows' | 'tiles' | 'tiles8' | 'tiles4' = 'rows',
  spread?: { var: Float32Array; coef: Float32Array },
): Float32Array {
  return native.scoreCentroids(q, groupSize, centroids, n, dim, layout, spread) as Float32Array;
}

/**
 * n x dim row-major centroids in the index's tile layout: ceil(n/16) tiles of dim x 16 lanes as f32
 * (default); (dtype 'i8') int8 tiles: per centroid, 7-bit codes round(c / s) with s = max|c| / 63,
 * in 16-lane tiles of 4-dim groups; (dtype 'u4') 4-bit tiles: codes round(c / s) with s = max|c| / 7,
 * two 4-dim groups per 64-byte block, exactly as the index stores its centroids (so
 * `scoreCentroids(.., 'tiles4')` over them runs the kernel a select's level 1 runs). E_DTYPE for
 * another dtype.
 */
export function centroidTiles(centroids: Float32Array, n: number, dim: number): Float32Array;
export function centroidTiles(centroids: Float32Array, n: number, dim: number, dtype: 'f32'): Float32Array;
export function centroidTiles(centroids: Float32Array, n: number, dim: number, dtype: 'i8'): CentroidTilesI8;
export function centroidTiles(centroids: Float32Array, n: number, dim: number, dtype: 'u4'): CentroidTiles4;
export function centroidTiles(centroids: Float32Array, n: number, dim: number, dtype: 'f32' | 'i8' | 'u4' = 'f32'): Float32Array | CentroidTilesI8 | CentroidTiles4 {
  return native.centroidTiles(centroids, n, dim, dtype) as Float32Array | CentroidTilesI8 | CentroidTiles4;
}

export type IndexKernelLevel = 'scalar' | 'avx2' | 'avx512';

/** The SIMD level the index kernels run at; with an argument, caps it first ('best' lifts the cap). */
export function indexKernelLevel(cap?: IndexKernelLevel | 'best'): IndexKernelLevel {
  return native.indexKernelLevel(cap) as IndexKernelLevel;
}
