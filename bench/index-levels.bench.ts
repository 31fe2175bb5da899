/**
 * The index kernels at every SIMD level this CPU runs, in one run (tinybench): each row's time at
 * the best level beside the same row at the scalar level (the portable bodies every vector level
 * must equal bit for bit), so a level whose bodies compile poorly shows up as a small ratio. Rows,
 * on one layer of the `kvdrive demo` workload (synthetic, 32 query / 8 kv heads, dim 128, f16):
 *   - centroids: centroid scoring, 8192 centroids x 4 query heads with the spread term, in the
 *     tiles kvdrive's level 1 scores per kv head (4-bit; int8 in a build from before them);
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
 *   npm run build:ts && node dist/bench/index-levels.bench.js [--context 131072] [--time-ms 500] [--rounds 3] [--dist DIR]
 *
 * Every row runs `--time-ms` per level and round, `--rounds` times; a row's figure is the median
 * of its round means and the least of its minima (on a shared VM a slow few seconds then move one
 * round of every row, not every round of a few rows).
 *
 * `--dist DIR`: also load another build's dist/ (the "before" of a change, with its own addon) into
 * this process and run the same rows on the same inputs beside this build's, interleaved, so the
 * before / after does not depend on how busy the machine was in two separate runs.
 */
import { cpus, loadavg } from 'node:os';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { blobPoints, importFromBuild, RoundTimes, timeTasks, uniform } from './bench-util.js';

const { values: a } = parseArgs({
  options: { context: { type: 'string' }, 'time-ms': { type: 'string' }, rounds: { type: 'string' }, dist: { type: 'string' } },
});
const CONTEXT = Number(a.context ?? 131072);
const TIME_MS = Number(a['time-ms'] ?? 500);
const ROUNDS = Number(a.rounds ?? 3);
if (!Number.isInteger(CONTEXT) || CONTEXT < 16384) throw new Error(`--context: expected an integer >= 16384, got ${a.context}`);
if (!(TIME_MS > 0)) throw new Error(`--time-ms: expected a positive number, got ${a['time-ms']}`);
if (!Number.isInteger(ROUNDS) || ROUNDS < 1) throw new Error(`--rounds: expected an integer >= 1, got ${a.rounds}`);
const distRoot = a.dist ? resolve(a.dist) : undefined;

// The modules a build's rows need, imported from this build or from DIR/dist.
async function load(root?: string) {
  const [policy, options, kernels, nat] = await Promise.all(
    ['src/index/policy.js', 'src/index/options.js', 'src/index/kernels.js', 'src/native.js'].map((p) => importFromBuild<any>(p, root)),
  );
  return { ...policy, ...options, ...kernels, ...nat };
}
const here = await load();
const { generateSyntheticTrace } = await import('../src/trace/synthetic.js');
const { toF32 } = await import('../src/util/f16.js');

const DIM = 128;
const QH = 32;
const KVH = 8;
const G = QH / KVH;
const BUDGET = 2048;

const trace = generateSyntheticTrace({ layers: 1, promptTokens: CONTEXT, decodeSteps: 1, qHeads: QH, kvHeads: KVH, headDim: DIM, dtype: 'f16', seed: 5 });
const layer = trace.layerData(0);
const k = { data: layer.k, dtype: 'f16', tokens: CONTEXT, heads: KVH, dim: DIM };
const q = toF32(layer.q, 'f16') as Float32Array;

// Kernel inputs (the same arrays for every build).
const nCentroids = 8192;
const centroidRows = uniform(nCentroids * DIM, 2);
const spread = { var: Float32Array.from(uniform(nCentroids, 3), (x) => Math.abs(x)), coef: Float32Array.from({ length: G }, () => 0.05) };
const points = blobPoints(1024, DIM, 300, 3);
const sketchTokens = Int32Array.from({ length: 16384 }, (_, i) => (i * 7919) % (CONTEXT - 64));
const BUILD_TOKENS = 16384;

