/**
 * Sparse synchronization (kvdrive §7.3): per decode step and layer, fetch only the selected chunks
 * of a sequence's segment chain — from the DRAM tier when resident, else from SSD (only the missing
 * chunks, file neighbours merged into one read, each chunk's checksum verified) — into a caller-provided buffer.
 * Chunks fetched from SSD are promoted into DRAM by importance. A prefetch API issues the SSD reads
 * for the next step's likely chunks early into a preallocated staging pool and can cancel them.
 *
 * Output layout: entry i of the request (kv head h's chunk ids in request order, heads in order)
 * occupies bytes [i * chunkBytes, (i + 1) * chunkBytes) of `dest`, page-first: chunkSize K rows then
 * chunkSize V rows of headDim elements in the store dtype (see {@link chunkRows}). Native attention
 * gets one `Span` per entry from native/storage/page_spans.h (`FetchBufferSpans`), without another copy.
 * {@link TieredKv.fetchInPlace} copies nothing out of DRAM: it leaves DRAM-resident chunks in the
 * DRAM tier's arena (pinned until released) and packs only the SSD reads into `dest`.
 */
import { z } from 'zod';
import { fail, KvdriveError } from '../errors.js';
import type { Selection } from '../index/selection.js';
import { native } from '../native.js';
import { DramStore, type DramChain } from './dram-store.js';
import { parseOptions } from './io-engine.js';
import { chunkBytesOf, storeShapeSchema, type SsdStore, type StoreShape } from './ssd-store.js';
import { expectArray, expectInt, expectObject } from '../util/check.js';
import type { DramTierPages, ReadLanding } from './fetched-attention.js';

/** Options of a {@link TieredKv}. */
export interface TieredKvOptions {
  /**
   * The SSD tier holding every segment (the full backing store). Optional: without it the DRAM
   * tier must hold every chunk of every segment (a DRAM miss is then E_INTERNAL).
   */
  ssd?: SsdStore;
  /** The DRAM tier (optional: SSD-only when omitted). Segments are registered in it if missing. */
  dram?: DramStore;
  /** The sequence's sealed segment ids in token order; global chunk ids run across them. More may follow ({@link TieredKv.appendSegment}). */
  segments: string[];
  /** Prefetch staging pool: number of buffers (default 2; 0 disables prefetch). */
  stagingBuffers?: number;
  /** Bytes per staging buffer (default 8 MiB); a prefetch stages at most this much. */
  stagingBytes?: number;
  /** Promote chunks fetched from SSD into DRAM by their request score (default true). */
  promote?: boolean;
  /**
   * Pin the DRAM-tier chunks {@link TieredKv.fetchInPlace} leaves in the arena until the placement
   * is released (default true), so that no admission evicts them while they are read. false only
   * when nothing can evict them meanwhile: the runtime's memory model without an SSD store, whose
   * DRAM tier holds every chunk for good (F32_MAX importance, public calls serialized). Saves a pass
   * over the pins (at random, one per chunk) per fetch and per release.
   */
  pinInPlace?: boolean;
}

const optionsSchema = z
  .object({
    ssd: z.custom<SsdStore>((v) => typeof v === 'object' && v !== null, 'an SsdStore').optional(),
    dram: z.custom<DramStore>((v) => typeof v === 'object' && v !== null, 'a DramStore').optional(),
    segments: z.array(z.string()).min(1),
    stagingBuffers: z.number().int().min(0).max(64).optional(),
    stagingBytes: z.number().int().min(1).max(2 ** 31).optional(),
    promote: z.boolean().optional(),
    pinInPlace: z.boolean().optional(),
  })
  .strict();

/** Chunks of one layer to fetch, per kv head (the shape of a {@link Selection}). */
export interface FetchRequest {
  layer: number;
  /** kvHeads + 1 offsets into chunkIds: head h owns chunkIds[offsets[h] .. offsets[h+1]). */
  offsets: Int32Array;
  /** Global chunk ids (across the segment chain). */
  chunkIds: Int32Array;
  /** Optional importance per entry (attention mass); ranks DRAM residency. Default 0. */
  scores?: Float32Array;
  /** Tokens per chunk the ids refer to; when given it must equal the store's (E_CONFIG). */
  chunkSize?: number;
}

/** Bytes and chunks moved per tier in one fetch. */
export interface FetchStats {
  chunks: number;
  dramChunks: number;
  dramBytes: number;
  /** Chunks served from completed prefetches (their SSD bytes were counted by the prefetch). */
  prefetchedChunks: number;
  prefetchedBytes: number;
  ssdChunks: number;
  /** Requested chunk bytes read from SSD in this call. */
  ssdBytes: number;
  /** Bytes the device transferred in this call (the chunks read, page alignment included). */
  ssdReadBytes: number;
  /** Extents (clusters) the SSD-read chunks lie in. */
  ssdExtents: number;
  ssdRuns: number;
  /** Chunks newly admitted into DRAM. */
  promoted: number;
  /** Wall time of the call, milliseconds. */
  ms: number;
}

