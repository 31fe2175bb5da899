/**
 * The decode stages of one layer step over a micro-batch slot of the shared arena:
 *   selection: per entry, seal new chunks into the (sequence, layer) index and select the critical
 *              chunks for its query → selMeta / selOffsets / selIds of the slot
 *   compute:   per entry, exact sparse attention over sinks + selected chunks + tail, reading K/V
 *              from the shared sequence store → out / lse of the slot
 * The SAME code runs on the main thread in sequential mode and in stage workers in pipelined mode
 * (this file is also the stage module: `createStage`), which is what makes both modes produce
 * bit-identical outputs.
 *
 * With a hot tier (src/cache/hot-tier.ts, reached by its native handle from any thread) a third
 * stage runs between them:
 *   fetch:     per entry, hit/miss of the selected chunks against the tier's residents, eviction,
 *              admission of misses copied from the store
 * and compute reads chunks from their hot-tier slots (bit-identical to reading the store).
 * Without a hot tier, compute reads the shared DRAM store directly.
 *
 * SSD-backed (init.ssd): every prefilled prompt is also a sealed SsdStore segment, and the fetch
 * stage reads the selected chunks of the prompt from it (native.segmentRead: async I/O on the
 * engine's threads / io_uring, reached by segment handle from any thread) into the slot's `staged`
 * region; compute attends over them there (native.attendStaged) and over sinks, tail and newer
 * chunks in DRAM. The DRAM copy of those prompt VALUES is poisoned with NaN by the runtime, so a
 * chunk that was not read from SSD cannot go unnoticed (E_NONFINITE); keys stay in DRAM for the
 * selection index (build, and rebuild after a worker crash).
 */
import { KvdriveError } from '../errors.js';
import { NativeSelectionPolicy, createPolicy, type SelectionPolicy } from '../index/policy.js';
import type { ClusterLayout } from '../storage/ssd-store.js';
import type { PolicyOptions } from '../index/options.js';
import type { PolicyName, Selection } from '../index/selection.js';
import { attendSparse } from '../attention/kernels.js';
import type { ModelShape } from '../types.js';
import { SharedArena, decodeSlotRegions, type ArenaLayout } from './shared-arena.js';
import { SequenceStore, type SequenceStoreLayout } from './sequence-store.js';
import type { StageContext, StageHandlers } from './stage-contract.js';
import { native } from '../native.js';

export type DecodeRegions = ReturnType<typeof decodeSlotRegions>;

/** Everything a decode stage needs; structured-cloneable (buffers are shared). */
export interface DecodeInit {
  shape: ModelShape;
  /** Tokens per kv head per step beside sinks and tail. */
  budget: number;
  policy: PolicyName;
  policyOptions: PolicyOptions;
  /** Capacity of selIds per (entry, kv head). */
  maxChunksPerHead: number;
  store: { buffer: SharedArrayBuffer; layout: SequenceStoreLayout };
  arena: { buffer: SharedArrayBuffer; layout: ArenaLayout<DecodeRegions> };
  /** Native handle of the hot tier (sequences = store's maxSequences), or undefined for none. */
  hotTier?: number;
  /**
   * SSD-backed prompts: Int32 words [(seq * layers + layer) * 2 + 0] = native segment handle of that
   * prompt (-1: none), [... + 1] = chunks readable from it (whole prompt chunks). Written by the
   * runtime before the layer becomes attendable; read by the fetch and compute stages.
   */
  ssd?: { segments: SharedArrayBuffer; chunkSize: number };
}

/** Control requests of the selection stage. */
export type DecodeControl =
  /** layoutChunks: also return the SSD extent layout of chunks [0, layoutChunks) (see clusterLayout). */
  | { type: 'build'; seq: number; layer: number; tokens: number; layoutChunks?: number }
  | { type: 'drop'; seq: number };

