/**
 * The hot tier (DESIGN.md §2–§3, kvdrive.txt §5): per (sequence, layer, kv head) a fixed arena of
 * chunk slots that the attention kernels read. Each decode step, {@link HotTier.fetch} evaluates the
 * selected chunks against the residents (hits), evicts by policy and copies misses in from the source
 * KV; {@link HotTier.attend} then computes the sparse attention reading chunks from their slots
 * (bit-identical to `attendSparse` over the contiguous KV) and records each chunk's attention mass,
 * which the lookahead policy ranks residents by.
 *
 * Memory is allocated once by the native addon at creation and never grows past `maxBytes`
 * (E_BUDGET names the minimum otherwise). The tier is reachable by {@link HotTier.handle} from any
 * worker thread through the addon; at most one operation per (sequence, layer) runs at a time
 * (a concurrent second one is rejected with E_CONFIG).
 */
import { z } from 'zod';
import { KvdriveError, describe, fail } from '../errors.js';
import { native } from '../native.js';
import type { Dtype, KvTensor } from '../types.js';
import type { Selection } from '../index/selection.js';
import { expectInt } from '../util/check.js';

/** Eviction policies of the hot tier. */
export const EvictionPolicies = ['lookahead', 'lru', 'lfu'] as const;
/**
 * - `lookahead` (kvdrive): evict residents with the lowest attention mass at the latest step (0 if
 *   not attended then; ties least recently used), keeping chunks of the current lookahead pool
 *   (Selection.poolIds, top-M ranked, M > K) until last, lowest selection score first;
 * - `lru`: least recently selected first; `lfu`: fewest selections since admission first.
 * Chunks selected in the current step are never evicted.
 */
export type EvictionPolicy = (typeof EvictionPolicies)[number];

/** Options of {@link HotTier}. */
export interface HotTierOptions {
  /** Layers of the model. */
  layers: number;
  /** KV heads per layer. */
  kvHeads: number;
  /** Head dimension. */
  headDim: number;
  /** Storage dtype of the K/V rows (must match the source KV). */
  dtype: Dtype;
  /** Tokens per chunk (the selection's chunkSize). */
  chunkSize: number;
  /** Sparsity budget K: tokens selected per (layer, kv head) per step; one window = ceil(K / chunkSize) slots. */
  budget: number;
  /**
   * Window ×N per (layer, kv head): one number for all, `windows[layer][head]`, or a window
   * allocation (windows.json from `kvdrive solve-windows`, validated against this shape).
   * 0 retains nothing between steps. A window is sized for a chunk-granular selection; a
   * token-granular one (the runtime's kvdrive default) spreads its K tokens over more chunks, up to
   * K (~0.6 K on the demo workload, so ~2.4 windows per step: `kvdrive demo --storage` uses 3).
   */
  windows: number | number[][] | { version: 1; shape: { layers: number; kvHeads: number }; windows: number[][] };
  /** Hard limit on the tier's bytes (K/V slots plus metadata). */
  maxBytes: number;
  /** Eviction policy, default 'lookahead'. */
  eviction?: EvictionPolicy;
  /** Independent sequences (each with its own residency), default 1. */
  sequences?: number;
}

/** Counters of one step or accumulated, for one (layer, kv head) or a total. */
export interface TierCounters {
  /** Selected chunks found resident. */
  hits: number;
  /** Selected chunks not resident (admitted or streamed). */
  misses: number;
  /** Misses copied into a slot. */
  admitted: number;
  /** Misses read from the source without admission (window smaller than the selection). */
  streamed: number;
  /** K+V bytes copied into slots (including rows of a resident chunk that appeared since admission). */
  bytesAdmitted: number;
  /** K+V bytes of streamed misses. */
  bytesStreamed: number;
  /** Residents evicted. */
  evictions: number;
  /** hits / (hits + misses), NaN before any selected chunk. */
  hitRate: number;
}

/** Per-step statistics returned by {@link HotTier.fetch}. */
export interface HotTierStepStats {
  /** One entry per kv head of the layer. */
  heads: TierCounters[];
  /** Sum over the layer's kv heads. */
  total: TierCounters;
}

