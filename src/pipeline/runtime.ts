/**
 * The decode runtime a host embeds: sequences, prefill, and per-layer sparse attention for a batch,
 * either sequentially on the calling thread or pipelined over stage worker pools (selection ∥
 * fetch ∥ compute across micro-batches). Both modes run the same stage code (decode-stages.ts) on
 * the same shared memory, so their outputs are bit-identical.
 *
 *   attend(layer, batch) ─ append k/v ─ split into micro-batches ─▶ arena slot ─▶ S ─▶ [F] ─▶ C ─▶ outputs
 *   (F, the hot-tier fetch, only with options.hotTier)
 */
import { fileURLToPath } from 'node:url';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { z } from 'zod';
import { KvdriveError, describe, fail } from '../errors.js';
import { offloadedPolicyOptions, resolvePolicyOptions, type PolicyOptions, type ResolvedPolicyOptions } from '../index/options.js';
import { warmUpAsync } from '../cache/warmup.js';
import type { PolicyName } from '../index/selection.js';
import type { KvTensor, ModelShape } from '../types.js';
import {
  DecodeState,
  TIMING_COMPUTE,
  TIMING_FETCH,
  TIMING_HITMISS,
  TIMING_HITS,
  TIMING_MISSES,
  TIMING_SELECTION,
  TIMING_SSD_BYTES,
  TIMING_SSD_CHUNKS,
  TIMING_SSD_READ_BYTES,
  type DecodeControl,
  type DecodeInit,
  type DecodeRegions,
} from './decode-stages.js';
import { HotTier, type HotTierOptions } from '../cache/hot-tier.js';
import { SsdStore, type ClusterLayout } from '../storage/ssd-store.js';
import { ioEngineOptionsSchema, type IoEngineOptions } from '../storage/io-engine.js';
import { Pipeline } from './pipeline.js';
import { SequenceStore } from './sequence-store.js';
import { SharedArena, decodeSlotRegions } from './shared-arena.js';
import type { StageStats } from './stage-pool.js';
import { calibrate, type CalibrateOptions, type CalibrationResult } from './calibrate.js';
import { MemoryRuntime, toDtype, type MemoryEntry } from '../runtime/memory-runtime.js';
import type { MemoryStats } from '../runtime/kv-memory.js';
import type { MemoryTraffic } from '../runtime/memory-runtime.js';
import type { Dtype } from '../types.js';

/** Options of {@link openRuntime}. */
export interface RuntimeOptions {
  /** Model shape: layers, qHeads (a multiple of kvHeads), kvHeads, headDim. */
  shape: ModelShape;
  /** Tokens attended per kv head per step beside the sinks and the tail (integer >= 1). */
  budget: number;
  /** Selection policy (default 'kvdrive'). */
  policy?: PolicyName;
  /** Options of the policy (chunkSize, sinks, local, ...); shape fields come from `shape`. */
  policyOptions?: Omit<PolicyOptions, 'qHeads' | 'kvHeads' | 'headDim'>;
  /**
   * 'sequential' (default): selection then compute on the calling thread, no workers.
   * 'pipelined': a selection worker, a fetch worker (with a hot tier) and a compute worker joined
   * by ring queues; micro-batches overlap (selection of micro-batch i+1 runs while later stages
   * work on i).
   */
  mode?: 'sequential' | 'pipelined';
  /**
   * Pipelined mode: selection worker threads (default 1, at most 4). Every selection worker builds
   * and keeps every index (build and drop requests go to all of them; each catches up on the
   * tokens appended since it last served a sequence), so any worker takes any micro-batch and
   * selection of consecutive micro-batches runs in parallel. Costs one index copy and one build per
   * extra worker; pays only with a core per worker.
   */
  selectionThreads?: number;
  /** Batch entries per micro-batch (default 1, at most 256). */
  microBatch?: number;
  /** Sequences open at once (default 4, at most 4096). */
  maxSequences?: number;
  /** Context capacity of a sequence in tokens, prompt + decoded (default 4096). */
  maxTokens?: number;
  /**
   * The memory model (DESIGN.md §3): everything the runtime keeps in DRAM, bytes — sinks and open
   * tails, the selection indexes (reserved at their measured bytes per token x maxTokens), the hot
   * tier's maxBytes, fetch buffers, and the DRAM tier (the rest). Sealed segments (prompt and
   * decoded tokens, sealed in blocks of `sealTokens` as they leave the local window) go to the SSD
   * store (`ssd`) and are cached in the DRAM tier; without `ssd` the DRAM tier must hold every chunk
   * of maxSequences x maxTokens, else open fails with E_BUDGET naming the bytes needed. `stats().memory`
   * itemises it. Without dramBudget the runtime uses the legacy store (every token, f32, in one
   * SharedArrayBuffer of kvMemoryBytes).
   */
  dramBudget?: number;
  /** With dramBudget: KV dtype kept in every tier, never widened (default 'f32'). */
  dtype?: Dtype;
  /** With dramBudget: tokens per segment sealed while decoding (a multiple of the chunk size; default 1024). */
  sealTokens?: number;
  /**
   * Legacy store (no dramBudget): hard cap in bytes of the shared KV store, allocated at open as
   * maxSequences x layers x 2 x maxTokens x kvHeads x headDim x 4 (default 1 GiB). Exceeding it is
   * E_NOMEM at open.
   */
  kvMemoryBytes?: number;
  /** Pipelined mode: spin budget of the rings in µs, or 'auto' (see PipelineOptions.spinMicros). */
  spinMicros?: number | 'auto';
  /**
   * A hot tier (src/cache/hot-tier.ts) between the store and compute: adds the fetch stage (hit/miss
   * against the residents, eviction, admission) and compute reads chunks from their slots
   * (bit-identical outputs). `windows` and `eviction` as in HotTierOptions; `maxBytes` is its hard
   * byte cap. Closing a sequence empties its arenas, so its handle is reused like without a tier.
   */
  hotTier?: Pick<HotTierOptions, 'windows' | 'maxBytes' | 'eviction'>;
  /**
   * SSD-backed prompts: each prefilled prompt layer (its whole chunks) is sealed into an SsdStore
   * segment under `dir` (created if missing; the runtime deletes its segments when a sequence
   * closes and at close), and every step the fetch stage reads the selected prompt chunks from
   * there (async I/O: io_uring or the pread pool, or memory-mapped with `io: { kind: 'mmap' }`;
   * `io` options as in IoEngineOptions; `direct` = O_DIRECT, no page cache, not with mmap). The DRAM copy keeps the keys (the index needs them) and the sinks,
   * tail and decoded tokens; prompt values it does not need are overwritten with NaN, so nothing is
   * silently read from DRAM instead. With a hotTier, only the selected chunks not resident in it
   * are read from SSD; their values are written back into DRAM, where the tier admits them from.
   * `layout`: 'chunks' (default) one extent per chunk, a selected chunk costs exactly its bytes;
   * 'clusters' one extent per k-means cluster of the index (kvdrive policy; DESIGN.md §4), fewer
   * and larger reads but whole clusters are read when selection takes part of one (bench/pipeline.md
   * §3 measures both).
   */
  ssd?: { dir: string; direct?: boolean; io?: IoEngineOptions; layout?: 'chunks' | 'clusters' };
  /**
   * Run the pre-run calibration (src/pipeline/calibrate.ts, paper §6.2) before opening: it picks
   * microBatch, policyOptions.tokensPerCluster (kvdrive policy) and hotTier.windows (with a tier)
   * on a short synthetic decode of this shape, overriding those options. `true` = default sweep.
   * The result is kept in {@link Runtime.calibration}.
   */
  calibrate?: boolean | CalibrateOptions;
}

