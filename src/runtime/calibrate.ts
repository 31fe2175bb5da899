/**
 * Pre-run calibration of the pipeline (kvdrive paper §6.2): a short decode on synthetic KV of the
 * runtime's shape picks, in this order,
 *   1. the index granularity (kvdrive policy: tokensPerCluster, i.e. centroids = tokens / it): the
 *      most centroids (best selection granularity) whose selection time per step does not exceed
 *      the rest of the step (fetch + compute), so selection does not become the pipeline bottleneck;
 *   2. the hot-tier size (with a hotTier): windows grown x1, x2, ... while the step gets faster; it
 *      stops at the first size where the extra hit/miss evaluation costs more than the transfers it
 *      saves (the equilibrium of the paper), or at the byte cap;
 *   3. the micro-batch size: the candidate with the highest pipelined throughput.
 * Every trial opens a fresh runtime, prefills `batch` sequences of `contextTokens`, runs one warm-up
 * step and `steps` measured steps over every layer, and closes it. The whole table is returned so
 * callers (bench/tune.ts, `openRuntime({ calibrate })`) can show why a value was chosen.
 */
import { z } from 'zod';
import { KvdriveError, describe } from '../errors.js';
import type { AttendEntry, CalibrateOptions, RuntimeOptions, RuntimeStats } from './runtime-types.js';
import { uniform } from '../util/uniform.js';
import type { KvTensor } from '../types.js';

/** What a trial needs of a runtime: the subset of runtime.ts's Runtime it calls. */
export interface TrialRuntime {
  createSequence(): number;
  prefill(seq: number, layer: number, k: KvTensor, v: KvTensor): Promise<void>;
  attend(layer: number, batch: AttendEntry[]): Promise<Float32Array[]>;
  stats(): Promise<RuntimeStats>;
  close(): Promise<void>;
}

/** One trial of the sweep. */
export interface CalibrationTrial {
  stage: 'index' | 'hotTier' | 'microBatch';
  microBatch: number;
  tokensPerCluster?: number;
  window?: number;
  /**
   * Median wall time of one attend() (a layer step of the batch) over the measured steps, ms.
   * Medians, not means: one descheduling of a shared machine must not decide the sweep.
   */
  stepMs: number;
  /** Per layer step, medians in ms: selection, fetch (hot tier, DRAM tier, SSD, tail), compute. */
  selectionMs: number;
  fetchMs: number;
  computeMs: number;
  /** Hot-tier hit rate of the measured steps (0 without a tier). */
  hitRate: number;
  /** Batch entries per second at the median step time. */
  throughput: number;
}

/** The configuration picked and the trials behind it. */
export interface CalibrationResult {
  microBatch: number;
  /** kvdrive policy only. */
  tokensPerCluster?: number;
  /** With a hot tier: the window multiple chosen for every (layer, kv head). */
  window?: number;
  trials: CalibrationTrial[];
  /** Wall time of the calibration, ms. */
  elapsedMs: number;
}

const schema = z
  .object({
    contextTokens: z.number().int().min(16).max(1 << 22).optional(),
    batch: z.number().int().min(1).max(256).optional(),
    steps: z.number().int().min(1).max(1000).optional(),
    microBatches: z.array(z.number().int().min(1).max(256)).min(1).optional(),
    tokensPerCluster: z.array(z.number().int().min(1).max(1 << 20)).min(1).optional(),
    maxWindow: z.number().int().min(1).max(64).optional(),
    seed: z.number().int().min(0).optional(),
  })
  .strict();

/** Keys with cluster structure (16 directions plus noise) so selection work is realistic. */
function structuredKeys(tokens: number, row: number, seed: number): Float32Array {
  const k = uniform(tokens * row, seed);
  const dirs = uniform(16 * row, seed + 7);
  for (let t = 0; t < tokens; t++) {
    const d = (t * 2654435761) % 16;
    for (let i = 0; i < row; i++) k[t * row + i] = 0.3 * k[t * row + i]! + dirs[d * row + i]!;
  }
  return k;
}

/**
 * Runs the calibration for `base` (the runtime options to tune; its mode is forced to 'pipelined'
 * for the trials, its microBatch / hotTier.windows / policyOptions.tokensPerCluster are what is
 * swept). `open` opens each trial's runtime: openRuntime (runtime.ts), passed in by the caller so
 * that this module never imports runtime.ts (which imports it).
 */
