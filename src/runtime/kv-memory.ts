/**
 * The runtime's memory model (DESIGN.md §3, "Where a sequence's KV lives"): which tier holds which
 * tokens of every (sequence, layer), and what that costs.
 *
 *   tokens [0, sinks)          the sinks: a copy in DRAM, always attended
 *   tokens [sealed, tokens)    the open tail: in DRAM, host dtype (the local window and the tokens
 *                              not sealed yet)
 *   tokens [0, sealed)         sealed segments (prompt AND decoded tokens, sealed in blocks of
 *                              `sealTokens` once they have left the local window): written to the SSD
 *                              store (cluster-contiguous checksummed extents) and cached in the DRAM
 *                              tier under its byte budget; without an SSD store the DRAM tier holds
 *                              every sealed chunk (open fails with E_BUDGET naming the bytes needed
 *                              when it cannot)
 *
 * K/V are kept in the host's dtype (f32, f16 or bf16), never widened in storage. The selection index
 * of each (sequence, layer) is built from the prompt's keys and extended from the tail as chunks
 * leave the local window; it never needs the sealed keys again. A hot tier (src/cache/hot-tier.ts)
 * may sit in front; the step (step.ts) reads hot-tier slots, the DRAM tier, SSD and the tail.
 *
 * Budget (`dramBudget`, bytes) is split at open into itemised parts (see {@link MemoryPlan}); every
 * part is allocated or reserved at open, so the process's resident set is the budget plus a stated
 * overhead whatever the context length. Sealing runs after the step that made it due, off that
 * step's path (awaited by the next step of the same layer, whose failure it then becomes).
 */
import { KvdriveError, fail } from '../errors.js';
import type { PolicyOptions, ResolvedPolicyOptions } from '../index/options.js';
import { createPolicy, NativeSelectionPolicy, type SelectionPolicy } from '../index/policy.js';
import type { PolicyName } from '../index/selection.js';
import { DramStore, type DramStats } from '../storage/dram-store.js';
import { chunkBytesOf, type ClusterLayout, type SsdStore, type StoreShape } from '../storage/ssd-store.js';
import { TieredKv } from '../storage/tiered-kv.js';
import { clusterLayout } from '../storage/cluster-layout.js';
import { dtypeArray, placedArray } from '../util/kv-array.js';
import type { Dtype, KvTensor, ModelShape } from '../types.js';

/** What the memory model is built from (resolved runtime options). */
export interface KvMemoryConfig {
  shape: ModelShape;
  /** Kv heads a sequential step selects, then fetches, at a time with an SSD (RuntimeOptions.ssd.streamHeads); kvHeads: no streaming. */
  streamHeads?: number;
  dtype: Dtype;
  policy: PolicyName;
  /** Resolved policy options, shape fields included (geometry: chunkSize, sinks, local). */
  policyOptions: ResolvedPolicyOptions;
  /** The options indexes are created with (as given, shape fields added). */
  policyInput: PolicyOptions;
  /** Selection budget, tokens per kv head (sizes the fetch buffers). */
  budget: number;
  maxSequences: number;
  maxTokens: number;
  /**
   * Everything the model keeps in DRAM, bytes. Undefined (DRAM only, no SSD store): exactly what
   * holds every chunk of maxSequences x maxTokens beside the fixed parts.
   */
  dramBudget?: number;
  /** Tokens per sealed segment once decoding (a multiple of the chunk size). */
  sealTokens: number;
  /** Bytes the hot tier holds (0: none; what it allocated, at most its cap); counted inside dramBudget. */
  hotTierBytes: number;
  /** Micro-batches that may run at once (fetch buffers in flight). */
  concurrency: number;
  /** Chunks per kv head a selection may touch at most (fetch buffer size). */
  maxChunksPerHead: number;
  /** The pipelined select stage's shared arena (queries in, selections out), bytes; 0 sequentially. */
  selectArenaBytes: number;
  ssd?: SsdStore;
}