/** Time breakdown of one attend() call (a layer step of the batch), milliseconds. */
export interface StepBreakdown {
  layer: number;
  entries: number;
  wallMs: number;
  selectionMs: number;
  /** Hot-tier hit/miss evaluation, eviction and admission copies. */
  hitMissMs: number;
  /** Whole fetch stage: SSD reads (I/O wait included) and the hit/miss part. */
  fetchMs: number;
  computeMs: number;
  /** wallMs - computeMs: time of the step not covered by attention compute. */
  stallMs: number;
}

/** One batch entry of {@link Runtime.attend}. */
export interface AttendEntry {
  /** Sequence handle from createSequence. */
  seq: number;
  /** Queries of the new position, Float32Array(qHeads * headDim), head-major. */
  q: Float32Array;
  /** Key and value of the new token, Float32Array(kvHeads * headDim) each; appended before attending. */
  kNew: Float32Array;
  vNew: Float32Array;
}

/** Time breakdown since open (ms). */
export interface RuntimeStats {
  mode: 'sequential' | 'pipelined';
  attendCalls: number;
  entries: number;
  microBatches: number;
  /** Wall time inside attend(). */
  wallMs: number;
  /** Validating and appending k/v on the calling thread. */
  appendMs: number;
  /** Selection stage (index extend + select), summed over micro-batches. */
  selectionMs: number;
  /** Compute stage (sparse attention), summed over micro-batches. */
  computeMs: number;
  /** Fetch stage (SSD reads incl. I/O wait, and hitMissMs); 0 without a tier or SSD. */
  fetchMs: number;
  /** Hot tier hit/miss evaluation, eviction and admission copies (part of fetchMs). */
  hitMissMs: number;
  /** SSD-backed: selected prompt chunks and their payload bytes read from SSD. */
  ssdChunks: number;
  ssdBytes: number;
  /** SSD-backed: bytes the device transferred for them (whole extents; / ssdBytes = read amplification). */
  ssdReadBytes: number;
  /** Selected chunks found resident / not resident in the hot tier (0 without a tier). */
  hits: number;
  misses: number;
  /** Chunks placed in the hot tier by prefill warm-up (obsQ). */
  warmedChunks: number;
  /**
   * Wall time inside attend() during which compute was not running: what the pipeline failed to
   * hide (sequentially it is append + selection + fetch + overhead).
   */
  stallMs: number;
  /** Pipelined mode: per-stage worker counters. */
  stages?: StageStats[];
  /**
   * Most micro-batches ever inside the stages at once (pipelined; 1 sequentially). Bounded by the
   * arena slots: a host submitting more waits for a slot (back-pressure), nothing is dropped.
   */
  maxInFlight: number;
  /** The last (up to 64) attend() calls, oldest first. */
  recentSteps: StepBreakdown[];
  /**
   * Memory model (dramBudget): the itemised budget, index bytes in use, sealed tokens, SSD writes,
   * the DRAM tier's counters and per-tier traffic (chunks served by the hot tier, DRAM, SSD, tail).
   */
  memory?: MemoryStats & { traffic: MemoryTraffic };
}

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
    selectionThreads: int(1, 4).optional(),
    maxSequences: int(1, 4096).optional(),
    maxTokens: int(1, 1 << 24).optional(),
    kvMemoryBytes: z.number().int().min(1).optional(),
    dramBudget: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER).optional(),
    dtype: z.enum(['f32', 'f16', 'bf16']).optional(),
    sealTokens: int(1, 1 << 24).optional(),
    spinMicros: z.union([z.literal('auto'), z.number().min(0).max(100_000)]).optional(),
    hotTier: z.object({ windows: z.unknown(), maxBytes: z.number(), eviction: z.string().optional() }).strict().optional(),
    ssd: z.object({ dir: z.string().min(1), direct: z.boolean().optional(), io: ioEngineOptionsSchema.optional(), layout: z.enum(['chunks', 'clusters']).optional() }).strict().optional(),
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
  selectionThreads: 'an integer in [1, 4]',
  maxSequences: 'an integer in [1, 4096]',
  maxTokens: 'an integer in [1, 2^24]',
  kvMemoryBytes: 'a positive integer',
  dramBudget: 'a positive integer number of bytes',
  dtype: "'f32', 'f16' or 'bf16'",
  sealTokens: 'an integer in [1, 2^24] (a multiple of the chunk size)',
  spinMicros: "'auto' or a number of µs in [0, 100000]",
  hotTier: '{ windows, maxBytes, eviction? }',
  ssd: "{ dir: a directory path, direct?: boolean, io?: IoEngineOptions, layout?: 'chunks' | 'clusters' }",
  calibrate: 'true, false or CalibrateOptions',
};

