/**
 * Replays a trace's decode steps through a selection policy and compares every step with dense
 * attention: the engine behind `kvdrive eval` and `kvdrive demo`.
 *
 * Per layer: the policy indexes the prompt keys (`build`), then for decode step s the context is
 * the prompt plus new tokens 0..s (tokens = T + s + 1); the policy extends its index, selects for
 * q_s, sparse attention runs over the selection, and dense attention + dense probabilities give
 * the reference, the recall of dense mass, the oracle's recall at the same budget and the error.
 */
import type { KvTensor } from '../types.js';
import type { PolicyName, Selection } from '../index/selection.js';
import { createPolicy } from '../index/policy.js';
import { offloadedPolicyOptions, type PolicyOptions } from '../index/options.js';
import { fail } from '../errors.js';
import { layerKvWithNew, type TraceMeta, type TraceReader } from '../trace/trace.js';
import { NEEDLES_TENSOR } from '../trace/synthetic.js';
import { attendDenseAsync, attendSparse, attentionWeights } from '../attention/kernels.js';
import { attendedMask, massRecall, MetricsScratch, relativeError, StepOracle } from './metrics.js';

/** One layer of a trace, with the prompt and the new tokens in one KV tensor (prompt first). */
export interface ReplayLayer {
  layer: number;
  promptTokens: number;
  decodeSteps: number;
  qHeads: number;
  /** promptTokens + decodeSteps tokens. */
  k: KvTensor;
  v: KvTensor;
  /** decodeSteps × qHeads × headDim, f32. */
  q: Float32Array;
}

/** A planted needle: the retrieval head must attend `token` during steps [firstStep, lastStep]. */
export interface Needle {
  layer: number;
  kvHead: number;
  token: number;
  firstStep: number;
  lastStep: number;
}

export interface StepResult {
  recall: number;
  oracleRecall: number;
  relError: number;
  selectMs: number;
  attendMs: number;
  /** Bytes of K/V rows read by sparse attention plus index bytes scored by selection. */
  sparseBytes: number;
}

export interface LayerResult {
  layer: number;
  steps: StepResult[];
  buildMs: number;
  indexBytes: number;
  needlesFound: number;
  needlesTotal: number;
}

/** Dense reference per step, shared by every policy replayed on the same layer. */
export interface DenseStep {
  ms: number;
  bytes: number;
}

export interface ReplayOptions {
  policies: PolicyName[];
  budget: number;
  policyOptions?: Partial<PolicyOptions>;
  needles?: Needle[];
  /**
   * Threads (of the addon's pool) for dense attention (the reference), and for every policy's
   * selection and sparse attention, so both sides of the comparison use the same cores (default 1).
   */
  denseThreads?: number;
  /** Called after each step (progress). */
  onStep?: (layer: number, step: number) => void;
  /**
   * Select as the offloaded runtime does (openRuntime with dramBudget): from the index alone, without
   * the layer's full keys, which the memory model never holds. Default false: kvdrive re-ranks with
   * the keys read in place.
   */
  offloaded?: boolean;
  /**
   * Selections made elsewhere (e.g. by the runtime, `kvdrive demo`), scored against the same dense
   * reference as the policies: per (layer, step) what was attended and its output.
   */
  attended?: AttendedSource[];
}

/** What something other than a policy object attended at one (layer, step); see ReplayOptions.attended. */
export interface AttendedStep {
  selection: Selection;
  out: Float32Array;
  /** Index bytes scored by its selection. */
  bytesScored: number;
  selectMs: number;
  attendMs: number;
}

export interface AttendedSource {
  name: string;
  /** Called with each layer before it is replayed (e.g. to prefill it); `step` is asked after. */
  prepare?: (layer: ReplayLayer) => Promise<void>;
  /**
   * The layer's decode step `step`, asked once per step in step order, among the policies' own
   * steps (the rows take turns going first): a source that decodes here (rather than in `prepare`)
   * runs each step in the same conditions as the policies (after that step's dense pass, which
   * leaves the caches cold, as a layer's step finds them between the other layers' steps of a real
   * decode).
   */
  step: (layer: number, step: number) => AttendedStep | Promise<AttendedStep>;
}

function mean(xs: number[]): number {
  return xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length;
}

/** A view of the first `tokens` tokens of a token-major KV tensor, without copying. */
export function prefixView(kv: KvTensor, tokens: number): KvTensor {
  const row = kv.heads * kv.dim;
  return { ...kv, tokens, data: kv.data.subarray(0, tokens * row) };
}