/** Words of the slot's `timing` region, summed over the slot's entries (times in ms). */
export const TIMING_SELECTION = 0;
export const TIMING_COMPUTE = 1;
export const TIMING_FETCH = 2;
/** Selected chunks found resident / not resident in the hot tier. */
export const TIMING_HITS = 3;
export const TIMING_MISSES = 4;
/** Hot tier hit/miss evaluation, eviction and admission copies (ms); part of the fetch stage. */
export const TIMING_HITMISS = 5;
/** SSD-backed: chunks and bytes (payload) read from SSD by the fetch stage. */
export const TIMING_SSD_CHUNKS = 6;
export const TIMING_SSD_BYTES = 7;
/** SSD-backed: bytes the device transferred (whole extents, alignment): read amplification = this / payload. */
export const TIMING_SSD_READ_BYTES = 8;

/**
 * The on-disk order of chunks [0, n) of one kv head: the index's k-means clusters (kvdrive policy)
 * one extent each — selection takes chunks cluster by cluster, so a selected cluster is one
 * sequential read — then the chunks no cluster holds (sinks, tail at build time; every chunk for
 * the quest / shadowkv policies) in runs of at most 4 consecutive chunks.
 */
export function clusterLayout(policy: SelectionPolicy, head: number, n: number): ClusterLayout {
  const seen = new Uint8Array(n);
  const offsets = [0];
  const ids: number[] = [];
  const segs = policy instanceof NativeSelectionPolicy ? policy.clusters(head) : [];
  for (const seg of segs)
    for (let c = 0; c < seg.k; c++) {
      const before = ids.length;
      for (let i = seg.offsets[c]!; i < seg.offsets[c + 1]!; i++) {
        const id = seg.members[i]!;
        if (id < n && !seen[id]) {
          seen[id] = 1;
          ids.push(id);
        }
      }
      if (ids.length > before) offsets.push(ids.length);
    }
  for (let id = 0; id < n; ) {
    if (seen[id]) {
      id++;
      continue;
    }
    let run = 0;
    while (id < n && !seen[id] && run < 4) {
      ids.push(id++);
      run++;
    }
    offsets.push(ids.length);
  }
  return { offsets: Int32Array.from(offsets), chunkIds: Int32Array.from(ids) };
}

/** Selection indexes and views of one thread. */
export class DecodeState {
  readonly init: DecodeInit;
  private readonly store: SequenceStore;
  private readonly arena: SharedArena<DecodeRegions>;
  /** (seq * layers + layer) → index of that sequence's layer. Owned by the selection thread only. */
  private readonly policies = new Map<number, SelectionPolicy>();
  /** SSD-backed: see DecodeInit.ssd. */
  private readonly ssdSegments: Int32Array | undefined;

  constructor(init: DecodeInit) {
    this.init = init;
    this.ssdSegments = init.ssd ? new Int32Array(init.ssd.segments) : undefined;
    this.store = SequenceStore.attach(init.store.buffer, init.store.layout);
    this.arena = SharedArena.attach(init.arena.buffer, init.arena.layout);
  }

  /** Builds (or rebuilds) the index of (seq, layer) over its first `tokens` keys; drops a sequence. */
  async control(req: DecodeControl): Promise<ClusterLayout[] | undefined> {
    const L = this.init.shape.layers;
    if (req.type === 'drop') {
      for (let l = 0; l < L; l++) this.policies.delete(req.seq * L + l);
      return;
    }
    const { qHeads, kvHeads, headDim } = this.init.shape;
    const policy = createPolicy(this.init.policy, { ...this.init.policyOptions, qHeads, kvHeads, headDim });
    await policy.build(this.store.tensor(req.seq, req.layer, 0, req.tokens), req.tokens);
    this.policies.set(req.seq * L + req.layer, policy);
    if (req.layoutChunks !== undefined) return Array.from({ length: kvHeads }, (_, h) => clusterLayout(policy, h, req.layoutChunks!));
    return undefined;
  }

