/**
 * The decode runtime a host embeds: sequences, prefill, and per-layer sparse attention for a batch
 * of sequences, over the memory model (src/runtime/): sinks and the open tail of every (sequence,
 * layer) in DRAM in the host's dtype, sealed segments in the DRAM tier (and on SSD when `ssd` is
 * given), a hot tier in front when `hotTier` is given. Every attend() entry runs the one decode
 * step of src/pipeline/step.ts (append → select → fetch → compute), sequentially on the calling
 * thread or pipelined (micro-batches of different sequences overlap: selection on a piscina stage
 * worker while I/O and attention of others run off the JS thread); both modes give bit-identical
 * outputs.
 *
 *   attend(layer, batch) ─ validate, narrow k/v to the host dtype ─▶ MemoryRuntime.attend ─▶ outputs
 */
import { z } from 'zod';
import { KvdriveError, describe, fail } from '../errors.js';
import { offloadedPolicyOptions, resolvePolicyOptions, type PolicyOptions } from '../index/options.js';
import type { KvTensor, ModelShape } from '../types.js';
import type { HotTierOptions } from '../cache/hot-tier.js';
import { ioEngineOptionsSchema } from '../storage/io-engine.js';
import { calibrate, type CalibrationResult } from './calibrate.js';
import { MemoryRuntime, toDtype, type MemoryEntry } from './memory-runtime.js';
import { selectEntry } from '../pipeline/select-stage.js';
import type { AttendEntry, RuntimeOptions, RuntimeStats, StepBreakdown, TracedOutput } from './runtime-types.js';

export type { AttendEntry, RuntimeOptions, RuntimeStats, StepBreakdown, TracedOutput } from './runtime-types.js';

const int = (min: number, max: number) => z.number().int().min(min).max(max);
const optionsSchema = z
  .object({
    shape: z
      .object({ layers: int(1, 4096), qHeads: int(1, 4096), kvHeads: int(1, 4096), headDim: int(1, 65536) })
      .strict()
      .refine((s) => s.qHeads % s.kvHeads === 0, { message: 'qHeads must be a multiple of kvHeads' }),
    budget: int(1, 1 << 30),
    policy: z.enum(['kvdrive', 'quest', 'shadowkv']).optional(),
    policyOptions: z.record(z.string(), z.unknown()).optional(),
    mode: z.enum(['sequential', 'pipelined']).optional(),
    microBatch: int(1, 256).optional(),
    maxSequences: int(1, 4096).optional(),
    maxTokens: int(1, 1 << 24).optional(),
    dramBudget: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER).optional(),
    dtype: z.enum(['f32', 'f16', 'bf16']).optional(),
    sealTokens: int(1, 1 << 24).optional(),
    hotTier: z.object({ windows: z.unknown(), maxBytes: z.number(), eviction: z.string().optional() }).strict().optional(),
    ssd: z
      .object({ dir: z.string().min(1), direct: z.boolean().optional(), io: ioEngineOptionsSchema.optional(), streamHeads: z.number().int().min(1).optional() })
      .strict()
      .optional(),
    calibrate: z.union([z.boolean(), z.object({}).passthrough()]).optional(),
  })
  .strict();

const EXPECTED: Record<string, string> = {
  shape: '{ layers, qHeads, kvHeads, headDim } positive integers with qHeads a multiple of kvHeads',
  budget: 'an integer >= 1',
  policy: "'kvdrive', 'quest' or 'shadowkv'",
  policyOptions: 'an options object',
  mode: "'sequential' or 'pipelined'",
  microBatch: 'an integer in [1, 256]',
  maxSequences: 'an integer in [1, 4096]',
  maxTokens: 'an integer in [1, 2^24]',
  dramBudget: 'a positive integer number of bytes, at most 2^53 - 1',
  dtype: "'f32', 'f16' or 'bf16'",
  sealTokens: 'an integer in [1, 2^24] (a multiple of the chunk size)',
  hotTier: '{ windows, maxBytes, eviction? }',
  ssd: '{ dir: a directory path, direct?: boolean, io?: IoEngineOptions, streamHeads?: kv heads per streamed select group }',
  calibrate: 'true, false or CalibrateOptions',
};