/** How `dramBudget` is spent, bytes; every item is allocated or reserved at open. */
export interface MemoryPlan {
  dramBudgetBytes: number;
  /** Sinks and open tails of every (sequence, layer), host dtype, allocated at open. */
  residentBytes: number;
  /** Selection index reserve: (indexFixedBytes + indexBytesPerToken x maxTokens) x maxSequences x layers. */
  indexBytes: number;
  /**
   * Index bytes per token and layer (sketch, centroids, membership lists; chunk representatives
   * where kept), the slope measured on two probe builds.
   */
  indexBytesPerToken: number;
  /**
   * Index bytes per (sequence, layer) that do not grow with the context, from the same probes: the
   * open segment's working set at its largest (kvdrive: its chunk means, running sums, centroids).
   */
  indexFixedBytes: number;
  /** The hot tier's bytes (what it allocated for its windows, at most its maxBytes cap). */
  hotTierBytes: number;
  /** Fetch buffers (SSD reads; DRAM-tier chunks are attended in place): concurrency x kvHeads x maxChunksPerHead chunks with an SSD, 0 without. */
  fetchBytes: number;
  /** The pipelined select stage's shared arena (SharedArrayBuffer slots: queries, selections); 0 sequentially. */
  selectArenaBytes: number;
  /**
   * The SSD store's I/O engine: its bounce buffers and rings at the most its options allow
   * (IoEngineInfo.bufferBytes: io_uring maxBatches x (2 x queueDepth x (maxIoBytes + 8 KiB) + ring
   * mappings), pread threads x (maxIoBytes + 8 KiB), mmap 0); 0 without an SSD store. Native memory:
   * the engine allocates part of it at open and the rest as concurrent reads need rings.
   */
  ioBufferBytes: number;
  /**
   * What is left for the DRAM tier (arena + slot metadata), at most DramStore.maxChunks worth of
   * chunks (255 arena blocks of 1 GiB); budget beyond that stays unused.
   */
  dramTierBytes: number;
  /** K + V bytes per token of one layer in the host dtype. */
  kvBytesPerTokenLayer: number;
}

/** Counters of the memory model. */
export interface MemoryStats {
  plan: MemoryPlan;
  /** Index bytes in use now (sum over open sequences and layers). */
  indexBytes: number;
  /** Tokens held by open sequences, summed over layers. */
  tokens: number;
  /** Tokens sealed into segments (tiers), summed over layers. */
  sealedTokens: number;
  /** Segments written to SSD and their bytes (since open). */
  ssdSegments: number;
  ssdWrittenBytes: number;
  dram: DramStats;
}

const elemBytes = (d: Dtype) => (d === 'f32' ? 4 : 2);
/** Largest finite f32: the importance of a chunk whose only copy is in DRAM (no SSD store). */
const F32_MAX = 3.4028234663852886e38;

/** One (sequence, layer): its index, sinks, open tail and sealed segment chain. */
export class LayerKv {
  /** Tokens committed (-1: not prefilled). Advanced only by a step that completed. */
  tokens = -1;
  /** Tokens [0, sealed) are in sealed segments; the tail holds [sealed, tokens). A multiple of the chunk size. */
  sealed = 0;
  policy: SelectionPolicy | undefined;
  /** Fetch over the sealed segment chain (created at the first seal). */
  tiers: TieredKv | undefined;
  readonly segments: string[] = [];
  /** A seal started after the last step; the next step awaits it. */
  pendingSeal: Promise<void> | undefined;
  readonly sinkK: Float32Array | Uint16Array;
  readonly sinkV: Float32Array | Uint16Array;
  readonly tailK: Float32Array | Uint16Array;
  readonly tailV: Float32Array | Uint16Array;

  constructor(dtype: Dtype, sinks: number, tailCapacity: number, row: number) {
    this.sinkK = dtypeArray(dtype, sinks * row);
    this.sinkV = dtypeArray(dtype, sinks * row);
    this.tailK = dtypeArray(dtype, tailCapacity * row);
    this.tailV = dtypeArray(dtype, tailCapacity * row);
  }
}