/** Arena slots in pipelined mode: enough for every stage to hold one and the host to fill more. */
const PIPELINE_SLOTS = 4;
/**
 * Fetch workers of an SSD-backed runtime. A fetch worker mostly waits for its reads; with one, the
 * reads of micro-batch i+1 cannot start before those of i completed, so F serializes the step.
 * Two keep two micro-batches' reads in flight (the stage is stateless: any worker takes any batch).
 */
const FETCH_THREADS_SSD = 2;

function decodeStagesModule(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  for (const p of [join(here, 'decode-stages.js'), join(here, '..', '..', 'dist', 'src', 'pipeline', 'decode-stages.js')]) if (existsSync(p)) return p;
  throw new KvdriveError('E_NOT_FOUND', `pipelined runtime: expected compiled dist/src/pipeline/decode-stages.js, got none near ${here}; run \`npm run build:ts\``);
}

function checkVector(what: string, v: unknown, length: number): asserts v is Float32Array {
  if (!(v instanceof Float32Array)) fail('E_TYPE', what, `a Float32Array(${length})`, v);
  if (v.length !== length) fail('E_SHAPE', what, `${length} elements`, v.length);
  for (let i = 0; i < v.length; i++)
    if (!Number.isFinite(v[i]!)) throw new KvdriveError('E_NONFINITE', `${what}: expected finite values, got ${v[i]} at element ${i}`);
}

