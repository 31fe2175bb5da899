/** Synthetic data for the index tests: clustered points and structured keys with planted needles. */
import { randn, rng } from './helpers.js';

/** n points in `clusters` Gaussian blobs (centres ~ N(0, spread²), unit noise), row-major n x dim. */
export function blobs(n: number, dim: number, clusters: number, seed: number, spread = 3): Float32Array {
  const centres = randn(clusters * dim, seed);
  const noise = randn(n * dim, seed + 1);
  const r = rng(seed + 2);
  const out = new Float32Array(n * dim);
  for (let i = 0; i < n; i++) {
    const c = Math.floor(r() * clusters);
    for (let d = 0; d < dim; d++) out[i * dim + d] = spread * centres[c * dim + d]! + noise[i * dim + d]!;
  }
  return out;
}

/** Sum of squared distances of points to the nearest of the given centroids. */
export function inertiaOf(points: Float32Array, dim: number, centroids: ArrayLike<number>[] | Float32Array, k: number): number {
  const c = (j: number, d: number) =>
    centroids instanceof Float32Array ? centroids[j * dim + d]! : (centroids as ArrayLike<number>[])[j]![d]!;
  let total = 0;
  for (let i = 0; i < points.length / dim; i++) {
    let best = Infinity;
    for (let j = 0; j < k; j++) {
      let s = 0;
      for (let d = 0; d < dim; d++) {
        const t = points[i * dim + d]! - c(j, d);
        s += t * t;
      }
      if (s < best) best = s;
    }
    total += best;
  }
  return total;
}