/** The memory model of one runtime: every open sequence's KV and the tiers below it. */
export class KvMemory {
  readonly config: KvMemoryConfig;
  readonly plan: MemoryPlan;
  readonly storeShape: StoreShape;
  readonly chunkBytes: number;
  /** Tail capacity in tokens: a seal leaves fewer than sealTokens + local + chunk, a step adds one. */
  readonly tailCapacity: number;
  readonly dram: DramStore;
  readonly ssd: SsdStore | undefined;
  /** layers[seq * L + layer]; undefined while the sequence is closed. */
  private readonly layers: (LayerKv | undefined)[];
  private generation = 0;
  /** SSD writes run one at a time (the store's manifest is rewritten per segment). */
  private writes: Promise<unknown> = Promise.resolve();
  private ssdSegments = 0;
  private ssdWrittenBytes = 0;
  /** Fetch buffers not in use; `fetchBuffers` exist (at most config.concurrency), plan.fetchBytes / concurrency bytes each. */
  private readonly fetchPool: Uint8Array[] = [];
  private fetchBuffers = 0;
  /** Bytes of one fetch buffer (kvHeads x maxChunksPerHead chunks): what an entry's SSD reads can take at most. */
  readonly fetchBufferBytes: number;

  private constructor(config: KvMemoryConfig, plan: MemoryPlan) {
    this.config = config;
    this.plan = plan;
    const { shape, dtype, policyOptions: p } = config;
    this.storeShape = { layers: 1, kvHeads: shape.kvHeads, headDim: shape.headDim, dtype, chunkSize: p.chunkSize };
    this.chunkBytes = chunkBytesOf(this.storeShape);
    this.tailCapacity = tailCapacity(config);
    this.fetchBufferBytes = plan.fetchBytes / config.concurrency;
    this.ssd = config.ssd;
    this.dram = new DramStore({ budgetBytes: plan.dramTierBytes, shape: this.storeShape, shared: false });
    this.layers = new Array<LayerKv | undefined>(config.maxSequences * shape.layers);
  }

  /**
   * Splits the budget (E_BUDGET naming the bytes needed when it cannot hold the fixed parts, or —
   * without an SSD store — every sealed chunk of maxSequences x maxTokens) and allocates.
   */
  static open(config: KvMemoryConfig): KvMemory {
    return new KvMemory(config, planMemory(config));
  }

  /** Opens the layers of a sequence (allocates its sinks and tails: part of residentBytes). */
  openSequence(seq: number): void {
    const { shape, dtype, policyOptions: p } = this.config;
    const row = shape.kvHeads * shape.headDim;
    for (let l = 0; l < shape.layers; l++) this.layers[seq * shape.layers + l] = new LayerKv(dtype, p.sinks, this.tailCapacity, row);
  }

  layer(seq: number, layer: number): LayerKv {
    const lk = this.layers[seq * this.config.shape.layers + layer];
    if (!lk) throw new KvdriveError('E_INTERNAL', `memory: expected sequence ${seq} to be open, got a closed one`);
    return lk;
  }

  /** Frees a sequence: waits for its seals, deletes its segments from both tiers. The first error is rethrown after cleanup. */
  async closeSequence(seq: number): Promise<void> {
    const L = this.config.shape.layers;
    let error: unknown;
    for (let l = 0; l < L; l++) {
      const lk = this.layers[seq * L + l];
      if (!lk) continue;
      this.layers[seq * L + l] = undefined;
      await lk.pendingSeal?.catch(() => undefined);
      await lk.tiers?.close();
      for (const id of lk.segments) {
        if (this.dram.hasSegment(id)) this.dram.removeSegment(id);
        if (this.ssd) await this.ssd.deleteSegment(id).catch((e: unknown) => (error ??= e));
      }
    }
    if (error !== undefined) throw error;
  }

  /**
   * A fetch buffer (the SSD reads of one entry, packed; the plan's fetch buffers) of at least
   * `bytes`, reused across steps: a step allocates, zeroes and leaves to the GC no buffer of its
   * own. Each of the config.concurrency buffers is allocated on first use (its pages touched only
   * as reads land). Give it back with {@link releaseFetchBuffer} after the entry's last read of it.
   * More entries in flight than the plan counts get a transient buffer (never pooled).
   */
  acquireFetchBuffer(bytes: number): Uint8Array {
    const cap = this.fetchBufferBytes;
    if (!(bytes >= 0 && bytes <= cap)) fail('E_INTERNAL', 'KvMemory fetch buffer', `at most ${cap} bytes (kvHeads x maxChunksPerHead chunks)`, bytes);
    const pooled = this.fetchPool.pop();
    if (pooled) return pooled;
    // Placed like the DRAM tier's arenas (kv-array.ts): attention reads the SSD-read pages' rows at random.
    if (this.fetchBuffers >= this.config.concurrency) return placedArray(Uint8Array, bytes);
    this.fetchBuffers++;
    return placedArray(Uint8Array, cap);
  }

