/**
 * Decode from the storage tiers, end to end (kvdrive.txt §7, DESIGN.md §3–§4): one sequence, every
 * layer. Prefill seals the prompt's KV into SSD segments laid out by the kvdrive index clusters
 * (each cluster's chunks contiguous in one extent) and warms the DRAM tier by importance (attention
 * mass of an observation window). Each decode step of a layer then runs
 *   select (kvdrive index) → fetch the selected chunks (DRAM, else a staged prefetch, else SSD
 *   extents, coalesced, read while DRAM hits are copied) → exact attention over sinks + selected
 *   chunks + tail in token order → output → SSD-read chunks admitted into DRAM by the attention
 *   mass they just received,
 * and, with a lookahead pool (`pool` > 0), prefetches the pool's non-resident chunks for the
 * layer's next step (sparse synchronization); a prefetch none of whose chunks the next selection
 * picks is cancelled. With a hot tier (src/cache/hot-tier.ts) in front, its residents are attended
 * from their slots and only the other selected chunks go through DRAM/SSD, then into the hot tier.
 *
 * Memory: the DRAM store's budget is a hard limit (see {@link DramStore}). Outside it, stated: the
 * selection index, the sinks and the in-memory tail (the last `local` prompt tokens plus every
 * decoded token: decoded tokens are never offloaded in this version), one fetch buffer (budget
 * tokens x kv heads, page-first) and the TieredKv staging pool.
 *
 * Outputs do not depend on the tier that served a chunk: attention reads the same rows in the same
 * order (see native/tiered_attention.cc), so they are bit-identical to attendSparse over the
 * contiguous cache with the same selection.
 */
import { z } from 'zod';
import { fail, KvdriveError } from '../errors.js';
import { native } from '../native.js';
import type { KvTensor } from '../types.js';
import type { Selection } from '../index/selection.js';
import type { PolicyOptions } from '../index/options.js';
import { createPolicy, NativeSelectionPolicy, type SelectionPolicy } from '../index/policy.js';
import { importanceScoresAsync, rankChunks, type ObservationWindow } from '../cache/warmup.js';
import type { HotTier } from '../cache/hot-tier.js';
import type { DramStore } from './dram-store.js';
import { parseOptions } from './io-engine.js';
import type { ClusterLayout, SsdStore } from './ssd-store.js';
import { TieredKv, type FetchStats, type PrefetchHandle } from './tiered-kv.js';

/** Options of {@link attendFetched}. */
export interface AttendFetchedOptions {
  /** Queries, Float32Array(qHeads * dim), finite. */
  q: Float32Array;
  qHeads: number;
  /** Token-major K/V of tokens [0, sink.tokens), sink.tokens >= selection.sinkEnd. */
  sink: { k: KvTensor; v: KvTensor };
  /** Token-major K/V of tokens [tailBase, tailBase + tail.tokens), covering [selection.tailStart, selection.tokens). */
  tail: { k: KvTensor; v: KvTensor };
  /** First token of `tail`; <= selection.tailStart. */
  tailBase: number;
  /** What each kv head attends (chunk ids ascending per head, < ceil(tailStart / chunkSize)). */
  selection: Selection;
  /** Page-first chunks (a TieredKv fetch buffer): entry i = selection.chunkIds[i], or fetchedIds[i] when given. */
  fetched: Uint8Array;
  /** kvHeads + 1 offsets and ascending ids per kv head of the chunks `fetched` holds (default: the selection's). */
  fetchedOffsets?: Int32Array;
  fetchedIds?: Int32Array;
  /** Read selected chunks resident in this hot tier (all rows) from their slots; records their mass for eviction. */
  hot?: { handle: number; sequence?: number; layer: number };
  /** Softmax scale, default 1/sqrt(dim). */
  scale?: number;
}

/** Output of {@link attendFetched}: as attendSparse's (out, lse, chunkMass per selected chunk). */
export interface FetchedAttentionResult {
  out: Float32Array;
  lse: Float32Array;
  chunkMass: Float32Array;
}

/**
 * Exact attention over sinks and tail held in memory plus chunks staged page-first by the tiers;
 * bit-identical to attendSparse over a contiguous cache holding the same rows. Off the JS thread.
 */
