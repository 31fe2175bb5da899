/**
 * Native k-means vs ml-kmeans on the same data (the test oracle), both k-means++-seeded and run to
 * convergence (at most 100 iterations), reported as a speed ratio measured in the same run, plus the
 * inertia of each (quality must match for the speed ratio to mean anything).
 *
 *   npm run build:ts && node dist/bench/kmeans.bench.js [n=2000] [dim=16] [k=20]
 */
import { kmeans as mlKmeans } from 'ml-kmeans';
import { indexKernelLevel, kmeans } from '../src/index/kernels.js';
import { blobPoints, meanMs } from './bench-util.js';

const n = Number(process.argv[2] ?? 2000);
const dim = Number(process.argv[3] ?? 16);
const k = Number(process.argv[4] ?? 20);
const pts = blobPoints(n, dim, k, 1);
const rows: number[][] = [];
for (let i = 0; i < n; i++) rows.push(Array.from(pts.subarray(i * dim, (i + 1) * dim)));

function inertia(centroids: ArrayLike<number>[]): number {
  let total = 0;
  for (const r of rows) {
    let best = Infinity;
    for (const c of centroids) {
      let s = 0;
      for (let d = 0; d < dim; d++) s += (r[d]! - c[d]!) ** 2;
      best = Math.min(best, s);
    }
    total += best;
  }
  return total;
}

let seed = 0;
const times = await meanMs({
  native: () => kmeans(pts, dim, { k, iters: 100, seed: ++seed }),
  'ml-kmeans': () => mlKmeans(rows, k, { initialization: 'kmeans++', seed: ++seed, maxIterations: 100 }),
});
// Quality: mean inertia over the same 8 seeds (single runs land in different local optima).
let natInertia = 0;
let mlInertia = 0;
for (let s = 1; s <= 8; s++) {
  natInertia += kmeans(pts, dim, { k, iters: 100, seed: s }).inertia / 8;
  mlInertia += inertia(mlKmeans(rows, k, { initialization: 'kmeans++', seed: s, maxIterations: 100 }).centroids) / 8;
}
console.log(`k-means ${n} points x ${dim} dims, k = ${k}, index kernels at ${indexKernelLevel()}`);
console.log(`  native    ${times.native!.toFixed(3)} ms/run  mean inertia over seeds 1-8 ${natInertia.toFixed(1)}`);
console.log(`  ml-kmeans ${times['ml-kmeans']!.toFixed(3)} ms/run  mean inertia over seeds 1-8 ${mlInertia.toFixed(1)}`);
console.log(`  speed ratio native / ml-kmeans: ${(times['ml-kmeans']! / times.native!).toFixed(1)}x`);
