/**
 * Same-process A/B of the whole runtime step between two builds: `openRuntime` from each build's
 * dist/ (its JS and its own addon, loaded side by side), DRAM-only and without a hot tier (the
 * demo's runtime rows), prefilled with the same 128K-token layer of the `kvdrive demo` trace
 * (32 query / 8 kv heads, dim 128, f16), then decoded step by step, the two runtimes' attend()
 * calls alternating (which goes first alternates too). On a shared VM separate runs differ by more
 * than most changes; here both builds see the same machine phase. Prints each build's median and
 * mean ms per layer-step (the first two steps not counted: caches and V8 warm up) and whether every
 * step's outputs were bit-identical between the builds (the loop: bench-util's alternateDecode,
 * shared with bench/huge-pages.ts), then each build's time per layer-step in its addon's busiest
 * calls (every exported function of the build's src/native.js timed around the call, over every
 * step: where a difference between the builds comes from).
 * (bench/select-ab.ts, attend-ab.ts and kernels-ab.ts do the same for single kernels.)
 *
 *   node dist/bench/runtime-ab.js <a-dist> <b-dist> [context=131072] [steps=160] [seed=11] [between=none]
 *
 * `between`: `none` (steps back to back) or `dense` (untimed before each step, that build's dense
 * attention over the layer on 2 threads, as `kvdrive demo` runs each step after its dense pass:
 * caches cold and the addon's pool threads just gone to sleep, as between a real decode's layers).
 *
 * `<x-dist>`: a build's dist/ folder (e.g. another clone's, after its `npm install`).
 */
import { resolve } from 'node:path';
import { alternateDecode, type DecodeRuntime, importFromBuild, mean, median } from './bench-util.js';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { toF32 } from '../src/util/f16.js';

const [A, B] = [process.argv[2], process.argv[3]];
if (!A || !B) throw new Error('usage: node dist/bench/runtime-ab.js <a-dist> <b-dist> [context=131072] [steps=160] [seed=11]');
const CONTEXT = Number(process.argv[4] ?? 131072);
const STEPS = Number(process.argv[5] ?? 160);
const SEED = Number(process.argv[6] ?? 11);
const BETWEEN = process.argv[7] ?? 'none';
if (!Number.isInteger(CONTEXT) || CONTEXT < 4096) throw new Error(`context: expected an integer >= 4096, got ${process.argv[4]}`);
if (!Number.isInteger(STEPS) || STEPS < 3) throw new Error(`steps: expected an integer >= 3, got ${process.argv[5]}`);
if (!Number.isInteger(SEED) || SEED < 0) throw new Error(`seed: expected an integer >= 0, got ${process.argv[6]}`);
if (BETWEEN !== 'none' && BETWEEN !== 'dense') throw new Error(`between: expected none or dense, got ${process.argv[7]}`);

const Q_HEADS = 32, KV_HEADS = 8, DIM = 128, BUDGET = 2048, WARM_STEPS = 2;
type Runtime = DecodeRuntime & {
  createSequence(): number;
  prefill(seq: number, layer: number, k: unknown, v: unknown, obs?: Float32Array): Promise<void>;
  close(): Promise<void>;
};
const builds = [A, B].map((d) => resolve(d));
// Each build's native calls, timed by name (wall ms summed; the wrapper is the same for both).
const callMs = builds.map(() => new Map<string, number>());
for (let k = 0; k < builds.length; k++) {
  const { native } = await importFromBuild<{ native: Record<string, unknown> }>('src/native.js', builds[k]);
  for (const [name, fn] of Object.entries(native)) {
    if (typeof fn !== 'function' || /^[A-Z]/.test(name)) continue;
    native[name] = (...args: unknown[]) => {
      const t = performance.now();
      try {
        return (fn as (...a: unknown[]) => unknown)(...args);
      } finally {
        callMs[k]!.set(name, (callMs[k]!.get(name) ?? 0) + performance.now() - t);
      }
    };
  }
}
const open = await Promise.all(builds.map((root) => importFromBuild<{ openRuntime(o: unknown): Promise<Runtime> }>('src/runtime/runtime.js', root)));
type DenseArgs = { q: Float32Array; qHeads: number; k: unknown; v: unknown; threads: number };
const dense = await Promise.all(builds.map((root) => importFromBuild<{ attendDenseAsync(a: DenseArgs): Promise<unknown> }>('src/attention/kernels.js', root)));

