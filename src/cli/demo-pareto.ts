/**
 * `kvdrive demo --pareto`: cost against accuracy for every policy at budgets 512, 1024, 2048 and
 * 4096 on the demo workload. Per layer, each policy indexes the prompt once; every decode step then
 * extends each index, and for every budget selects and attends (both with the same threads, the
 * addon's pool), beside dense attention and the dense probabilities that give the recall of dense
 * mass and the token oracle's recall at that budget (the policies taking turns going first, and
 * 64 MiB read before every select, so that each finds its index in DRAM as a real decode does).
 * One row per (policy, budget): mean time per
 * layer-step (extend + select + sparse attention; the steps after each layer's first, for every
 * policy alike) and recall / oracle (every step), so a reader sees which policy
 * buys which recall at which cost. The same function backs bench/pareto.ts.
 */
import { generateSyntheticTrace } from '../trace/synthetic.js';
import { layerKvWithNew } from '../trace/trace.js';
import { alternate, isTimedStep, prefixView, traceNeedles, turnOrder } from '../eval/replay.js';
import { attendedMask, massRecall, MetricsScratch, StepOracle } from '../eval/metrics.js';
import { attendDense, attendSparse, attentionWeights, memoryRead } from '../attention/kernels.js';
import { createPolicy, type SelectionPolicy } from '../index/policy.js';
import { offloadedPolicyOptions } from '../index/options.js';
import type { PolicyName, Selection } from '../index/selection.js';
import { ms, table } from '../eval/format.js';
import { cpuFeatures } from '../native.js';
import { ProgressBar } from './progress.js';

/**
 * Bytes read before every timed (policy, budget) select: twice this VM's 32 MiB L3, so each select
 * finds its index in DRAM, as a decode step of one layer finds it after the other layers' steps.
 * Without it the budgets after a policy's first read an index the previous select had just
 * brought into cache (kvdrive's ~15 MiB of centroids and sketch rows fit; quest's 64 MiB of page
 * bounds do not, so the warm reads favoured kvdrive).
 */
const FLUSH_BYTES = 64 * 2 ** 20;

/** The budgets of the table (tokens per kv head beside sinks and local window). */
export const PARETO_BUDGETS = [512, 1024, 2048, 4096] as const;

export interface ParetoOptions {
  context: number;
  layers: number;
  steps: number;
  dtype: 'f32' | 'f16' | 'bf16';
  seed: number;
  /** Threads of selection, sparse and dense attention. */
  threads: number;
  policy: PolicyName[];
  budgets?: readonly number[];
  /** Called after each (layer, step). */
  onStep?: (layer: number, step: number) => void;
}

/**
 * Label of the keyless kvdrive variant: select without the keys, re-ranking on the key sketch, with
 * the options the runtime's memory model uses (offloadedPolicyOptions).
 */
export const KEYLESS = 'kvdrive keyless (sketch)';

export interface ParetoRow {
  /** A policy name, or {@link KEYLESS}. */
  policy: string;
  budget: number;
  /** Mean per layer-step over the steps after each layer's first, milliseconds: extend + select, sparse attention, and their sum. */
  selectMs: number;
  attendMs: number;
  totalMs: number;
  /**
   * Process CPU time of the same work (all threads), milliseconds per layer-step: the work done,
   * which other processes on a loaded machine do not inflate the way they inflate wall time.
   */
  cpuMs: number;
  recall: number;
  oracleRecall: number;
  /** Mean over steps of recall / oracle recall. */
  recallVsOracle: number;
  needlesFound: number;
  needlesTotal: number;
}

export interface ParetoResult {
  context: number;
  layers: number;
  steps: number;
  seed: number;
  threads: number;
  denseMs: number;
  rows: ParetoRow[];
}

interface Acc {
  /** Steps timed (select, attend, cpu sum over these). */
  timed: number;
  cpu: number;
  select: number;
  attend: number;
  recall: number;
  oracle: number;
  ratio: number;
  n: number;
  found: number;
  total: number;
}

const BASELINES: readonly string[] = ['quest', 'shadowkv'];
const QHEADS = 32;
const KVHEADS = 8;
const HEAD_DIM = 128;

