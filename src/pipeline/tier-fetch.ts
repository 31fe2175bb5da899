/**
 * The fetch stage of a decode step through the tiers (src/pipeline/step.ts runs it whenever a hot
 * tier sits in front or an SSD backs the DRAM tier): the selection split head group by head group
 * into hot-tier residents, chunks still in the tail and tier chunks (native fetchSplit), each
 * group's tier chunks fetched in place (DRAM-tier pages pinned in the arena, SSD reads packed into
 * the entry's fetch buffer, in flight while the next group is selected), and the groups' pages
 * merged into the one placement attention and the admissions read. Nothing here attends or commits.
 */
import { native } from '../native.js';
import type { Selection } from '../index/selection.js';
import type { HotTier } from '../cache/hot-tier.js';
import type { ReadLanding } from '../storage/fetched-attention.js';
import type { FetchPlacement, FetchStats } from '../storage/tiered-kv.js';
import type { KvMemory, LayerKv } from '../runtime/kv-memory.js';
import { selectEntry, type EntrySelection } from './select-stage.js';
import type { AppendedEntry, EntryStepStats } from './append-stage.js';

/**
 * Arrays one (sequence, layer)'s steps reuse (at most one step of a pair runs at a time, and
 * nothing keeps them past the step): what native fetchSplit writes, head group after head group at
 * growing offsets — the selection widened to the tiers' chunks (chunkOffsets / chunkIds) and its
 * tier chunks (tierOffsets / tierIds, tierEntry: each one's entry in chunkIds) — and where each tier
 * page lies once fetched (pageSource / pageAt, see FetchPlacement). Grown (doubled, content kept)
 * when a step names more units than they hold; a fetch still in flight keeps the arrays it was given.
 */
export interface StepScratch {
  chunkOffsets: Int32Array;
  chunkIds: Int32Array;
  tierOffsets: Int32Array;
  tierIds: Int32Array;
  tierEntry: Int32Array;
  pageSource: Uint8Array;
  pageAt: Float64Array;
  /** Attention mass per selected unit (attendFetched's chunkMass; not read after the step). */
  unitMass: Float32Array;
  /** With an SSD: attention mass per tier page (the DRAM admission's scores). */
  pageMass: Float32Array;
}
const stepScratch = new WeakMap<LayerKv, StepScratch>();

export function scratchFor(lk: LayerKv, heads: number, units: number): StepScratch {
  let s = stepScratch.get(lk);
  if (!s || s.chunkIds.length < units) {
    const cap = Math.max(units, 2 * (s?.chunkIds.length ?? 0), 1024);
    const grown = <A extends Int32Array | Uint8Array | Float32Array | Float64Array>(old: A | undefined, make: (n: number) => A): A => {
      const a = make(cap);
      if (old) a.set(old as never);
      return a;
    };
    s = {
      chunkOffsets: s?.chunkOffsets ?? new Int32Array(heads + 1),
      chunkIds: grown(s?.chunkIds, (n) => new Int32Array(n)),
      tierOffsets: s?.tierOffsets ?? new Int32Array(heads + 1),
      tierIds: grown(s?.tierIds, (n) => new Int32Array(n)),
      tierEntry: grown(s?.tierEntry, (n) => new Int32Array(n)),
      pageSource: grown(s?.pageSource, (n) => new Uint8Array(n)),
      pageAt: grown(s?.pageAt, (n) => new Float64Array(n)),
      unitMass: new Float32Array(cap),
      pageMass: new Float32Array(cap),
    };
    stepScratch.set(lk, s);
  }
  return s;
}

/**
 * One head group [h0, h1) of an entry: its token selection, where its chunks landed in the step's
 * scratch (tier chunks [tierBase, tierBase + tier)), and the fetch of its tier chunks (in flight
 * while the next group is selected).
 */
