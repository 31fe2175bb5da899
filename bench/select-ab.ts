/**
 * Same-process A/B of kvdrive select between two builds of the addon (for a loaded machine, where
 * separate runs are not comparable): builds one layer's index in each, checks that both select the
 * same tokens, then alternates select calls and reports min / median wall and CPU per call of each
 * (process CPU: mean, and the median call, which the V8 threads compiling the bench's own JS early
 * on, counted in whichever build runs then, do not move).
 * The options are the runtime's (`offloadedPolicyOptions`, keyless select on the key sketch);
 * `"keyed": true` in them takes them as given and selects with the keys.
 *
 * Repeating one query keeps the index in cache and so understates level 1 (every centroid tile is
 * streamed once per step). `"steps": N` in the options runs the decode instead: the trace's N
 * consecutive decode steps, each extending both indexes (not timed) and selecting once per build
 * with that step's query (which build goes first alternates), with `flushMiB` (default 256) of
 * other memory read before every select so the index comes from DRAM, as in a runtime step that
 * alternates layers; reps then repeats the whole decode, each rep from a fresh build at the prompt
 * (as a runtime prefill leaves it), and each select after a rep's first has the previous step's
 * selection as its prior (setPrior), as in the runtime. Selections of the two builds may differ (the count of identical
 * steps is printed). The extends are timed too (not flushed before; each build's every call):
 * mean and max wall and CPU per call, since the runtime's select column adds them
 * (src/pipeline/step.ts: appendEntry's extend), and one slow call in a short decode moves its mean.
 *
 *   node dist/bench/select-ab.js <a.node> <b.node> [context=131072] [budget=2048] [seed=3] [reps=40] ['{"preferSketch":true}']
 *   node dist/bench/select-ab.js <a.node> <b.node> 131072 2048 3 3 '{"steps":16}'
 *
 * `"b": {...}` in the options are policy options for B only (A and B may then be the same build):
 *
 *   node dist/bench/select-ab.js <x.node> <x.node> 131130 2048 3 3 '{"steps":16,"reclusterDelay":0,"b":{"reclusterDelay":256}}'
 */
import { createRequire } from 'node:module';
import os from 'node:os';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { layerKvWithNew } from '../src/trace/trace.js';
import { prefixView } from '../src/eval/replay.js';
import { offloadedPolicyOptions, resolvePolicyOptions } from '../src/index/options.js';

const require = createRequire(import.meta.url);
const [A, B] = [process.argv[2]!, process.argv[3]!];
const CONTEXT = Number(process.argv[4] ?? 131072);
const BUDGET = Number(process.argv[5] ?? 2048);
const SEED = Number(process.argv[6] ?? 3);
const REPS = Number(process.argv[7] ?? 40);
const { keyed = false, steps: STEPS = 0, flushMiB: FLUSH_MIB = 256, b: B_OPTS = {}, ...OPTS } = process.argv[8] ? JSON.parse(process.argv[8]) : {};