/** Cumulative prefetch counters of a {@link TieredKv}. */
export interface PrefetchTotals {
  /** Prefetches started. */
  issued: number;
  /** Chunks they staged (whether or not a fetch used them). */
  chunks: number;
  /** Bytes the device transferred for them (page alignment included; cancelled reads count what was read). */
  readBytes: number;
  /** Prefetches cancelled before a fetch consumed them. */
  cancelled: number;
}

/** A prefetch in flight or staged. */
export interface PrefetchHandle {
  readonly id: number;
  readonly layer: number;
  /** Chunks this prefetch reads (misses of DRAM that fit one staging buffer). */
  readonly chunks: number;
  /** Settles when the reads finished (or were cancelled); never rejects: after a failed prefetch the
   * fetch reads those chunks itself, so a read error surfaces there. */
  readonly done: Promise<void>;
}

/** Where {@link TieredKv.fetchInPlace} left each entry of the request. */
export interface FetchPlacement {
  /** Where entry i's page is: 0 the caller's `dest`, 1 + b block b of the DRAM tier's {@link arenas}. */
  source: Uint8Array;
  /** Byte offset of entry i's page in its buffer. */
  at: Float64Array;
  /** The DRAM tier's arena blocks (pages of entries with source >= 1); empty without a DRAM tier. */
  arenas: readonly Uint8Array[];
  /** Entries read into `dest` (SSD reads, prefetches). */
  inDest: number;
  /**
   * Unpins the DRAM slots this fetch left in place; call once, after the last read of them. `source`
   * and `at` are valid until then (their arrays serve a later fetch).
   */
  release: () => void;
}

/** What {@link TieredKv.fetchInPlace} tells its `onIssued` once every entry is placed and the reads are in flight. */
export interface FetchIssued {
  /** Where each entry's page is (the object the promise resolves with; not to be released before it settles). */
  placement: FetchPlacement;
  /** Per kv head: 1 when some entry of the head still lands in dest (an SSD read, a prefetch), 0 when every page can be read now. */
  pending: Uint8Array;
  /** Per kv head: 1 when some entry was staged by a prefetch (copied into dest only after the promise settles). */
  staged: Uint8Array;
  /** The SSD read's landing flags, when some entries are read from SSD (attendFetched's `landing`). */
  reads?: ReadLanding;
}

/**
 * The arrays one fetch's DRAM lookup writes (DramStore.locate), for up to `lists.length / 3`
 * entries: hit slots, hit entries, misses (thirds of `lists`), and the in-place placement (source,
 * at). Reused across fetches: allocating them per call (~200 KB per decode step) cost more than the
 * lookup itself.
 */
interface FetchScratch {
  lists: Int32Array;
  source: Uint8Array;
  at: Float64Array;
}

interface Prefetch {
  handle: PrefetchHandle;
  layer: number;
  buffer: Uint8Array;
  staged: Map<number, number>; // key (head * totalChunks + global chunk) -> byte offset in buffer
  flag: number;
  state: 'reading' | 'ready' | 'failed' | 'cancelled';
  error?: unknown;
  ssdReadBytes: number;
}

/** K and V rows of entry `i` of a fetch buffer, as typed views (f32: Float32Array, else Uint16Array). */
export function chunkRows(buf: Uint8Array, i: number, shape: StoreShape): { k: Float32Array | Uint16Array; v: Float32Array | Uint16Array } {
  expectArray(buf, Uint8Array, 'chunkRows buf');
  shape = parseOptions(storeShapeSchema, shape, 'chunkRows shape');
  const cb = chunkBytesOf(shape);
  expectInt(i, 'chunkRows entry', 0, Math.floor(buf.length / cb) - 1);
  const n = shape.chunkSize * shape.headDim;
  const es = shape.dtype === 'f32' ? 4 : 2;
  const base = buf.byteOffset + i * 2 * n * es;
  const b = buf.buffer as ArrayBuffer;
  if (shape.dtype === 'f32') return { k: new Float32Array(b, base, n), v: new Float32Array(b, base + n * es, n) };
  return { k: new Uint16Array(b, base, n), v: new Uint16Array(b, base + n * es, n) };
}

export class TieredKv {
  readonly shape: StoreShape;
  readonly chunkBytes: number;
  /** Chunks per (layer, kv head) over the whole segment chain. */
  totalChunks: number;
  private readonly ssd?: SsdStore;
  private readonly dram?: DramStore;
  private readonly segments: string[];
  private readonly segHandles: number[] = [];
  private readonly segStart: number[] = [0]; // first global chunk of each segment (+ total at the end)
  private chunkSeg: Int32Array; // global chunk -> segment index
  private readonly dramMaps: Array<{ slots: Int32Array; chunks: number }> = [];
  /** The chain as the native DRAM lookup reads it (DramStore.locate); rebuilt by appendSegment. */
  private chain: DramChain = { segStart: new Int32Array(1), maps: [] };
  /** Fetch scratch not in use: a fetch takes one (or a new one) and gives it back when it ends / its placement is released. */
  private readonly scratchFree: FetchScratch[] = [];
  private readonly promote: boolean;
  private readonly pinInPlace: boolean;
  private readonly pool: Uint8Array[] = [];
  private readonly stagingBytes: number;
  private readonly prefetches = new Map<number, Prefetch>();
  private nextPrefetch = 1;
  private closed = false;
  private readonly totalsAcc: FetchStats = TieredKv.zeroStats();
  private readonly prefetchAcc: PrefetchTotals = { issued: 0, chunks: 0, readBytes: 0, cancelled: 0 };