export interface HeadGroup {
  h0: number;
  h1: number;
  /** The group's token selection (offsets over h1 - h0 heads, from 0). */
  tokSel: Selection;
  tierBase: number;
  tier: number;
  hotChunks: number;
  tailChunks: number;
  /** Byte offset of the group's SSD reads in the entry's fetch buffer. */
  base: number;
  fetch?: Promise<{ stats: FetchStats; placement?: FetchPlacement }>;
  /** Once the fetch settled: what it moved. */
  fetched?: FetchStats;
  /**
   * Where the fetch left the pages (pins released at the end of the step): known once its reads
   * are issued (TieredKv.fetchInPlace's onIssued), with `pending`, the kv heads whose pages are
   * still being read.
   */
  placement?: FetchPlacement;
  pending?: Uint8Array;
  /** The kv heads with entries staged by a prefetch: there only once the fetch's promise settles. */
  staged?: Uint8Array;
  /** The SSD read's own landing flags (when the group reads from SSD): what attention waits on. */
  reads?: ReadLanding;
}

/** The group selections of one entry, in head order, as one selection over every kv head. */
export function concatSelections(parts: Selection[], heads: number): Selection {
  if (parts.length === 1) return parts[0]!;
  const offsets = new Int32Array(heads + 1);
  let n = 0;
  for (const s of parts) n += s.chunkIds.length;
  const chunkIds = new Int32Array(n);
  let h = 0;
  n = 0;
  for (const s of parts) {
    chunkIds.set(s.chunkIds, n);
    for (let j = 1; j < s.offsets.length; j++) offsets[++h] = n + s.offsets[j]!;
    n += s.chunkIds.length;
  }
  const f = parts[0]!;
  return { chunkSize: f.chunkSize, tokens: f.tokens, sinkEnd: f.sinkEnd, tailStart: f.tailStart, offsets, chunkIds };
}

/** The fetch buffer of an entry that read nothing from SSD. */
const NO_READS = new Uint8Array(0);

/**
 * The fetch buffer one entry's SSD reads land in, packed group after group: one of the memory's
 * fetch buffers (reused across steps), taken on the first read and given back by release().
 */
export class EntryReads {
  buf: Uint8Array = NO_READS;
  private used = 0;
  constructor(private readonly mem: KvMemory) {}
  /** Byte offset the next group's reads land at. */
  get offset(): number {
    return this.used;
  }
  /** Room for `bytes` more bytes of reads (TieredKv.fetchInPlace's dest callback). */
  readonly take = (bytes: number): Uint8Array => {
    if (bytes === 0) return NO_READS;
    if (this.buf === NO_READS) this.buf = this.mem.acquireFetchBuffer(this.mem.fetchBufferBytes);
    const d = this.buf.subarray(this.used, this.used + bytes);
    this.used += bytes;
    return d;
  };
  release(): void {
    if (this.buf !== NO_READS) this.mem.releaseFetchBuffer(this.buf);
    this.buf = NO_READS;
  }
}

/** One entry's step as fetchAttendEntry was given it (see there). */
export interface EntryStep {
  mem: KvMemory;
  hot: HotTier | undefined;
  seq: number;
  layer: number;
  a: AppendedEntry;
  q: Float32Array;
  s: EntrySelection | undefined;
}

/** What the select-and-fetch loop of one entry leaves: its groups (in `groups`) written into `sc`. */
interface SelectedAndFetched {
  sc: StepScratch;
  /** Units of the chunk selection (sc.chunkIds[0, nChunks)). */
  nChunks: number;
  bytesScored: number;
  /** Wall time of the selects made here, milliseconds (0 with a stage worker's selection). */
  selectMs: number;
}

/**
 * Select and fetch stages of entry (seq, layer): selects head group by head group (or takes `s`, a
 * stage worker's selection, as one group), splits each group's chunks into hot residents, tail and
 * tier chunks (written into the entry's scratch after the previous groups'), and starts the group's
 * tier fetch (DRAM pins, SSD reads into `reads`) before selecting the next group. Once every
 * group's fetch is issued and some SSD reads are in flight, `whileReading` runs (the caller
 * computes the kv heads those reads do not touch). Returns once every fetch settled. Each group is pushed on `groups` as soon as it exists, so the caller can release
 * its pins whatever happens; a failure (select or read) is rethrown only after every read landed.
 */
