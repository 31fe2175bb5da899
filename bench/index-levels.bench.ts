/**
 * The index kernels at every SIMD level this CPU runs, in one run (tinybench): each row's time at
 * the best level beside the same row at the scalar level (the portable bodies every vector level
 * must equal bit for bit), so a level whose bodies compile poorly shows up as a small ratio. Rows,
 * on one layer of the `kvdrive demo` workload (synthetic, 32 query / 8 kv heads, dim 128, f16):
 *   - centroids: int8 centroid scoring, 8192 centroids x 4 query heads with the spread term (what
 *     kvdrive's level 1 scores per kv head);
 *   - kmeans: one segment's k-means, 1024 chunk means -> 256 clusters (what prefill runs per
 *     segment and kv head);
 *   - sketch rows: the 4-bit key sketch's scores of 16384 tokens of one kv head for its 4 query
 *     heads (the offloaded re-rank's inner kernel);
 *   - build 16K: one layer's offloaded index built from scratch over its first 16384 tokens (chunk
 *     means, every segment's k-means, the 4-bit key sketch's quantization: what prefill runs);
 *   - select keyless: kvdrive's select as the runtime runs it (offloaded options: from the index and
 *     the 4-bit sketch, the previous selection as prior; includes the re-rank's attention shares);
 *   - select quest / select shadowkv: the baselines' selects (every page bound / chunk mean scored).
 * Selects and the build run on the `threads` option's two threads; the kernel rows on one.
 *
 *   npm run build:ts && node dist/bench/index-levels.bench.js [--context 131072] [--time-ms 1000] [--dist DIR]
 *
 * `--dist DIR`: import everything from another build's dist/ (the "before" of a change), so two
 * builds run the same bench; run them alternately for a before/after.
 */
import { cpus, loadavg } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { Bench } from 'tinybench';
import { blobPoints, uniform } from './bench-util.js';

const { values: a } = parseArgs({
  options: { context: { type: 'string' }, 'time-ms': { type: 'string' }, dist: { type: 'string' } },
});
const CONTEXT = Number(a.context ?? 131072);
const TIME_MS = Number(a['time-ms'] ?? 1000);
if (!Number.isInteger(CONTEXT) || CONTEXT < 16384) throw new Error(`--context: expected an integer >= 16384, got ${a.context}`);
if (!(TIME_MS > 0)) throw new Error(`--time-ms: expected a positive number, got ${a['time-ms']}`);
const distRoot = a.dist ? resolve(a.dist) : undefined;
const from = async (p: string) => import(distRoot ? pathToFileURL(join(distRoot, p)).href : `../${p}`);

const { createPolicy } = await from('src/index/policy.js');
const { offloadedPolicyOptions } = await from('src/index/options.js');
const { centroidTiles, indexKernelLevel, kmeans, scoreCentroids } = await from('src/index/kernels.js');
const { cpuFeatures } = await from('src/native.js');
const { generateSyntheticTrace } = await from('src/trace/synthetic.js');
const { toF32 } = await from('src/util/f16.js');

const DIM = 128;
const QH = 32;
const KVH = 8;
const G = QH / KVH;
const BUDGET = 2048;

const trace = generateSyntheticTrace({ layers: 1, promptTokens: CONTEXT, decodeSteps: 1, qHeads: QH, kvHeads: KVH, headDim: DIM, dtype: 'f16', seed: 5 });
const layer = trace.layerData(0);
const k = { data: layer.k, dtype: 'f16', tokens: CONTEXT, heads: KVH, dim: DIM };
const q = toF32(layer.q, 'f16') as Float32Array;

// Kernel inputs.
const nCentroids = 8192;
const tiles = centroidTiles(uniform(nCentroids * DIM, 2), nCentroids, DIM, 'i8');
const spread = { var: Float32Array.from(uniform(nCentroids, 3), (x) => Math.abs(x)), coef: Float32Array.from({ length: G }, () => 0.05) };
const points = blobPoints(1024, DIM, 300, 3);
const sketchTokens = Int32Array.from({ length: 16384 }, (_, i) => (i * 7919) % (CONTEXT - 64));

const offloaded = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { threads: 2 }));
const rebuilt = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { threads: 2 }));
const BUILD_TOKENS = 16384;
const quest = createPolicy('quest', { threads: 2 });
const shadowkv = createPolicy('shadowkv', { threads: 2 });
for (const p of [offloaded, quest, shadowkv]) await p.build(k, CONTEXT);
offloaded.setPrior(offloaded.select(q, BUDGET));

const rows: Record<string, () => unknown> = {
  centroids: () => scoreCentroids(q.subarray(0, G * DIM), G, tiles, nCentroids, DIM, 'tiles8', spread),
  kmeans: () => kmeans(points, DIM, { k: 256, iters: 8, seed: 1, trials: 2 }),
  'sketch rows': () => offloaded.sketchScores(q.subarray(0, G * DIM), 0, sketchTokens),
  'build 16K': () => rebuilt.buildSync(k, BUILD_TOKENS),
  'select keyless': () => offloaded.select(q, BUDGET),
  'select quest': () => quest.select(q, BUDGET, { keys: k }),
  'select shadowkv': () => shadowkv.select(q, BUDGET, { keys: k }),
};

/** Mean and minimum ms per call of every row at one index-kernel level. */
async function at(level: string): Promise<Record<string, { mean: number; min: number }>> {
  indexKernelLevel(level);
  const bench = new Bench({ time: TIME_MS, warmupTime: 100, iterations: 5 });
  for (const [name, fn] of Object.entries(rows)) bench.add(name, fn);
  await bench.run();
  indexKernelLevel('best');
  const out: Record<string, { mean: number; min: number }> = {};
  for (const t of bench.tasks) {
    const r = t.result as { state: string; period?: number; min?: number; latency?: { min: number }; error?: unknown };
    if (r.state !== 'completed' || r.period === undefined) throw new Error(`bench task ${t.name} did not complete: ${String(r.error ?? r.state)}`);
    out[t.name] = { mean: r.period, min: r.latency?.min ?? r.min ?? r.period };
  }
  return out;
}

const best = indexKernelLevel('best') as string;
const levels = ['scalar', ...(best === 'scalar' ? [] : ['avx2']), ...(best === 'avx512' ? ['avx512'] : [])];
const results: Record<string, Record<string, { mean: number; min: number }>> = {};
for (const level of levels) results[level] = await at(level);

const f = cpuFeatures() as { active: string };
console.log(`# index kernels by SIMD level (${distRoot ? `build ${distRoot}` : 'this build'}; CPU ${cpus()[0]?.model ?? '?'}, best level ${best}, active ${f.active}; ` +
  `context ${CONTEXT}, ${TIME_MS} ms per row and level; load ${loadavg().map((x) => x.toFixed(1)).join(' ')})`);
console.log('');
console.log(`| row | ${levels.map((l) => `${l} ms (mean / min)`).join(' | ')} | ${levels.slice(1).map((l) => `scalar / ${l} (means)`).join(' | ')} |`);
console.log(`|---|${levels.map(() => '---:').join('|')}|${levels.slice(1).map(() => '---:').join('|')}|`);
for (const name of Object.keys(rows)) {
  const cells = levels.map((l) => `${results[l]![name]!.mean.toFixed(3)} / ${results[l]![name]!.min.toFixed(3)}`);
  const ratios = levels.slice(1).map((l) => (results.scalar![name]!.mean / results[l]![name]!.mean).toFixed(2));
  console.log(`| ${name} | ${cells.join(' | ')} | ${ratios.join(' | ')} |`);
}