  /** Selection stage over entries [0, count) of `slot`. */
  select(slot: number, count: number, layer: number): void {
    const t0 = performance.now();
    const { qHeads: hq, kvHeads: hkv, headDim: d, layers: L } = this.init.shape;
    const a = this.arena;
    const seqs = a.view(slot, 'seq');
    const q = a.view(slot, 'q');
    const meta = a.view(slot, 'selMeta');
    const offsets = a.view(slot, 'selOffsets');
    const ids = a.view(slot, 'selIds');
    const maxC = this.init.maxChunksPerHead;
    for (let b = 0; b < count; b++) {
      const seq = seqs[b]!;
      const tokens = meta[b * 4 + 1]!;
      const policy = this.policies.get(seq * L + layer);
      if (!policy) throw new KvdriveError('E_RANGE', `selection: expected sequence ${seq} layer ${layer} to be prefilled, got no index for it`);
      policy.extend(this.store.tensor(seq, layer, 0, tokens), tokens);
      const sel = policy.select(q.subarray(b * hq * d, (b + 1) * hq * d), this.init.budget);
      for (let h = 0; h < hkv; h++) {
        const n = sel.offsets[h + 1]! - sel.offsets[h]!;
        if (n > maxC)
          throw new KvdriveError('E_INTERNAL', `selection: expected at most ${maxC} chunks per kv head for budget ${this.init.budget}, got ${n} (kv head ${h})`);
      }
      meta.set([sel.chunkSize, sel.tokens, sel.sinkEnd, sel.tailStart], b * 4);
      offsets.set(sel.offsets, b * (hkv + 1));
      ids.set(sel.chunkIds, b * hkv * maxC);
    }
    a.view(slot, 'timing')[TIMING_SELECTION] = performance.now() - t0;
  }

  /** The Selection of entry b of `slot`, as views into the arena (no copies). */
  private selectionOf(slot: number, b: number): Selection {
    const hkv = this.init.shape.kvHeads;
    const maxC = this.init.maxChunksPerHead;
    const meta = this.arena.view(slot, 'selMeta');
    const off = this.arena.view(slot, 'selOffsets').subarray(b * (hkv + 1), (b + 1) * (hkv + 1));
    return {
      chunkSize: meta[b * 4]!,
      tokens: meta[b * 4 + 1]!,
      sinkEnd: meta[b * 4 + 2]!,
      tailStart: meta[b * 4 + 3]!,
      offsets: off,
      chunkIds: this.arena.view(slot, 'selIds').subarray(b * hkv * maxC, b * hkv * maxC + off[hkv]!),
    };
  }

  /**
   * Fetch stage over entries [0, count) of `slot`: SSD reads of the selected prompt chunks
   * (SSD-backed), then hot-tier hit/miss and admission (with a tier). Async only when it reads SSD.
   */
  fetch(slot: number, count: number, layer: number): void | Promise<void> {
    const t0 = performance.now();
    if (this.init.ssd) return this.readSsd(slot, count, layer).then(() => this.finishFetch(slot, count, layer, t0));
    this.finishFetch(slot, count, layer, t0);
  }

  private finishFetch(slot: number, count: number, layer: number, t0: number): void {
    if (this.init.hotTier !== undefined) this.tierFetch(slot, count, layer);
    this.arena.view(slot, 'timing')[TIMING_FETCH] = performance.now() - t0;
  }