export async function calibrate(base: RuntimeOptions, open: (options: RuntimeOptions) => Promise<TrialRuntime>, options: CalibrateOptions = {}): Promise<CalibrationResult> {
  const parsed = schema.safeParse(options);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const key = String(issue.path[0] ?? '');
    throw new KvdriveError('E_CONFIG', `calibrate options${key ? `.${key}` : ''}: expected ${issue.message}, got ${describe(key ? (options as Record<string, unknown>)[key] : options)}`);
  }
  const o = parsed.data;
  const t0 = performance.now();
  const batch = o.batch ?? 4;
  const steps = o.steps ?? 6;
  const context = o.contextTokens ?? 4096;
  const maxSeqs = base.maxSequences ?? 4;
  if (batch > maxSeqs) throw new KvdriveError('E_CONFIG', `calibrate options.batch: expected at most the runtime's maxSequences = ${maxSeqs}, got ${batch}`);
  const maxTokens = base.maxTokens ?? 4096;
  if (context + steps + 1 > maxTokens)
    throw new KvdriveError('E_CONFIG', `calibrate options.contextTokens: expected at most maxTokens - steps - 1 = ${maxTokens - steps - 1}, got ${context}`);
  const { layers, qHeads, kvHeads, headDim } = base.shape;
  const row = kvHeads * headDim;
  const seed = o.seed ?? 1;
  const prompts = Array.from({ length: batch * layers }, (_, i) => ({ k: structuredKeys(context, row, seed + 2 * i), v: uniform(context * row, seed + 2 * i + 1) }));

  const queryBase = Array.from({ length: batch * layers }, (_, i) => uniform(qHeads * headDim, seed + 777 + i));
  const mix = (a: Float32Array, b: Float32Array) => a.map((x, j) => 0.7 * x + 0.3 * b[j]!);

  async function trial(stage: CalibrationTrial['stage'], microBatch: number, tpc: number | undefined, window: number | undefined): Promise<CalibrationTrial> {
    const policyOptions = tpc === undefined ? base.policyOptions : { ...base.policyOptions, tokensPerCluster: tpc };
    const hotTier = base.hotTier && window !== undefined ? { ...base.hotTier, windows: window } : base.hotTier;
    const rt = await open({ ...base, mode: 'pipelined', microBatch, policyOptions, hotTier, maxSequences: maxSeqs, maxTokens });
    try {
      const seqs = Array.from({ length: batch }, () => rt.createSequence());
      for (const [i, s] of seqs.entries())
        for (let l = 0; l < layers; l++) {
          const p = prompts[i * layers + l]!;
          const t = { dtype: 'f32' as const, tokens: context, heads: kvHeads, dim: headDim };
          await rt.prefill(s, l, { ...t, data: p.k }, { ...t, data: p.v });
        }
      // Consecutive decode queries of a sequence are correlated (a fixed direction plus 30 % fresh
      // noise per step), which is what gives a hot tier its temporal reuse.
      const step = async (t: number) => {
        for (let l = 0; l < layers; l++)
          await rt.attend(
            l,
            seqs.map((s, i) => ({ seq: s, q: mix(queryBase[i * layers + l]!, uniform(qHeads * headDim, seed + 1000 * t + 10 * i + l)), kNew: uniform(row, seed + 3 + t + i), vNew: uniform(row, seed + 5 + t + i) })),
          );
      };
      await step(0); // warm-up: first-touch faults, tier fill
      const a = await rt.stats();
      for (let t = 1; t <= steps; t++) await step(t);
      const b = await rt.stats();
      return summarize(stage, microBatch, tpc, window, a, b, batch);
    } finally {
      await rt.close();
    }
  }

  const trials: CalibrationTrial[] = [];
  // 1. index granularity, at the runtime's own micro-batch and tier
  const mb0 = Math.min(base.microBatch ?? 1, batch);
  let tpc: number | undefined;
  if ((base.policy ?? 'kvdrive') === 'kvdrive') {
    const cands = [...(o.tokensPerCluster ?? [8, 16, 32])].sort((x, y) => x - y); // most centroids first
    for (const c of cands) {
      const r = await trial('index', mb0, c, undefined);
      trials.push(r);
      // accept the first (finest) candidate whose selection fits beside fetch + compute
      if (tpc === undefined && r.selectionMs <= r.fetchMs + r.computeMs) tpc = c;
    }
    if (tpc === undefined) tpc = cands[cands.length - 1]!; // none balances: the cheapest selection
  }
  // 2. hot-tier size: grow while the step gets faster
  let window: number | undefined;
  if (base.hotTier) {
    let best: CalibrationTrial | undefined;
    for (let w = 1; w <= (o.maxWindow ?? 4); w++) {
      let r: CalibrationTrial;
      try {
        r = await trial('hotTier', mb0, tpc, w);
      } catch (e) {
        if (e instanceof KvdriveError && e.code === 'E_BUDGET') break; // byte cap reached
        throw e;
      }
      trials.push(r);
      if (best && r.stepMs >= best.stepMs) break; // evaluation now costs more than it saves
      best = r;
      window = w;
    }
    if (window === undefined) throw new KvdriveError('E_BUDGET', 'calibrate: expected hotTier.maxBytes to hold at least window x1, got too few bytes');
  }
  // 3. micro-batch size: best pipelined throughput
  const mbs = [...new Set((o.microBatches ?? [1, 2, 4]).map((m) => Math.min(m, batch)))];
  let bestMb: CalibrationTrial | undefined;
  for (const m of mbs) {
    const r = await trial('microBatch', m, tpc, window);
    trials.push(r);
    if (!bestMb || r.throughput > bestMb.throughput) bestMb = r;
  }
  return { microBatch: bestMb!.microBatch, tokensPerCluster: tpc, window, trials, elapsedMs: performance.now() - t0 };
}

function summarize(
  stage: CalibrationTrial['stage'],
  microBatch: number,
  tokensPerCluster: number | undefined,
  window: number | undefined,
  a: RuntimeStats,
  b: RuntimeStats,
  batch: number,
): CalibrationTrial {
  const n = Math.max(1, b.attendCalls - a.attendCalls);
  const last = b.recentSteps.slice(-Math.min(n, b.recentSteps.length));
  const median = (f: (s: (typeof last)[number]) => number) => {
    const x = last.map(f).sort((p, q) => p - q);
    return x.length % 2 ? x[(x.length - 1) / 2]! : (x[x.length / 2 - 1]! + x[x.length / 2]!) / 2;
  };
  const hits = b.hits - a.hits;
  const misses = b.misses - a.misses;
  const stepMs = median((s) => s.wallMs);
  return {
    stage,
    microBatch,
    ...(tokensPerCluster !== undefined ? { tokensPerCluster } : {}),
    ...(window !== undefined ? { window } : {}),
    stepMs,
    selectionMs: median((s) => s.selectionMs),
    fetchMs: median((s) => s.fetchMs),
    computeMs: median((s) => s.computeMs),
    hitRate: hits + misses > 0 ? hits / (hits + misses) : 0,
    throughput: (batch * 1000) / stepMs,
  };
}