/** Accumulated statistics of {@link HotTier.stats}. */
export interface HotTierStats {
  /** layers × kvHeads entries, layer-major. */
  pairs: (TierCounters & { layer: number; head: number; resident: number; warmAdmitted: number; warmBytes: number })[];
  total: TierCounters & { warmAdmitted: number; warmBytes: number };
}

/** Sizes of a created tier. */
export interface HotTierInfo {
  /** Total bytes held (slots + metadata), ≤ maxBytes. */
  bytes: number;
  slotBytes: number;
  metadataBytes: number;
  /** Slots of one window: ceil(budget / chunkSize). */
  slotsPerStep: number;
  /** K+V bytes of one chunk slot. */
  chunkBytes: number;
  /** Slots per (layer, kv head), layer-major. */
  capacities: Int32Array;
  eviction: EvictionPolicy;
}

/** Arguments shared by the per-layer operations. */
export interface LayerArgs {
  /** Sequence index, default 0. */
  sequence?: number;
  layer: number;
  /** Source keys of the layer (all tokens so far). */
  k: KvTensor;
  /** Source values of the layer. */
  v: KvTensor;
}

/** Arguments of {@link HotTier.attend} / {@link HotTier.step}. */
export interface AttendArgs extends LayerArgs {
  selection: Selection;
  /** Queries of the decode position, Float32Array(qHeads × headDim), finite. */
  q: Float32Array;
  /** Query heads, a multiple of kvHeads (GQA). */
  qHeads: number;
  /** Softmax scale, default 1/sqrt(headDim). */
  scale?: number;
}

/** Result of the slot-read attention. */
export interface SlotAttentionResult {
  /** Float32Array(qHeads × headDim): attention output, bit-identical to attendSparse. */
  out: Float32Array;
  /** Float32Array(qHeads): log-sum-exp per query head. */
  lse: Float32Array;
  /** Float32Array(selection.chunkIds.length): attention mass per selected chunk (group mean). */
  chunkMass: Float32Array;
  /** Selected chunks read from the source instead of a slot (not resident). */
  sourceChunks: number;
}

const int = (min: number, max = 2 ** 31 - 1) => z.number().int().min(min).max(max);
const OptionsSchema = z.object({
  layers: int(1, 4096),
  kvHeads: int(1, 4096),
  headDim: int(1, 65536),
  dtype: z.enum(['f32', 'f16', 'bf16']),
  chunkSize: int(1, 65536),
  budget: int(1),
  windows: z.union([
    int(0, 1 << 16),
    z.array(z.array(int(0, 1 << 16))),
    z.object({
      version: z.literal(1),
      shape: z.object({ layers: int(1), kvHeads: int(1) }),
      windows: z.array(z.array(int(0, 1 << 16))),
    }),
  ]),
  maxBytes: z.number().finite().nonnegative(),
  eviction: z.string().optional(),
  sequences: int(1, 4096).optional(),
});

function counters(o: Record<string, Float64Array>, i: number): TierCounters {
  const hits = o.hits![i]!;
  const misses = o.misses![i]!;
  return {
    hits,
    misses,
    admitted: o.admitted![i]!,
    streamed: o.streamed![i]!,
    bytesAdmitted: o.bytesAdmitted![i]!,
    bytesStreamed: o.bytesStreamed![i]!,
    evictions: o.evictions![i]!,
    hitRate: hits / (hits + misses),
  };
}

function sum<T extends TierCounters>(xs: T[]): TierCounters {
  const t: TierCounters = { hits: 0, misses: 0, admitted: 0, streamed: 0, bytesAdmitted: 0, bytesStreamed: 0, evictions: 0, hitRate: NaN };
  for (const x of xs) {
    t.hits += x.hits;
    t.misses += x.misses;
    t.admitted += x.admitted;
    t.streamed += x.streamed;
    t.bytesAdmitted += x.bytesAdmitted;
    t.bytesStreamed += x.bytesStreamed;
    t.evictions += x.evictions;
  }
  t.hitRate = t.hits / (t.hits + t.misses);
  return t;
}