export function attendFetchedAsync(o: AttendFetchedOptions): Promise<FetchedAttentionResult> {
  return native.attendFetchedAsync(o) as Promise<FetchedAttentionResult>;
}

/** {@link attendFetchedAsync} on the calling thread. */
export function attendFetched(o: AttendFetchedOptions): FetchedAttentionResult {
  return native.attendFetched(o) as FetchedAttentionResult;
}

/** Options of {@link TieredAttention.open}. */
export interface TieredAttentionOptions {
  /** The SSD store (its shape fixes layers, kv heads, head dim, dtype and chunk size). */
  ssd: SsdStore;
  /** The DRAM tier (its budget is a hard limit). */
  dram: DramStore;
  /** Segment ids are `${sequence}.${i}`; [A-Za-z0-9_-], 1-100 characters, not yet in the store. */
  sequence: string;
  /** Query heads (a multiple of the store's kv heads). */
  qHeads: number;
  /** Tokens selected per kv head and step beside sinks and tail (integer >= chunkSize). */
  budget: number;
  /**
   * Lookahead pool in tokens per kv head (>= budget) whose non-resident chunks are prefetched for
   * the layer's next step; 0 (the default) disables prefetch. Off by default because on the
   * synthetic decode traces measured so far (bench/storage.md, "decode") the pool predicted few of
   * the next step's misses (about 2% of the staged bytes were used), so the extra reads and
   * checksums cost more CPU than the latency they hid on a 2-core host.
   */
  pool?: number;
  /** Decode steps the in-memory tail can hold per layer (>= 1). */
  maxDecodeTokens: number;
  /**
   * kvdrive index options (chunkSize must equal the store's; segmentTokens is also the sealed
   * segment size; tokensPerCluster sets the extent size on SSD).
   */
  policy?: Omit<PolicyOptions, 'qHeads' | 'kvHeads' | 'headDim'>;
  /** TieredKv staging buffers for prefetch (default 2) and their size in bytes (default 8 MiB). */
  stagingBuffers?: number;
  stagingBytes?: number;
  /**
   * Hot tier in front of DRAM (same layers, kv heads, head dim, dtype, chunk size; its budget >=
   * `budget`): warmed at prefill with the most important chunks (DRAM is warmed inclusively: it
   * holds them too), then per step its residents are
   * attended from their slots, only the other selected chunks are fetched (DRAM, else SSD) and
   * admitted into it (lookahead eviction). The caller owns it (destroy it after close).
   */
  hotTier?: HotTier;
  /** Sequence index of this sequence in the hot tier (default 0). */
  hotSequence?: number;
}

const optionsSchema = z
  .object({
    ssd: z.custom<SsdStore>((v) => typeof v === 'object' && v !== null, 'an SsdStore'),
    dram: z.custom<DramStore>((v) => typeof v === 'object' && v !== null, 'a DramStore'),
    sequence: z.string().regex(/^[A-Za-z0-9_-]{1,100}$/),
    qHeads: z.number().int().min(1).max(65536),
    budget: z.number().int().min(1).max(2 ** 30),
    pool: z.number().int().min(0).max(2 ** 30).optional(),
    maxDecodeTokens: z.number().int().min(1).max(2 ** 24),
    policy: z.record(z.string(), z.unknown()).optional(),
    stagingBuffers: z.number().int().min(0).max(64).optional(),
    stagingBytes: z.number().int().min(1).max(2 ** 31).optional(),
    hotTier: z.custom<HotTier>((v) => typeof v === 'object' && v !== null && typeof (v as HotTier).handle === 'number', 'a HotTier').optional(),
    hotSequence: z.number().int().min(0).optional(),
  })
  .strict();

/** One prompt layer handed to {@link TieredAttention.prefill}. */
export interface PrefillLayer {
  /** Prompt keys/values, token-major, tokens = promptTokens (a multiple of chunkSize). */
  k: KvTensor;
  v: KvTensor;
  /** Observation window for importance-guided DRAM warm-up; without it DRAM fills on demand. */
  obs?: ObservationWindow;
}