/** Opens a runtime; see {@link RuntimeOptions}. Pipelined mode starts its workers before resolving. */
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
  if (options.calibrate) {
    if (options.dramBudget !== undefined)
      fail('E_CONFIG', 'openRuntime options.calibrate', 'no calibrate with dramBudget (the sweep tunes the legacy stage pipeline)', options.calibrate);
    const { calibrate: c, ...base } = options;
    const result = await calibrate(base, c === true ? {} : c, openRuntime);
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
  const resolved = resolvePolicyOptions(policy, { ...policyOptions, qHeads: shape.qHeads, kvHeads: shape.kvHeads, headDim: shape.headDim });
  const maxTokens = o.maxTokens ?? 4096;
  const mode = o.mode ?? 'sequential';
  const microBatch = o.microBatch ?? 1;
  // A selection holds at most `budget` tokens beside sinks and tail: floor(budget/c) whole chunks
  // plus up to two clipped at the sink and tail edges; never more chunks than the context has.
  const maxChunksPerHead = Math.min(Math.floor(o.budget / resolved.chunkSize) + 2, Math.ceil(maxTokens / resolved.chunkSize));
  if (o.dramBudget === undefined) {
    if (o.dtype !== undefined && o.dtype !== 'f32') fail('E_CONFIG', 'openRuntime options.dtype', "'f32' without dramBudget (the legacy store is f32)", o.dtype);
    if (o.sealTokens !== undefined) fail('E_CONFIG', 'openRuntime options.sealTokens', 'dramBudget (sealing belongs to the memory model)', 'no dramBudget');
  } else {
    if (o.kvMemoryBytes !== undefined) fail('E_CONFIG', 'openRuntime options.kvMemoryBytes', 'no kvMemoryBytes with dramBudget (the memory model has one budget)', o.kvMemoryBytes);
    if (o.ssd?.layout !== undefined) fail('E_CONFIG', 'openRuntime options.ssd.layout', 'no layout with dramBudget (extents are the index clusters)', o.ssd.layout);
    if (o.selectionThreads !== undefined || o.spinMicros !== undefined)
      fail('E_CONFIG', 'openRuntime options.selectionThreads / spinMicros', 'neither with dramBudget (no stage workers)', 'one of them');
    const maxSequences = o.maxSequences ?? 4;
    const dtype = o.dtype ?? 'f32';
    const cs = resolved.chunkSize;
    const sealTokens = o.sealTokens ?? Math.ceil(1024 / cs) * cs;
    // The memory model selects without the full keys (they are sealed away): kvdrive re-ranks on its
    // key sketch and selects single tokens (offloadedPolicyOptions, shared with eval --offloaded).
    const memPolicyOptions = offloadedPolicyOptions(policy, policyOptions);
    const memPolicyInput = { ...memPolicyOptions, qHeads: shape.qHeads, kvHeads: shape.kvHeads, headDim: shape.headDim };
    const memResolved = resolvePolicyOptions(policy, memPolicyInput);
    // A token-granular selection of `budget` tokens may touch that many chunks (one token each).
    const memChunksPerHead = policy === 'kvdrive' && memResolved.tokenGranular ? Math.min(o.budget, Math.ceil(maxTokens / cs)) : maxChunksPerHead;
    const memory = await MemoryRuntime.open({
      shape,
      dtype,
      policy,
      policyOptions: memResolved,
      policyInput: memPolicyInput,
      budget: o.budget,
      maxSequences,
      maxTokens,
      dramBudget: o.dramBudget,
      sealTokens,
      maxChunksPerHead: memChunksPerHead,
      mode,
      microBatch,
      hotTier: o.hotTier
        ? {
            ...(o.hotTier as Pick<HotTierOptions, 'windows' | 'maxBytes' | 'eviction'>),
            layers: shape.layers,
            kvHeads: shape.kvHeads,
            headDim: shape.headDim,
            dtype,
            chunkSize: cs,
            budget: o.budget,
            sequences: maxSequences,
          }
        : undefined,
      ssd: o.ssd ? { dir: o.ssd.dir, direct: o.ssd.direct, io: o.ssd.io } : undefined,
    });
    return new Runtime(undefined, undefined, undefined, mode, microBatch, resolved, undefined, undefined, undefined, 'chunks', { runtime: memory, shape, maxSequences, maxTokens });
  }
  const store = SequenceStore.create({ shape, maxSequences: o.maxSequences ?? 4, maxTokens }, o.kvMemoryBytes ?? 1 << 30);
  const stagedChunkElems = o.ssd ? 2 * resolved.chunkSize * shape.headDim : 0;
  const arena = SharedArena.create(mode === 'pipelined' ? PIPELINE_SLOTS : 1, decodeSlotRegions(shape, microBatch, maxChunksPerHead, stagedChunkElems), 4 * 2 ** 30);
  const ssd = o.ssd
    ? await SsdStore.open({
        ...(o.ssd.io ?? {}),
        dir: o.ssd.dir,
        direct: o.ssd.direct ?? false,
        shape: { layers: 1, kvHeads: shape.kvHeads, headDim: shape.headDim, dtype: 'f32', chunkSize: resolved.chunkSize },
      })
    : undefined;
  const ssdSegments = ssd ? new SharedArrayBuffer(store.layout.maxSequences * shape.layers * 2 * 4) : undefined;
  if (ssdSegments) new Int32Array(ssdSegments).fill(-1);
  // The tier validates its own options (E_CONFIG / E_POLICY / E_BUDGET naming the minimum bytes).
  const tier = o.hotTier
    ? new HotTier({
        ...(o.hotTier as Pick<HotTierOptions, 'windows' | 'maxBytes' | 'eviction'>),
        layers: shape.layers,
        kvHeads: shape.kvHeads,
        headDim: shape.headDim,
        dtype: 'f32',
        chunkSize: resolved.chunkSize,
        budget: o.budget,
        sequences: store.layout.maxSequences,
      })
    : undefined;
  const init: DecodeInit = {
    shape,
    budget: o.budget,
    policy,
    policyOptions,
    maxChunksPerHead,
    store: { buffer: store.buffer, layout: store.layout },
    arena: { buffer: arena.buffer, layout: arena.layout },
    hotTier: tier?.handle,
    ssd: ssdSegments ? { segments: ssdSegments, chunkSize: resolved.chunkSize } : undefined,
  };
  let pipeline: Pipeline | undefined;
  // The selection worker owns the indexes; if it dies, its replacement rebuilds every index from
  // the shared store (up to each layer's current length) before it takes a micro-batch.
  let replay: () => unknown[] = () => [];
  if (mode === 'pipelined') {
    const module = decodeStagesModule();
    try {
      pipeline = await Pipeline.start({
        stages: [
          { name: 'selection', module, init: { ...init, role: 'selection' }, replay: () => replay(), threads: o.selectionThreads ?? 1 },
          ...(tier || ssd ? [{ name: 'fetch', module, init: { ...init, role: 'fetch' }, threads: ssd ? FETCH_THREADS_SSD : 1 }] : []),
          { name: 'compute', module, init: { ...init, role: 'compute' } },
        ],
        words: 3,
        capacity: PIPELINE_SLOTS,
        spinMicros: o.spinMicros,
      });
    } catch (e) {
      tier?.destroy();
      await ssd?.close();
      throw e;
    }
  }
  const rt = new Runtime(init, store, arena, mode, microBatch, resolved, pipeline, tier, ssd, o.ssd?.layout);
  replay = () => rt.indexRebuildRequests();
  return rt;
}

/** See {@link openRuntime}. Calls to attend/prefill/closeSequence run one at a time, in call order. */
export class Runtime {
  readonly shape: ModelShape;
  readonly mode: 'sequential' | 'pipelined';
  readonly microBatch: number;
  /** What `openRuntime({ calibrate })` chose and measured; undefined without calibration. */
  calibration: CalibrationResult | undefined;
  private readonly legacyStore: SequenceStore | undefined;
  private readonly legacyArena: SharedArena<DecodeRegions> | undefined;
  /** The memory model (openRuntime with dramBudget); undefined: the legacy all-f32 shared store. */
  private readonly memory: MemoryRuntime | undefined;
  private readonly maxTokens: number;
  private readonly pipeline: Pipeline | undefined;
  /** Sequential mode: the stages run here. */
  private readonly local: DecodeState | undefined;
  private readonly tier: HotTier | undefined;
  /** tokens[seq * layers + layer]: context length of that layer; -1 = layer not prefilled. */
  private readonly tokens: Int32Array;
  /** Prompt length of each (seq, layer), where its index was built (rebuilt there after a crash). */
  private readonly prefilled: Int32Array;
  /** Per sequence handle: 0 free, 1 open. */
  private readonly open: Uint8Array;
  private readonly freeSlots: number[];
  private readonly slotWaiters: ((slot: number) => void)[] = [];
  /** Serializes public operations (they mutate per-sequence token counts). */
  private queue: Promise<unknown> = Promise.resolve();
  private closed = false;
  private readonly counters = {
    attendCalls: 0,
    entries: 0,
    microBatches: 0,
    wallMs: 0,
    appendMs: 0,
    selectionMs: 0,
    computeMs: 0,
    fetchMs: 0,
    hitMissMs: 0,
    hits: 0,
    misses: 0,
    ssdChunks: 0,
    ssdBytes: 0,
    ssdReadBytes: 0,
    warmedChunks: 0,
  };
  private readonly recent: StepBreakdown[] = [];
  private inFlight = 0;
  private maxInFlight = 0;
  /** SSD-backed: the store, segment ids per (seq * layers + layer), and the shared handle words. */
  private readonly ssd: SsdStore | undefined;
  private readonly segmentIds: (string | undefined)[];
  private readonly segmentWords: Int32Array | undefined;
  private segmentGeneration = 0;
  /** SSD-backed: extent layout of the prompt segments. */
  private readonly ssdLayout: 'chunks' | 'clusters';
  /** The selection policy's resolved options (chunk geometry for warm-up). */
  private readonly policyOptions: ResolvedPolicyOptions;