/** Resolves the `windows` option to windows[layer][head], validating the shape. */
export function resolveWindows(w: HotTierOptions['windows'], layers: number, kvHeads: number): number[][] {
  expectInt(layers, 'resolveWindows layers', 1, 4096);
  expectInt(kvHeads, 'resolveWindows kvHeads', 1, 4096);
  const r = OptionsSchema.shape.windows.safeParse(w);
  if (!r.success) fail('E_CONFIG', 'hot tier windows', 'a window, windows[layer][head] or a window allocation', w);
  w = r.data as HotTierOptions['windows'];
  if (typeof w === 'number') return Array.from({ length: layers }, () => new Array<number>(kvHeads).fill(w));
  let rows: number[][];
  if (Array.isArray(w)) rows = w;
  else {
    if (w.shape.layers !== layers || w.shape.kvHeads !== kvHeads)
      throw new KvdriveError(
        'E_SHAPE',
        `hot tier windows: expected an allocation for ${layers} layers × ${kvHeads} kv heads, got one for ${w.shape.layers} × ${w.shape.kvHeads}`,
      );
    rows = w.windows;
  }
  if (rows.length !== layers || rows.some((r) => r.length !== kvHeads))
    throw new KvdriveError(
      'E_SHAPE',
      `hot tier windows: expected ${layers} rows of ${kvHeads} windows, got ${rows.length} rows of [${rows.map((r) => r.length).join(', ')}]`,
    );
  return rows;
}

/** A bounded, per-sequence hot tier; see the module comment. Call {@link destroy} to free it. */
export class HotTier {
  /** Native handle (reachable from worker threads through the addon). */
  readonly handle: number;
  readonly options: Readonly<Required<Omit<HotTierOptions, 'windows'>>> & { windows: number[][] };
  private closed = false;

  constructor(options: HotTierOptions) {
    const r = OptionsSchema.safeParse(options);
    if (!r.success) {
      const issue = r.error.issues[0]!;
      const path = issue.path.join('.');
      const given = issue.path.reduce<unknown>((o, k) => (o as Record<PropertyKey, unknown> | undefined)?.[k], options);
      throw new KvdriveError('E_CONFIG', `hot tier options.${path}: ${issue.message}, got ${describe(given)}`);
    }
    const o = r.data;
    const eviction = (o.eviction ?? 'lookahead') as EvictionPolicy;
    if (!(EvictionPolicies as readonly string[]).includes(eviction))
      throw new KvdriveError('E_POLICY', `hot tier options.eviction: expected one of ${EvictionPolicies.join(', ')}, got ${describe(o.eviction)}`);
    const windows = resolveWindows(o.windows as HotTierOptions['windows'], o.layers, o.kvHeads);
    this.options = { ...o, eviction, sequences: o.sequences ?? 1, windows };
    this.handle = native.hotTierCreate({
      ...o,
      eviction,
      sequences: o.sequences ?? 1,
      windows: Int32Array.from(windows.flat()),
    }) as number;
  }

