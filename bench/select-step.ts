/**
 * Focused decode-step driver for kvdrive's select + sparse attention on the `kvdrive demo` workload
 * (Llama-3-8B-shaped synthetic trace: 32/8 heads, dim 128, f16 KV, planted needles): builds one
 * layer's index once, then per decode step extends it and times select and sparse attention `REPS`
 * times (wall min / median and process CPU per call), beside recall / oracle. For profiling
 * (`perf record -g node dist/bench/select-step.js ...`) and A/B of option sets in one run: the sets'
 * selects alternate rep by rep, and each later set's select time is printed as a ratio of the first's.
 * Each option set is what the runtime uses by default: passed through `offloadedPolicyOptions` and
 * selected without the keys (the offloaded re-rank on the key sketch); `"keyed": true` in a set
 * passes the options as given and selects with the keys (the host's in-place KV).
 *
 *   npm run build:ts && node dist/bench/select-step.js [context=131072] [budget=2048] [steps=4] [seed=3] \
 *     [reps=10] ['[{}, {"candidateFactor":4}]']
 */
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { layerKvWithNew } from '../src/trace/trace.js';
import { prefixView, traceNeedles } from '../src/eval/replay.js';
import { attendedMask, massRecall, oracleMask } from '../src/eval/metrics.js';
import { attendSparse, attentionWeights } from '../src/attention/kernels.js';
import { createPolicy } from '../src/index/policy.js';
import { offloadedPolicyOptions, type PolicyOptions } from '../src/index/options.js';
import type { PolicyName, Selection } from '../src/index/selection.js';
import os from 'node:os';

const CONTEXT = Number(process.argv[2] ?? 131072);
const BUDGET = Number(process.argv[3] ?? 2048);
const STEPS = Number(process.argv[4] ?? 4);
const SEED = Number(process.argv[5] ?? 3);
const REPS = Number(process.argv[6] ?? 10);
const SETS: (PolicyOptions & { policy?: PolicyName; keyed?: boolean })[] = process.argv[7] ? JSON.parse(process.argv[7]) : [{}];
const THREADS = 2;
const cpuMs = (c: NodeJS.CpuUsage) => (c.user + c.system) / 1000;

const trace = generateSyntheticTrace({
  layers: 1, promptTokens: CONTEXT, decodeSteps: STEPS, qHeads: 32, kvHeads: 8, headDim: 128, dtype: 'f16', seed: SEED,
});
const needles = await traceNeedles(trace);
const qHeads = trace.meta.qHeads;
const layer = await trace.layer(0);
const { k, v } = layerKvWithNew(layer);
const dim = k.dim;
const T = trace.meta.promptTokens;
const steps = [];
for (let s = 0; s < STEPS; s++) {
  const tokens = T + s + 1;
  const q = layer.q.subarray(s * qHeads * dim, (s + 1) * qHeads * dim);
  steps.push({ tokens, q, weights: attentionWeights({ q, qHeads, k: prefixView(k, tokens) }) });
}