  /**
   * @internal use openRuntime. Either over the memory model (`memory`: every tier below, see
   * src/runtime/memory-runtime.ts) or over the legacy all-f32 shared store (`init`, `store`, `arena`).
   */
  constructor(
    init: DecodeInit | undefined,
    store: SequenceStore | undefined,
    arena: SharedArena<DecodeRegions> | undefined,
    mode: 'sequential' | 'pipelined',
    microBatch: number,
    policyOptions: ResolvedPolicyOptions,
    pipeline?: Pipeline,
    tier?: HotTier,
    ssd?: SsdStore,
    ssdLayout: 'chunks' | 'clusters' = 'chunks',
    memory?: { runtime: MemoryRuntime; shape: ModelShape; maxSequences: number; maxTokens: number },
  ) {
    this.tier = tier;
    this.ssd = ssd;
    this.memory = memory?.runtime;
    const maxSequences = memory ? memory.maxSequences : store!.layout.maxSequences;
    this.maxTokens = memory ? memory.maxTokens : store!.layout.maxTokens;
    this.shape = memory ? memory.shape : init!.shape;
    this.segmentIds = new Array<string | undefined>(maxSequences * this.shape.layers);
    this.segmentWords = init?.ssd ? new Int32Array(init.ssd.segments) : undefined;
    this.ssdLayout = ssdLayout;
    this.policyOptions = policyOptions;
    this.legacyStore = store;
    this.legacyArena = arena;
    this.mode = mode;
    this.microBatch = microBatch;
    this.pipeline = pipeline;
    this.local = mode === 'sequential' && init ? new DecodeState(init) : undefined;
    this.tokens = new Int32Array(maxSequences * this.shape.layers).fill(-1);
    this.prefilled = new Int32Array(maxSequences * this.shape.layers);
    this.open = new Uint8Array(maxSequences);
    this.freeSlots = Array.from({ length: arena ? arena.layout.slots : 0 }, (_, i) => i);
  }

  /** Legacy mode: the all-f32 shared store. */
  private get store(): SequenceStore {
    if (!this.legacyStore) throw new KvdriveError('E_INTERNAL', 'runtime: expected the legacy shared store, got a memory-model runtime');
    return this.legacyStore;
  }

  private get arena(): SharedArena<DecodeRegions> {
    if (!this.legacyArena) throw new KvdriveError('E_INTERNAL', 'runtime: expected the legacy arena, got a memory-model runtime');
    return this.legacyArena;
  }

  /**
   * @internal Build requests recreating every index (selection worker replacement): built over the
   * prompt as at prefill; the next selection extends it to the current length exactly as the lost
   * worker had (extends catch up over any number of tokens), so outputs do not depend on the crash.
   */
  indexRebuildRequests(): DecodeControl[] {
    const L = this.shape.layers;
    const out: DecodeControl[] = [];
    for (let seq = 0; seq < this.open.length; seq++)
      if (this.open[seq] === 1)
        for (let l = 0; l < L; l++)
          if (this.tokens[seq * L + l]! >= 0) out.push({ type: 'build', seq, layer: l, tokens: this.prefilled[seq * L + l]! });
    return out;
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
    this.memory?.openSequence(seq);
    return seq;
  }

  /** Closes a sequence: its indexes are dropped and its handle may be reused. */
  closeSequence(seq: number): Promise<void> {
    return this.serial(async () => {
      this.checkSeq('closeSequence', seq);
      if (this.memory) {
        this.open[seq] = 0;
        await this.memory.closeSequence(seq);
        return;
      }
      if (this.pipeline) await this.pipeline.control(0, { type: 'drop', seq });
      else await this.local!.control({ type: 'drop', seq });
      // No batch is in flight (operations are serialized), so no worker holds this sequence's
      // tier layers: empty its arenas and the handle is free for the next createSequence.
      this.tier?.resetSequence(seq);
      for (let l = 0; l < this.shape.layers; l++) await this.dropSegment(seq, l);
      this.open[seq] = 0;
    });
  }