/** Bytes per stored element. */
export function dtypeBytes(kv: KvTensor): number {
  return kv.dtype === 'f32' ? 4 : 2;
}

/**
 * Replays one layer for every policy in `opts.policies`; dense attention and the dense
 * probabilities are computed once per step and shared.
 */
export async function replayLayer(
  layer: ReplayLayer,
  opts: ReplayOptions,
): Promise<{ dense: DenseStep[]; byPolicy: Map<PolicyName, LayerResult>; attended: LayerResult[] }> {
  const { k, v, promptTokens: T, decodeSteps: S, qHeads } = layer;
  const kvHeads = k.heads;
  const dim = k.dim;
  const rowBytes = dim * dtypeBytes(k);
  const needles = (opts.needles ?? []).filter((n) => n.layer === layer.layer);

  for (const src of opts.attended ?? []) await src.prepare?.(layer);
  const runs = [];
  for (const name of opts.policies) {
    const given = { threads: opts.denseThreads ?? 1, ...opts.policyOptions, qHeads, kvHeads, headDim: dim };
    const policy = createPolicy(name, opts.offloaded ? offloadedPolicyOptions(name, given) : given);
    const t0 = performance.now();
    await policy.build(prefixView(k, T), T);
    const result: LayerResult = {
      layer: layer.layer, steps: [], buildMs: performance.now() - t0, indexBytes: policy.indexBytes(),
      needlesFound: 0, needlesTotal: 0,
    };
    runs.push({ name, policy, result });
  }

  const attendedRuns = (opts.attended ?? []).map(
    (): LayerResult => ({ layer: layer.layer, steps: [], buildMs: 0, indexBytes: 0, needlesFound: 0, needlesTotal: 0 }),
  );
  // The metrics' buffers, reused across rows and steps: scoring allocates nothing per step (see
  // the step loop below).
  const scratch = new MetricsScratch();
  const weightsBuf = new Float32Array(qHeads * (T + S));
  /** One row's step as it ran, scored once every row of the step has run. */
  interface RowStep {
    result: LayerResult;
    selection: Selection;
    out: Float32Array;
    bytesScored: number;
    selectMs: number;
    attendMs: number;
  }
  /** Scores one row's step against the dense reference and the step's oracle. */
  const score = (s: number, tokens: number, r: RowStep, weights: Float32Array, ref: Float32Array, oracle: StepOracle) => {
    const sel = r.selection;
    const mask = attendedMask(sel, kvHeads, scratch);
    let attended = 0;
    for (let i = 0; i < mask.length; i++) attended += mask[i]!;
    for (const n of needles) {
      if (s < n.firstStep || s > n.lastStep) continue;
      r.result.needlesTotal++;
      if (mask[n.kvHead * tokens + n.token]) r.result.needlesFound++;
    }
    r.result.steps.push({
      recall: massRecall(weights, mask, qHeads, kvHeads, tokens),
      oracleRecall: oracle.recall(opts.budget, sel.sinkEnd, sel.tailStart),
      relError: relativeError(r.out, ref),
      sparseBytes: 2 * attended * rowBytes + r.bytesScored,
      selectMs: r.selectMs,
      attendMs: r.attendMs,
    });
  };

  const dense: DenseStep[] = [];
  for (let s = 0; s < S; s++) {
    const tokens = T + s + 1;
    const kView = prefixView(k, tokens);
    const vView = prefixView(v, tokens);
    const q = layer.q.subarray(s * qHeads * dim, (s + 1) * qHeads * dim);

    const td = performance.now();
    const ref = await attendDenseAsync({ q, qHeads, k: kView, v: vView, threads: opts.denseThreads });
    dense.push({ ms: performance.now() - td, bytes: 2 * tokens * kvHeads * rowBytes });

    // Every row of this step: each policy (extend, select, attend) and each attended source, timed
    // back to back after the dense pass. Scoring waits until every row has run: the dense
    // probabilities and the masks are eval work, not a decode's, and neither they nor their garbage
    // belong between two timed rows (at 128K, fresh probabilities and masks were ~50 MiB per step,
    // and the runtime rows' attend(), which awaits, paid for collecting it: bench/RESULTS.md).
    const ran: RowStep[] = [];
    const policyRows: (() => Promise<void>)[] = runs.map((run) => async () => {
      const ts = performance.now();
      run.policy.extend(kView, tokens);
      // The keys let kvdrive re-rank its best candidates exactly (the others ignore them).
      const sel: Selection = run.policy.select(q, opts.budget, opts.offloaded ? undefined : { keys: kView });
      const selectMs = performance.now() - ts;
      // The next step starts from this selection, as a runtime step does (reuseCandidateFactor).
      run.policy.setPrior(sel);
      const ta = performance.now();
      const sparse = attendSparse({ q, qHeads, k: kView, v: vView, selection: sel, threads: opts.denseThreads });
      const attendMs = performance.now() - ta;
      ran.push({ result: run.result, selection: sel, out: sparse.out, bytesScored: run.policy.lastSelectStats().bytesScored, selectMs, attendMs });
    });
    const attendedRows = (opts.attended ?? []).map((src, i) => async () => {
      const a = await src.step(layer.layer, s);
      ran.push({ result: attendedRuns[i]!, selection: a.selection, out: a.out, bytesScored: a.bytesScored, selectMs: a.selectMs, attendMs: a.attendMs });
    });
    // Attended sources and policies alternate: two sources running the same code back to back (the
    // demo's two runtime modes) made the second find that code warm (see alternate).
    const rows = alternate(attendedRows, policyRows);
    // The rows take turns going first (turnOrder): the first after the dense pass finds the caches
    // and cores as that left them (in the demo it measured ~1 ms slower in its fetch stage), and no
    // row should always be it. Each row still sees its own steps in order.
    for (const r of turnOrder(rows.length, s)) await rows[r]!();

    const weights = attentionWeights({ q, qHeads, k: kView, into: weightsBuf.subarray(0, qHeads * tokens) });
    const oracle = new StepOracle(weights, qHeads, kvHeads, tokens, scratch);
    for (const r of ran) score(s, tokens, r, weights, ref.out, oracle);
    opts.onStep?.(layer.layer, s);
  }
  return { dense, byPolicy: new Map(runs.map((r) => [r.name, r.result])), attended: attendedRuns };
}