/** What prefill did. */
export interface PrefillStats {
  segments: number;
  /** Bytes written to SSD (extent files). */
  ssdBytes: number;
  /** Chunks admitted into DRAM by importance. */
  dramWarmed: number;
  /** Chunks placed in the hot tier by importance. */
  hotWarmed: number;
  /** Milliseconds: index build, SSD write, warm-up. */
  buildMs: number;
  writeMs: number;
  warmMs: number;
}

/** One layer-step. */
export interface TieredStepResult extends FetchedAttentionResult {
  selection: Selection;
  stats: TieredStepStats;
}

/** Per layer-step traffic and time. */
export interface TieredStepStats {
  /** Selected chunks (all kv heads). */
  chunks: number;
  /** Chunk bytes attended from hot-tier slots (resident before this step). */
  hotBytes: number;
  /** Chunks admitted into / evicted from the hot tier this step. */
  hotAdmitted: number;
  hotEvicted: number;
  /** Chunk bytes served by DRAM / by a staged prefetch (read from SSD earlier) / read from SSD now. */
  dramBytes: number;
  prefetchedBytes: number;
  ssdBytes: number;
  /** Bytes the device transferred in this step's own reads (whole extents). */
  ssdReadBytes: number;
  /** Chunks newly promoted into DRAM. */
  promoted: number;
  /** Prefetch started for the next step (chunks), and whether the previous one was cancelled. */
  prefetchChunks: number;
  prefetchCancelled: boolean;
  selectMs: number;
  fetchMs: number;
  attendMs: number;
  ms: number;
}

interface LayerState {
  policy: SelectionPolicy;
  /** Last known attention mass per (kv head, chunk): h * chunks + c (importance for DRAM residency). */
  mass: Float32Array;
  sink: { k: KvTensor; v: KvTensor };
  /** Tail tensors with capacity for the decode tokens; `tokens` grows per step. */
  tailK: KvTensor;
  tailV: KvTensor;
  tailTokens: number;
  /** Decode steps done. */
  steps: number;
  prefetch?: { handle: PrefetchHandle; ids: Set<number> };
}

function elemBytes(t: KvTensor): number {
  return t.dtype === 'f32' ? 4 : 2;
}

/** Copy of tokens [a, b) of a token-major tensor into a new tensor with `capacity` tokens. */
function copyTokens(t: KvTensor, a: number, b: number, capacity: number): KvTensor {
  const row = t.heads * t.dim;
  const data = t.dtype === 'f32' ? new Float32Array(capacity * row) : new Uint16Array(capacity * row);
  (data as Float32Array).set((t.data as Float32Array).subarray(a * row, b * row));
  return { data, dtype: t.dtype, tokens: b - a, heads: t.heads, dim: t.dim };
}

function view(t: KvTensor, tokens: number): KvTensor {
  return { ...t, tokens, data: t.data.subarray(0, tokens * t.heads * t.dim) };
}

/**
 * Tiered decode of one sequence. Create with {@link TieredAttention.open}, seal the prompt with
 * {@link prefill}, then call {@link step} per layer and decode position.
 */
export class TieredAttention {
  readonly qHeads: number;
  readonly budget: number;
  readonly pool: number;
  promptTokens = 0;
  private readonly o: TieredAttentionOptions;
  private readonly layers: LayerState[] = [];
  private kv?: TieredKv;
  private fetchBuf = new Uint8Array(0);
  private segmentIds: string[] = [];
  private closed = false;

  private constructor(o: TieredAttentionOptions) {
    this.o = o;
    this.qHeads = o.qHeads;
    this.budget = o.budget;
    this.pool = o.pool ?? 0;
  }