  /**
   * Hands over the prompt's K and V of one layer (f32, 'thd' or 'htd' layout, kvHeads x headDim per
   * token) and builds its selection index. Replaces an earlier prefill of the same layer.
   * E_BUDGET when the prompt exceeds maxTokens.
   *
   * `obsQ` (needs a hot tier): the queries of the last W prompt positions, Float32Array(W x qHeads x
   * headDim), position-major; their attention over the prompt ranks the chunks (SnapKV-style) and
   * the most important ones are placed in the hot tier before the first decode step.
   */
  prefill(seq: number, layer: number, k: KvTensor, v: KvTensor, obsQ?: Float32Array): Promise<void> {
    return this.serial(async () => {
      this.checkSeq('prefill', seq);
      this.checkLayer('prefill', layer);
      const { kvHeads, headDim } = this.shape;
      for (const [name, t] of [['k', k], ['v', v]] as const) {
        if (t === null || typeof t !== 'object') fail('E_TYPE', `prefill ${name}`, 'a KvTensor { data, dtype, tokens, heads, dim }', t);
        const dtype = this.memory?.memory.config.dtype ?? 'f32';
        const ok = (t.dtype === 'f32' && t.data instanceof Float32Array) || (t.dtype === dtype && t.data instanceof Uint16Array);
        if (!ok) fail('E_DTYPE', `prefill ${name}`, dtype === 'f32' ? "dtype 'f32' with Float32Array data" : `dtype '${dtype}' (Uint16Array bits) or 'f32' (Float32Array, narrowed to ${dtype})`, t.dtype);
        if (t.heads !== kvHeads || t.dim !== headDim) fail('E_SHAPE', `prefill ${name} heads x dim`, `${kvHeads} x ${headDim}`, `${t.heads} x ${t.dim}`);
        if (!Number.isInteger(t.tokens) || t.tokens < 0) fail('E_SHAPE', `prefill ${name}.tokens`, 'a non-negative integer', t.tokens);
        if (t.data.length !== t.tokens * kvHeads * headDim) fail('E_SHAPE', `prefill ${name}.data length`, `tokens x heads x dim = ${t.tokens * kvHeads * headDim}`, t.data.length);
        if (t.layout !== undefined && t.layout !== 'thd' && t.layout !== 'htd') fail('E_CONFIG', `prefill ${name}.layout`, "'thd' or 'htd'", t.layout);
      }
      if (k.tokens !== v.tokens) fail('E_SHAPE', 'prefill v.tokens', `k.tokens = ${k.tokens}`, v.tokens);
      if (k.tokens > this.maxTokens) fail('E_BUDGET', 'prefill tokens', `at most maxTokens = ${this.maxTokens}`, k.tokens);
      if (this.tier && this.tokens[seq * this.shape.layers + layer]! >= 0)
        fail('E_CONFIG', `prefill seq ${seq} layer ${layer}`, 'one prefill per layer with a hot tier (its slots would keep the old rows)', 'a second prefill');
      let window = 0;
      if (obsQ !== undefined) {
        if (!this.tier && !this.memory) fail('E_CONFIG', 'prefill obsQ', 'a runtime opened with a hotTier or a dramBudget (the observation window warms them)', 'no hot tier');
        const row = this.shape.qHeads * headDim;
        if (!(obsQ instanceof Float32Array)) fail('E_TYPE', 'prefill obsQ', `a Float32Array(W x ${row})`, obsQ);
        window = obsQ.length / row;
        if (!Number.isInteger(window) || window < 1 || window > k.tokens)
          fail('E_SHAPE', 'prefill obsQ length', `W x qHeads x headDim with 1 <= W <= ${k.tokens} prompt tokens (rows of ${row})`, obsQ.length);
        checkVector('prefill obsQ', obsQ, obsQ.length);
      }
      if (this.memory) {
        const dtype = this.memory.memory.config.dtype;
        const conv = (name: string, t: KvTensor): KvTensor => ({ ...t, layout: 'thd', dtype, data: toDtype(`prefill ${name}`, toThd(t), dtype) });
        await this.memory.prefill(seq, layer, conv('k', k), conv('v', v), obsQ);
        this.tokens[seq * this.shape.layers + layer] = k.tokens;
        return;
      }
      for (const [kind, t] of [[0, k], [1, v]] as const) this.store.write(seq, layer, kind, 0, toThd(t) as Float32Array); // validated above: f32
      const ssdChunks = this.ssd && this.ssdLayout === 'clusters' ? Math.floor(k.tokens / this.policyOptions.chunkSize) : 0;
      const req: DecodeControl = { type: 'build', seq, layer, tokens: k.tokens, ...(ssdChunks > 0 ? { layoutChunks: ssdChunks } : {}) };
      this.tokens[seq * this.shape.layers + layer] = -1; // not attendable until the index exists
      this.prefilled[seq * this.shape.layers + layer] = k.tokens;
      const layout = (this.pipeline ? (await this.pipeline.control(0, req))[0] : await this.local!.control(req)) as ClusterLayout[] | undefined;
      if (window > 0) {
        // Warm candidates are the chunks the index can select: [sinkEnd, tailStart) by the
        // policy's rule (sinks; tail = local window rounded down to a chunk boundary).
        const { sinks, local, chunkSize } = this.policyOptions;
        const T = k.tokens;
        const sinkEnd = Math.min(sinks, T);
        const tailStart = Math.max(sinkEnd, Math.floor((T - local) / chunkSize) * chunkSize);
        const positions = Int32Array.from({ length: window }, (_, w) => T - window + w);
        const placed = await warmUpAsync(this.tier!, {
          sequence: seq,
          layer,
          k: this.store.tensor(seq, layer, 0, T),
          v: this.store.tensor(seq, layer, 1, T),
          sinkEnd,
          tailStart,
          q: obsQ!,
          qHeads: this.shape.qHeads,
          positions,
        });
        for (const n of placed) this.counters.warmedChunks += n;
      }
      // After the warm-up, which copies prompt rows into the tier from DRAM.
      if (this.ssd) await this.persistPrompt(seq, layer, k.tokens, layout);
      this.tokens[seq * this.shape.layers + layer] = k.tokens;
    });
  }

