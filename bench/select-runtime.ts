/**
 * The runtime's select against the same select out of the decode step, in one process: why the
 * runtime's select column (the demo's, src/pipeline/step.ts: index extend + native select) is
 * larger than `select-step` / `select-ab` give for the same workload (bench/index.md, "The
 * runtime's select column vs the same select out of the step").
 *
 * Runs the runtime's DRAM row (openRuntime sequential, 1 GiB DRAM budget, one layer of the demo's
 * synthetic trace: 32 / 8 heads, dim 128, f16, budget 2048 tokens per kv head) for `steps` decode
 * steps, timing each native select (`selectIndex`, wrapped) and each index extend; then, on the
 * runtime's own index (its handle) and the same queries, the native select alone: with 256 MiB
 * read before each call ("cold"), back to back, and one query repeated. For every phase: wall and
 * process CPU per call (medians from the third call on), and each thread's on-CPU time around each
 * call (/proc/self/task/{tid}/schedstat), split into the two select threads (the two threads with
 * the most time in the back-to-back phase: the JS thread and the pool worker) and the process's
 * other threads (V8's compiler and GC, libuv). The schedstat reads run on the JS thread inside the
 * per-thread window (not the timed one): they add to every phase's select-thread figure (0.4-1.1 ms
 * per call over the process CPU of the same calls, measured out of the step on a loaded machine).
 *
 *   npm run build:ts && node dist/bench/select-runtime.js [context=131072] [steps=40] [seed=1] [windows.json]
 *
 * `windows.json`: each decode select's [start, end] in CLOCK_MONOTONIC ns, to keep only the samples
 * of `perf record -k CLOCK_MONOTONIC` that fall inside a select (by thread and symbol).
 */
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { native } from '../src/native.js';
import { NativeSelectionPolicy } from '../src/index/policy.js';
import { openRuntime } from '../src/runtime/runtime.js';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { toF32 } from '../src/util/f16.js';

const CONTEXT = Number(process.argv[2] ?? 131072);
const STEPS = Number(process.argv[3] ?? 40);
const SEED = Number(process.argv[4] ?? 1);
const WINDOWS = process.argv[5];
const BUDGET = 2048;
const [QH, KVH, DIM] = [32, 8, 128];

/** On-CPU ns of every thread of this process. */
function threadTimes(): Map<string, number> {
  const m = new Map<string, number>();
  for (const t of readdirSync('/proc/self/task')) {
    try {
      m.set(t, Number(readFileSync(`/proc/self/task/${t}/schedstat`, 'utf8').split(' ')[0]));
    } catch {
      // the thread exited between the listing and the read
    }
  }
  return m;
}

interface Phase {
  wall: number[];
  cpu: number[];
  threads: Map<string, number>;
}
const phase = (): Phase => ({ wall: [], cpu: [], threads: new Map() });
let rec: Phase | undefined;
let handle = 0;
const windows: [string, string][] = [];
const selectIndex = native.selectIndex as (...a: unknown[]) => unknown;
native.selectIndex = (...a: unknown[]) => {
  handle = a[0] as number;
  const m0 = rec ? threadTimes() : undefined;
  const h0 = process.hrtime.bigint();
  const c = process.cpuUsage();
  const t = performance.now();
  const r = selectIndex(...a);
  const dt = performance.now() - t;
  const d = process.cpuUsage(c);
  const h1 = process.hrtime.bigint();
  if (rec) {
    rec.wall.push(dt);
    rec.cpu.push((d.user + d.system) / 1000);
    for (const [k, v] of threadTimes()) rec.threads.set(k, (rec.threads.get(k) ?? 0) + v - (m0!.get(k) ?? 0));
    if (rec === decode) windows.push([String(h0), String(h1)]);
  }
  return r;
};
const extendMs: number[] = [];
const extend = NativeSelectionPolicy.prototype.extend;
NativeSelectionPolicy.prototype.extend = function (this: NativeSelectionPolicy, ...a: Parameters<typeof extend>) {
  const t = performance.now();
  extend.apply(this, a);
  if (rec) extendMs.push(performance.now() - t);
};