  /**
   * Reads the selected chunks below the prompt's SSD chunk count into the slot's staged region
   * (chunk at selection position j of head h of entry b at ((b*Hkv + h)*maxC + j) * chunkBytes).
   * With a hot tier only the chunks not resident are read, and their values are then written into
   * the DRAM rows (where the tier's admission copies them from, see landValues).
   */
  private async readSsd(slot: number, count: number, layer: number): Promise<void> {
    const tier = this.init.hotTier;
    const { kvHeads: hkv, layers: L } = this.init.shape;
    const maxC = this.init.maxChunksPerHead;
    const segs = this.ssdSegments!;
    const seqs = this.arena.view(slot, 'seq');
    const staged = this.arena.view(slot, 'staged');
    const chunkBytes = 8 * this.init.ssd!.chunkSize * this.init.shape.headDim; // K + V rows, f32
    const segments: number[] = [];
    const entries: number[] = []; // batch entry of each item
    const heads: number[] = [];
    const itemOffsets: number[] = [0];
    const chunkIds: number[] = [];
    const destOffsets: number[] = [];
    for (let b = 0; b < count; b++) {
      const seq = seqs[b]!;
      const handle = segs[(seq * L + layer) * 2]!;
      const onSsd = segs[(seq * L + layer) * 2 + 1]!;
      if (handle < 0) continue; // nothing of this prompt on SSD (empty prompt)
      const sel = this.selectionOf(slot, b);
      for (let h = 0; h < hkv; h++) {
        const first = sel.offsets[h]!;
        const resident = tier !== undefined ? (native.hotTierResidents(tier, { sequence: seq, layer, head: h }) as Int32Array) : undefined;
        let r = 0;
        let n = 0;
        for (let i = first; i < sel.offsets[h + 1]!; i++) {
          const c = sel.chunkIds[i]!;
          if (c >= onSsd) break; // ascending ids: the rest are newer chunks, in DRAM
          if (resident) {
            while (r < resident.length && resident[r]! < c) r++; // both ascending
            if (r < resident.length && resident[r] === c) continue; // a hit: no read
          }
          chunkIds.push(c);
          destOffsets.push(((b * hkv + h) * maxC + (i - first)) * chunkBytes);
          n++;
        }
        if (n === 0) continue;
        segments.push(handle);
        entries.push(b);
        heads.push(h);
        itemOffsets.push(chunkIds.length);
      }
    }
    const timing = this.arena.view(slot, 'timing');
    if (chunkIds.length === 0) return;
    const r = (await native.segmentRead({
      segments: Int32Array.from(segments),
      layers: new Int32Array(segments.length), // one-layer segments: layer 0
      heads: Int32Array.from(heads),
      itemOffsets: Int32Array.from(itemOffsets),
      chunkIds: Int32Array.from(chunkIds),
      dest: new Uint8Array(staged.buffer, staged.byteOffset, staged.byteLength),
      destOffsets: Float64Array.from(destOffsets),
    })) as { chunks: number; payloadBytes: number; bytesRead: number };
    timing[TIMING_SSD_CHUNKS]! += r.chunks;
    timing[TIMING_SSD_BYTES]! += r.payloadBytes;
    timing[TIMING_SSD_READ_BYTES]! += r.bytesRead;
    if (tier !== undefined) this.landValues(slot, layer, entries, heads, itemOffsets, chunkIds, destOffsets);
  }

  /**
   * Hot tier + SSD: copies the V rows of the chunks just read into the DRAM store (whose prompt
   * values are NaN) so the tier admits them from there; K rows are already in DRAM. Only this
   * (sequence, layer) is written, and no other stage touches it during this layer step.
   */
  private landValues(slot: number, layer: number, entries: number[], heads: number[], itemOffsets: number[], chunkIds: number[], destOffsets: number[]): void {
    const { kvHeads: hkv, headDim: d } = this.init.shape;
    const cs = this.init.ssd!.chunkSize;
    const staged = this.arena.view(slot, 'staged');
    const seqs = this.arena.view(slot, 'seq');
    const meta = this.arena.view(slot, 'selMeta');
    for (let i = 0; i < entries.length; i++) {
      const b = entries[i]!;
      const v = this.store.tensor(seqs[b]!, layer, 1, meta[b * 4 + 1]!).data;
      const h = heads[i]!;
      for (let k = itemOffsets[i]!; k < itemOffsets[i + 1]!; k++) {
        const c = chunkIds[k]!;
        const src = destOffsets[k]! / 4 + cs * d; // f32 elements; V rows follow the K rows
        for (let row = 0; row < cs; row++) {
          const at = ((c * cs + row) * hkv + h) * d;
          v.set(staged.subarray(src + row * d, src + (row + 1) * d), at);
        }
      }
    }
  }