  private live(): number {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'hot tier: expected a live tier, got one already destroyed');
    return this.handle;
  }

  /** Sizes and per-pair capacities. */
  info(): HotTierInfo {
    return native.hotTierInfo(this.live()) as HotTierInfo;
  }

  /**
   * F stage for one layer: hit/miss of every kv head's selected chunks, eviction, admission of
   * misses copied from the source KV. Returns the step's counters per kv head and in total.
   */
  fetch(args: LayerArgs & { selection: Selection }): HotTierStepStats {
    return this.stepStats(native.hotTierFetch(this.live(), args) as Record<string, Float64Array>);
  }

  /** {@link fetch} off the JS thread (the arrays must not be modified until it settles). */
  async fetchAsync(args: LayerArgs & { selection: Selection }): Promise<HotTierStepStats> {
    return this.stepStats((await native.hotTierFetchAsync(this.live(), args)) as Record<string, Float64Array>);
  }

  private stepStats(o: Record<string, Float64Array>): HotTierStepStats {
    const heads = Array.from({ length: this.options.kvHeads }, (_, h) => counters(o, h));
    return { heads, total: sum(heads) };
  }

  /**
   * C stage for one layer: exact sparse attention over sinks + selected chunks + tail, reading
   * chunks from their slots. `sourceChunks` counts selected chunks read from the source instead
   * (not resident: streamed, or fetch was skipped). Records chunk masses for lookahead eviction.
   */
  attend(args: AttendArgs): SlotAttentionResult {
    return native.hotTierAttend(this.live(), args) as SlotAttentionResult;
  }

  /** {@link attend} off the JS thread; bit-identical results. */
  attendAsync(args: AttendArgs): Promise<SlotAttentionResult> {
    return native.hotTierAttendAsync(this.live(), args) as Promise<SlotAttentionResult>;
  }

  /** fetch then attend: one decode step of one layer. */
  step(args: AttendArgs): SlotAttentionResult & { stats: HotTierStepStats } {
    const stats = this.fetch(args);
    return { stats, ...this.attend(args) };
  }

  /** {@link step} off the JS thread. */
  async stepAsync(args: AttendArgs): Promise<SlotAttentionResult & { stats: HotTierStepStats }> {
    const stats = await this.fetchAsync(args);
    return { stats, ...(await this.attendAsync(args)) };
  }

  /** Records attention masses computed elsewhere (e.g. attendSparse's chunkMass) for lookahead eviction. */
  recordMass(args: { sequence?: number; layer: number; selection: Selection; chunkMass: Float32Array }): void {
    native.hotTierRecordMass(this.live(), args);
  }

  /**
   * Places chunks into free slots, best first, per kv head (offsets: kvHeads + 1 into chunkIds);
   * stops at capacity. Returns the chunks placed per kv head. Not counted as step traffic.
   */
  warm(args: LayerArgs & { offsets: Int32Array; chunkIds: Int32Array }): Int32Array {
    return native.hotTierWarm(this.live(), args) as Int32Array;
  }

  /** {@link warm} off the JS thread. */
  warmAsync(args: LayerArgs & { offsets: Int32Array; chunkIds: Int32Array }): Promise<Int32Array> {
    return native.hotTierWarmAsync(this.live(), args) as Promise<Int32Array>;
  }

  /** Accumulated counters per (layer, kv head) and in total (all sequences, or one). */
  stats(sequence?: number): HotTierStats {
    const o = native.hotTierStats(this.live(), sequence) as Record<string, Float64Array>;
    const { layers, kvHeads } = this.options;
    const pairs: HotTierStats['pairs'] = [];
    for (let l = 0; l < layers; l++)
      for (let h = 0; h < kvHeads; h++) {
        const i = l * kvHeads + h;
        pairs.push({ layer: l, head: h, ...counters(o, i), resident: o.resident![i]!, warmAdmitted: o.warmAdmitted![i]!, warmBytes: o.warmBytes![i]! });
      }
    const total = { ...sum(pairs), warmAdmitted: 0, warmBytes: 0 };
    for (const p of pairs) {
      total.warmAdmitted += p.warmAdmitted;
      total.warmBytes += p.warmBytes;
    }
    return { pairs, total };
  }

  /** Resident chunk ids of one (sequence, layer, kv head), ascending. */
  residents(layer: number, head: number, sequence = 0): Int32Array {
    return native.hotTierResidents(this.live(), { layer, head, sequence }) as Int32Array;
  }

  /**
   * Empties every arena of one sequence handle (all its slots freed) so the handle can serve a new
   * sequence. Counters are per handle since creation and are kept. E_RANGE for a bad handle,
   * E_CONFIG while an operation on that sequence runs on another thread.
   */
  resetSequence(sequence: number): void {
    native.hotTierResetSequence(this.live(), sequence);
  }

  /** Checks the slot map invariants; returns '' or the first violation (for tests and debugging). */
  check(): string {
    return native.hotTierCheck(this.live()) as string;
  }

  /** Frees the tier (idempotent). Workers still inside an operation finish first. */
  destroy(): void {
    if (this.closed) return;
    this.closed = true;
    native.hotTierDestroy(this.handle);
  }
}