  /** SSD-backed: forgets and deletes the prompt segment of (seq, layer), if any. */
  private async dropSegment(seq: number, layer: number): Promise<void> {
    const i = seq * this.shape.layers + layer;
    const id = this.segmentIds[i];
    if (!this.ssd || id === undefined) return;
    this.segmentWords![i * 2] = -1;
    this.segmentWords![i * 2 + 1] = 0;
    this.segmentIds[i] = undefined;
    await this.ssd.deleteSegment(id);
  }

  /**
   * SSD-backed: seals the prompt's whole chunks of (seq, layer) into a segment laid out by the
   * index's clusters (one extent per cluster, see clusterLayout), publishes its handle to the stages, and
   * overwrites the DRAM values of the chunks that will only be read from SSD with NaN.
   */
  private async persistPrompt(seq: number, layer: number, tokens: number, clusters: ClusterLayout[] | undefined): Promise<void> {
    await this.dropSegment(seq, layer);
    const { chunkSize, sinks, local } = this.policyOptions;
    const chunks = Math.floor(tokens / chunkSize);
    if (chunks === 0) return;
    const id = `p${seq}-${layer}-${this.segmentGeneration++}`;
    const n = chunks * chunkSize;
    const layers = [{ k: this.store.tensor(seq, layer, 0, n), v: this.store.tensor(seq, layer, 1, n) }];
    await this.ssd!.writeSegment(id, clusters ? { layers, clusters } : { layers, extentChunks: 1 });
    const i = seq * this.shape.layers + layer;
    this.segmentIds[i] = id;
    this.segmentWords![i * 2] = this.ssd!.segmentHandle(id);
    this.segmentWords![i * 2 + 1] = chunks;
    // Rows [sinkEnd, tailStart) at prefill are attended only as selected chunks, i.e. from SSD.
    const sinkEnd = Math.min(sinks, tokens);
    const tailStart = Math.max(sinkEnd, Math.floor((tokens - local) / chunkSize) * chunkSize);
    const end = Math.min(tailStart, n);
    if (end > sinkEnd) {
      const row = this.shape.kvHeads * this.shape.headDim;
      this.store.tensor(seq, layer, 1, end).data.fill(NaN, sinkEnd * row, end * row);
    }
  }

  /**
   * Attention of layer `layer` for every batch entry: appends the entry's kNew/vNew to its sequence,
   * selects the critical chunks for q and attends over sinks + selected + tail (the new token
   * included). Resolves with one Float32Array(qHeads * headDim) per entry, in batch order.
   */
  attend(layer: number, batch: AttendEntry[]): Promise<Float32Array[]> {
    return this.serial(() => this.attendNow(layer, batch));
  }

  private async attendNow(layer: number, batch: AttendEntry[]): Promise<Float32Array[]> {
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
    if (this.memory) return this.attendMemory(layer, batch, t0);
    // Written at the next position but not committed: the token counts advance only when every
    // micro-batch succeeded, so a failed step retried with the same input equals a clean run.
    for (const e of batch) {
      const at = this.tokens[e.seq * L + layer]!;
      this.store.write(e.seq, layer, 0, at, e.kNew);
      this.store.write(e.seq, layer, 1, at, e.vNew);
    }
    this.counters.appendMs += performance.now() - t0;

    const outputs = batch.map(() => new Float32Array(hq * d));
    const jobs: Promise<void>[] = [];
    for (let start = 0; start < batch.length; start += this.microBatch) {
      const part = batch.slice(start, start + this.microBatch);
      jobs.push(this.runMicroBatch(layer, part, outputs.slice(start, start + part.length)));
    }
    const before = { ...this.counters };
    const settled = await Promise.allSettled(jobs);
    const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected');
    const wallMs = performance.now() - t0;
    this.counters.attendCalls++;
    this.counters.entries += batch.length;
    this.counters.wallMs += wallMs;
    const c = this.counters;
    const computeMs = c.computeMs - before.computeMs;
    this.recent.push({
      layer,
      entries: batch.length,
      wallMs,
      selectionMs: c.selectionMs - before.selectionMs,
      hitMissMs: c.hitMissMs - before.hitMissMs,
      fetchMs: c.fetchMs - before.fetchMs,
      computeMs,
      stallMs: Math.max(0, wallMs - computeMs),
    });
    if (this.recent.length > 64) this.recent.shift();
    if (failed) throw failed.reason;
    for (const e of batch) this.tokens[e.seq * L + layer]!++;
    return outputs;
  }

  /** attend() over the memory model (src/runtime/step.ts per entry). */
  private async attendMemory(layer: number, batch: AttendEntry[], t0: number): Promise<Float32Array[]> {
    const mem = this.memory!;
    const dtype = mem.memory.config.dtype;
    const entries: MemoryEntry[] = batch.map((e, i) => ({
      seq: e.seq,
      q: e.q,
      kNew: toDtype(`attend batch[${i}].kNew`, e.kNew, dtype),
      vNew: toDtype(`attend batch[${i}].vNew`, e.vNew, dtype),
    }));
    const before = { ...mem.time };
    this.counters.appendMs += performance.now() - t0;
    let outputs: Float32Array[] | undefined;
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
    c.attendCalls++;
    c.entries += batch.length;
    c.microBatches += Math.ceil(batch.length / this.microBatch);
    c.wallMs += wallMs;
    c.selectionMs += selectionMs;
    c.fetchMs += fetchMs;
    c.computeMs += computeMs;
    this.recent.push({ layer, entries: batch.length, wallMs, selectionMs, hitMissMs: 0, fetchMs, computeMs, stallMs: Math.max(0, wallMs - computeMs) });
    if (this.recent.length > 64) this.recent.shift();
    this.maxInFlight = Math.max(this.maxInFlight, this.mode === 'pipelined' ? Math.min(Math.ceil(batch.length / this.microBatch), PIPELINE_SLOTS) : 1);
    if (error !== undefined) throw error;
    for (const e of batch) this.tokens[e.seq * this.shape.layers + layer] = mem.tokens(e.seq, layer);
    return outputs!;
  }