/** One build's rows: its policies built over the shared layer, each row a closure over them. */
async function rowsOf(m: typeof here): Promise<Record<string, () => unknown>> {
  const { createPolicy, offloadedPolicyOptions, centroidTiles, scoreCentroids, kmeans } = m;
  // The build's own level-1 tiles: 4-bit, or int8 where it has none (E_DTYPE from before them).
  let centroids: () => unknown;
  try {
    const t4 = centroidTiles(centroidRows, nCentroids, DIM, 'u4');
    centroids = () => scoreCentroids(q.subarray(0, G * DIM), G, t4, nCentroids, DIM, 'tiles4', spread);
  } catch {
    const t8 = centroidTiles(centroidRows, nCentroids, DIM, 'i8');
    centroids = () => scoreCentroids(q.subarray(0, G * DIM), G, t8, nCentroids, DIM, 'tiles8', spread);
  }
  const offloaded = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { threads: 2 }));
  const rebuilt = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { threads: 2 }));
  const quest = createPolicy('quest', { threads: 2 });
  const shadowkv = createPolicy('shadowkv', { threads: 2 });
  for (const p of [offloaded, quest, shadowkv]) await p.build(k, CONTEXT);
  offloaded.setPrior(offloaded.select(q, BUDGET));
  return {
    centroids,
    kmeans: () => kmeans(points, DIM, { k: 256, iters: 8, seed: 1, trials: 2 }),
    'sketch rows': () => offloaded.sketchScores(q.subarray(0, G * DIM), 0, sketchTokens),
    'build 16K': () => rebuilt.buildSync(k, BUILD_TOKENS),
    'select keyless': () => offloaded.select(q, BUDGET),
    'select quest': () => quest.select(q, BUDGET, { keys: k }),
    'select shadowkv': () => shadowkv.select(q, BUDGET, { keys: k }),
  };
}

const builds: { name: string; m: typeof here; rows: Record<string, () => unknown> }[] = [];
if (distRoot) {
  const m = await load(distRoot);
  builds.push({ name: 'before', m, rows: await rowsOf(m) });
}
builds.push({ name: distRoot ? 'this build' : 'ms', m: here, rows: await rowsOf(here) });
const rowNames = Object.keys(builds[0]!.rows);

const best = here.indexKernelLevel('best') as string;
const levels = ['scalar', ...(best === 'scalar' ? [] : ['avx2']), ...(best === 'avx512' ? ['avx512'] : [])];
const rounds = new RoundTimes();  // task names: level | build | row
for (let round = 0; round < ROUNDS; round++) {
  for (const level of levels) {
    for (const b of builds) b.m.indexKernelLevel(level);
    const tasks = rowNames.flatMap((name) => builds.map((b): [string, () => unknown] => [`${level}|${b.name}|${name}`, b.rows[name]!]));
    rounds.add(await timeTasks(tasks, { timeMs: TIME_MS, warmupMs: 100, iterations: 5 }));
    for (const b of builds) b.m.indexKernelLevel('best');
  }
}
const cell = (level: string, b: string, row: string) => rounds.get(`${level}|${b}|${row}`);

const f = here.cpuFeatures() as { active: string };
console.log(`# index kernels by SIMD level (${distRoot ? `this build against ${distRoot}, in one process` : 'this build'}; CPU ${cpus()[0]?.model ?? '?'}, best level ${best}, active ${f.active}; ` +
  `context ${CONTEXT}, ${ROUNDS} rounds x ${TIME_MS} ms per row and level; load ${loadavg().map((x) => x.toFixed(1)).join(' ')})`);
console.log('');
const cols = levels.flatMap((l) => builds.map((b) => `${l}${builds.length > 1 ? ` ${b.name}` : ''} ms (median mean / min)`));
const ratioCols = [
  ...levels.slice(1).map((l) => `scalar / ${l} (means)`),
  ...(builds.length > 1 ? levels.map((l) => `${l}: before / this (means; minima)`) : []),
];
console.log(`| row | ${cols.join(' | ')} | ${ratioCols.join(' | ')} |`);
console.log(`|---|${cols.map(() => '---:').join('|')}|${ratioCols.map(() => '---:').join('|')}|`);
const me = builds[builds.length - 1]!.name;
for (const name of rowNames) {
  const cells = levels.flatMap((l) => builds.map((b) => cell(l, b.name, name))).map((c) => `${c.mean.toFixed(3)} / ${c.min.toFixed(3)}`);
  const ratios = levels.slice(1).map((l) => (cell('scalar', me, name).mean / cell(l, me, name).mean).toFixed(2));
  if (builds.length > 1)
    for (const l of levels) {
      const b0 = cell(l, 'before', name), b1 = cell(l, me, name);
      ratios.push(`${(b0.mean / b1.mean).toFixed(2)}; ${(b0.min / b1.min).toFixed(2)}`);
    }
  console.log(`| ${name} | ${cells.join(' | ')} | ${ratios.join(' | ')} |`);
}
