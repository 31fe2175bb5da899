/**
 * Calibration sweep (paper §6.2) and what it buys: runs `calibrate()` for two deployments of a
 * Llama-like shape (GQA 32/8, head dim 128) and writes the chosen configuration and the sweep table
 * to bench/tune.md:
 *   A. SSD-backed prompts (fetch = SSD reads): index granularity, then micro-batch;
 *   B. DRAM with a hot tier: index granularity, hot-tier windows (grown until the step stops getting
 *      faster), then micro-batch.
 * Then tinybench times one decode step (every layer, the whole batch) of the default configuration
 * (microBatch 1, tokensPerCluster 16, windows x1) against the calibrated one, in the same run, and
 * reports the ratio.
 *
 * Run: npm run build:ts && node dist/bench/tune.js [--context 8192] [--batch 4] [--budget 512]
 *      [--steps 6] [--time 3000] [--out bench/tune.md]
 */
import { cpus, loadavg, tmpdir } from 'node:os';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Bench } from 'tinybench';
import { calibrate, type CalibrationResult, type CalibrationTrial } from '../src/runtime/calibrate.js';
import { openRuntime, type Runtime, type RuntimeOptions } from '../src/runtime/runtime.js';
import { uniform } from './bench-util.js';

const arg = (name: string, dflt: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1]! : dflt;
};
const CONTEXT = Number(arg('context', '8192'));
const BATCH = Number(arg('batch', '4'));
const BUDGET = Number(arg('budget', '512'));
const STEPS = Number(arg('steps', '6'));
const TIME = Number(arg('time', '3000'));
const OUT = arg('out', 'bench/tune.md');
const shape = { layers: 1, qHeads: 32, kvHeads: 8, headDim: 128 };
const ROW = shape.kvHeads * shape.headDim;
const root = mkdtempSync(join(arg('dir', tmpdir()), 'kvd-tune-'));
const maxTokens = CONTEXT + 4096;
const common: RuntimeOptions = { shape, budget: BUDGET, maxSequences: BATCH, maxTokens };
const deployments: { name: string; options: RuntimeOptions }[] = [
  { name: 'A. SSD-backed (page cache)', options: { ...common, dramBudget: 2 ** 30, ssd: { dir: join(root, 'a') } } },
  { name: 'B. DRAM + hot tier', options: { ...common, hotTier: { windows: 1, maxBytes: 2 ** 31 } } },
];

/** A pipelined runtime with `batch` prefilled sequences, and a function running one decode step. */
async function prepared(options: RuntimeOptions): Promise<{ rt: Runtime; step: () => Promise<void> }> {
  const rt = await openRuntime({ ...options, mode: 'pipelined' });
  const seqs = Array.from({ length: BATCH }, () => rt.createSequence());
  for (const [i, s] of seqs.entries()) {
    const t = { dtype: 'f32' as const, tokens: CONTEXT, heads: shape.kvHeads, dim: shape.headDim };
    await rt.prefill(s, 0, { ...t, data: uniform(CONTEXT * ROW, 11 + i) }, { ...t, data: uniform(CONTEXT * ROW, 51 + i) });
  }
  // correlated consecutive queries, as in calibrate()
  const base = seqs.map((_, i) => uniform(shape.qHeads * shape.headDim, 777 + i));
  const fresh = (i: number) => uniform(shape.qHeads * shape.headDim, 1000 + n * 7 + i);
  const mix = (a: Float32Array, b: Float32Array) => a.map((x, j) => 0.7 * x + 0.3 * b[j]!);
  let n = 0;
  const step = async () => {
    n++;
    await rt.attend(
      0,
      seqs.map((seq, i) => ({ seq, q: mix(base[i]!, fresh(i)), kNew: uniform(ROW, 3 + n + i), vNew: uniform(ROW, 5 + n + i) })),
    );
  };
  return { rt, step };
}