const trace = generateSyntheticTrace({ layers: 1, promptTokens: CONTEXT, decodeSteps: STEPS, qHeads: Q_HEADS, kvHeads: KV_HEADS, headDim: DIM, dtype: 'f16', seed: SEED });
const layer = trace.layerData(0);
const options = {
  shape: { layers: 1, qHeads: Q_HEADS, kvHeads: KV_HEADS, headDim: DIM },
  budget: BUDGET,
  mode: 'sequential',
  maxSequences: 1,
  maxTokens: CONTEXT + STEPS,
  dtype: 'f16',
  // The whole layer (K + V f16) with room for the index, tails and fetch buffers.
  dramBudget: Math.ceil(CONTEXT * KV_HEADS * DIM * 2 * 2 * 1.6) + 256 * 2 ** 20,
};
const runtimes: Runtime[] = [];
try {
  for (const o of open) runtimes.push(await o.openRuntime(options));
  const seqs = runtimes.map((r) => r.createSequence());
  const tensor = (data: Uint16Array | Float32Array) => ({ data, dtype: 'f16', tokens: CONTEXT, heads: KV_HEADS, dim: DIM });
  for (let k = 0; k < 2; k++) await runtimes[k]!.prefill(seqs[k]!, 0, tensor(layer.k), tensor(layer.v), trace.observationQueries(0, 32));
  for (const m of callMs) m.clear(); // the decode's calls only
  const q = toF32(layer.q, 'f16');
  const row = KV_HEADS * DIM;
  const { times: ms, identical } = await alternateDecode(
    runtimes.map((rt, k) => ({ rt, seq: seqs[k]! })),
    (s) => ({
      q: q.slice(s * Q_HEADS * DIM, (s + 1) * Q_HEADS * DIM),
      kNew: toF32(layer.kNew.slice(s * row, (s + 1) * row), 'f16'),
      vNew: toF32(layer.vNew.slice(s * row, (s + 1) * row), 'f16'),
    }),
    STEPS,
    WARM_STEPS,
    undefined,
    BETWEEN === 'dense'
      ? async (k, s) => {
          await dense[k]!.attendDenseAsync({ q: q.subarray(s * Q_HEADS * DIM, (s + 1) * Q_HEADS * DIM), qHeads: Q_HEADS, k: tensor(layer.k), v: tensor(layer.v), threads: 2 });
        }
      : undefined,
  );
  console.log(`runtime A/B: seed ${SEED}, context ${CONTEXT}, budget ${BUDGET}, ${STEPS} steps (first ${WARM_STEPS} not timed), DRAM-only, no hot tier; between steps: ${BETWEEN === 'dense' ? "that build's dense pass" : 'nothing'}`);
  for (let k = 0; k < 2; k++) console.log(`${builds[k]}: median ${median(ms[k]!).toFixed(2)} mean ${mean(ms[k]!).toFixed(2)} ms per layer-step`);
  console.log(`B / A: median ${(median(ms[1]!) / median(ms[0]!)).toFixed(3)}, mean ${(mean(ms[1]!) / mean(ms[0]!)).toFixed(3)}; bit-identical outputs in ${identical} of ${STEPS} steps`);
  const busiest = [...callMs[0]!.entries()].sort((x, y) => y[1] - x[1]).slice(0, 6).map(([name]) => name);
  for (let k = 0; k < 2; k++)
    console.log(`${builds[k]}: ms per layer-step in ` + busiest.map((name) => `${name} ${((callMs[k]!.get(name) ?? 0) / STEPS).toFixed(3)}`).join(', '));
} finally {
  for (const r of runtimes) await r.close();
}