export async function selectAndFetch(
  entry: EntryStep,
  groups: HeadGroup[],
  reads: EntryReads,
  whileReading: (sc: StepScratch, nChunks: number) => Promise<void>,
): Promise<SelectedAndFetched> {
  const { mem, hot, seq, layer, a, q, s } = entry;
  const { lk } = a;
  const { shape, policyOptions: p, budget } = mem.config;
  const H = shape.kvHeads;
  const cs = p.chunkSize;
  // Streaming pays only when there are SSD reads to hide, and not always then: each group is one
  // more select call (a fork/join of the pool, the group waiting for its slowest head). Groups of
  // config.streamHeads with an SSD (default every head: one group), one group without.
  const groupHeads = s || !mem.ssd ? H : Math.max(1, Math.min(H, mem.config.streamHeads ?? H));
  let failure: { error: unknown } | undefined;
  let sc = scratchFor(lk, H, 0);
  let bytesScored = 0;
  let selectMs = 0;
  let cBase = 0; // units of the chunk selection written so far
  let tBase = 0; // tier chunks written so far
  try {
    for (let h0 = 0; h0 < H; h0 += groupHeads) {
      const h1 = Math.min(H, h0 + groupHeads);
      const gs = s ?? selectEntry(a.handle, q, budget, [h0, h1]);
      if (!s) selectMs += gs.ms;
      bytesScored += gs.bytesScored;
      // One native pass (native/cache/fetch_split.cc) over the group: its selection widened to
      // the tiers' chunks (those holding a selected token, before the tail) and split per kv head
      // into hot-tier residents, chunks still in the tail (read there in place) and the rest,
      // fetched through the tiers (ascending per head), written after the previous groups'.
      const n = gs.selection.chunkIds.length;
      sc = scratchFor(lk, H, Math.max(cBase, tBase) + n);
      const split = native.fetchSplit({
        selection: gs.selection,
        kvHeads: h1 - h0,
        headBase: h0,
        pageChunkSize: cs,
        sealed: lk.sealed,
        ...(hot ? { hot: { handle: hot.handle, sequence: seq, layer } } : {}),
        out: {
          chunkOffsets: sc.chunkOffsets.subarray(h0, h1 + 1),
          chunkIds: sc.chunkIds.subarray(cBase),
          tierOffsets: sc.tierOffsets.subarray(h0, h1 + 1),
          tierIds: sc.tierIds.subarray(tBase),
          tierEntry: sc.tierEntry.subarray(tBase),
        },
      }) as { chunks: number; hot: number; tail: number; tier: number };
      // The group's offsets count from 0: shift them (and its tier entries) to the step's.
      for (let h = h0; h <= h1; h++) {
        sc.chunkOffsets[h]! += cBase;
        sc.tierOffsets[h]! += tBase;
      }
      if (cBase) for (let i = tBase; i < tBase + split.tier; i++) sc.tierEntry[i]! += cBase;
      const g: HeadGroup = { h0, h1, tokSel: gs.selection, tierBase: tBase, tier: split.tier, hotChunks: split.hot, tailChunks: split.tail, base: reads.offset };
      groups.push(g);
      cBase += split.chunks;
      tBase += split.tier;
      if (!g.tier) continue;
      // The request spans every kv head (the tiers' shape), empty outside the group.
      const offsets = new Int32Array(H + 1);
      for (let h = 0; h <= H; h++) offsets[h] = sc.tierOffsets[Math.max(h0, Math.min(h, h1))]! - g.tierBase;
      g.fetch = lk.tiers!.fetchInPlace({ layer: 0, offsets, chunkIds: sc.tierIds.subarray(g.tierBase, tBase), chunkSize: cs }, reads.take, (issued) => {
        g.placement = issued.placement;
        g.pending = issued.pending;
        g.staged = issued.staged;
        g.reads = issued.reads;
      });
      // Its failure is taken from allSettled below; meanwhile the step may wait event-loop turns for
      // other heads' reads, and a rejection seen then must not count as unhandled.
      g.fetch.catch(() => undefined);
    }
    // Every group's reads are in flight: the heads they do not touch can be computed meanwhile.
    if (groups.some((g) => g.pending?.includes(1))) await whileReading(sc, cBase);
  } finally {
    // Every read in flight lands before anything is released (also when a select threw).
    const settled = await Promise.allSettled(groups.map((g) => g.fetch));
    settled.forEach((r, i) => {
      if (r.status === 'rejected') failure ??= { error: r.reason };
      else if (r.value) groups[i]!.fetched = r.value.stats;
    });
  }
  if (failure) throw failure.error;
  return { sc, nChunks: cBase, bytesScored, selectMs };
}