const lines: string[] = [];
const log = (s = '') => {
  console.log(s);
  lines.push(s);
};
log('# Calibration sweep (`bench/tune.ts`)');
log();
log('```');
log(`npm run build:ts && node dist/bench/tune.js --context ${CONTEXT} --batch ${BATCH} --budget ${BUDGET} --steps ${STEPS} --time ${TIME}`);
log('```');
log();
log(
  `Shape: 1 layer, GQA ${shape.qHeads}/${shape.kvHeads}, head dim ${shape.headDim}; context ${CONTEXT}, batch ${BATCH}, budget ${BUDGET}; ` +
    `${cpus().length} vCPUs, load avg ${loadavg()[0]!.toFixed(1)} at start, ${new Date().toISOString().slice(0, 16)} UTC. Trials run pipelined, ${STEPS} measured steps after one warm-up; trial figures are medians over those steps.`,
);
log();
log(
  'How to read: the index stage keeps the finest granularity (most centroids, best selection) whose selection time fits beside ' +
    'fetch + compute, so the calibrated step may be slower than the default when it buys finer selection; the window and ' +
    'micro-batch stages pick the fastest step. Differences below the noise floor printed per deployment are not significant.',
);
for (const d of deployments) {
  const t0 = performance.now();
  const r: CalibrationResult = await calibrate(d.options, openRuntime, { contextTokens: CONTEXT, batch: BATCH, steps: STEPS, microBatches: [1, 2, 4], tokensPerCluster: [8, 16, 32], maxWindow: 4 });
  log();
  log(`## ${d.name}`);
  log();
  log(
    `**Chosen:** microBatch ${r.microBatch}, tokensPerCluster ${r.tokensPerCluster}${r.window !== undefined ? `, hot-tier windows x${r.window}` : ''} ` +
      `(calibration took ${(r.elapsedMs / 1000).toFixed(1)} s).`,
  );
  log();
  log('| stage | microBatch | tokens/cluster | window | ms per layer step | selection | fetch | compute | hit rate | entries/s |');
  log('|---|---|---|---|---|---|---|---|---|---|');
  for (const t of r.trials)
    log(
      `| ${t.stage} | ${t.microBatch} | ${t.tokensPerCluster ?? '-'} | ${t.window ?? '-'} | ${t.stepMs.toFixed(2)} | ${t.selectionMs.toFixed(2)} | ${t.fetchMs.toFixed(2)} | ${t.computeMs.toFixed(2)} | ${t.hitRate.toFixed(2)} | ${t.throughput.toFixed(1)} |`,
    );
  // Noise floor: a configuration the sweep measured twice (e.g. the index winner re-run as the
  // first micro-batch candidate) shows how far two trials of the same thing differ right now.
  const key = (t: CalibrationTrial) => `${t.microBatch}/${t.tokensPerCluster}/${t.window}`;
  const twice = r.trials.find((t, i) => r.trials.findIndex((u) => key(u) === key(t)) < i);
  if (twice) {
    const first = r.trials.find((u) => key(u) === key(twice))!;
    log();
    log(
      `Noise floor: the same configuration (microBatch ${twice.microBatch}, tokensPerCluster ${twice.tokensPerCluster}${twice.window !== undefined ? `, windows x${twice.window}` : ''}) ` +
        `measured twice: ${first.stepMs.toFixed(2)} ms (${first.stage}) and ${twice.stepMs.toFixed(2)} ms (${twice.stage}), a factor ${(Math.max(first.stepMs, twice.stepMs) / Math.min(first.stepMs, twice.stepMs)).toFixed(2)}.`,
    );
  }
  // Default vs calibrated, timed by tinybench in the same run.
  const tuned: RuntimeOptions = {
    ...d.options,
    microBatch: r.microBatch,
    policyOptions: { tokensPerCluster: r.tokensPerCluster },
    ...(d.options.hotTier && r.window !== undefined ? { hotTier: { ...d.options.hotTier, windows: r.window } } : {}),
  };
  const dflt: RuntimeOptions = { ...d.options, microBatch: 1, policyOptions: { tokensPerCluster: 16 } };
  const ssdDir = (o: RuntimeOptions, sub: string): RuntimeOptions => (o.ssd ? { ...o, ssd: { ...o.ssd, dir: join(root, sub) } } : o);
  const a = await prepared(ssdDir(dflt, 'default'));
  const b = await prepared(ssdDir(tuned, 'tuned'));
  const bench = new Bench({ time: TIME, warmupTime: 200 });
  bench.add('default', a.step).add('calibrated', b.step);
  await bench.run();
  const mean = (name: string) => (bench.tasks.find((t) => t.name === name)!.result as { period: number }).period;
  const [md, mc] = [mean('default'), mean('calibrated')];
  log();
  log(
    `tinybench, one decode step of the batch: default (microBatch 1, tokensPerCluster 16${d.options.hotTier ? ', windows x1' : ''}) ${md.toFixed(2)} ms, ` +
      `calibrated ${mc.toFixed(2)} ms: **${(md / mc).toFixed(2)}x** throughput (load avg ${loadavg()[0]!.toFixed(1)}; ${((performance.now() - t0) / 1000).toFixed(0)} s).`,
  );
  await a.rt.close();
  await b.rt.close();
}
rmSync(root, { recursive: true, force: true });
writeFileSync(OUT, lines.join('\n') + '\n');
console.error(`wrote ${OUT}`);