/**
 * a[0], b[0], a[1], b[1], ... then the rest of the longer list: the order timed rows run in when
 * a's rows share code with each other (kvdrive's runtime modes, or its keyed and keyless selects).
 * Run back to back, the second of two such rows found the code's caches and branch predictors warm
 * and measured 0.5-1 ms per layer-step faster than the first, whichever it was (bench/RESULTS.md,
 * "The demo's pipelined row was timed warm").
 */
export function alternate<T>(a: readonly T[], b: readonly T[]): T[] {
  const out: T[] = [];
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    if (i < a.length) out.push(a[i]!);
    if (i < b.length) out.push(b[i]!);
  }
  return out;
}

/**
 * The order n timed rows run in at step s: rotated to start at row s mod n, and reversed in every
 * other round of n steps. Rotation alone gives each row the same predecessor three steps in four
 * (its left neighbour); reversing alternate rounds gives it its right neighbour as often, so two rows
 * with the same neighbours (alternate's a-rows between the same b-rows) run after the same rows
 * equally often.
 */
export function turnOrder(n: number, s: number): number[] {
  const order = Array.from({ length: n }, (_, r) => (s + r) % n);
  return Math.floor(s / n) % 2 === 1 ? order.reverse() : order;
}

/**
 * Whether decode step `s` of a layer of `steps` steps counts in a time mean: every step after the
 * layer's first (with one step, that one). The first pays one-off costs a long decode does not
 * repeat, and pays them unevenly between rows: a runtime's first select has no previous selection
 * to start from (PolicyOptions.reuseCandidateFactor), the row that runs first after the layer's
 * generation and prefill meets their garbage (collected there), and every policy's scratch grows to
 * the context there. Recall, error and needles count every step.
 * The demo's table, its Pareto sweep and `kvdrive eval` all time by this rule.
 */
export function isTimedStep(s: number, steps: number): boolean {
  return s > 0 || steps === 1;
}

/** The steps of one layer (in step order) that {@link isTimedStep} counts. */
function timed<T>(steps: readonly T[]): readonly T[] {
  return steps.filter((_, s) => isTimedStep(s, steps.length));
}