const row = KVH * DIM;
const trace = generateSyntheticTrace({ layers: 1, qHeads: QH, kvHeads: KVH, headDim: DIM, promptTokens: CONTEXT, decodeSteps: STEPS, dtype: 'f16', seed: SEED });
const d = trace.layerData(0);
const kv = (data: Float32Array | Uint16Array, tokens: number) => ({ data: data.subarray(0, tokens * row), dtype: 'f16' as const, tokens, heads: KVH, dim: DIM });
const slice = (a: Float32Array | Uint16Array, s: number, n: number) => toF32(a.subarray(s * n, (s + 1) * n), 'f16');
const qs = Array.from({ length: STEPS }, (_, s) => slice(d.q, s, QH * DIM));
const rt = await openRuntime({
  shape: { layers: 1, qHeads: QH, kvHeads: KVH, headDim: DIM }, budget: BUDGET, policy: 'kvdrive', dtype: 'f16',
  maxSequences: 1, maxTokens: CONTEXT + STEPS + 64, mode: 'sequential', dramBudget: 2 ** 30,
});
const seq = rt.createSequence();
await rt.prefill(seq, 0, kv(d.k, CONTEXT), kv(d.v, CONTEXT));

const decode = phase();
const column: number[] = [];
for (let s = 0; s < STEPS; s++) {
  const before = (await rt.stats()).selectionMs;
  rec = decode;
  await rt.attend(0, [{ seq, q: qs[s]!, kNew: slice(d.kNew, s, row), vNew: slice(d.vNew, s, row) }]);
  rec = undefined;
  column.push((await rt.stats()).selectionMs - before);
}
// One cache line of every 64 bytes read: evicts the index from the last-level cache.
const flush = new Int32Array((256 * 2 ** 20) / 4).fill(1);
let sink = 0;
const touch = () => {
  for (let i = 0; i < flush.length; i += 16) sink += flush[i]!;
};
for (let i = 0; i < 3; i++) touch();
const [cold, b2b, repeated] = [phase(), phase(), phase()];
for (let r = 0; r < 2; r++)
  for (let s = 0; s < STEPS; s++) {
    touch();
    rec = cold;
    native.selectIndex(handle, qs[s], BUDGET);
    rec = b2b;
    native.selectIndex(handle, qs[(s + 1) % STEPS], BUDGET);
    rec = undefined;
  }
rec = repeated;
for (let r = 0; r < STEPS; r++) native.selectIndex(handle, qs[STEPS - 1], BUDGET);
rec = undefined;
await rt.close();
if (WINDOWS) writeFileSync(WINDOWS, JSON.stringify(windows));

const median = (a: number[], from = 0) => {
  const b = a.slice(from).sort((x, y) => x - y);
  return b[b.length >> 1]!.toFixed(2);
};
const mean = (a: number[], from = 0) => (a.slice(from).reduce((x, y) => x + y, 0) / (a.length - from)).toFixed(2);
const half = STEPS >> 1;
console.log(`seed ${SEED}, context ${CONTEXT}, budget ${BUDGET}, ${STEPS} steps; load ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}${sink > 0 ? '' : ' (flush not read)'}`);
console.log(
  `decode: select column mean ${mean(column)} p50 ${median(column, 2)} ms (steps ${half}-${STEPS - 1}: mean ${mean(column, half)}); ` +
    `extend mean ${mean(extendMs)} ms; first two native selects ${decode.wall.slice(0, 2).map((x) => x.toFixed(1)).join(', ')} ms`,
);
const selectThreads = [...b2b.threads].sort((x, y) => y[1] - x[1]).slice(0, 2).map((x) => x[0]);
const rows: [string, Phase, number][] = [['decode', decode, 2], [`decode, steps ${half}-${STEPS - 1}`, decode, half], ['same index, cold', cold, 2], ['same index, back to back', b2b, 2], ['same index, one query repeated', repeated, 2]];
for (const [name, p, from] of rows) {
  let sel = 0, other = 0;
  for (const [k, v] of p.threads) if (selectThreads.includes(k)) sel += v; else other += v;
  const per = (ns: number) => (ns / 1e6 / p.wall.length).toFixed(2);
  console.log(
    `${name}: native select wall p50 ${median(p.wall, from)} mean ${mean(p.wall, from)} ms, process CPU p50 ${median(p.cpu, from)} mean ${mean(p.cpu, from)} ms` +
      (from === 2 ? `; per call (all calls), select threads ${per(sel)} ms, other threads ${per(other)} ms` : ''),
  );
}