/** The tier pages of one entry's step as attendFetched and the admissions read them. */
export interface StepPages {
  /** [fetch buffer, ...DRAM-tier arena blocks]: pageIn 0 is the fetch buffer, 1 + b arena block b. */
  buffers: Uint8Array[];
  offsets: Int32Array;
  ids: Int32Array;
  at: Float64Array;
  source: Uint8Array;
  /** The pages as one FetchPlacement (undefined when no chunk came from the tiers). */
  placement: FetchPlacement | undefined;
}

/**
 * The groups' tier pages as one request over every kv head: where each page lies (the groups'
 * fetch-buffer offsets made absolute), in the scratch's pageSource / pageAt. Valid once every
 * group's reads are issued (pages still being read are placed, not yet there).
 */
export function mergeGroupPages(groups: readonly HeadGroup[], sc: StepScratch, heads: number, readBuf: Uint8Array): StepPages {
  const nTier = sc.tierOffsets[heads]!;
  const pages = (source: Uint8Array, at: Float64Array, arenas: readonly Uint8Array[], inDest: number): StepPages => ({
    buffers: [readBuf, ...arenas],
    offsets: sc.tierOffsets,
    ids: sc.tierIds.subarray(0, nTier),
    at,
    source,
    placement: nTier ? { source, at, arenas, inDest, release: () => undefined } : undefined,
  });
  const only = groups.length === 1 ? groups[0]!.placement : undefined;
  // One group whose reads start the fetch buffer (every DRAM-only step, and an SSD step not
  // streamed by heads): its placement is already the step's, nothing to copy.
  if (only && groups[0]!.base === 0) return pages(only.source, only.at, only.arenas, only.inDest);
  const source = sc.pageSource.subarray(0, nTier);
  const at = sc.pageAt.subarray(0, nTier);
  let arenas: readonly Uint8Array[] = [];
  let inDest = 0;
  for (const g of groups) {
    const pl = g.placement;
    if (pl) {
      const k = g.tierBase;
      source.set(pl.source, k);
      for (let i = 0; i < g.tier; i++) at[k + i] = pl.source[i] === 0 ? g.base + pl.at[i]! : pl.at[i]!;
      arenas = pl.arenas;
      inDest += pl.inDest;
    }
  }
  return pages(source, at, arenas, inDest);
}

/** The traffic of the groups (once their fetches settled) added to `stats`. */
export function addGroupStats(groups: readonly HeadGroup[], stats: EntryStepStats): void {
  for (const g of groups) {
    stats.hotChunks += g.hotChunks;
    stats.tailChunks += g.tailChunks;
    stats.dramChunks += g.fetched?.dramChunks ?? 0;
    stats.ssdChunks += g.fetched?.ssdChunks ?? 0;
    stats.ssdReadBytes += g.fetched?.ssdReadBytes ?? 0;
  }
}