  private async runMicroBatch(layer: number, part: AttendEntry[], outputs: Float32Array[]): Promise<void> {
    const slot = await this.acquireSlot();
    try {
      const { qHeads: hq, headDim: d, layers: L } = this.shape;
      const a = this.arena;
      const seqs = a.view(slot, 'seq');
      const q = a.view(slot, 'q');
      const meta = a.view(slot, 'selMeta');
      const timing = a.view(slot, 'timing');
      timing.fill(0);
      part.forEach((e, b) => {
        seqs[b] = e.seq;
        q.set(e.q, b * hq * d);
        meta[b * 4 + 1] = this.tokens[e.seq * L + layer]! + 1; // the new token included (committed after the step)
      });
      this.maxInFlight = Math.max(this.maxInFlight, ++this.inFlight);
      if (this.pipeline) await this.pipeline.submit([slot, part.length, layer]).finally(() => this.inFlight--);
      else {
        this.inFlight--; // sequential: one micro-batch at a time, run to the end below
        this.local!.select(slot, part.length, layer);
        if (this.tier || this.ssd) await this.local!.fetch(slot, part.length, layer);
        this.local!.compute(slot, part.length, layer);
      }
      const out = a.view(slot, 'out');
      outputs.forEach((o, b) => o.set(out.subarray(b * hq * d, (b + 1) * hq * d)));
      this.counters.microBatches++;
      this.counters.selectionMs += timing[TIMING_SELECTION]!;
      this.counters.computeMs += timing[TIMING_COMPUTE]!;
      this.counters.fetchMs += timing[TIMING_FETCH]!;
      this.counters.hitMissMs += timing[TIMING_HITMISS]!;
      this.counters.ssdChunks += timing[TIMING_SSD_CHUNKS]!;
      this.counters.ssdBytes += timing[TIMING_SSD_BYTES]!;
      this.counters.ssdReadBytes += timing[TIMING_SSD_READ_BYTES]!;
      this.counters.hits += timing[TIMING_HITS]!;
      this.counters.misses += timing[TIMING_MISSES]!;
    } finally {
      this.releaseSlot(slot);
    }
  }

  private acquireSlot(): Promise<number> {
    const s = this.freeSlots.pop();
    if (s !== undefined) return Promise.resolve(s);
    return new Promise((r) => this.slotWaiters.push(r));
  }

  private releaseSlot(slot: number): void {
    const w = this.slotWaiters.shift();
    if (w) w(slot);
    else this.freeSlots.push(slot);
  }

  /**
   * @internal Fault injection for tests: kills the worker thread of stage `stage` (pipelined mode)
   * like a crash — now, or (`at`) when it next has just popped a micro-batch or just handed one on.
   * The runtime recovers by itself: a batch the worker held and had not handed on rejects with
   * E_WORKER, a replacement starts (the selection stage's replacement rebuilds every index first).
   */
  killStageWorker(stage: 'selection' | 'fetch' | 'compute', at: 'now' | 'popped' | 'pushed' = 'now'): Promise<void> {
    if (!this.pipeline) throw new KvdriveError('E_CONFIG', 'killStageWorker: expected a pipelined runtime, got a sequential one');
    const names = ['selection', ...(this.tier || this.ssd ? ['fetch'] : []), 'compute'];
    const i = names.indexOf(stage);
    if (i < 0) fail('E_RANGE', 'killStageWorker stage', names.join(', '), stage);
    return at === 'now' ? this.pipeline.killWorker(i) : this.pipeline.arm(i, 0, { point: at, action: 'exit' });
  }

  /** Time breakdown since open (see {@link RuntimeStats}). */
  async stats(): Promise<RuntimeStats> {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'runtime stats: expected an open runtime, got one that was closed');
    const c = this.counters;
    const s: RuntimeStats = { mode: this.mode, ...c, stallMs: Math.max(0, c.wallMs - c.computeMs), maxInFlight: this.maxInFlight, recentSteps: this.recent.map((r) => ({ ...r })) };
    if (this.pipeline) s.stages = (await this.pipeline.stats()).stages;
    if (this.memory) {
      const m = this.memory.stats();
      s.memory = m;
      s.hits = m.traffic.hotChunks;
      s.misses = m.traffic.chunks - m.traffic.hotChunks;
      s.ssdChunks = m.traffic.ssdChunks;
      s.ssdBytes = m.traffic.ssdChunks * this.memory.memory.chunkBytes;
      s.ssdReadBytes = m.traffic.ssdReadBytes;
      s.warmedChunks = this.memory.time.warmedChunks;
    }
    return s;
  }

  /** Stops the workers (pipelined) and frees the runtime; later calls fail with E_CLOSED. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true; // later calls, and calls queued behind the current one, fail with E_CLOSED
    await this.pipeline?.close(); // rejects micro-batches in flight with E_CLOSED
    await this.queue;
    if (this.memory) {
      const open: number[] = [];
      this.open.forEach((o, seq) => o === 1 && open.push(seq));
      this.open.fill(0);
      await this.memory.close(open);
      return;
    }
    this.tier?.destroy(); // after every worker has exited: nobody holds the handle any more
    if (this.ssd) {
      // The runtime's segments are scratch: delete them, then release files and the I/O engine.
      // A failed delete is reported after everything is released (the store stays consistent).
      let error: unknown;
      for (const id of this.segmentIds)
        if (id !== undefined) await this.ssd.deleteSegment(id).catch((e: unknown) => (error ??= e));
      await this.ssd.close();
      if (error !== undefined) throw error;
    }
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