function checkVector(what: string, v: unknown, length: number): asserts v is Float32Array {
  if (!(v instanceof Float32Array)) fail('E_TYPE', what, `a Float32Array(${length})`, v);
  if (v.length !== length) fail('E_SHAPE', what, `${length} elements`, v.length);
  for (let i = 0; i < v.length; i++)
    if (!Number.isFinite(v[i]!)) throw new KvdriveError('E_NONFINITE', `${what}: expected finite values, got ${v[i]} at element ${i}`);
}

/** RuntimeOptions.maxSequences and .dtype when not given (openRuntime and hotTierOptionsOf alike). */
const DEFAULT_MAX_SEQUENCES = 4;
const DEFAULT_DTYPE = 'f32';

/** Opens a runtime; see {@link RuntimeOptions}. */
export async function openRuntime(options: RuntimeOptions): Promise<Runtime> {
  if (options === null || typeof options !== 'object') fail('E_CONFIG', 'openRuntime options', 'an object', options);
  const parsed = optionsSchema.safeParse(options);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    if (issue.code === 'unrecognized_keys' && issue.path.length === 0)
      throw new KvdriveError('E_CONFIG', `openRuntime options: expected only ${Object.keys(EXPECTED).join(', ')}, got unknown ${issue.keys.join(', ')}`);
    const key = String(issue.path[0]);
    throw new KvdriveError('E_CONFIG', `openRuntime options.${key}: expected ${EXPECTED[key] ?? 'a valid value'}, got ${describe((options as unknown as Record<string, unknown>)[key])}`);
  }
  if (options.ssd !== undefined && options.dramBudget === undefined)
    fail('E_CONFIG', 'openRuntime options.dramBudget', 'a DRAM budget in bytes with ssd (how much of the sealed KV the DRAM tier caches)', undefined);
  if (options.ssd?.streamHeads !== undefined && options.ssd.streamHeads > options.shape.kvHeads)
    fail('E_CONFIG', 'openRuntime options.ssd.streamHeads', `kv heads per streamed group in [1, ${options.shape.kvHeads}] (shape.kvHeads)`, options.ssd.streamHeads);
  if (options.calibrate) {
    const { calibrate: c, ...base } = options;
    const result = await calibrate(base, openRuntime, c === true ? {} : c);
    const tuned: RuntimeOptions = { ...base, microBatch: result.microBatch };
    if (result.tokensPerCluster !== undefined) tuned.policyOptions = { ...base.policyOptions, tokensPerCluster: result.tokensPerCluster };
    if (result.window !== undefined && base.hotTier) tuned.hotTier = { ...base.hotTier, windows: result.window };
    const rt = await openRuntime(tuned);
    rt.calibration = result;
    return rt;
  }
  const o = parsed.data;
  const shape: ModelShape = o.shape;
  const policy = o.policy ?? 'kvdrive';
  const policyOptions = (o.policyOptions ?? {}) as PolicyOptions;
  for (const k of ['qHeads', 'kvHeads', 'headDim'])
    if (k in policyOptions) fail('E_CONFIG', `openRuntime options.policyOptions.${k}`, 'no shape field (it comes from options.shape)', (policyOptions as Record<string, unknown>)[k]);
  const maxTokens = o.maxTokens ?? 4096;
  const maxSequences = o.maxSequences ?? DEFAULT_MAX_SEQUENCES;
  const mode = o.mode ?? 'sequential';
  const microBatch = o.microBatch ?? 1;
  const dtype = o.dtype ?? DEFAULT_DTYPE;
  // The memory model selects without the full keys (they are sealed away): kvdrive re-ranks on its
  // key sketch and selects single tokens (offloadedPolicyOptions, shared with eval --offloaded).
  const memPolicyOptions = offloadedPolicyOptions(policy, policyOptions);
  const memPolicyInput = { ...memPolicyOptions, qHeads: shape.qHeads, kvHeads: shape.kvHeads, headDim: shape.headDim };
  const resolved = resolvePolicyOptions(policy, memPolicyInput);
  const cs = resolved.chunkSize;
  // A selection holds at most `budget` tokens beside sinks and tail: floor(budget/c) whole chunks
  // plus up to two clipped at the sink and tail edges; never more chunks than the context has.
  const chunkSelChunks = Math.min(Math.floor(o.budget / cs) + 2, Math.ceil(maxTokens / cs));
  // A token-granular selection of `budget` tokens may touch that many chunks (one token each).
  const maxChunksPerHead = policy === 'kvdrive' && resolved.tokenGranular ? Math.min(o.budget, Math.ceil(maxTokens / cs)) : chunkSelChunks;
  const memory = await MemoryRuntime.open({
    shape,
    dtype,
    policy,
    policyOptions: resolved,
    policyInput: memPolicyInput,
    budget: o.budget,
    maxSequences,
    maxTokens,
    dramBudget: o.dramBudget,
    sealTokens: o.sealTokens ?? Math.ceil(1024 / cs) * cs,
    maxChunksPerHead,
    mode,
    microBatch,
    hotTier: hotTierOptionsOf(options, cs),
    ssd: o.ssd ? { dir: o.ssd.dir, direct: o.ssd.direct, io: o.ssd.io } : undefined,
    streamHeads: o.ssd?.streamHeads ?? shape.kvHeads,
  });
  return new Runtime(memory, shape, mode, microBatch, maxSequences, maxTokens);
}