/** Runs the sweep (see the file comment). */
export async function runPareto(o: ParetoOptions): Promise<ParetoResult> {
  const budgets = o.budgets ?? PARETO_BUDGETS;
  const trace = generateSyntheticTrace({
    layers: o.layers, promptTokens: o.context, decodeSteps: o.steps, qHeads: QHEADS, kvHeads: KVHEADS, headDim: HEAD_DIM,
    dtype: o.dtype, seed: o.seed,
  });
  const needles = await traceNeedles(trace);
  // Every policy selects with the keys (kvdrive re-ranks on them); beside kvdrive, the same index
  // selecting without keys on its key sketch (the offloaded paths' contract).
  type Variant = { label: string; name: PolicyName; keyed: boolean };
  const variants: Variant[] = o.policy.flatMap((name): Variant[] =>
    name === 'kvdrive' ? [{ label: name, name, keyed: true }, { label: KEYLESS, name, keyed: false }] : [{ label: name, name, keyed: true }],
  );
  const acc = new Map<string, Acc>();
  const key = (p: string, b: number) => `${p}/${b}`;
  for (const { label } of variants)
    for (const b of budgets) acc.set(key(label, b), { timed: 0, cpu: 0, select: 0, attend: 0, recall: 0, oracle: 0, ratio: 0, n: 0, found: 0, total: 0 });
  let denseMs = 0;
  let denseN = 0;
  const T = o.context;
  const flush = new Uint8Array(FLUSH_BYTES).fill(1);
  // The metrics' buffers and the dense probabilities, reused: scoring between timed selects leaves
  // no garbage for a timed select's GC (replay.ts, the same for the demo's table).
  const scratch = new MetricsScratch();
  const weightsBuf = new Float32Array(QHEADS * (T + o.steps));
  for (let l = 0; l < o.layers; l++) {
    const layer = await trace.layer(l);
    const { k, v } = layerKvWithNew(layer);
    const built: { label: string; name: PolicyName; keyed: boolean; policy: SelectionPolicy }[] = [];
    const priors = new Map<string, Selection>();
    for (const { label, name, keyed } of variants) {
      // Keyless: the runtime's own configuration (offloadedPolicyOptions: its key sketch, chunk means
      // released), so this row times the select the runtime runs.
      const given = { qHeads: QHEADS, kvHeads: KVHEADS, headDim: HEAD_DIM, threads: o.threads };
      const policy = createPolicy(name, keyed ? given : offloadedPolicyOptions(name, given));
      await policy.build(prefixView(k, T), T);
      built.push({ label, name, keyed, policy });
    }
    // kvdrive's keyed and keyless rows (the same select code) never run back to back (alternate).
    const policies = alternate(built.filter((p) => p.name === 'kvdrive'), built.filter((p) => p.name !== 'kvdrive'));
    for (let s = 0; s < o.steps; s++) {
      const tokens = T + s + 1;
      const kv = prefixView(k, tokens);
      const vv = prefixView(v, tokens);
      const q = layer.q.subarray(s * QHEADS * HEAD_DIM, (s + 1) * QHEADS * HEAD_DIM);
      const td = performance.now();
      attendDense({ q, qHeads: QHEADS, k: kv, v: vv, threads: o.threads });
      denseMs += performance.now() - td;
      denseN++;
      const weights = attentionWeights({ q, qHeads: QHEADS, k: kv, into: weightsBuf.subarray(0, QHEADS * tokens) });
      // The oracle's recall per budget (the same for every policy): once per step.
      const oracle = new StepOracle(weights, QHEADS, KVHEADS, tokens, scratch);
      // The policies take turns going first (turnOrder), as the demo's rows do;
      // before each select 64 MiB are read (FLUSH_BYTES), so every select finds its data cold.
      for (const r of turnOrder(policies.length, s)) {
        const { label, keyed, policy } = policies[r]!;
        const ce = process.cpuUsage();
        const te = performance.now();
        policy.extend(kv, tokens);
        const extendMs = performance.now() - te;
        const cExtend = process.cpuUsage(ce);
        const extendCpu = (cExtend.user + cExtend.system) / 1000;
        for (const budget of budgets) {
          // Each budget continues its own chain of selections (reuseCandidateFactor): its previous
          // step's selection is this select's prior, as in a decode at that budget. Set outside the
          // timed select (a runtime sets it when the previous step commits).
          policy.setPrior(priors.get(key(label, budget)) ?? null);
          memoryRead(flush);
          const c0 = process.cpuUsage();
          const ts = performance.now();
          const sel = policy.select(q, budget, keyed ? { keys: kv } : undefined);
          const selectMs = performance.now() - ts + extendMs;
          priors.set(key(label, budget), sel);
          const ta = performance.now();
          attendSparse({ q, qHeads: QHEADS, k: kv, v: vv, selection: sel, threads: o.threads });
          const attendMs = performance.now() - ta;
          const c1 = process.cpuUsage(c0);
          const cpuMs = (c1.user + c1.system) / 1000 + extendCpu;
          const mask = attendedMask(sel, KVHEADS, scratch);
          const recall = massRecall(weights, mask, QHEADS, KVHEADS, tokens);
          const best = oracle.recall(budget, sel.sinkEnd, sel.tailStart);
          const a = acc.get(key(label, budget))!;
          // Time: the steps after each layer's first (isTimedStep), for every policy alike. Recall: every step.
          if (isTimedStep(s, o.steps)) {
            a.select += selectMs;
            a.cpu += cpuMs;
            a.attend += attendMs;
            a.timed++;
          }
          a.recall += recall;
          a.oracle += best;
          a.ratio += best > 0 ? recall / best : 1;
          a.n++;
          for (const nd of needles) {
            if (nd.layer !== l || s < nd.firstStep || s > nd.lastStep) continue;
            a.total++;
            if (mask[nd.kvHead * tokens + nd.token]) a.found++;
          }
        }
      }
      o.onStep?.(l, s);
    }
  }
  const rows: ParetoRow[] = [];
  for (const { label: p } of variants)
    for (const b of budgets) {
      const a = acc.get(key(p, b))!;
      rows.push({
        policy: p, budget: b, selectMs: a.select / a.timed, attendMs: a.attend / a.timed, totalMs: (a.select + a.attend) / a.timed, cpuMs: a.cpu / a.timed,
        recall: a.recall / a.n, oracleRecall: a.oracle / a.n, recallVsOracle: a.ratio / a.n, needlesFound: a.found, needlesTotal: a.total,
      });
    }
  return { context: o.context, layers: o.layers, steps: o.steps, seed: o.seed, threads: o.threads, denseMs: denseMs / denseN, rows };
}

