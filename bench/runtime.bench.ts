/**
 * Decode step time of the Runtime, sequential vs pipelined, in the same run (results in
 * bench/pipeline.md). One "layer step" = attend(layer, batch) for the whole batch. Modes are
 * measured in alternating rounds so machine load drifts hit both alike; the figure is the ratio
 * pipelined / sequential of the median layer-step time (< 1: the pipeline wins).
 *
 * Run: npm run build:ts && node dist/bench/runtime.bench.js [--context 4096] [--batch 4]
 *      [--budget 128] [--micro 1,2,4] [--steps 40] [--rounds 3] [--tier 2]
 */
import { loadavg, cpus } from 'node:os';
import { openRuntime, type Runtime } from '../src/runtime/runtime.js';

const arg = (name: string, dflt: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1]! : dflt;
};
const CONTEXT = Number(arg('context', '4096'));
const BATCH = Number(arg('batch', '4'));
const BUDGET = Number(arg('budget', '128'));
const MICRO = arg('micro', '1,2,4').split(',').map(Number);
const STEPS = Number(arg('steps', '40'));
const ROUNDS = Number(arg('rounds', '3'));
/** --tier N: put a hot tier with windows xN in front of compute (adds the fetch stage). */
const TIER = Number(arg('tier', '0'));
const shape = { layers: 2, qHeads: 8, kvHeads: 2, headDim: 64 };
const ROW = shape.kvHeads * shape.headDim;

/** Mulberry32 normal-ish values: deterministic inputs shared by both modes. */
function randn(n: number, seed: number): Float32Array {
  let a = seed >>> 0;
  const r = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = Math.sqrt(-2 * Math.log(Math.max(r(), 1e-12))) * Math.cos(2 * Math.PI * r());
  return out;
}

async function setup(mode: 'sequential' | 'pipelined', microBatch: number): Promise<{ rt: Runtime; seqs: number[] }> {
  const rt = await openRuntime({
    shape,
    budget: BUDGET,
    mode,
    microBatch,
    maxSequences: BATCH,
    maxTokens: CONTEXT + ROUNDS * (STEPS + 5) + 16,
    ...(TIER > 0 ? { hotTier: { windows: TIER, maxBytes: 1 << 30 } } : {}),
  });
  const seqs: number[] = [];
  for (let s = 0; s < BATCH; s++) {
    const seq = rt.createSequence();
    seqs.push(seq);
    for (let l = 0; l < shape.layers; l++) {
      const k = { data: randn(CONTEXT * ROW, 1 + s * 10 + l), dtype: 'f32' as const, tokens: CONTEXT, heads: shape.kvHeads, dim: shape.headDim };
      const v = { ...k, data: randn(CONTEXT * ROW, 100 + s * 10 + l) };
      await rt.prefill(seq, l, k, v);
    }
  }
  return { rt, seqs };
}

/** Runs `steps` decode steps (every layer) and returns per-layer-step times in ms. */
async function run(rt: Runtime, seqs: number[], steps: number, seed: number): Promise<number[]> {
  const times: number[] = [];
  for (let t = 0; t < steps; t++)
    for (let l = 0; l < shape.layers; l++) {
      const batch = seqs.map((seq, i) => ({
        seq,
        q: randn(shape.qHeads * shape.headDim, seed + t * 97 + i * 13 + l),
        kNew: randn(ROW, seed + t * 89 + i * 7 + l),
        vNew: randn(ROW, seed + t * 83 + i * 5 + l),
      }));
      const t0 = performance.now();
      await rt.attend(l, batch);
      times.push(performance.now() - t0);
    }
  return times;
}

const median = (x: number[]) => [...x].sort((a, b) => a - b)[Math.floor(x.length / 2)]!;

console.log(
  `# runtime bench: layers ${shape.layers}, qHeads ${shape.qHeads}, kvHeads ${shape.kvHeads}, headDim ${shape.headDim}, context ${CONTEXT}, batch ${BATCH}, budget ${BUDGET}, hot tier ${TIER > 0 ? `windows x${TIER}` : 'none'}; ${cpus().length} CPUs, load avg ${loadavg()[0]!.toFixed(2)}\n`,
);
const cols = TIER > 0 ? 'selection / fetch (hit rate) / compute / stall' : 'selection / compute / stall';
console.log(`| microBatch | sequential ms/layer-step median (mean) | pipelined ms/layer-step median (mean) | ratio pip/seq median (mean) | sequential ${cols}, mean ms | pipelined ${cols}, mean ms |`);
console.log('|---|---|---|---|---|---|');
for (const micro of MICRO) {
  const seq = await setup('sequential', micro);
  const pip = await setup('pipelined', micro);
  await run(seq.rt, seq.seqs, 5, 1);
  await run(pip.rt, pip.seqs, 5, 1);
  const s0 = await seq.rt.stats();
  const p0 = await pip.rt.stats();
  const ts: number[] = [];
  const tp: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    ts.push(...(await run(seq.rt, seq.seqs, STEPS, 1000 + r)));
    tp.push(...(await run(pip.rt, pip.seqs, STEPS, 1000 + r)));
  }
  const s1 = await seq.rt.stats();
  const p1 = await pip.rt.stats();
  const n = ts.length;
  const per = (a: number, b: number) => ((a - b) / n).toFixed(3);
  const mean = (x: number[]) => x.reduce((a, b) => a + b, 0) / x.length;
  const br = (a: typeof s0, b: typeof s0) =>
    `${per(b.selectionMs, a.selectionMs)} / ${TIER > 0 ? `${per(b.fetchMs, a.fetchMs)} (hit ${((b.hits - a.hits) / Math.max(1, b.hits - a.hits + b.misses - a.misses)).toFixed(2)}) / ` : ''}${per(b.computeMs, a.computeMs)} / ${per(b.stallMs, a.stallMs)}`;
  console.log(
    `| ${micro} | ${median(ts).toFixed(3)} (${mean(ts).toFixed(3)}) | ${median(tp).toFixed(3)} (${mean(tp).toFixed(3)}) | ${(median(tp) / median(ts)).toFixed(3)} (${(mean(tp) / mean(ts)).toFixed(3)}) | ${br(s0, s1)} | ${br(p0, p1)} |`,
  );
  await seq.rt.close();
  await pip.rt.close();
}