  /** Validates the options (E_CONFIG / E_SHAPE / E_BUDGET); nothing is written yet. */
  static open(options: TieredAttentionOptions): TieredAttention {
    const o = parseOptions(optionsSchema, options, 'TieredAttention options') as TieredAttentionOptions;
    const s = o.ssd.shape;
    if (o.dram.chunkBytes !== o.ssd.chunkBytes || JSON.stringify(o.dram.shape) !== JSON.stringify(s))
      fail('E_CONFIG', 'TieredAttention options.dram', `a DRAM store of the SSD store's shape ${JSON.stringify(s)}`, JSON.stringify(o.dram.shape));
    if (o.qHeads % s.kvHeads !== 0) fail('E_SHAPE', 'TieredAttention options.qHeads', `a multiple of kvHeads ${s.kvHeads}`, o.qHeads);
    if (o.budget < s.chunkSize) fail('E_BUDGET', 'TieredAttention options.budget', `at least one chunk (${s.chunkSize} tokens)`, o.budget);
    const pool = o.pool ?? 0;
    if (pool !== 0 && pool < o.budget) fail('E_BUDGET', 'TieredAttention options.pool', `0 or at least the budget ${o.budget}`, pool);
    if (o.hotTier) {
      const h = o.hotTier.options;
      const want = `${s.layers} layers x ${s.kvHeads} kv heads x ${s.headDim} ${s.dtype}, chunk ${s.chunkSize}`;
      if (h.layers !== s.layers || h.kvHeads !== s.kvHeads || h.headDim !== s.headDim || h.dtype !== s.dtype || h.chunkSize !== s.chunkSize)
        fail('E_SHAPE', 'TieredAttention options.hotTier', `a hot tier of the store's shape (${want})`, `${h.layers} x ${h.kvHeads} x ${h.headDim} ${h.dtype}, chunk ${h.chunkSize}`);
      if (h.budget < o.budget) fail('E_BUDGET', 'TieredAttention options.hotTier budget', `at least the selection budget ${o.budget}`, h.budget);
      if ((o.hotSequence ?? 0) >= h.sequences) fail('E_RANGE', 'TieredAttention options.hotSequence', `an index below the hot tier's ${h.sequences} sequences`, o.hotSequence);
    }
    const cs = (o.policy as PolicyOptions | undefined)?.chunkSize;
    if (cs !== undefined && cs !== s.chunkSize) fail('E_CONFIG', 'TieredAttention options.policy.chunkSize', `the store's chunk size ${s.chunkSize}`, cs);
    return new TieredAttention(o);
  }

