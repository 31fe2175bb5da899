import { describe, expect, it } from 'vitest';
import { kmeans as mlKmeans } from 'ml-kmeans';
import { indexKernelLevel, kmeans } from '../src/index/kernels.js';
import { cpuFeatures } from '../src/index.js';
import { blobs, inertiaOf } from './index-data.js';
import { expectKvdError } from './helpers.js';

const N = 2000;
const DIM = 16;
const K = 20;

function toRows(p: Float32Array, dim: number): number[][] {
  const rows: number[][] = [];
  for (let i = 0; i < p.length / dim; i++) rows.push(Array.from(p.subarray(i * dim, (i + 1) * dim)));
  return rows;
}

/** The index kernel levels this CPU runs (the cap never raises a level above the CPU's). */
function levels(): string[] {
  const out = new Set<string>();
  for (const l of ['scalar', 'avx2', 'avx512'] as const) out.add(indexKernelLevel(l));
  indexKernelLevel('best');
  return [...out];
}

describe('native k-means', () => {
  it('reaches ml-kmeans inertia within 2% (both k-means++ seeded, same seeds, run to convergence)', () => {
    for (const dataSeed of [11, 12]) {
      const pts = blobs(N, DIM, K, dataSeed);
      const rows = toRows(pts, DIM);
      const seeds = [1, 2, 3, 4];
      let nativeSum = 0;
      let mlSum = 0;
      let nativeBest = Infinity;
      let mlBest = Infinity;
      for (const seed of seeds) {
        const r = kmeans(pts, DIM, { k: K, iters: 100, seed });
        // The reported inertia is the real one for the returned centroids.
        expect(r.inertia / inertiaOf(pts, DIM, r.centroids, K)).toBeCloseTo(1, 4);
        const m = mlKmeans(rows, K, { initialization: 'kmeans++', seed, maxIterations: 100 });
        const mi = inertiaOf(pts, DIM, m.centroids, K);
        nativeSum += r.inertia;
        mlSum += mi;
        nativeBest = Math.min(nativeBest, r.inertia);
        mlBest = Math.min(mlBest, mi);
      }
      expect(nativeSum / mlSum).toBeLessThanOrEqual(1.02);
      expect(nativeBest / mlBest).toBeLessThanOrEqual(1.02);
    }
  });

  it('is deterministic: same seed -> identical clusters; another seed -> another start', () => {
    const pts = blobs(1000, DIM, K, 5);
    const a = kmeans(pts, DIM, { k: K, iters: 20, seed: 7 });
    const b = kmeans(pts, DIM, { k: K, iters: 20, seed: 7 });
    expect(b.centroids).toEqual(a.centroids);
    expect(b.assignments).toEqual(a.assignments);
    expect(b.inertia).toBe(a.inertia);
    const c = kmeans(pts, DIM, { k: K, iters: 0, seed: 8 });
    const d = kmeans(pts, DIM, { k: K, iters: 0, seed: 7 });
    expect(c.centroids).not.toEqual(d.centroids);
  });

  it('gives bit-identical results at every SIMD level of the index kernels', () => {
    const lv = levels();
    expect(lv).toContain('scalar');
    if (cpuFeatures().avx2) expect(lv).toContain('avx2');
    // dim 37 exercises the vector tail; k 21 a partial centroid tile.
    for (const dim of [DIM, 37]) {
      const pts = blobs(600, dim, 21, 9);
      const results = lv.map((l) => {
        indexKernelLevel(l as 'scalar');
        return kmeans(pts, dim, { k: 21, iters: 15, seed: 3 });
      });
      indexKernelLevel('best');
      for (const r of results.slice(1)) {
        expect(r.centroids).toEqual(results[0]!.centroids);
        expect(r.assignments).toEqual(results[0]!.assignments);
        expect(r.inertia).toBe(results[0]!.inertia);
      }
    }
  });

  it('lists members as CSR covering every point exactly once, consistent with assignments', () => {
    const pts = blobs(777, 8, 13, 21);
    const r = kmeans(pts, 8, { k: 40, iters: 10, seed: 1 });
    expect(r.offsets.length).toBe(41);
    expect(r.offsets[0]).toBe(0);
    expect(r.offsets[40]).toBe(777);
    const seen = new Uint8Array(777);
    for (let j = 0; j < 40; j++) {
      for (let m = r.offsets[j]!; m < r.offsets[j + 1]!; m++) {
        const i = r.members[m]!;
        expect(r.assignments[i]).toBe(j);
        if (m > r.offsets[j]!) expect(i).toBeGreaterThan(r.members[m - 1]!);
        seen[i]! += 1;
      }
    }
    expect(seen.every((v) => v === 1)).toBe(true);
  });

  it('repairs empty clusters: duplicates and k = n still give k non-empty clusters', () => {
    // 30 distinct points, each twice: k = 30 must put every distinct point in its own cluster.
    const base = blobs(30, 4, 30, 3);
    const pts = new Float32Array(60 * 4);
    pts.set(base, 0);
    pts.set(base, 30 * 4);
    const r = kmeans(pts, 4, { k: 30, iters: 50, seed: 2 });
    for (let j = 0; j < 30; j++) expect(r.offsets[j + 1]! - r.offsets[j]!).toBeGreaterThan(0);
    expect(r.inertia).toBeCloseTo(0, 3);
    const all = kmeans(base, 4, { k: 30, iters: 5, seed: 2 });
    expect(all.inertia).toBeCloseTo(0, 3);
  });

  it('rejects bad input with typed errors', async () => {
    const pts = blobs(10, 4, 2, 1);
    await expectKvdError(() => kmeans(pts, 4, { k: 11 }), 'E_RANGE', /k: expected an integer in \[1, 10\].*got 11/);
    await expectKvdError(() => kmeans(pts, 4, { k: 0 }), 'E_RANGE', /got 0/);
    await expectKvdError(() => kmeans(pts, 3, { k: 2 }), 'E_SHAPE', /multiple of dim 3.*got 40/);
    await expectKvdError(() => kmeans(new Float64Array(8) as never, 4, { k: 1 }), 'E_DTYPE', /Float32Array, got a Float64Array/);
    const bad = pts.slice();
    bad[5] = NaN;
    await expectKvdError(() => kmeans(bad, 4, { k: 2 }), 'E_NONFINITE', /NaN at element 5/);
    await expectKvdError(() => kmeans(pts, 4, { k: 2, iters: -1 }), 'E_RANGE', /iters/);
    await expectKvdError(() => indexKernelLevel('sse' as never), 'E_CONFIG', /expected 'scalar'/);
  });
});