  /** Hot tier: hit/miss of the selected chunks, eviction, admission of misses from the store. */
  private tierFetch(slot: number, count: number, layer: number): void {
    const t0 = performance.now();
    const handle = this.init.hotTier!;
    const seqs = this.arena.view(slot, 'seq');
    const timing = this.arena.view(slot, 'timing');
    for (let b = 0; b < count; b++) {
      const seq = seqs[b]!;
      const selection = this.selectionOf(slot, b);
      const { tokens } = selection;
      const r = native.hotTierFetch(handle, {
        sequence: seq,
        layer,
        k: this.store.tensor(seq, layer, 0, tokens),
        v: this.store.tensor(seq, layer, 1, tokens),
        selection,
      }) as { hits: Float64Array; misses: Float64Array };
      for (let h = 0; h < r.hits.length; h++) {
        timing[TIMING_HITS]! += r.hits[h]!;
        timing[TIMING_MISSES]! += r.misses[h]!;
      }
    }
    timing[TIMING_HITMISS] = performance.now() - t0;
  }

  /** Compute stage over entries [0, count) of `slot` (from hot-tier slots when there is a tier). */
  compute(slot: number, count: number, layer: number): void {
    const t0 = performance.now();
    const { qHeads: hq, headDim: d } = this.init.shape;
    const a = this.arena;
    const seqs = a.view(slot, 'seq');
    const q = a.view(slot, 'q');
    const out = a.view(slot, 'out');
    const lse = a.view(slot, 'lse');
    const handle = this.init.hotTier;
    const L = this.init.shape.layers;
    const staged = this.ssdSegments ? a.view(slot, 'staged') : undefined;
    // Bytes of one entry's staged chunks: Hkv x maxChunksPerHead page-first f32 chunks.
    const stagedPerEntry = staged ? this.init.shape.kvHeads * this.init.maxChunksPerHead * 8 * this.init.ssd!.chunkSize * d : 0;
    for (let b = 0; b < count; b++) {
      const seq = seqs[b]!;
      const selection = this.selectionOf(slot, b);
      const args = {
        q: q.subarray(b * hq * d, (b + 1) * hq * d),
        qHeads: hq,
        k: this.store.tensor(seq, layer, 0, selection.tokens),
        v: this.store.tensor(seq, layer, 1, selection.tokens),
        selection,
      };
      let r: { out: Float32Array; lse: Float32Array };
      if (this.ssdSegments && handle === undefined) {
        const per = stagedPerEntry;
        r = native.attendStaged({
          ...args,
          staged: new Uint8Array(staged!.buffer, staged!.byteOffset + b * per, per),
          stagedChunks: Math.max(0, this.ssdSegments[(seq * L + layer) * 2 + 1]!),
          maxChunksPerHead: this.init.maxChunksPerHead,
        }) as { out: Float32Array; lse: Float32Array };
      } else if (handle === undefined) r = attendSparse(args);
      else r = native.hotTierAttend(handle, { ...args, sequence: seq, layer }) as { out: Float32Array; lse: Float32Array };
      out.set(r.out, b * hq * d);
      lse.set(r.lse, b * hq);
    }
    a.view(slot, 'timing')[TIMING_COMPUTE] = performance.now() - t0;
  }
}

/** Stage module entry (see stage-contract.ts): descriptor user words are [slot, count, layer]. */
export function createStage(init: DecodeInit & { role: 'selection' | 'fetch' | 'compute' }, _ctx: StageContext): StageHandlers {
  const state = new DecodeState(init);
  if (init.role === 'selection')
    return { run: (desc) => state.select(desc[0]!, desc[1]!, desc[2]!), control: (req) => state.control(req as DecodeControl) };
  if (init.role === 'fetch') return { run: (desc) => state.fetch(desc[0]!, desc[1]!, desc[2]!) };
  return { run: (desc) => state.compute(desc[0]!, desc[1]!, desc[2]!) };
}