  private check(): void {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'TieredAttention: expected an open instance, got a closed one');
  }

  /** The sealed segment ids, in token order. */
  get segments(): readonly string[] {
    return this.segmentIds;
  }

  /** The tiered fetcher (after prefill), for its cumulative counters. */
  get tiers(): TieredKv {
    if (!this.kv) throw new KvdriveError('E_CONFIG', 'TieredAttention: expected prefill to have run, got none');
    return this.kv;
  }

  /**
   * End of prefill: builds the kvdrive index of every layer, seals the prompt into SSD segments
   * (extents = index clusters), warms DRAM with the most important chunks (when observation
   * windows are given) and keeps sinks and tail in memory.
   */
  async prefill(layers: PrefillLayer[]): Promise<PrefillStats> {
    this.check();
    if (this.kv) fail('E_CONFIG', 'TieredAttention.prefill', 'one prefill per instance', 'a second call');
    const s = this.o.ssd.shape;
    if (!Array.isArray(layers) || layers.length !== s.layers) fail('E_SHAPE', 'prefill layers', `an array of ${s.layers} layers`, layers);
    const T = layers[0]!.k.tokens;
    if (!Number.isInteger(T) || T < s.chunkSize || T % s.chunkSize !== 0)
      fail('E_SHAPE', 'prefill prompt tokens', `a positive multiple of chunkSize ${s.chunkSize}`, T);
    layers.forEach((l, i) => {
      for (const t of [l.k, l.v])
        if (!t || t.tokens !== T || t.heads !== s.kvHeads || t.dim !== s.headDim || t.dtype !== s.dtype || (t.layout ?? 'thd') !== 'thd')
          fail('E_SHAPE', `prefill layers[${i}] k/v`, `${T} x ${s.kvHeads} x ${s.headDim} ${s.dtype} token-major`, t ? `${t.tokens} x ${t.heads} x ${t.dim} ${t.dtype} ${t.layout ?? 'thd'}` : t);
    });
    this.promptTokens = T;
    const popts: PolicyOptions = { ...(this.o.policy as PolicyOptions | undefined), chunkSize: s.chunkSize, qHeads: this.qHeads, kvHeads: s.kvHeads, headDim: s.headDim };
    const t0 = performance.now();
    const policies: SelectionPolicy[] = [];
    for (const l of layers) {
      const p = createPolicy('kvdrive', popts);
      await p.build(l.k, T);
      policies.push(p);
    }
    const resolved = (policies[0] as NativeSelectionPolicy).options;
    const segTokens = resolved.segmentTokens;
    const t1 = performance.now();

    // Seal: one SSD segment per index segment, extents = that segment's clusters.
    const chunks = T / s.chunkSize;
    const segChunks = segTokens / s.chunkSize;
    let ssdBytes = 0;
    const segData: Array<{ id: string; first: number; end: number }> = [];
    for (let first = 0, i = 0; first < chunks; first += segChunks, i++) {
      const end = Math.min(chunks, first + segChunks);
      const id = `${this.o.sequence}.${i}`;
      const data = layers.map((l) => ({ k: sliceTokens(l.k, first * s.chunkSize, end * s.chunkSize), v: sliceTokens(l.v, first * s.chunkSize, end * s.chunkSize) }));
      const clusters: ClusterLayout[] = [];
      for (let l = 0; l < s.layers; l++)
        for (let h = 0; h < s.kvHeads; h++) clusters.push(clusterLayout(policies[l] as NativeSelectionPolicy, h, first, end));
      const info = await this.o.ssd.writeSegment(id, { layers: data, clusters });
      ssdBytes += info.bytes;
      segData.push({ id, first, end });
      this.segmentIds.push(id);
    }
    const t2 = performance.now();

    this.kv = new TieredKv({
      ssd: this.o.ssd,
      dram: this.o.dram,
      segments: this.segmentIds,
      stagingBuffers: this.pool ? this.o.stagingBuffers : 0,
      stagingBytes: this.o.stagingBytes,
      // Chunks are admitted into DRAM after attention, with the mass they just received (see step).
      promote: false,
    });

    // Importance-guided placement: everything is on SSD; the most important chunks go to DRAM.
    const masses: Float32Array[] = [];
    for (const l of layers) masses.push(l.obs ? await importanceScoresAsync(l.k, l.obs, s.chunkSize) : new Float32Array(s.kvHeads * chunks));
    // The most important chunks go to the hot tier; DRAM takes the most important ones too (hot
    // residents included, so a chunk the hot tier evicts later is still a DRAM hit: measured, an
    // exclusive DRAM made those SSD misses and cost more than the duplicate bytes).
    let hotWarmed = 0;
    const hot = this.o.hotTier;
    const sinkTokens = Math.min(resolved.sinks, T);
    const local = resolved.local;
    const tailBase = Math.max(0, Math.floor((T - local - s.chunkSize) / s.chunkSize) * s.chunkSize);
    if (hot) {
      layers.forEach((l, i) => {
        if (!l.obs) return;
        const ranked = rankChunks(masses[i]!, s.kvHeads, s.chunkSize, sinkTokens, tailBase);
        const placed = hot.warm({ sequence: this.o.hotSequence ?? 0, layer: i, k: l.k, v: l.v, ...ranked });
        for (const n of placed) hotWarmed += n;
      });
    }
    let dramWarmed = 0;
    if (layers.some((l) => l.obs)) {
      for (const seg of segData) {
        const n = seg.end - seg.first;
        const scores = new Float32Array(s.layers * s.kvHeads * n);
        for (let l = 0; l < s.layers; l++)
          for (let h = 0; h < s.kvHeads; h++) scores.set(masses[l]!.subarray(h * chunks + seg.first, h * chunks + seg.end), (l * s.kvHeads + h) * n);
        const data = layers.map((l) => ({ k: sliceTokens(l.k, seg.first * s.chunkSize, seg.end * s.chunkSize), v: sliceTokens(l.v, seg.first * s.chunkSize, seg.end * s.chunkSize) }));
        dramWarmed += this.o.dram.warm(seg.id, { layers: data }, scores);
      }
    }
    const t3 = performance.now();

    // Sinks and the tail stay in memory (never offloaded); the tail starts at the first token the
    // index may leave out of its chunks (the local window, rounded down to a chunk).
    this.tailBase = tailBase;
    layers.forEach((l, i) => {
      this.layers.push({
        policy: policies[i]!,
        mass: masses[i]!,
        sink: { k: copyTokens(l.k, 0, sinkTokens, sinkTokens), v: copyTokens(l.v, 0, sinkTokens, sinkTokens) },
        tailK: copyTokens(l.k, tailBase, T, T - tailBase + this.o.maxDecodeTokens),
        tailV: copyTokens(l.v, tailBase, T, T - tailBase + this.o.maxDecodeTokens),
        tailTokens: T - tailBase,
        steps: 0,
      });
    });
    return { segments: this.segmentIds.length, ssdBytes, dramWarmed, hotWarmed, buildMs: t1 - t0, writeMs: t2 - t1, warmMs: t3 - t2 };
  }

  /** First token of the in-memory tail. */
  tailBase = 0;

  /**
   * One decode step of one layer: appends the position's own K/V (kNew, vNew: one token each) to
   * the tail, selects with the kvdrive index, fetches, attends, and prefetches for the next step.
   */
  async step(layer: number, q: Float32Array, kNew: KvTensor, vNew: KvTensor): Promise<TieredStepResult> {
    const st = this.layerState(layer);
    const s = this.o.ssd.shape;
    if (st.steps >= this.o.maxDecodeTokens) fail('E_BUDGET', `step layer ${layer}`, `at most maxDecodeTokens = ${this.o.maxDecodeTokens} steps`, st.steps + 1);
    for (const [name, t] of [['kNew', kNew], ['vNew', vNew]] as const)
      if (!t || t.tokens !== 1 || t.heads !== s.kvHeads || t.dim !== s.headDim || t.dtype !== s.dtype || t.data.length !== s.kvHeads * s.headDim)
        fail('E_SHAPE', `step ${name}`, `one token of ${s.kvHeads} x ${s.headDim} ${s.dtype}`, t ? `${t.tokens} x ${t.heads} x ${t.dim} ${t.dtype}` : t);
    if (!(q instanceof Float32Array) || q.length !== this.qHeads * s.headDim) fail('E_SHAPE', 'step q', `a Float32Array(${this.qHeads * s.headDim})`, q);
    const t0 = performance.now();
    const sel = st.policy.select(q, this.budget, this.pool ? { pool: this.pool } : undefined);
    const selectMs = performance.now() - t0;
    // The index covers the prompt; the decoded tokens are attended from the tail.
    const row = s.kvHeads * s.headDim;
    (st.tailK.data as Float32Array).set(kNew.data as Float32Array, st.tailTokens * row);
    (st.tailV.data as Float32Array).set(vNew.data as Float32Array, st.tailTokens * row);
    st.tailTokens++;
    st.steps++;
    const full: Selection = { ...sel, tokens: this.promptTokens + st.steps };
    let r: TieredStepResult;
    try {
      r = await this.attendSelection(layer, q, full, { selectMs, t0 });
    } catch (e) {
      // The step did not happen: a retry of this position appends its token again.
      st.tailTokens--;
      st.steps--;
      throw e;
    }
    // Sparse synchronization: prefetch the pool's non-resident chunks for this layer's next step.
    if (this.pool && sel.poolIds && sel.poolOffsets) {
      let offsets = sel.poolOffsets;
      let chunkIds = sel.poolIds;
      const hot = this.o.hotTier;
      if (hot) {
        // Hot-tier residents need no prefetch (TieredKv skips DRAM-resident ones itself).
        const keep: number[] = [];
        offsets = new Int32Array(s.kvHeads + 1);
        for (let h = 0; h < s.kvHeads; h++) {
          const res = new Set(hot.residents(layer, h, this.o.hotSequence ?? 0));
          for (let i = sel.poolOffsets[h]!; i < sel.poolOffsets[h + 1]!; i++) if (!res.has(sel.poolIds[i]!)) keep.push(sel.poolIds[i]!);
          offsets[h + 1] = keep.length;
        }
        chunkIds = Int32Array.from(keep);
      }
      const req = { layer, offsets, chunkIds, scores: this.scoresOf(st, offsets, chunkIds) };
      const handle = this.tiers.prefetch(req);
      if (handle) {
        const ids = new Set<number>();
        for (let h = 0; h < s.kvHeads; h++) for (let i = offsets[h]!; i < offsets[h + 1]!; i++) ids.add(h * this.tiers.totalChunks + chunkIds[i]!);
        st.prefetch = { handle, ids };
        r.stats.prefetchChunks = handle.chunks;
      }
    }
    r.stats.ms = performance.now() - t0;
    return r;
  }

  private layerState(layer: number): LayerState {
    this.check();
    if (!this.kv) throw new KvdriveError('E_CONFIG', 'TieredAttention: expected prefill before decode steps, got none');
    if (!Number.isInteger(layer) || layer < 0 || layer >= this.layers.length) fail('E_RANGE', 'layer', `an integer in [0, ${this.layers.length})`, layer);
    return this.layers[layer]!;
  }

  private scoresOf(st: LayerState, offsets: Int32Array, ids: Int32Array): Float32Array {
    const n = this.tiers.totalChunks;
    const out = new Float32Array(ids.length);
    for (let h = 0; h + 1 < offsets.length; h++) for (let i = offsets[h]!; i < offsets[h + 1]!; i++) out[i] = st.mass[h * n + ids[i]!]!;
    return out;
  }

  /**
   * Fetch + attention for a given selection of one layer (tokens = prompt + steps done so far;
   * chunk ids ascending per kv head, inside the prompt). {@link step} uses it after selecting; tests
   * use it to attend a chosen selection from whichever tier holds the chunks.
   */
  async attendSelection(layer: number, q: Float32Array, selection: Selection, timing?: { selectMs: number; t0: number }): Promise<TieredStepResult> {
    const st = this.layerState(layer);
    const s = this.o.ssd.shape;
    const t0 = timing?.t0 ?? performance.now();
    let prefetchCancelled = false;
    if (st.prefetch) {
      // Cancel a prefetch whose chunks the new selection does not need at all.
      const { handle, ids } = st.prefetch;
      st.prefetch = undefined;
      let needed = false;
      for (let h = 0; h < s.kvHeads && !needed; h++)
        for (let i = selection.offsets[h]!; i < selection.offsets[h + 1]!; i++)
          if (ids.has(h * this.tiers.totalChunks + selection.chunkIds[i]!)) {
            needed = true;
            break;
          }
      if (!needed) {
        await this.tiers.cancel(handle);
        prefetchCancelled = true;
      }
    }
    const n = selection.chunkIds.length;
    const cb = this.o.ssd.chunkBytes;
    const hot = this.o.hotTier;
    const hotSeq = this.o.hotSequence ?? 0;
    // What the tiers below must supply: the selection, or with a hot tier its non-resident chunks
    // (need[j] = selection entry of fetch entry j).
    let need = { offsets: selection.offsets, chunkIds: selection.chunkIds };
    let entryOf: Int32Array | undefined;
    if (hot) {
      const offsets = new Int32Array(s.kvHeads + 1);
      const ids: number[] = [];
      const from: number[] = [];
      for (let h = 0; h < s.kvHeads; h++) {
        const res = hot.residents(layer, h, hotSeq);
        let r = 0;
        for (let i = selection.offsets[h]!; i < selection.offsets[h + 1]!; i++) {
          const c = selection.chunkIds[i]!;
          while (r < res.length && res[r]! < c) r++;
          if (r < res.length && res[r] === c) continue;
          ids.push(c);
          from.push(i);
        }
        offsets[h + 1] = ids.length;
      }
      need = { offsets, chunkIds: Int32Array.from(ids) };
      entryOf = Int32Array.from(from);
    }
    const m = need.chunkIds.length;
    if (this.fetchBuf.length < m * cb) this.fetchBuf = new Uint8Array(m * cb);
    const tf = performance.now();
    const f: FetchStats = await this.tiers.fetch(
      { layer, offsets: need.offsets, chunkIds: need.chunkIds, chunkSize: selection.chunkSize, scores: this.scoresOf(st, need.offsets, need.chunkIds) },
      this.fetchBuf,
    );
    let hotStats = { admitted: 0, evictions: 0 };
    if (hot)
      hotStats = native.hotTierAdmitPages({
        hot: { handle: hot.handle, sequence: hotSeq, layer },
        selection,
        tokens: this.promptTokens,
        pages: this.fetchBuf,
        pageOffsets: need.offsets,
        pageIds: need.chunkIds,
      }) as { admitted: number; evictions: number };
    const ta = performance.now();
    const r = await attendFetchedAsync({
      q,
      qHeads: this.qHeads,
      sink: st.sink,
      tail: { k: view(st.tailK, st.tailTokens), v: view(st.tailV, st.tailTokens) },
      tailBase: this.tailBase,
      selection,
      fetched: this.fetchBuf,
      ...(hot ? { fetchedOffsets: need.offsets, fetchedIds: need.chunkIds, hot: { handle: hot.handle, sequence: hotSeq, layer } } : {}),
    });
    const te = performance.now();
    // Decode attention mass is the chunks' importance from now on: it ranks DRAM residency, and
    // chunks served from SSD are admitted into DRAM when it beats the least important resident.
    const N = this.tiers.totalChunks;
    for (let h = 0; h < s.kvHeads; h++)
      for (let i = selection.offsets[h]!; i < selection.offsets[h + 1]!; i++) st.mass[h * N + selection.chunkIds[i]!] = r.chunkMass[i]!;
    const needMass = entryOf ? Float32Array.from(entryOf, (i) => r.chunkMass[i]!) : r.chunkMass;
    const promoted = this.tiers.admit({ layer, offsets: need.offsets, chunkIds: need.chunkIds, scores: needMass }, this.fetchBuf);
    return {
      ...r,
      selection,
      stats: {
        chunks: n,
        hotBytes: (n - m) * cb,
        hotAdmitted: hotStats.admitted,
        hotEvicted: hotStats.evictions,
        dramBytes: f.dramBytes,
        prefetchedBytes: f.prefetchedBytes,
        ssdBytes: f.ssdBytes,
        ssdReadBytes: f.ssdReadBytes,
        promoted,
        prefetchChunks: 0,
        prefetchCancelled,
        selectMs: timing?.selectMs ?? 0,
        fetchMs: ta - tf,
        attendMs: te - ta,
        ms: te - t0,
      },
    };
  }

  /** Cancels outstanding prefetches; the stores stay open (they belong to the caller). Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.kv?.close();
  }
}

function sliceTokens(t: KvTensor, a: number, b: number): KvTensor {
  const row = t.heads * t.dim;
  return { data: t.data.subarray(a * row, b * row), dtype: t.dtype, tokens: b - a, heads: t.heads, dim: t.dim };
}

/**
 * On-disk order of chunks [first, end) of one (layer, kv head): the kvdrive index clusters inside
 * that range, each one extent; chunks the index does not cover (sinks, the local window) follow in
 * token order, four per extent.
 */
export function clusterLayout(policy: NativeSelectionPolicy, head: number, first: number, end: number): ClusterLayout {
  const n = end - first;
  const seen = new Uint8Array(n);
  const ids: number[] = [];
  const offsets = [0];
  for (const seg of policy.clusters(head)) {
    if (seg.endChunk <= first || seg.firstChunk >= end) continue;
    for (let c = 0; c < seg.k; c++) {
      let added = 0;
      for (let m = seg.offsets[c]!; m < seg.offsets[c + 1]!; m++) {
        const j = seg.members[m]! - first;
        if (j < 0 || j >= n || seen[j]) continue;
        seen[j] = 1;
        ids.push(j);
        added++;
      }
      if (added) offsets.push(ids.length);
    }
  }
  let run = 0;
  for (let j = 0; j < n; j++) {
    if (seen[j]) continue;
    ids.push(j);
    if (++run === 4) {
      offsets.push(ids.length);
      run = 0;
    }
  }
  if (offsets[offsets.length - 1] !== ids.length) offsets.push(ids.length);
  return { offsets: Int32Array.from(offsets), chunkIds: Int32Array.from(ids) };
}