  constructor(options: TieredKvOptions) {
    const o = parseOptions(optionsSchema, options, 'TieredKv options');
    if (!o.ssd && !o.dram) fail('E_CONFIG', 'TieredKv options', 'an ssd store, a dram store or both', 'neither');
    this.ssd = o.ssd;
    this.dram = o.dram;
    this.shape = o.ssd ? o.ssd.shape : o.dram!.shape;
    this.chunkBytes = o.ssd ? o.ssd.chunkBytes : o.dram!.chunkBytes;
    this.promote = o.promote ?? true;
    this.pinInPlace = o.pinInPlace ?? true;
    if (o.dram && o.dram.chunkBytes !== this.chunkBytes)
      fail('E_CONFIG', 'TieredKv options.dram', `a DRAM store of the SSD store's shape (chunk ${this.chunkBytes} bytes)`, `chunk ${o.dram.chunkBytes} bytes`);
    this.segments = [];
    this.totalChunks = 0;
    this.chunkSeg = new Int32Array(0);
    for (const id of o.segments) this.appendSegment(id);
    this.stagingBytes = o.stagingBytes ?? 8 << 20;
    if (this.stagingBytes < this.chunkBytes) fail('E_CONFIG', 'TieredKv options.stagingBytes', `at least one chunk (${this.chunkBytes} bytes)`, this.stagingBytes);
    for (let i = 0; i < (o.stagingBuffers ?? 2); i++) this.pool.push(new Uint8Array(this.stagingBytes));
  }

  /**
   * Appends a sealed segment to the chain (decode seals segments as tokens leave the local window);
   * its chunks get the next global ids. Without an SSD store the DRAM store must already hold it.
   */
  appendSegment(id: string): void {
    this.check();
    let chunks: number;
    if (this.ssd) {
      const handle = this.ssd.segmentHandle(id); // E_NOT_FOUND / E_CORRUPT for unusable ids
      chunks = this.ssd.segments().find((s) => s.id === id)!.chunks;
      this.segHandles.push(handle);
      if (this.dram && !this.dram.hasSegment(id)) this.dram.addSegment(id, chunks * this.shape.chunkSize);
    } else {
      chunks = this.dram!.slotMap(id).chunks; // E_NOT_FOUND for a segment it does not hold
      this.segHandles.push(-1);
    }
    if (this.dram) this.dramMaps.push(this.dram.slotMap(id));
    const s = this.segments.length;
    this.segments.push(id);
    this.segStart.push(this.totalChunks + chunks);
    const seg = new Int32Array(this.totalChunks + chunks);
    seg.set(this.chunkSeg);
    seg.fill(s, this.totalChunks);
    this.chunkSeg = seg;
    this.totalChunks += chunks;
    this.chain = { segStart: Int32Array.from(this.segStart), maps: this.dramMaps.map((m) => m.slots) };
  }

  /**
   * Where a reader finds every sealed chunk of `layer` when the DRAM tier holds all of them for
   * good: no SSD store, and nothing evicts or moves them (`pinInPlace: false`, the memory model
   * without an SSD). attendFetched's `dramTier` then looks each selected page up itself, and the
   * step has no fetch to make (no split, no lookups, no placement). Undefined otherwise. Valid
   * until the next {@link appendSegment} (the chain grows then: ask again).
   */
  residentPages(layer: number): DramTierPages | undefined {
    this.check();
    if (this.ssd || !this.dram || this.pinInPlace) return undefined;
    if (!Number.isInteger(layer) || layer < 0 || layer >= this.shape.layers) fail('E_RANGE', 'TieredKv.residentPages layer', `an integer in [0, ${this.shape.layers})`, layer);
    const { segStart, maps } = this.chain;
    return { segStart, maps, layer, arenas: this.dram.arenas, slotsPerBlock: this.dram.slotsPerBlock };
  }

  private static zeroStats(): FetchStats {
    return { chunks: 0, dramChunks: 0, dramBytes: 0, prefetchedChunks: 0, prefetchedBytes: 0, ssdChunks: 0, ssdBytes: 0, ssdReadBytes: 0, ssdExtents: 0, ssdRuns: 0, promoted: 0, ms: 0 };
  }