/** Aggregates over layers and steps (means per step; times per {@link isTimedStep}). */
export function summarize<P extends string = PolicyName>(policy: P, budget: number, layers: LayerResult[]) {
  const all = layers.flatMap((l) => l.steps);
  const allTimed = layers.flatMap((l) => timed(l.steps));
  const nf = layers.reduce((a, l) => a + l.needlesFound, 0);
  const nt = layers.reduce((a, l) => a + l.needlesTotal, 0);
  return {
    policy,
    budget,
    steps: all.length,
    recall: mean(all.map((s) => s.recall)),
    oracleRecall: mean(all.map((s) => s.oracleRecall)),
    recallVsOracle: mean(all.map((s) => (s.oracleRecall > 0 ? s.recall / s.oracleRecall : 1))),
    relError: mean(all.map((s) => s.relError)),
    selectMs: mean(allTimed.map((s) => s.selectMs)),
    attendMs: mean(allTimed.map((s) => s.attendMs)),
    sparseBytes: mean(all.map((s) => s.sparseBytes)),
    buildMs: layers.reduce((a, l) => a + l.buildMs, 0),
    indexBytes: layers.reduce((a, l) => a + l.indexBytes, 0),
    needlesFound: nf,
    needlesTotal: nt,
    layers: layers.map((l) => ({
      layer: l.layer,
      recall: mean(l.steps.map((s) => s.recall)),
      oracleRecall: mean(l.steps.map((s) => s.oracleRecall)),
      relError: mean(l.steps.map((s) => s.relError)),
      selectMs: mean(timed(l.steps).map((s) => s.selectMs)),
      needlesFound: l.needlesFound,
      needlesTotal: l.needlesTotal,
    })),
  };
}
export type ReplaySummary = ReturnType<typeof summarize<PolicyName>>;

/** Reads the planted needles of a trace (rows [layer, kvHead, token, firstStep, lastStep]), if any. */
export async function traceNeedles(reader: TraceReader): Promise<Needle[]> {
  const t = await reader.extra(NEEDLES_TENSOR);
  if (!t) return [];
  if (!(t.data instanceof Int32Array) || t.shape.length !== 2 || t.shape[1] !== 5)
    fail('E_TRACE_FORMAT', `trace tensor ${NEEDLES_TENSOR}`, 'an I32 tensor of shape [n, 5]', `shape [${t.shape.join(', ')}]`);
  const d = t.data;
  const out: Needle[] = [];
  for (let i = 0; i < t.shape[0]!; i++)
    out.push({ layer: d[i * 5]!, kvHead: d[i * 5 + 1]!, token: d[i * 5 + 2]!, firstStep: d[i * 5 + 3]!, lastStep: d[i * 5 + 4]! });
  return out;
}

export interface TraceEvaluation {
  meta: TraceMeta;
  dtype: string;
  /** Dense attention per layer and step, averaged. */
  dense: { ms: number; bytes: number };
  policies: ReplaySummary[];
  /** One summary per ReplayOptions.attended source, in order. */
  attended: ReturnType<typeof summarize<string>>[];
}

/** Layer `l` of a trace as {@link replayLayer} takes it: the prompt's and the new tokens' K / V, the decode queries. */
export async function loadReplayLayer(reader: TraceReader, l: number): Promise<ReplayLayer> {
  const { meta } = reader;
  const layer = await reader.layer(l);
  return { layer: l, promptTokens: meta.promptTokens, decodeSteps: meta.decodeSteps, qHeads: meta.qHeads, ...layerKvWithNew(layer), q: layer.q };
}

/**
 * Evaluates policies on every layer of a trace, one layer in memory at a time.
 * `onLayer` is called before each layer loads (progress reporting).
 */
export async function evaluateTrace(
  reader: TraceReader,
  opts: ReplayOptions & { layers?: number[]; onPhase?: (what: string) => void },
): Promise<TraceEvaluation> {
  const meta = reader.meta;
  const needles = opts.needles ?? (await traceNeedles(reader));
  const layers = opts.layers ?? Array.from({ length: meta.layers }, (_, l) => l);
  const per = new Map<PolicyName, LayerResult[]>(opts.policies.map((p) => [p, []]));
  const dense: DenseStep[] = [];
  const attended: LayerResult[][] = (opts.attended ?? []).map(() => []);
  for (const l of layers) {
    opts.onPhase?.(`layer ${l}: loading`);
    const layer = await loadReplayLayer(reader, l);
    opts.onPhase?.(`layer ${l}: indexing`);
    const r = await replayLayer(layer, { ...opts, needles });
    dense.push(...r.dense);
    for (const [name, res] of r.byPolicy) per.get(name)!.push(res);
    r.attended.forEach((res, i) => attended[i]!.push(res));
  }
  return {
    meta,
    dtype: reader.dtype,
    dense: { ms: mean(dense.map((d) => d.ms)), bytes: mean(dense.map((d) => d.bytes)) },
    policies: opts.policies.map((p) => summarize(p, opts.budget, per.get(p)!)),
    attended: (opts.attended ?? []).map((src, i) => summarize(src.name, opts.budget, attended[i]!)),
  };
}