/**
 * Per budget, whether `policy` is faster and whether it is more accurate (recall / oracle) than
 * every one of `others`.
 */
export function dominates(r: ParetoResult, policy: string, others: readonly string[]): { budget: number; faster: boolean; moreAccurate: boolean }[] {
  const budgets = [...new Set(r.rows.map((x) => x.budget))];
  return budgets.map((budget) => {
    const mine = r.rows.find((x) => x.policy === policy && x.budget === budget);
    const rest = r.rows.filter((x) => others.includes(x.policy) && x.budget === budget);
    return {
      budget,
      faster: !!mine && rest.every((x) => mine.totalMs < x.totalMs),
      moreAccurate: !!mine && rest.every((x) => mine.recallVsOracle > x.recallVsOracle),
    };
  });
}

/** The table printed by `kvdrive demo --pareto` (and written by bench/pareto.ts). */
export function renderPareto(r: ParetoResult): string {
  const head =
    `pareto: synthetic trace (seed ${r.seed}), ${r.layers} layers x ${r.steps} decode steps, context ${r.context} tokens, ` +
    `${QHEADS} query / ${KVHEADS} kv heads, head dim ${HEAD_DIM}; ${r.threads} thread(s) for selection and attention; SIMD ${cpuFeatures().active}`;
  const rows: (string | number)[][] = [['policy', 'budget', 'time/layer-step', 'select', 'attend', 'CPU time', 'recall', 'oracle', 'recall/oracle', 'needles']];
  for (const x of r.rows)
    rows.push([x.policy, x.budget, ms(x.totalMs), ms(x.selectMs), ms(x.attendMs), ms(x.cpuMs), x.recall.toFixed(4), x.oracleRecall.toFixed(4),
      x.recallVsOracle.toFixed(4), x.needlesTotal ? `${x.needlesFound}/${x.needlesTotal}` : '-']);
  const lines = [head, '', table(rows), '', `dense attention over the whole context: ${ms(r.denseMs)} per layer-step (${r.threads} thread(s)).`];
  const baselines = BASELINES.filter((b) => r.rows.some((x) => x.policy === b));
  for (const mine of ['kvdrive', KEYLESS])
    if (baselines.length > 0 && r.rows.some((x) => x.policy === mine))
      lines.push(`${mine} against ${baselines.join(' and ')}, per budget: ` +
        dominates(r, mine, baselines).map((x) => `${x.budget}: ${x.faster ? 'faster' : 'NOT faster'}, ${x.moreAccurate ? 'more accurate' : 'NOT more accurate'}`).join('; '));
  lines.push(`time: extend + select + sparse attention, mean wall time per layer-step over ${r.steps > 1 ? "the steps after each layer's first (that one pays each policy's one-off costs)" : 'the one step'}; CPU time: the same work in process CPU time (all threads);`,
    'recall / oracle: share of dense attention mass on the attended tokens over the same for the exact top-budget tokens, mean per step.');
  return lines.join('\n');
}

/** `kvdrive demo --pareto [--json]`: runs the sweep with a progress bar and prints it. */
export async function runParetoDemo(o: Omit<ParetoOptions, 'onStep'> & { json?: boolean }): Promise<void> {
  const bar = new ProgressBar(o.layers * o.steps, 'pareto');
  const r = await runPareto({ ...o, onStep: (l, s) => bar.tick(`layer ${l} step ${s}`) });
  bar.finish();
  process.stdout.write((o.json ? JSON.stringify({ ...r, kvdriveVsBaselines: dominates(r, 'kvdrive', BASELINES) }) : renderPareto(r)) + '\n');
}