  /** Returns a buffer of {@link acquireFetchBuffer} (a transient one is dropped). */
  releaseFetchBuffer(buf: Uint8Array): void {
    if (buf.length === this.fetchBufferBytes && this.fetchPool.length < this.fetchBuffers) this.fetchPool.push(buf);
  }

  /** A view of `tokens` tokens of a thd array (host dtype). */
  tensor(data: Float32Array | Uint16Array, tokens: number): KvTensor {
    const { kvHeads, headDim } = this.config.shape;
    return { data: data.subarray(0, tokens * kvHeads * headDim), dtype: this.config.dtype, tokens, heads: kvHeads, dim: headDim };
  }

  /** Where sealing of a layer holding `tokens` tokens should reach: whole blocks of tokens the index has sealed. */
  sealTarget(lk: LayerKv, tokens: number): number {
    const { local, chunkSize } = this.config.policyOptions;
    const indexed = Math.max(0, Math.floor((tokens - local) / chunkSize)) * chunkSize;
    const st = this.config.sealTokens;
    // The prompt seals as one segment (everything the index sealed, whole chunks); decode in blocks.
    if (lk.sealed === 0 && lk.tokens <= 0) return indexed;
    return lk.sealed + Math.floor((indexed - lk.sealed) / st) * st;
  }

  /**
   * Seals tokens [lk.sealed, end) — rows given thd from token lk.sealed — into one segment: SSD write
   * (extents = the index's clusters for kvdrive) and DRAM (every chunk without SSD; with SSD the
   * chunks that fit in free slots). Then the tail drops those rows. State changes only on success.
   */
  async seal(seq: number, layer: number, lk: LayerKv, k: Float32Array | Uint16Array, v: Float32Array | Uint16Array, end: number, scores?: Float32Array): Promise<void> {
    const first = lk.sealed;
    const n = end - first;
    if (n <= 0) return;
    const { kvHeads, headDim } = this.config.shape;
    const cs = this.config.policyOptions.chunkSize;
    const row = kvHeads * headDim;
    const id = `s${seq}_${layer}_${this.generation++}`;
    const kt = this.tensor(k, n);
    const vt = this.tensor(v, n);
    const chunks = n / cs;
    if (this.ssd) {
      const policy = lk.policy;
      const clusters: ClusterLayout[] | undefined =
        policy instanceof NativeSelectionPolicy && policy.name === 'kvdrive'
          ? Array.from({ length: kvHeads }, (_, h) => clusterLayout(policy, h, first / cs, end / cs))
          : undefined;
      const write = this.writes.then(() => this.ssd!.writeSegment(id, clusters ? { layers: [{ k: kt, v: vt }], clusters } : { layers: [{ k: kt, v: vt }] }));
      this.writes = write.catch(() => undefined);
      const info = await write;
      this.ssdSegments++;
      this.ssdWrittenBytes += info.bytes;
    }
    try {
      this.dram.addSegment(id, n);
      const s = new Float32Array(kvHeads * chunks);
      // Without an SSD the tier holds the only copy: never evicted, whatever the window ranked.
      if (!this.ssd) s.fill(F32_MAX);
      else if (scores) s.set(scores.subarray(0, s.length));
      const admitted = this.dram.warm(id, { layers: [{ k: kt, v: vt }] }, s);
      if (!this.ssd && admitted !== kvHeads * chunks)
        throw new KvdriveError('E_BUDGET', `memory: expected the DRAM tier to hold every sealed chunk (no SSD store), got room for ${admitted} of ${kvHeads * chunks}`);
      if (lk.tiers) lk.tiers.appendSegment(id);
      // Without an SSD nothing is ever evicted (every chunk F32_MAX, above): the step's in-place
      // reads need no pins.
      else lk.tiers = new TieredKv({ ssd: this.ssd, dram: this.dram, segments: [id], stagingBuffers: 0, promote: false, pinInPlace: !!this.ssd });
    } catch (e) {
      if (this.dram.hasSegment(id)) this.dram.removeSegment(id);
      await this.ssd?.deleteSegment(id).catch(() => undefined);
      throw e;
    }
    lk.segments.push(id);
    // The tail keeps [end, tokens): shift the rows left (the tail is a small window).
    const keep = Math.max(0, lk.tokens - end);
    if (k === lk.tailK) {
      lk.tailK.copyWithin(0, n * row, (n + keep) * row);
      lk.tailV.copyWithin(0, n * row, (n + keep) * row);
    }
    lk.sealed = end;
  }

