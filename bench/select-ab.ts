/**
 * Same-process A/B of kvdrive select between two builds of the addon (for a loaded machine, where
 * separate runs are not comparable): builds one layer's index in each, checks that both select the
 * same tokens, then alternates select calls and reports min / median wall and CPU per call of each.
 * The options are the runtime's (`offloadedPolicyOptions`, keyless select on the key sketch);
 * `"keyed": true` in them takes them as given and selects with the keys.
 *
 *   node dist/bench/select-ab.js <a.node> <b.node> [context=131072] [budget=2048] [seed=3] [reps=40] ['{"preferSketch":true}']
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
const { keyed = false, ...OPTS } = process.argv[8] ? JSON.parse(process.argv[8]) : {};

const trace = generateSyntheticTrace({ layers: 1, promptTokens: CONTEXT, decodeSteps: 1, qHeads: 32, kvHeads: 8, headDim: 128, dtype: 'f16', seed: SEED });
const layer = await trace.layer(0);
const { k } = layerKvWithNew(layer);
const T = CONTEXT;
const kv = prefixView(k, T + 1);
const q = layer.q.subarray(0, 32 * 128);
const { qHeads: _q, kvHeads: _k, headDim: _d, ...cfg } = resolvePolicyOptions('kvdrive', keyed ? OPTS : offloadedPolicyOptions('kvdrive', OPTS));
const keys = keyed ? kv : undefined;
type Sel = { chunkIds: Int32Array; offsets: Int32Array };
const runs = [A, B].map((path) => {
  const mod = require(path);
  const index = new mod.SelectionIndex({ policy: 'kvdrive', ...cfg });
  index.buildSync(prefixView(k, T), T);
  index.extend(kv, T + 1);
  return { path, index, wall: [] as number[], cpu: 0 };
});
const sels = runs.map((r) => r.index.select(q, BUDGET, undefined, keys) as Sel);
const same = sels[0]!.chunkIds.length === sels[1]!.chunkIds.length && sels[0]!.chunkIds.every((x, i) => x === sels[1]!.chunkIds[i]);
console.log(`seed ${SEED}, context ${CONTEXT}, budget ${BUDGET}, ${JSON.stringify({ keyed, ...OPTS })}; same selection: ${same}; load ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
for (let r = 0; r < REPS; r++)
  for (const run of runs) {
    const c = process.cpuUsage();
    const t = performance.now();
    run.index.select(q, BUDGET, undefined, keys);
    run.wall.push(performance.now() - t);
    const d = process.cpuUsage(c);
    run.cpu += (d.user + d.system) / 1000;
  }
const median = (a: number[]) => [...a].sort((x, y) => x - y)[a.length >> 1]!;
for (const run of runs)
  console.log(`${run.path}: select min ${Math.min(...run.wall).toFixed(2)} p50 ${median(run.wall).toFixed(2)} ms, CPU ${(run.cpu / REPS).toFixed(2)} ms/call`);
console.log(`load after ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