const trace = generateSyntheticTrace({ layers: 1, promptTokens: CONTEXT, decodeSteps: Math.max(1, STEPS), qHeads: 32, kvHeads: 8, headDim: 128, dtype: 'f16', seed: SEED });
const layer = await trace.layer(0);
const { k } = layerKvWithNew(layer);
const T = CONTEXT;
const kv = prefixView(k, T + 1);
const q = layer.q.subarray(0, 32 * 128);
const configOf = (opts: object) => {
  const { qHeads: _q, kvHeads: _k, headDim: _d, ...cfg } = resolvePolicyOptions('kvdrive', keyed ? opts : offloadedPolicyOptions('kvdrive', opts));
  return cfg;
};
const cfgs = [configOf(OPTS), configOf({ ...OPTS, ...B_OPTS })];
const keys = keyed ? kv : undefined;
type Sel = { chunkIds: Int32Array; offsets: Int32Array };
const runs = [A, B].map((path, i) => {
  const mod = require(path);
  const index = new mod.SelectionIndex({ policy: 'kvdrive', ...cfgs[i] });
  index.buildSync(prefixView(k, T), T);
  index.extend(kv, T + 1);
  return { path, index, wall: [] as number[], cpu: 0, cpus: [] as number[], ext: [] as number[], extCpu: 0 };
});
const sels = runs.map((r) => r.index.select(q, BUDGET, undefined, keys) as Sel);
const same = sels[0]!.chunkIds.length === sels[1]!.chunkIds.length && sels[0]!.chunkIds.every((x, i) => x === sels[1]!.chunkIds[i]);
console.log(`seed ${SEED}, context ${CONTEXT}, budget ${BUDGET}, ${JSON.stringify({ keyed, ...OPTS, b: B_OPTS })}; same selection: ${same}; load ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
const timed = (run: (typeof runs)[number], query: Float32Array, keysNow: typeof keys) => {
  const c = process.cpuUsage();
  const t = performance.now();
  const sel = run.index.select(query, BUDGET, undefined, keysNow) as Sel;
  run.wall.push(performance.now() - t);
  const d = process.cpuUsage(c);
  run.cpu += (d.user + d.system) / 1000;
  run.cpus.push((d.user + d.system) / 1000);
  return sel;
};
let calls = REPS;
if (STEPS > 0) {
  // One cache line of every 64 bytes read: evicts the index from the last-level cache.
  const flush = new Int32Array((FLUSH_MIB * 2 ** 20) / 4).fill(1);
  let sink = 0;
  const touch = () => {
    for (let i = 0; i < flush.length; i += 16) sink += flush[i]!;
  };
  let sameSteps = 0;
  calls = REPS * STEPS;
  for (let r = 0; r < REPS; r++) {
    // A fresh index per rep at the prompt (the decode extends it), built outside the timing.
    for (const run of runs) run.index.buildSync(prefixView(k, T), T);
    for (let s = 0; s < STEPS; s++) {
      const tokens = T + s + 1;
      const kvNow = prefixView(k, tokens);
      const qs = layer.q.subarray(s * 32 * 128, (s + 1) * 32 * 128);
      const order = s % 2 === 0 ? runs : [...runs].reverse();
      for (const run of order) {
        const c = process.cpuUsage();
        const t = performance.now();
        run.index.extend(kvNow, tokens);
        run.ext.push(performance.now() - t);
        const d = process.cpuUsage(c);
        run.extCpu += (d.user + d.system) / 1000;
      }
      const got = new Map<(typeof runs)[number], Sel>();
      for (const run of order) {
        touch();
        got.set(run, timed(run, qs, keyed ? kvNow : undefined));
      }
      // The next step's select starts from this one's selection (reuseCandidateFactor), as the
      // runtime's does once a step commits.
      for (const run of runs) run.index.setPrior(got.get(run)!);
      const [x, y] = [got.get(runs[0]!)!, got.get(runs[1]!)!];
      sameSteps += Number(x.chunkIds.length === y.chunkIds.length && x.chunkIds.every((v, i) => v === y.chunkIds[i]));
    }
  }
  console.log(`decode: ${STEPS} consecutive steps x ${REPS} reps, ${FLUSH_MIB} MiB read before each select; identical selections in ${sameSteps} of ${STEPS * REPS} steps (${sink > 0 ? 'flushed' : ''})`);
} else {
  for (let r = 0; r < REPS; r++) for (const run of runs) timed(run, q, keys);
}
const median = (a: number[]) => [...a].sort((x, y) => x - y)[a.length >> 1]!;
const mean = (a: number[]) => a.reduce((x, y) => x + y, 0) / a.length;
for (const run of runs) {
  const ext = run.ext.length ? `; extend mean ${mean(run.ext).toFixed(3)} max ${Math.max(...run.ext).toFixed(2)} ms, CPU ${(run.extCpu / run.ext.length).toFixed(3)} ms/call` : '';
  console.log(`${run.path}: select min ${Math.min(...run.wall).toFixed(2)} p50 ${median(run.wall).toFixed(2)} mean ${mean(run.wall).toFixed(2)} ms, CPU ${(run.cpu / calls).toFixed(2)} ms/call (p50 ${median(run.cpus).toFixed(2)})${ext}`);
}
console.log(`load after ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
