/**
 * The runtime's public types, apart from the Runtime class itself (runtime.ts): the options of
 * openRuntime (the calibration's included), a batch entry of attend() and what attendTraced returns,
 * and the stats. Kept apart so that runtime.ts and calibrate.ts both import them and neither
 * imports the other's types (runtime.ts calls calibrate(); calibrate.ts gets openRuntime passed in).
 */
import type { PolicyOptions } from '../index/options.js';
import type { PolicyName, Selection } from '../index/selection.js';
import type { Dtype, KvTensor, ModelShape } from '../types.js';
import type { HotTierOptions } from '../cache/hot-tier.js';
import type { IoEngineOptions } from '../storage/io-engine.js';
import type { MemoryStats } from './kv-memory.js';
import type { MemoryTraffic } from './memory-runtime.js';

/** What to sweep and how long each trial runs. */
export interface CalibrateOptions {
  /** Prompt tokens per synthetic sequence of the pre-run (default 4096; at most the runtime's maxTokens minus steps). */
  contextTokens?: number;
  /** Sequences decoded together (default 4). */
  batch?: number;
  /** Measured decode steps per trial, each over every layer (default 6; at most 64 layer steps are kept). */
  steps?: number;
  /** Micro-batch sizes to try (default [1, 2, 4], capped at batch). */
  microBatches?: number[];
  /** kvdrive policy: tokensPerCluster candidates, fewest centroids last (default [8, 16, 32]). */
  tokensPerCluster?: number[];
  /** With a hot tier: largest window multiple to try (default 4). */
  maxWindow?: number;
  /** Seed of the synthetic KV and queries (default 1). */
  seed?: number;
}

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
   * 'sequential' (default): the entries of an attend() one after another on the calling thread.
   * 'pipelined': micro-batches of `microBatch` entries run concurrently (up to 4) — the selection
   * of one on a stage worker thread (one piscina worker, started at open, joined at close; the
   * micro-batch travels in a SharedArrayBuffer slot) while the SSD reads (I/O engine threads) and
   * the attention (native work off the JS thread) of others proceed. Appending the new tokens and
   * extending the indexes stay on the calling thread. A worker that dies is replaced and its
   * micro-batch selected again. Outputs are bit-identical to 'sequential'. Like a server, the
   * worker keeps the process alive until close(): a host that never closes the runtime never exits.
   */
  mode?: 'sequential' | 'pipelined';
  /** Batch entries per micro-batch (default 1, at most 256). */
  microBatch?: number;
  /** Sequences open at once (default 4, at most 4096). */
  maxSequences?: number;
  /** Context capacity of a sequence in tokens, prompt + decoded (default 4096). */
  maxTokens?: number;
  /**
   * Everything the runtime keeps in DRAM, bytes (DESIGN.md §3) — sinks and open tails, the
   * selection indexes (reserved at their measured bytes per token x maxTokens), the hot tier's
   * maxBytes, fetch buffers, with `ssd` the I/O engine's bounce buffers and rings at the most its
   * `io` options allow (IoEngineInfo.bufferBytes: 66 MiB with the default io_uring options), and the
   * DRAM tier (the rest). Sealed segments (prompt and decoded
   * tokens, sealed in blocks of `sealTokens` as they leave the local window) go to the SSD store
   * (`ssd`) and are cached in the DRAM tier; without `ssd` the DRAM tier must hold every chunk of
   * maxSequences x maxTokens, else open fails with E_BUDGET naming the bytes needed.
   * Default without `ssd`: exactly what holds everything declared (maxSequences x maxTokens of
   * every layer in DRAM; `stats().memory.plan` shows the sum). With `ssd` it must be given (how much
   * of the sealed KV DRAM caches is the deployment's choice): E_CONFIG otherwise.
   */
  dramBudget?: number;
  /** KV dtype kept in every tier, never widened (default 'f32'); f32 input is narrowed to it. */
  dtype?: Dtype;
  /** Tokens per segment sealed while decoding (a multiple of the chunk size; default 1024). */
  sealTokens?: number;
  /**
   * A hot tier (src/cache/hot-tier.ts) in front of the DRAM tier: its residents are attended from
   * their slots, the other selected chunks are admitted as they are fetched (bit-identical
   * outputs). `windows` and `eviction` as in HotTierOptions (a token-granular step needs ~2.4
   * windows to keep its chunks resident); `maxBytes` is its hard byte cap. What dramBudget counts
   * for it is what it allocates for its windows (at most the cap; the memory plan's hotTierBytes),
   * so a generous cap takes nothing from the DRAM tier. Closing a sequence empties its arenas.
   */
  hotTier?: Pick<HotTierOptions, 'windows' | 'maxBytes' | 'eviction'>;
  /**
   * SSD store under `dir` (created if missing) for the sealed segments: cluster-contiguous
   * checksummed extents read through io_uring, the pread pool or memory-mapped (`io: { kind: 'mmap' }`; `io` as in IoEngineOptions;
   * `direct` = O_DIRECT, no page cache, not with mmap). `io.maxBatches` defaults to the entries that
   * read at once (1 sequential, 4 pipelined): the engine's buffers for that many batches are
   * reserved inside dramBudget; `io.queueDepth` to 64 and `io.maxIoBytes` to 64 KiB (9.0 MiB of
   * io_uring bounce buffers per batch; the store alone defaults to 32 and 256 KiB, 16.5 MiB). The runtime deletes its segments when a sequence closes
   * and at close; at open the store starts empty (`reset`), so what a runtime that never closed left
   * (its process died) is deleted, whatever shape it had. One
   * runtime at a time holds a directory: opening a second on it, in any process, is E_BUSY until
   * the first closes. Needs `dramBudget`.
   *
   * `streamHeads` (integer in [1, kvHeads]; default kvHeads = no streaming): a sequential step
   * selects this many kv heads at a time and starts their DRAM pins and SSD reads before selecting
   * the next group, so the reads are in flight behind the select (outputs unchanged: kv heads select
   * independently). Each group is one more select call. On the 2-core VM with a virtio disk this
   * project measures on, groups of 2 were slower on an otherwise idle machine (DRAM+SSD / DRAM-only
   * 0.60 vs 0.67, median of 4-5 runs) and faster under load from other processes
   * (bench/runtime-memory.md, "SSD reads streamed behind the select"); measure on your machine.
   */
  ssd?: { dir: string; direct?: boolean; io?: IoEngineOptions; streamHeads?: number };
  /**
   * Run the pre-run calibration (src/runtime/calibrate.ts, paper §6.2) before opening: it picks
   * microBatch, policyOptions.tokensPerCluster (kvdrive policy) and hotTier.windows (with a tier)
   * on a short synthetic decode of this shape through this runtime (pipelined), overriding those
   * options. `true` = default sweep. The result is kept in {@link Runtime.calibration}.
   */
  calibrate?: boolean | CalibrateOptions;
}