  /** Builds a fetch request from a Selection of one layer (chunk sizes must match the store). */
  static requestFromSelection(sel: Selection, layer: number, scores?: Float32Array): FetchRequest {
    expectObject(sel, 'requestFromSelection selection');
    return { layer, offsets: sel.offsets, chunkIds: sel.chunkIds, scores, chunkSize: sel.chunkSize };
  }

  private check(): void {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'TieredKv: expected an open instance, got a closed one');
  }

  private validate(req: FetchRequest): void {
    const s = this.shape;
    const cs = req.chunkSize;
    if (cs !== undefined && cs !== s.chunkSize) fail('E_CONFIG', 'fetch request chunkSize', `the store's chunk size ${s.chunkSize}`, cs);
    if (!Number.isInteger(req.layer) || req.layer < 0 || req.layer >= s.layers) fail('E_RANGE', 'fetch request layer', `an integer in [0, ${s.layers})`, req.layer);
    // The kernels' chunk-list validator (native/common/args.h): offsets, ids in [0, sealed chunks of the chain).
    native.checkChunkLists({ offsets: req.offsets, chunkIds: req.chunkIds, kvHeads: s.kvHeads, maxChunks: this.totalChunks, what: 'fetch request', ascending: false });
    const ids = req.chunkIds;
    if (req.scores !== undefined) {
      if (!(req.scores instanceof Float32Array) || req.scores.length !== ids.length)
        fail('E_SHAPE', 'fetch request scores', `a Float32Array of ${ids.length} entries`, req.scores);
      for (let i = 0; i < ids.length; i++) if (!Number.isFinite(req.scores[i]!)) fail('E_NONFINITE', `fetch request scores[${i}]`, 'a finite number', req.scores[i]);
    }
  }

  /** DRAM slot of (layer, head, global chunk), or -1. */
  private dramSlot(layer: number, head: number, g: number): number {
    if (!this.dram) return -1;
    const s = this.chunkSeg[g]!;
    const m = this.dramMaps[s]!;
    return m.slots[(layer * this.shape.kvHeads + head) * m.chunks + (g - this.segStart[s]!)]!;
  }

  /**
   * Fetches the request's chunks into `dest` (entry i at i * chunkBytes). Chunks staged by this
   * layer's prefetches are taken from them; every other miss is read right away, so the device
   * works on those while prefetches still reading finish (and while DRAM hits are copied). A
   * prefetch that failed or was cancelled is replaced by a read of its chunks here, so a read error
   * surfaces in this call. The layer's prefetches are released afterwards.
   */
  async fetch(req: FetchRequest, dest: Uint8Array): Promise<FetchStats> {
    return (await this.fetchInto(req, dest, false)).stats;
  }

  /**
   * Like {@link fetch}, without copying DRAM-resident chunks: they stay in the DRAM tier's arena,
   * pinned (never evicted) until `placement.release()` (unless `pinInPlace: false`), and only the other entries (SSD reads,
   * prefetched chunks) are written to a buffer, packed in entry order: `dest` is that buffer or a
   * function giving one of at least the bytes it is called with (once, before any read; E_SHAPE
   * when too small). `placement` says where each entry's page is. For a reader that attends the
   * pages where they lie (the runtime's step); on error nothing stays pinned.
   *
   * `onIssued` (optional) is called within this call, before it returns its promise, once every
   * entry is placed and the reads are in flight, with {@link FetchIssued}: the placement (the object
   * the promise resolves with; its `source` / `at` final, not to be released before the promise
   * settles), which kv heads still wait for pages (`pending`: an SSD read or a prefetch), which of
   * those wait for a prefetch (`staged`: its entries are copied only after the promise), and the SSD
   * read's own landing flags (`reads`, when some entries are read from SSD). A reader attends the
   * ready heads while the reads are in flight, and the others as their reads land by waiting on
   * `reads` itself (attendFetched's `landing`: the read's thread flags the items of one (segment,
   * kv head) as they complete, mostly in head order) — except the `staged` heads, which are attended
   * after the promise. Not called when the call fails before the reads are issued.
   */
  async fetchInPlace(
    req: FetchRequest,
    dest: Uint8Array | ((bytes: number) => Uint8Array),
    onIssued?: (issued: FetchIssued) => void,
  ): Promise<{ stats: FetchStats; placement: FetchPlacement }> {
    const r = await this.fetchInto(req, dest, true, onIssued);
    return { stats: r.stats, placement: r.placement! };
  }

  private async fetchInto(
    req: FetchRequest,
    destOrFn: Uint8Array | ((bytes: number) => Uint8Array),
    inPlace: boolean,
    onIssued?: (issued: FetchIssued) => void,
  ): Promise<{ stats: FetchStats; placement?: FetchPlacement }> {
    this.check();
    const t0 = performance.now();
    this.validate(req);
    const n = req.chunkIds.length;
    let dest = destOrFn instanceof Uint8Array ? destOrFn : new Uint8Array(0);
    if (typeof destOrFn !== 'function' && (!(dest instanceof Uint8Array) || (!inPlace && dest.length < n * this.chunkBytes)))
      fail('E_SHAPE', 'fetch dest', `a Uint8Array of at least ${n} chunks x ${this.chunkBytes} bytes`, destOrFn);
    const layer = req.layer;
    const H = this.shape.kvHeads;
    const cb = this.chunkBytes;
    const mine = [...this.prefetches.values()].filter((p) => p.layer === layer && (p.state === 'reading' || p.state === 'ready'));
    const stagedIdx = mine.map(() => [] as number[]);
    const st = TieredKv.zeroStats();
    // Entries staged by this layer's prefetches are taken from them: marked in `skip` (a JS pass
    // only while prefetches are pending).
    let skip: Uint8Array | undefined;
    if (mine.length) {
      skip = new Uint8Array(n);
      for (let h = 0; h < H; h++)
        for (let i = req.offsets[h]!; i < req.offsets[h + 1]!; i++) {
          const key = h * this.totalChunks + req.chunkIds[i]!;
          for (let q = 0; q < mine.length; q++)
            if (mine[q]!.staged.has(key)) {
              stagedIdx[q]!.push(i);
              skip[i] = 1;
              break;
            }
        }
    }
    // The DRAM lookups of every other entry in one native pass (DramStore.locate): hits (their
    // slots and entries, in entry order; pinned in place) and misses (read from SSD).
    const scratch = this.takeScratch(n);
    const { lists } = scratch;
    const cap = lists.length / 3;
    const out = { slots: lists.subarray(0, n), entries: lists.subarray(cap, cap + n), misses: lists.subarray(2 * cap, 2 * cap + n) };
    // In place: entry i's page is at[i] in buffer source[i].
    const placement: FetchPlacement | undefined = inPlace
      ? { source: scratch.source.subarray(0, n), at: scratch.at.subarray(0, n), arenas: this.dram ? this.dram.arenas : [], inDest: 0, release: () => undefined }
      : undefined;
    let pinned: Int32Array | undefined;
    let missIdx: number[] = [];
    // Misses grouped by (segment, head) so each group is one item of the SSD read.
    const groups = new Map<number, number[]>();
    const addMiss = (into: Map<number, number[]>, h: number, i: number) => {
      const gk = this.chunkSeg[req.chunkIds[i]!]! * H + h;
      let list = into.get(gk);
      if (!list) into.set(gk, (list = []));
      list.push(i);
    };
    try {
      const pin = inPlace && this.pinInPlace;
      const found = DramStore.locate(this.dram, req, this.chain, placement ? { ...out, source: placement.source, at: placement.at } : out, { kvHeads: H, chunkBytes: cb, skip, pin });
      const nDram = found.hits;
      const dramSlots = out.slots.subarray(0, nDram);
      if (pin && nDram) pinned = dramSlots;
      missIdx = Array.from(out.misses.subarray(0, found.misses));
      for (let k = 0, h = 0; k < missIdx.length; k++) {
        const i = missIdx[k]!;
        while (i >= req.offsets[h + 1]!) h++;
        addMiss(groups, h, i);
      }
      if (placement) {
        // Entries not left in the arena are packed into dest in entry order (placement.at says where).
        const k = found.inDest;
        placement.inDest = k;
        if (typeof destOrFn === 'function') dest = destOrFn(k * cb);
        if (!(dest instanceof Uint8Array) || dest.length < k * cb) fail('E_SHAPE', 'fetch dest', `a Uint8Array of at least ${k} chunks x ${cb} bytes (the entries not resident in DRAM)`, dest);
      }
      const destOf = placement ? (i: number) => placement.at[i]! : (i: number) => i * cb;
      // SSD reads go first so they are in flight while DRAM hits are copied and prefetches finish.
      // `readDone` (onIssued's `reads`): element 0 set by the read's thread as it ends, element 1 + i
      // as read item i (groups' i-th (segment, kv head), in insertion order) lands (SsdStore.readArrays).
      const readDone = groups.size && onIssued ? new Int32Array(new SharedArrayBuffer(4 * (1 + groups.size))) : undefined;
      const reading = groups.size ? this.readGroups(layer, groups, req.chunkIds, dest, destOf, undefined, readDone) : undefined;
      reading?.catch(() => undefined); // awaited below; never an unhandled rejection if a copy throws first
      if (nDram) {
        const entries = out.entries;
        if (!placement) this.dram!.copyOut(dramSlots, dest, Float64Array.from(entries.subarray(0, nDram), (i) => i * cb));
        st.dramChunks = nDram;
        if (req.scores) {
          // Decode attention mass refreshes the importance of resident chunks.
          this.dram!.refreshScores(dramSlots, entries.subarray(0, nDram), req.scores);
        }
      }
      if (onIssued && placement) {
        // Heads with an entry still to land: those with SSD misses or prefetched entries.
        const pending = new Uint8Array(H);
        const itemHead = Int32Array.from(groups.keys(), (gk) => gk % H);
        for (const h of itemHead) pending[h] = 1;
        // Heads with prefetched entries land only once this call copies them (after the promise).
        const staged = new Uint8Array(H);
        for (const idx of stagedIdx)
          for (const i of idx) {
            const h = this.headOfEntry(req, i);
            pending[h] = staged[h] = 1;
          }
        try {
          onIssued({ placement, pending, staged, ...(readDone ? { reads: { done: readDone, itemHead } } : {}) });
        } catch (e) {
          // The reads write into dest: let them land before the caller may reuse it.
          await reading?.catch(() => undefined);
          throw e;
        }
      }
      await Promise.all(mine.map((p) => p.handle.done));
      const redo = new Map<number, number[]>();
      for (let q = 0; q < mine.length; q++) {
        const p = mine[q]!;
        const idx = stagedIdx[q]!;
        if (!idx.length) continue;
        if (p.state === 'ready') {
          const src = new Float64Array(idx.length);
          const dst = new Float64Array(idx.length);
          idx.forEach((i, k) => {
            src[k] = p.staged.get(this.keyOfEntry(req, i))!;
            dst[k] = destOf(i);
          });
          native.copyChunks(p.buffer, src, dest, dst, cb);
          st.prefetchedChunks += idx.length;
        } else {
          for (const i of idx) addMiss(redo, this.headOfEntry(req, i), i);
        }
        for (const i of idx) missIdx.push(i); // promoted like an SSD fetch
      }
      const rereading = redo.size ? this.readGroups(layer, redo, req.chunkIds, dest, destOf) : undefined;
      for (const r of await Promise.all([reading, rereading])) {
        if (!r) continue;
        st.ssdChunks += r.chunks;
        st.ssdReadBytes += r.bytesRead;
        st.ssdExtents += r.extents;
        st.ssdRuns += r.runs;
      }
      if (this.dram && this.promote && missIdx.length) st.promoted = this.promoteFrom(layer, req, Int32Array.from(missIdx), dest, placement?.at);
    } catch (e) {
      if (pinned) this.dram!.unpin(pinned);
      this.scratchFree.push(scratch);
      throw e;
    } finally {
      for (const p of mine) if (p.state !== 'reading') this.releasePrefetch(p);
    }
    if (placement) {
      // The scratch holds the placement (and the pinned slots) until release.
      const slots = pinned;
      const held = scratch;
      let released = false;
      placement.release = () => {
        if (released) return;
        released = true;
        if (slots) this.dram!.unpin(slots);
        this.scratchFree.push(held);
      };
    } else {
      this.scratchFree.push(scratch);
    }
    st.chunks = n;
    st.dramBytes = st.dramChunks * cb;
    st.ssdBytes = st.ssdChunks * cb;
    st.prefetchedBytes = st.prefetchedChunks * cb;
    st.ms = performance.now() - t0;
    for (const k of Object.keys(st) as Array<keyof FetchStats>) this.totalsAcc[k] += st[k];
    return { stats: st, placement };
  }

  /** Fetch scratch for n entries: a free one large enough, else a new one (room for 2n, so a growing request reallocates rarely). */
  private takeScratch(n: number): FetchScratch {
    const free = this.scratchFree;
    while (free.length) {
      const s = free.pop()!;
      if (s.source.length >= n) return s;
    }
    const cap = Math.max(64, 2 * n);
    return { lists: new Int32Array(3 * cap), source: new Uint8Array(cap), at: new Float64Array(cap) };
  }

  private headOfEntry(req: FetchRequest, i: number): number {
    let h = 0;
    while (i >= req.offsets[h + 1]!) h++;
    return h;
  }

  /** One SSD batch for grouped misses; chunk of entry i goes to dest[destOf(i)]. */
  private readGroups(layer: number, groups: Map<number, number[]>, ids: Int32Array, dest: Uint8Array, destOf: (i: number) => number, flag?: number, done?: Int32Array) {
    if (!this.ssd)
      throw new KvdriveError('E_INTERNAL', `TieredKv fetch: expected every chunk resident in DRAM (no SSD store), got ${groups.size} (segment, kv head) groups with misses`);
    const H = this.shape.kvHeads;
    const nItems = groups.size;
    const segments = new Int32Array(nItems);
    const layers = new Int32Array(nItems).fill(layer);
    const heads = new Int32Array(nItems);
    const itemOffsets = new Int32Array(nItems + 1);
    let total = 0;
    for (const list of groups.values()) total += list.length;
    const chunkIds = new Int32Array(total);
    const destOffsets = new Float64Array(total);
    let it = 0;
    let k = 0;
    for (const [gk, list] of groups) {
      const s = Math.floor(gk / H);
      segments[it] = this.segHandles[s]!;
      heads[it] = gk % H;
      for (const i of list) {
        chunkIds[k] = ids[i]! - this.segStart[s]!;
        destOffsets[k] = destOf(i);
        k++;
      }
      itemOffsets[++it] = k;
    }
    return this.ssd.readArrays({ segments, layers, heads, itemOffsets, chunkIds, dest, destOffsets, ...(done ? { done } : {}) }, flag);
  }

  /**
   * Admits entries `idx` of req into DRAM, one DramStore.put per (segment, kv head); entry i's page
   * at src[at[i]] (default i * chunkBytes). Typed arrays throughout: this runs every layer-step.
   */
  private promoteFrom(layer: number, req: FetchRequest, idx: Int32Array, src: Uint8Array, at?: Float64Array): number {
    const H = this.shape.kvHeads;
    const cb = this.chunkBytes;
    const n = idx.length;
    // Entries in ascending order are head-major, so group keys (segment * H + head) usually come out
    // non-decreasing (ids ascending per head); otherwise a stable sort by key groups them.
    let ent = Int32Array.from(idx).sort();
    let key = new Int32Array(n);
    let sorted = true;
    let h = 0;
    for (let k = 0; k < n; k++) {
      const i = ent[k]!;
      while (i >= req.offsets[h + 1]!) h++;
      key[k] = this.chunkSeg[req.chunkIds[i]!]! * H + h;
      if (k > 0 && key[k]! < key[k - 1]!) sorted = false;
    }
    if (!sorted) {
      const perm = Int32Array.from({ length: n }, (_, k) => k).sort((a, b) => key[a]! - key[b]! || a - b);
      ent = Int32Array.from(perm, (k) => ent[k]!);
      key = Int32Array.from(perm, (k) => key[k]!);
    }
    const ids = new Int32Array(n);
    const scores = new Float32Array(n);
    const offs = new Float64Array(n);
    for (let k = 0; k < n; k++) {
      const i = ent[k]!;
      ids[k] = req.chunkIds[i]! - this.segStart[Math.floor(key[k]! / H)]!;
      scores[k] = req.scores ? req.scores[i]! : 0;
      offs[k] = at ? at[i]! : i * cb;
    }
    let admitted = 0;
    for (let a = 0; a < n; ) {
      let b = a + 1;
      while (b < n && key[b] === key[a]) b++;
      const s = Math.floor(key[a]! / H);
      admitted += this.dram!.put(this.segments[s]!, layer, key[a]! % H, ids.subarray(a, b), scores.subarray(a, b), src, offs.subarray(a, b));
      a = b;
    }
    return admitted;
  }

  /**
   * Admits every entry of `req` into DRAM from `src` (entry i at i * chunkBytes, the layout of a
   * fetch buffer) with importance `req.scores` (required): resident chunks get their score
   * updated, others are admitted if they beat the least important resident chunk. For callers
   * that know a chunk's importance only after attending it (decode attention mass), with
   * `promote: false`. `srcAt` (the placement {@link fetchInPlace} gave for this request, its pins
   * still held): entry i's page at src[srcAt.at[i]]; the entries it left in the arena are resident
   * (their slot is their arena position), so only their score changes.
   * Returns how many chunks were admitted.
   */
  admit(req: FetchRequest, src: Uint8Array, srcAt?: FetchPlacement): number {
    this.check();
    this.validate(req);
    if (!req.scores) fail('E_CONFIG', 'TieredKv.admit scores', 'a Float32Array of importance scores, one per entry', undefined);
    const need = srcAt ? srcAt.inDest : req.chunkIds.length;
    if (srcAt && srcAt.at.length !== req.chunkIds.length) fail('E_SHAPE', 'TieredKv.admit srcAt', `a placement of ${req.chunkIds.length} entries`, srcAt.at.length);
    if (!(src instanceof Uint8Array) || src.length < need * this.chunkBytes)
      fail('E_SHAPE', 'TieredKv.admit src', `a Uint8Array of at least ${need} chunks x ${this.chunkBytes} bytes`, src);
    if (!this.dram || !req.chunkIds.length) return 0;
    // The DRAM lookups in one native pass (DramStore.locate, nothing pinned): the resident entries
    // get their score refreshed, in entry order; the others are offered for admission.
    const n = req.chunkIds.length;
    const scratch = this.takeScratch(n);
    try {
      const { lists } = scratch;
      const cap = lists.length / 3;
      const out = { slots: lists.subarray(0, n), entries: lists.subarray(cap, cap + n), misses: lists.subarray(2 * cap, 2 * cap + n) };
      let found: { hits: number; misses: number };
      if (srcAt) {
        // The fetch's own placement already says which entries it left in the arena (resident,
        // pinned until the caller releases them) and where: the slot is the arena position. No
        // second lookup of the slot maps (one cache miss per chunk).
        if (srcAt.arenas !== this.dram.arenas) fail('E_CONFIG', 'TieredKv.admit srcAt', "a placement this TieredKv's fetchInPlace made (its DRAM tier's arenas)", 'a placement over other buffers');
        found = { hits: 0, misses: 0 };
        const dram = this.dram;
        for (let i = 0; i < n; i++) {
          const b = srcAt.source[i]!;
          if (b >= 1) {
            const slot = dram.slotAt(b - 1, srcAt.at[i]!);
            if (slot < 0)
              fail('E_RANGE', `TieredKv.admit srcAt entry ${i}`, `an arena slot's place (a multiple of ${this.chunkBytes} bytes, slot below ${dram.capacityChunks})`, `block ${b - 1}, byte ${srcAt.at[i]}`);
            out.slots[found.hits] = slot;
            out.entries[found.hits++] = i;
          } else out.misses[found.misses++] = i;
        }
      } else found = DramStore.locate(this.dram, req, this.chain, out, { kvHeads: this.shape.kvHeads, chunkBytes: this.chunkBytes, pin: false });
      this.dram.refreshScores(out.slots.subarray(0, found.hits), out.entries.subarray(0, found.hits), req.scores);
      const missing = out.misses.subarray(0, found.misses);
      return missing.length ? this.promoteFrom(req.layer, req, missing, src, srcAt ? srcAt.at : undefined) : 0;
    } finally {
      this.scratchFree.push(scratch);
    }
  }

  /**
   * Starts reading, into a staging buffer, the chunks of `req` that are not DRAM-resident (up to
   * one staging buffer). The next {@link fetch} of the same layer uses them. Returns undefined when
   * no staging buffer is free or nothing needs reading.
   */
  prefetch(req: FetchRequest): PrefetchHandle | undefined {
    this.check();
    this.validate(req);
    if (!this.pool.length) return undefined;
    const H = this.shape.kvHeads;
    const cap = Math.floor(this.stagingBytes / this.chunkBytes);
    const groups = new Map<number, number[]>();
    const staged = new Map<number, number>();
    const stagedElsewhere = new Set<number>();
    for (const p of this.prefetches.values()) if (p.layer === req.layer) for (const k of p.staged.keys()) stagedElsewhere.add(k);
    let count = 0;
    for (let h = 0; h < H && count < cap; h++)
      for (let i = req.offsets[h]!; i < req.offsets[h + 1]! && count < cap; i++) {
        const g = req.chunkIds[i]!;
        const key = h * this.totalChunks + g;
        if (staged.has(key) || stagedElsewhere.has(key) || this.dramSlot(req.layer, h, g) >= 0) continue;
        staged.set(key, count * this.chunkBytes);
        const gk = this.chunkSeg[g]! * H + h;
        let list = groups.get(gk);
        if (!list) groups.set(gk, (list = []));
        list.push(i);
        count++;
      }
    if (count === 0) return undefined;
    const buffer = this.pool.pop()!;
    const flag = native.cancelFlagCreate() as number;
    const id = this.nextPrefetch++;
    const p = { layer: req.layer, buffer, staged, flag, state: 'reading', ssdReadBytes: 0 } as Prefetch;
    const done = this.readGroups(req.layer, groups, req.chunkIds, buffer, (i) => staged.get(this.keyOfEntry(req, i))!, flag).then(
      (r) => {
        p.ssdReadBytes = r.bytesRead;
        this.prefetchAcc.readBytes += r.bytesRead;
        if (p.state === 'reading') p.state = r.cancelled ? 'cancelled' : 'ready';
      },
      (e: unknown) => {
        if (p.state === 'reading') {
          p.state = 'failed';
          p.error = e;
        }
      },
    );
    p.handle = { id, layer: req.layer, chunks: count, done };
    this.prefetches.set(id, p);
    this.prefetchAcc.issued++;
    this.prefetchAcc.chunks += count;
    return p.handle;
  }

  private keyOfEntry(req: FetchRequest, i: number): number {
    let h = 0;
    while (i >= req.offsets[h + 1]!) h++;
    return h * this.totalChunks + req.chunkIds[i]!;
  }

  /** Cancels a prefetch: stops submitting its reads, drops what it staged, frees its buffer. */
  async cancel(handle: PrefetchHandle): Promise<void> {
    const p = this.prefetches.get(handle.id);
    if (!p) return;
    p.state = 'cancelled';
    this.prefetchAcc.cancelled++;
    native.cancelFlagRaise(p.flag);
    await p.handle.done;
    this.releasePrefetch(p);
  }

  private releasePrefetch(p: Prefetch): void {
    if (!this.prefetches.delete(p.handle.id)) return;
    native.cancelFlagRelease(p.flag);
    p.staged.clear();
    this.pool.push(p.buffer);
  }

  /** Prefetches not yet consumed by a fetch or cancelled. */
  get pendingPrefetches(): number {
    return this.prefetches.size;
  }

  /** Cumulative per-tier counters since construction. */
  totals(): FetchStats {
    return { ...this.totalsAcc };
  }

  /** Cumulative prefetch counters since construction. */
  prefetchTotals(): PrefetchTotals {
    return { ...this.prefetchAcc };
  }

  /** Cancels outstanding prefetches; the stores stay open (they belong to the caller). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const p of [...this.prefetches.values()]) {
      p.state = 'cancelled';
      native.cancelFlagRaise(p.flag);
      await p.handle.done;
      this.prefetches.delete(p.handle.id);
      native.cancelFlagRelease(p.flag);
      this.pool.push(p.buffer);
    }
  }
}