  /** Starts the seal a completed step made due (if any); the layer's next step awaits it. */
  startSeal(seq: number, layer: number, lk: LayerKv): void {
    const end = this.sealTarget(lk, lk.tokens);
    if (end <= lk.sealed || lk.pendingSeal) return;
    const p = this.seal(seq, layer, lk, lk.tailK, lk.tailV, end);
    lk.pendingSeal = p;
    p.then(
      () => (lk.pendingSeal = undefined),
      () => undefined, // kept: the next step awaits it, reports the error and clears it
    );
  }

  /** Before a step: a pending or due seal must complete (its error fails this step; state unchanged). */
  async settleSeal(seq: number, layer: number, lk: LayerKv): Promise<void> {
    if (lk.pendingSeal) {
      const p = lk.pendingSeal;
      try {
        await p;
      } finally {
        lk.pendingSeal = undefined;
      }
    }
    const end = this.sealTarget(lk, lk.tokens);
    if (end > lk.sealed) await this.seal(seq, layer, lk, lk.tailK, lk.tailV, end);
  }

  stats(): MemoryStats {
    let indexBytes = 0;
    let tokens = 0;
    let sealedTokens = 0;
    for (const lk of this.layers) {
      if (!lk || lk.tokens < 0) continue;
      indexBytes += lk.policy?.indexBytes() ?? 0;
      tokens += lk.tokens;
      sealedTokens += lk.sealed;
    }
    return { plan: { ...this.plan }, indexBytes, tokens, sealedTokens, ssdSegments: this.ssdSegments, ssdWrittenBytes: this.ssdWrittenBytes, dram: this.dram.stats() };
  }
}

function tailCapacity(c: KvMemoryConfig): number {
  const { local, chunkSize } = c.policyOptions;
  return c.sealTokens + local + chunkSize + 1;
}

/**
 * Index bytes of one layer for this policy and shape: fixed + perToken x tokens, fitted on two probe
 * builds over random keys whose open segment is one chunk short of full (its largest), one and three
 * full segments apart, so perToken is what every full segment adds per token and fixed what the open
 * one holds (kvdrive with releaseChunkMeans keeps chunk means for that segment only). A maxTokens
 * within the probes is measured directly.
 */
function indexCost(c: KvMemoryConfig): { perToken: number; fixed: number } {
  const p = c.policyOptions;
  const { kvHeads, headDim } = c.shape;
  const S = p.segmentTokens;
  // Chunk j covers tokens [j c, (j+1) c) whatever the sinks; chunks are sealed once past the local window.
  const at = (full: number) => p.local + (full + 1) * S - p.chunkSize;
  // The prior selection a kvdrive index keeps between steps (reuseCandidateFactor): at most budget
  // token ids (4 bytes) per kv head, plus a vector each. The probes set none.
  const priorBytes = p.reuseCandidateFactor > 0 && c.policy === 'kvdrive' ? kvHeads * (c.budget * 4 + 24) : 0;
  let reserve = 0;
  const measure = (tokens: number): number => {
    const data = new Float32Array(tokens * kvHeads * headDim);
    let x = 0x9e3779b9;
    for (let i = 0; i < data.length; i++) {
      x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + 0x6b43a9b5) >>> 0;
      data[i] = x / 2 ** 31 - 1;
    }
    const policy = createPolicy(c.policy, c.policyInput);
    policy.buildSync({ data, dtype: 'f32', tokens, heads: kvHeads, dim: headDim }, tokens);
    // A pending re-clustering exists only once a segment can fill: its last chunk sealed, i.e. the
    // segment plus the local window within maxTokens.
    reserve = (c.maxTokens >= p.local + S ? policy.reserveBytes() : 0) + priorBytes;
    return policy.indexBytes();
  };
  const t1 = at(1);
  const t2 = at(3);
  // A context no longer than the probes: the index at that context, its largest (no open segment
  // bigger than the context can exist).
  if (c.maxTokens <= t2) {
    const tokens = Math.max(c.maxTokens, p.sinks + p.local + p.chunkSize);
    return { perToken: Math.ceil(measure(tokens) / tokens), fixed: reserve };
  }
  const b1 = measure(t1);
  const b2 = measure(t2);
  const perToken = Math.ceil((b2 - b1) / (t2 - t1));
  return { perToken, fixed: Math.max(0, b1 - perToken * t1) + reserve };
}