/** Time breakdown of one attend() call (a layer step of the batch), milliseconds. */
export interface StepBreakdown {
  layer: number;
  entries: number;
  wallMs: number;
  /** Index extend + select, summed over entries. */
  selectionMs: number;
  /**
   * Hot-tier lookup, DRAM tier / SSD / tail staging and hot-tier admission, summed over entries; 0
   * without an SSD and a hot tier (the DRAM tier holds every chunk: attention reads them in place).
   */
  fetchMs: number;
  /** Attention, summed over entries. */
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

/** What one entry of {@link Runtime.attendTraced} attended. */
export interface TracedOutput {
  out: Float32Array;
  /** The selection attention ran over (beside sinks and tail): the runtime's attended tokens. */
  selection: Selection;
  /** Index bytes the selection scored. */
  bytesScored: number;
}

/** Time breakdown since open (ms). */
export interface RuntimeStats {
  mode: 'sequential' | 'pipelined';
  /**
   * Pipelined mode's select stage (absent sequentially): entries selected on its piscina worker,
   * entries selected on the calling thread instead (the worker's select threw, or its selection
   * outgrew the arena slot: the same select runs here), micro-batches submitted again after their
   * worker died holding them, and workers replaced since open. `fallback`: why the stage was given
   * up (its worker could not be replaced, or died more than 3 times on one micro-batch); every
   * entry has selected inline since (same outputs, no overlap).
   */
  selectStage?: { onWorker: number; inline: number; retries: number; restarts: number; fallback?: string };
  attendCalls: number;
  entries: number;
  microBatches: number;
  /** Wall time inside attend(). */
  wallMs: number;
  /** Validating and narrowing k/v on the calling thread. */
  appendMs: number;
  /** Selection (index extend + select), summed over entries. */
  selectionMs: number;
  /** Attention, summed over entries. */
  computeMs: number;
  /** Fetch (hot tier, DRAM tier, SSD reads incl. I/O wait, tail staging), summed over entries; 0 without an SSD and a hot tier. */
  fetchMs: number;
  /** Selected chunks served from SSD, their payload bytes, and the bytes the device transferred (those chunks, page-aligned). */
  ssdChunks: number;
  ssdBytes: number;
  ssdReadBytes: number;
  /** Selected chunks found resident / not resident in the hot tier (0 without a tier). */
  hits: number;
  misses: number;
  /** Chunks placed in the hot tier by prefill warm-up (obsQ). */
  warmedChunks: number;
  /**
   * Wall time inside attend() during which compute was not running: what the pipeline failed to
   * hide (sequentially it is selection + fetch + overhead).
   */
  stallMs: number;
  /** Most micro-batches of one attend() running at once (1 sequentially). */
  maxInFlight: number;
  /** The last (up to 64) attend() calls, oldest first. */
  recentSteps: StepBreakdown[];
  /**
   * The itemised budget, index bytes in use, sealed tokens, SSD writes, the DRAM tier's counters
   * and per-tier traffic (chunks served by the hot tier, DRAM, SSD, tail).
   */
  memory: MemoryStats & { traffic: MemoryTraffic };
}