const median = (a: number[]) => [...a].sort((x, y) => x - y)[a.length >> 1]!;
console.log(`seed ${SEED}, context ${CONTEXT}, budget ${BUDGET}, ${STEPS} steps x ${REPS} reps, ${THREADS} threads; load ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);

// Every set's policy is built first; then each step's selects (and attention calls) alternate
// between the sets rep by rep, the order flipped every rep, so a machine that slows down for a few
// seconds slows every set alike and the sets' figures compare within this one run.
interface Run {
  set: (typeof SETS)[number];
  keyed: boolean;
  p: ReturnType<typeof createPolicy>;
  selWall: number[];
  attWall: number[];
  extMs: number;
  selCpu: number;
  attCpu: number;
  n: number;
  ratio: number;
  recall: number;
  found: number;
  total: number;
  bytes: number;
}
const runs: Run[] = [];
for (const set of SETS) {
  const { policy: name = 'kvdrive', keyed = false, ...given } = set;
  const opts = keyed ? given : offloadedPolicyOptions(name, given);
  const p = createPolicy(name, { threads: THREADS, ...opts, qHeads, kvHeads: k.heads, headDim: dim });
  await p.build(prefixView(k, T), T);
  runs.push({ set, keyed, p, selWall: [] as number[], attWall: [] as number[], extMs: 0, selCpu: 0, attCpu: 0, n: 0, ratio: 0, recall: 0, found: 0, total: 0, bytes: 0 });
}
const order = (r: number) => (r % 2 ? [...runs].reverse() : runs);
for (const [s, st] of steps.entries()) {
  const kv = prefixView(k, st.tokens);
  const vv = prefixView(v, st.tokens);
  const sels = new Map<Run, Selection>();
  for (const x of runs) {
    const te = performance.now();
    x.p.extend(kv, st.tokens);
    x.extMs += performance.now() - te;
    sels.set(x, x.p.select(st.q, BUDGET, x.keyed ? { keys: kv } : {}));
  }
  for (let r = 0; r < REPS; r++)
    for (const x of order(r)) {
      const c0 = process.cpuUsage();
      const t = performance.now();
      sels.set(x, x.p.select(st.q, BUDGET, x.keyed ? { keys: kv } : {}));
      x.selWall.push(performance.now() - t);
      x.selCpu += cpuMs(process.cpuUsage(c0));
    }
  for (let r = 0; r < REPS; r++)
    for (const x of order(r)) {
      const c1 = process.cpuUsage();
      const t = performance.now();
      attendSparse({ q: st.q, qHeads, k: kv, v: vv, selection: sels.get(x)!, threads: THREADS });
      x.attWall.push(performance.now() - t);
      x.attCpu += cpuMs(process.cpuUsage(c1));
    }
  for (const x of runs) {
    const sel = sels.get(x)!;
    x.n += REPS;
    x.bytes += x.p.lastSelectStats().bytesScored;
    const mask = attendedMask(sel, k.heads);
    const oracle = oracleMask(st.weights, qHeads, k.heads, st.tokens, sel.sinkEnd, sel.tailStart, BUDGET);
    const rc = massRecall(st.weights, mask, qHeads, k.heads, st.tokens);
    x.recall += rc;
    x.ratio += rc / massRecall(st.weights, oracle, qHeads, k.heads, st.tokens);
    for (const nd of needles) {
      if (s < nd.firstStep || s > nd.lastStep) continue;
      x.total++;
      if (mask[nd.kvHead * st.tokens + nd.token]) x.found++;
    }
    // The next step starts from this one's selection, as the runtime's do (used with reuseCandidateFactor > 0).
    x.p.setPrior(sel);
  }
}
for (const x of runs)
  console.log(
    `${JSON.stringify(x.set)}: extend ${(x.extMs / STEPS).toFixed(2)} ms; recall ${(x.recall / STEPS).toFixed(4)} ratio ${(x.ratio / STEPS).toFixed(4)} needles ${x.found}/${x.total}; ` +
      `select min ${Math.min(...x.selWall).toFixed(2)} p50 ${median(x.selWall).toFixed(2)} cpu ${(x.selCpu / x.n).toFixed(2)} ms, ` +
      `${(x.bytes / STEPS / 2 ** 20).toFixed(1)} MiB; attend min ${Math.min(...x.attWall).toFixed(2)} p50 ${median(x.attWall).toFixed(2)} cpu ${(x.attCpu / x.n).toFixed(2)} ms`,
  );
if (runs.length > 1) {
  const base = runs[0]!;
  for (const x of runs.slice(1))
    console.log(`${JSON.stringify(x.set)} / ${JSON.stringify(base.set)} in this run: select p50 ${(median(x.selWall) / median(base.selWall)).toFixed(3)}, select CPU ${(x.selCpu / base.selCpu).toFixed(3)}`);
}
console.log(`load after ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