/**
 * The hot tier a runtime with these (validated) options creates in front of its tiers, or undefined
 * without `hotTier`: its windows, cap and eviction as given, its geometry from the shape, dtype,
 * budget and sequences, and `chunkSize` (the memory model's resolved chunk size). Internal: tests
 * size budgets around the tier's bytes with the same options the runtime uses.
 */
export function hotTierOptionsOf(o: RuntimeOptions, chunkSize: number): HotTierOptions | undefined {
  if (!o.hotTier) return undefined;
  return {
    ...o.hotTier,
    layers: o.shape.layers,
    kvHeads: o.shape.kvHeads,
    headDim: o.shape.headDim,
    dtype: o.dtype ?? DEFAULT_DTYPE,
    chunkSize,
    budget: o.budget,
    sequences: o.maxSequences ?? DEFAULT_MAX_SEQUENCES,
  };
}

/** See {@link openRuntime}. Calls to attend/prefill/closeSequence run one at a time, in call order. */
export class Runtime {
  readonly shape: ModelShape;
  readonly mode: 'sequential' | 'pipelined';
  readonly microBatch: number;
  /** What `openRuntime({ calibrate })` chose and measured; undefined without calibration. */
  calibration: CalibrationResult | undefined;
  private readonly memory: MemoryRuntime;
  private readonly maxTokens: number;
  /** tokens[seq * layers + layer]: context length of that layer; -1 = layer not prefilled. */
  private readonly tokens: Int32Array;
  /** Per sequence handle: 0 free, 1 open. */
  private readonly open: Uint8Array;
  /** Serializes public operations (they mutate per-sequence token counts). */
  private queue: Promise<unknown> = Promise.resolve();
  private closed = false;
  private readonly counters = { attendCalls: 0, entries: 0, microBatches: 0, wallMs: 0, appendMs: 0, selectionMs: 0, computeMs: 0, fetchMs: 0 };
  private readonly recent: StepBreakdown[] = [];

  /** @internal use openRuntime. */
  constructor(memory: MemoryRuntime, shape: ModelShape, mode: 'sequential' | 'pipelined', microBatch: number, maxSequences: number, maxTokens: number) {
    this.memory = memory;
    this.shape = shape;
    this.mode = mode;
    this.microBatch = microBatch;
    this.maxTokens = maxTokens;
    this.tokens = new Int32Array(maxSequences * shape.layers).fill(-1);
    this.open = new Uint8Array(maxSequences);
  }

  private serial<T>(fn: () => Promise<T> | T): Promise<T> {
    const run = this.queue.then(() => {
      if (this.closed) throw new KvdriveError('E_CLOSED', 'runtime: expected an open runtime, got one that was closed');
      return fn();
    });
    this.queue = run.catch(() => undefined);
    return run;
  }