/** Splits dramBudget into its parts; E_BUDGET naming the bytes needed when it is too small. */
export function planMemory(c: KvMemoryConfig): MemoryPlan {
  const { layers, kvHeads, headDim } = c.shape;
  const es = elemBytes(c.dtype);
  const row = kvHeads * headDim * es;
  const cs = c.policyOptions.chunkSize;
  if (c.sealTokens % cs !== 0 || c.sealTokens < cs) fail('E_CONFIG', 'memory sealTokens', `a positive multiple of the chunk size ${cs}`, c.sealTokens);
  const slotsPerLayer = c.maxSequences * layers;
  const residentBytes = slotsPerLayer * 2 * (c.policyOptions.sinks + tailCapacity(c)) * row;
  const { perToken, fixed: indexFixed } = indexCost(c);
  const indexBytes = (indexFixed + perToken * c.maxTokens) * slotsPerLayer;
  const chunkBytes = 2 * cs * headDim * es;
  // Only SSD reads land in a fetch buffer (DRAM-tier and hot-tier pages are read where they lie):
  // without an SSD there is none to count.
  const fetchBytes = c.ssd ? c.concurrency * kvHeads * c.maxChunksPerHead * chunkBytes : 0;
  const ioBufferBytes = c.ssd?.engineInfo.bufferBytes ?? 0;
  const fixed = residentBytes + indexBytes + c.hotTierBytes + fetchBytes + c.selectArenaBytes + ioBufferBytes;
  const perChunk = chunkBytes + DramStore.metadataBytesPerSlot;
  const items = `sinks + tails ${residentBytes} + index ${indexBytes} (${perToken} B/token + ${indexFixed} B per layer) + hot tier ${c.hotTierBytes} + fetch buffers ${fetchBytes} + select arena ${c.selectArenaBytes} + I/O engine buffers ${ioBufferBytes}`;
  let dramBudget = c.dramBudget;
  // The DRAM tier's arena is at most DramStore.maxBlocks blocks of 1 GiB.
  const maxTierChunks = DramStore.maxChunks(chunkBytes);
  if (!c.ssd) {
    const chunks = slotsPerLayer * kvHeads * Math.ceil(c.maxTokens / cs);
    const need = fixed + chunks * perChunk;
    dramBudget ??= need;
    if (need > dramBudget)
      fail('E_BUDGET', 'dramBudget (no SSD store: DRAM holds every chunk)', `at least ${need} bytes = ${items} + DRAM tier ${chunks} chunks x ${perChunk}`, dramBudget);
    if (chunks > maxTierChunks)
      fail(
        'E_BUDGET',
        'memory model without an SSD store',
        `a DRAM tier of at most ${maxTierChunks} chunks (${DramStore.maxBlocks} arena blocks of ${DramStore.defaultBlockBytes} bytes): give an ssd store and a dramBudget (the DRAM tier then caches part of the sealed KV), or fewer maxSequences x maxTokens x layers`,
        `${chunks} chunks of ${chunkBytes} B to hold every declared token`,
      );
  } else if (dramBudget === undefined) {
    fail('E_CONFIG', 'dramBudget', 'a DRAM budget in bytes with an SSD store', undefined);
  } else if (fixed + perChunk * kvHeads > dramBudget) {
    fail('E_BUDGET', 'dramBudget', `at least ${fixed + perChunk * kvHeads} bytes = ${items} + a DRAM tier of one chunk per kv head`, dramBudget);
  }
  return {
    dramBudgetBytes: dramBudget,
    residentBytes,
    indexBytes,
    indexBytesPerToken: perToken,
    indexFixedBytes: indexFixed,
    hotTierBytes: c.hotTierBytes,
    fetchBytes,
    selectArenaBytes: c.selectArenaBytes,
    ioBufferBytes,
    // With an SSD store the tier takes the rest of the budget, up to the largest arena.
    dramTierBytes: Math.min(dramBudget - fixed, maxTierChunks * perChunk),
    kvBytesPerTokenLayer: 2 * row,
  };
}