  private checkSeq(what: string, seq: unknown): asserts seq is number {
    if (typeof seq !== 'number' || !Number.isInteger(seq) || seq < 0 || seq >= this.open.length || this.open[seq] !== 1)
      fail('E_RANGE', `${what} seq`, 'a handle of an open sequence (from createSequence)', seq);
  }

  private checkLayer(what: string, layer: unknown): asserts layer is number {
    if (typeof layer !== 'number' || !Number.isInteger(layer) || layer < 0 || layer >= this.shape.layers)
      fail('E_RANGE', `${what} layer`, `an integer in [0, ${this.shape.layers})`, layer);
  }

  /** Opens a sequence and returns its handle. E_NOMEM when maxSequences are open. */
  createSequence(): number {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'createSequence: expected an open runtime, got one that was closed');
    const seq = this.open.indexOf(0);
    if (seq < 0) throw new KvdriveError('E_NOMEM', `createSequence: expected fewer than maxSequences = ${this.open.length} open sequences, got all of them open`);
    this.open[seq] = 1;
    this.tokens.fill(-1, seq * this.shape.layers, (seq + 1) * this.shape.layers);
    this.memory.openSequence(seq);
    return seq;
  }

  /** Closes a sequence: its indexes, tails and segments (both tiers) are dropped and its handle may be reused. */
  closeSequence(seq: number): Promise<void> {
    return this.serial(async () => {
      this.checkSeq('closeSequence', seq);
      this.open[seq] = 0;
      await this.memory.closeSequence(seq);
    });
  }

  /**
   * Hands over the prompt's K and V of one layer ('thd' or 'htd' layout, kvHeads x headDim per
   * token; f32, or the runtime's 16-bit dtype as Uint16Array bits) and builds its selection index;
   * the prompt's whole chunks outside the local window are sealed into the tiers. One prefill per
   * layer. E_BUDGET when the prompt exceeds maxTokens.
   *
   * `obsQ`: the queries of the last W prompt positions, Float32Array(W x qHeads x headDim),
   * position-major; their attention over the prompt ranks the chunks (SnapKV-style) for the DRAM
   * tier and, with a hot tier, places the most important ones there before the first decode step.
   */
  prefill(seq: number, layer: number, k: KvTensor, v: KvTensor, obsQ?: Float32Array): Promise<void> {
    return this.serial(async () => {
      this.checkSeq('prefill', seq);
      this.checkLayer('prefill', layer);
      const { kvHeads, headDim } = this.shape;
      const dtype = this.memory.memory.config.dtype;
      for (const [name, t] of [['k', k], ['v', v]] as const) {
        if (t === null || typeof t !== 'object') fail('E_TYPE', `prefill ${name}`, 'a KvTensor { data, dtype, tokens, heads, dim }', t);
        const ok = (t.dtype === 'f32' && t.data instanceof Float32Array) || (t.dtype === dtype && t.data instanceof Uint16Array);
        if (!ok) fail('E_DTYPE', `prefill ${name}`, dtype === 'f32' ? "dtype 'f32' with Float32Array data" : `dtype '${dtype}' (Uint16Array bits) or 'f32' (Float32Array, narrowed to ${dtype})`, t.dtype);
        if (t.heads !== kvHeads || t.dim !== headDim) fail('E_SHAPE', `prefill ${name} heads x dim`, `${kvHeads} x ${headDim}`, `${t.heads} x ${t.dim}`);
        if (!Number.isInteger(t.tokens) || t.tokens < 0) fail('E_SHAPE', `prefill ${name}.tokens`, 'a non-negative integer', t.tokens);
        if (t.data.length !== t.tokens * kvHeads * headDim) fail('E_SHAPE', `prefill ${name}.data length`, `tokens x heads x dim = ${t.tokens * kvHeads * headDim}`, t.data.length);
        if (t.layout !== undefined && t.layout !== 'thd' && t.layout !== 'htd') fail('E_CONFIG', `prefill ${name}.layout`, "'thd' or 'htd'", t.layout);
      }
      if (k.tokens !== v.tokens) fail('E_SHAPE', 'prefill v.tokens', `k.tokens = ${k.tokens}`, v.tokens);
      if (k.tokens > this.maxTokens) fail('E_BUDGET', 'prefill tokens', `at most maxTokens = ${this.maxTokens}`, k.tokens);
      if (obsQ !== undefined) {
        const row = this.shape.qHeads * headDim;
        if (!(obsQ instanceof Float32Array)) fail('E_TYPE', 'prefill obsQ', `a Float32Array(W x ${row})`, obsQ);
        const window = obsQ.length / row;
        if (!Number.isInteger(window) || window < 1 || window > k.tokens)
          fail('E_SHAPE', 'prefill obsQ length', `W x qHeads x headDim with 1 <= W <= ${k.tokens} prompt tokens (rows of ${row})`, obsQ.length);
        checkVector('prefill obsQ', obsQ, obsQ.length);
      }
      const conv = (name: string, t: KvTensor): KvTensor => ({ ...t, layout: 'thd', dtype, data: toDtype(`prefill ${name}`, toThd(t), dtype) });
      await this.memory.prefill(seq, layer, conv('k', k), conv('v', v), obsQ);
      this.warmSelect(seq, layer);
      this.tokens[seq * this.shape.layers + layer] = k.tokens;
    });
  }

  /**
   * One select on the index the prefill just built, with a constant query, its result dropped.
   * Select only reads the index, so nothing changes but the select threads' scratch, which grows
   * to this context's size here rather than in the first decode step: the process's first select
   * took 29-35 ms wall against ~7 ms later, about half of it page faults of that growth
   * (bench/index.md, "The runtime's select column vs the same select out of the step").
   */
  private warmSelect(seq: number, layer: number): void {
    const { memory } = this.memory;
    const lk = memory.layer(seq, layer);
    if (!lk.policy || lk.tokens === 0) return;
    const q = new Float32Array(this.shape.qHeads * this.shape.headDim).fill(1 / Math.sqrt(this.shape.headDim));
    selectEntry(lk.policy.handle(), q, memory.config.budget);
  }

  /**
   * Attention of layer `layer` for every batch entry: appends the entry's kNew/vNew to its sequence,
   * selects the critical chunks for q and attends over sinks + selected + tail (the new token
   * included). Resolves with one Float32Array(qHeads * headDim) per entry, in batch order. A step
   * that fails (for any entry) commits nothing: every sequence keeps its token count, and the same
   * call retried gives a clean run's outputs.
   */
  attend(layer: number, batch: AttendEntry[]): Promise<Float32Array[]> {
    return this.serial(async () => (await this.attendNow(layer, batch)).map((r) => r.out));
  }

  /**
   * attend() that also returns, per entry, the selection attention ran over (beside sinks and
   * tail) and the index bytes selection scored: what the runtime actually attended, for measuring
   * its recall against dense attention (`kvdrive demo`).
   */
  attendTraced(layer: number, batch: AttendEntry[]): Promise<TracedOutput[]> {
    return this.serial(() => this.attendNow(layer, batch));
  }

  private async attendNow(layer: number, batch: AttendEntry[]): Promise<TracedOutput[]> {
    const t0 = performance.now();
    this.checkLayer('attend', layer);
    if (!Array.isArray(batch) || batch.length === 0) fail('E_SHAPE', 'attend batch', 'a non-empty array of { seq, q, kNew, vNew }', batch);
    const { qHeads: hq, kvHeads: hkv, headDim: d, layers: L } = this.shape;
    const seen = new Set<number>();
    for (let i = 0; i < batch.length; i++) {
      const e = batch[i]!;
      if (e === null || typeof e !== 'object') fail('E_TYPE', `attend batch[${i}]`, 'an object { seq, q, kNew, vNew }', e);
      this.checkSeq(`attend batch[${i}]`, e.seq);
      if (seen.has(e.seq)) fail('E_CONFIG', `attend batch[${i}].seq`, 'each sequence at most once per batch', e.seq);
      seen.add(e.seq);
      const t = this.tokens[e.seq * L + layer]!;
      if (t < 0) fail('E_RANGE', `attend batch[${i}]`, `sequence ${e.seq} layer ${layer} prefilled first`, 'no prefill');
      if (t + 1 > this.maxTokens) fail('E_BUDGET', `attend batch[${i}] context`, `at most maxTokens = ${this.maxTokens} tokens`, t + 1);
      checkVector(`attend batch[${i}].q`, e.q, hq * d);
      checkVector(`attend batch[${i}].kNew`, e.kNew, hkv * d);
      checkVector(`attend batch[${i}].vNew`, e.vNew, hkv * d);
    }
    const mem = this.memory;
    const dtype = mem.memory.config.dtype;
    const entries: MemoryEntry[] = batch.map((e, i) => ({
      seq: e.seq,
      q: e.q,
      kNew: toDtype(`attend batch[${i}].kNew`, e.kNew, dtype),
      vNew: toDtype(`attend batch[${i}].vNew`, e.vNew, dtype),
    }));
    const before = { ...mem.time };
    this.counters.appendMs += performance.now() - t0;
    let outputs: TracedOutput[] | undefined;
    let error: unknown;
    try {
      outputs = await mem.attend(layer, entries);
    } catch (e) {
      error = e;
    }
    const wallMs = performance.now() - t0;
    const c = this.counters;
    const selectionMs = mem.time.selectionMs - before.selectionMs;
    const fetchMs = mem.time.fetchMs - before.fetchMs;
    const computeMs = mem.time.computeMs - before.computeMs;
    const parts = Math.ceil(batch.length / this.microBatch);
    c.attendCalls++;
    c.entries += batch.length;
    c.microBatches += parts;
    c.wallMs += wallMs;
    c.selectionMs += selectionMs;
    c.fetchMs += fetchMs;
    c.computeMs += computeMs;
    this.recent.push({ layer, entries: batch.length, wallMs, selectionMs, fetchMs, computeMs, stallMs: Math.max(0, wallMs - computeMs) });
    if (this.recent.length > 64) this.recent.shift();
    if (error !== undefined) throw error;
    for (const e of batch) this.tokens[e.seq * L + layer] = mem.tokens(e.seq, layer);
    return outputs!;
  }

  /** Time breakdown and memory counters since open (see {@link RuntimeStats}). */
  async stats(): Promise<RuntimeStats> {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'runtime stats: expected an open runtime, got one that was closed');
    const c = this.counters;
    const m = this.memory.stats();
    const t = m.traffic;
    return {
      mode: this.mode,
      ...c,
      ssdChunks: t.ssdChunks,
      ssdBytes: t.ssdChunks * this.memory.memory.chunkBytes,
      ssdReadBytes: t.ssdReadBytes,
      hits: t.hotChunks,
      misses: this.memory.hot ? t.chunks - t.hotChunks : 0,
      warmedChunks: this.memory.time.warmedChunks,
      stallMs: Math.max(0, c.wallMs - c.computeMs),
      maxInFlight: this.memory.maxInFlight,
      ...(this.memory.select
        ? {
            selectStage: {
              ...this.memory.selectCounts,
              restarts: this.memory.select.pipeline.restarts(0),
              ...(this.memory.selectFallback !== undefined ? { fallback: this.memory.selectFallback } : {}),
            },
          }
        : {}),
      recentSteps: this.recent.map((r) => ({ ...r })),
      memory: m,
    };
  }

  /** Frees the runtime (every open sequence, the tiers, the SSD store's files); later calls fail with E_CLOSED. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true; // later calls, and calls queued behind the current one, fail with E_CLOSED
    await this.queue;
    const open: number[] = [];
    this.open.forEach((o, seq) => o === 1 && open.push(seq));
    this.open.fill(0);
    await this.memory.close(open);
  }
}

/** The tensor's data in 'thd' order (a view when it already is). */
function toThd<T extends Float32Array | Uint16Array>(t: KvTensor & { data: T }): T;
function toThd(t: KvTensor): Float32Array | Uint16Array;
function toThd(t: KvTensor): Float32Array | Uint16Array {
  const data = t.data;
  if (t.layout !== 'htd') return data;
  const out = data instanceof Float32Array ? new Float32Array(data.length) : new Uint16Array(data.length);
  for (let h = 0; h < t.heads; h++)
    for (let tok = 0; tok < t.tokens; tok++) out.set(data.subarray((h * t.tokens + tok) * t.dim, (h * t.tokens + tok + 1) * t.dim), (tok * t.heads + h) * t.dim);
  return out;
}
