/**
 * One decode step of one (sequence, layer) over the memory model (kv-memory.ts):
 *
 *   append the new token to the open tail (not committed) ─▶ extend the index from the tail ─▶
 *   select (the index alone: it never needs the sealed keys; kvdrive picks single tokens) ─▶ fetch
 *   the chunks holding the selected tokens (the tiers' unit), copying nothing that is already in
 *   memory: hot-tier residents stay in their slots, DRAM-tier chunks in the DRAM arena (pinned for
 *   the step), chunks still in the tail in the tail; only SSD reads land in a fetch buffer
 *   (TieredKv.fetchInPlace) ─▶ hot-tier admission ─▶ exact attention over sinks + exactly the
 *   selected tokens, read where they lie + tail (attendFetched: bit-identical to attendSparse over
 *   a contiguous cache with the same selection, whichever tier served a token; while the SSD reads
 *   are in flight every kv head is admitted to the hot tier, its copies from the pages still being
 *   read made once they land, and one attention call takes each kv head as soon as its pages are
 *   all there: the read's thread flags each (segment, kv head) as it lands) ─▶ DRAM admission of
 *   SSD-read chunks by the attention mass their tokens received ─▶ (once every entry of the step
 *   succeeded) commit: token count + 1, and the seal this made due starts.
 *
 * Without an SSD and without a hot tier the DRAM tier holds every sealed chunk for good (the
 * memory model without an SSD), so the step has no fetch to make: attendResident passes the tier's
 * slot maps and arenas to attendFetched (`dramTier`), which looks each selected page up as it lists
 * the spans. The spans, hence the outputs, are those of the fetch path.
 *
 * The token count advances only after attention succeeded, so a failed step retried with the same
 * input gives the output of a clean run. The stages are separate functions: appendEntry (main
 * thread: it mutates tail and index), selectEntry (select-stage.ts: inline in sequential mode, on a
 * piscina stage worker in pipelined mode) and fetchAttendEntry. Both runtime modes run the same
 * three, so their outputs are bit-identical. In sequential mode with an SSD and ssd.streamHeads
 * below kvHeads, select and fetch interleave: the kv heads are selected group by group inside fetchAttendEntry, each group's SSD reads in flight while
 * the next group is selected (kv heads select independently: the same selection as one select).
 */
import { availableParallelism } from 'node:os';
import { KvdriveError } from '../errors.js';
import { native } from '../native.js';
import type { Selection } from '../index/selection.js';
import type { HotTier } from '../cache/hot-tier.js';
import { attendFetched, attendFetchedAsync, type DramTierPages, type FetchedAttentionResult, type ReadLanding } from '../storage/fetched-attention.js';
import type { FetchPlacement, FetchStats } from '../storage/tiered-kv.js';
import type { KvMemory, LayerKv } from '../runtime/kv-memory.js';
import type { KvTensor } from '../types.js';
import { selectEntry, type EntrySelection } from './select-stage.js';

/** Traffic and time of one step of one entry. */
export interface EntryStepStats {
  /** Selected chunks (all kv heads) and where they came from. */
  chunks: number;
  hotChunks: number;
  dramChunks: number;
  ssdChunks: number;
  tailChunks: number;
  /** Bytes the device transferred for the SSD reads (the chunks read, page-aligned). */
  ssdReadBytes: number;
  /** Chunks admitted into the hot tier / DRAM tier. */
  hotAdmitted: number;
  dramAdmitted: number;
  selectMs: number;
  fetchMs: number;
  computeMs: number;
}

/**
 * Workers of the addon's pool one entry's attention may use: every core this process may run on
 * (at most attendFetched's 8). The output does not depend on it (bit-identical at any count); in the
 * pipelined mode concurrent entries share the pool, each caller working on its own entry too.
 */
const ATTEND_THREADS = Math.min(8, availableParallelism());

/**
 * Arrays one (sequence, layer)'s steps reuse (at most one step of a pair runs at a time, and
 * nothing keeps them past the step): what native fetchSplit writes, head group after head group at
 * growing offsets — the selection widened to the tiers' chunks (chunkOffsets / chunkIds) and its
 * tier chunks (tierOffsets / tierIds, tierEntry: each one's entry in chunkIds) — and where each tier
 * page lies once fetched (pageSource / pageAt, see FetchPlacement). Grown (doubled, content kept)
 * when a step names more units than they hold; a fetch still in flight keeps the arrays it was given.
 */
interface StepScratch {
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

function scratchFor(lk: LayerKv, heads: number, units: number): StepScratch {
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

/** An entry after its append stage: the new token is in the open tail and the index extended. */
export interface AppendedEntry {
  lk: LayerKv;
  /** Context length with the new token. */
  T: number;
  tailK: KvTensor;
  tailV: KvTensor;
  /** The layer index's handle: what the select stage selects on (any thread). */
  handle: number;
  /** Wall time of the index extend, milliseconds. */
  extendMs: number;
}

/**
 * Append stage of entry (seq, layer), on the thread owning the memory (it mutates the tail and the
 * index): waits for a pending seal, appends the new token's kRow / vRow (host dtype, kvHeads x
 * headDim) to the open tail, sinks too while the context is short, and extends the index. Nothing
 * is committed (the token count stays): a failed step retried rewrites the same rows.
 */
export async function appendEntry(
  mem: KvMemory,
  seq: number,
  layer: number,
  kRow: Float32Array | Uint16Array,
  vRow: Float32Array | Uint16Array,
): Promise<AppendedEntry> {
  const lk = mem.layer(seq, layer);
  const { shape, policyOptions: p, maxTokens } = mem.config;
  const row = shape.kvHeads * shape.headDim;
  await mem.settleSeal(seq, layer, lk);
  const at = lk.tokens;
  const T = at + 1;
  if (T > maxTokens) throw new KvdriveError('E_BUDGET', `attend seq ${seq} layer ${layer} context: expected at most maxTokens = ${maxTokens} tokens, got ${T}`);
  const slot = at - lk.sealed;
  if (slot >= mem.tailCapacity) throw new KvdriveError('E_INTERNAL', `step: expected the tail to hold token ${at} (capacity ${mem.tailCapacity} from ${lk.sealed}), got it full`);
  lk.tailK.set(kRow, slot * row);
  lk.tailV.set(vRow, slot * row);
  if (at < p.sinks) {
    lk.sinkK.set(kRow, at * row);
    lk.sinkV.set(vRow, at * row);
  }
  const t0 = performance.now();
  const tailK = mem.tensor(lk.tailK, T - lk.sealed);
  const tailV = mem.tensor(lk.tailV, T - lk.sealed);
  lk.policy!.extend(tailK, T, lk.sealed);
  return { lk, T, tailK, tailV, handle: lk.policy!.handle(), extendMs: performance.now() - t0 };
}

/** Result of one entry's step; `commit()` once every entry of the step succeeded. */
export interface EntryResult {
  out: Float32Array;
  lse: Float32Array;
  selection: Selection;
  bytesScored: number;
  stats: EntryStepStats;
  commit: () => void;
}

/**
 * Attends entry (seq, layer) for query q with the new token's kRow / vRow, every stage on this
 * thread's turn: append, then select and fetch streamed head group by head group (see
 * fetchAttendEntry), then compute. `offThread`: I/O and attention run off the JS thread.
 */
export async function attendEntry(
  mem: KvMemory,
  hot: HotTier | undefined,
  seq: number,
  layer: number,
  q: Float32Array,
  kRow: Float32Array | Uint16Array,
  vRow: Float32Array | Uint16Array,
  offThread: boolean,
): Promise<EntryResult> {
  const a = await appendEntry(mem, seq, layer, kRow, vRow);
  return fetchAttendEntry(mem, hot, seq, layer, a, q, undefined, offThread);
}

/**
 * One head group [h0, h1) of an entry: its token selection, where its chunks landed in the step's
 * scratch (tier chunks [tierBase, tierBase + tier)), and the fetch of its tier chunks (in flight
 * while the next group is selected).
 */
interface HeadGroup {
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
function concatSelections(parts: Selection[], heads: number): Selection {
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
class EntryReads {
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
interface EntryStep {
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
async function selectAndFetch(
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
interface StepPages {
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
function mergeGroupPages(groups: readonly HeadGroup[], sc: StepScratch, heads: number, readBuf: Uint8Array): StepPages {
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
function addGroupStats(groups: readonly HeadGroup[], stats: EntryStepStats): void {
  for (const g of groups) {
    stats.hotChunks += g.hotChunks;
    stats.tailChunks += g.tailChunks;
    stats.dramChunks += g.fetched?.dramChunks ?? 0;
    stats.ssdChunks += g.fetched?.ssdChunks ?? 0;
    stats.ssdReadBytes += g.fetched?.ssdReadBytes ?? 0;
  }
}

/** What attention of an entry runs over, fixed once every group's reads are issued. */
interface EntryAttention {
  tokSel: Selection;
  /** The selection widened to the tiers' chunks (tokSel itself when it is chunk-granular). */
  sel: Selection;
  pages: StepPages;
  /** The result, filled head mask by head mask. */
  r: FetchedAttentionResult;
  /** With an SSD: the attention mass of each tier page (pages.ids), what DRAM admission ranks it by. */
  pageMass: Float32Array | undefined;
  /** Wall time of the attention calls, milliseconds. */
  computeMs: number;
}

/**
 * What commits an entry's step once every entry of the step succeeded: the token count advances,
 * the next step's select starts from this one's selection (PolicyOptions.reuseCandidateFactor; set
 * only here, so a failed step leaves the prior, and a retry selects, as before it) and the seal this
 * step made due starts.
 */
function commitStep(mem: KvMemory, seq: number, layer: number, lk: LayerKv, T: number, tokSel: Selection): () => void {
  return () => {
    lk.tokens = T;
    lk.policy?.setPrior(tokSel);
    mem.startSeal(seq, layer, lk);
  };
}

/**
 * Select and compute stages of entry (seq, layer) when its DRAM tier holds every sealed chunk
 * (`pages`, TieredKv.residentPages) and no hot tier sits in front: one select over every kv head
 * (or `s`, a stage worker's), then attention reading each selected page from the tier's arena,
 * looked up by attendFetched itself. Nothing to fetch, pin or admit; the traffic per source comes
 * back from the attention (pageCounts). Same spans as the fetch path, so the same bits.
 */
async function attendResident(entry: EntryStep, offThread: boolean, pages: DramTierPages): Promise<EntryResult> {
  const { mem, seq, layer, a, q, s } = entry;
  const { lk, T, tailK, tailV } = a;
  const { shape, policyOptions: p, budget } = mem.config;
  const gs = s ?? selectEntry(a.handle, q, budget);
  const tokSel = gs.selection;
  const n = tokSel.chunkIds.length;
  const sc = scratchFor(lk, shape.kvHeads, 0);
  if (sc.unitMass.length < n) sc.unitMass = new Float32Array(n);
  const into = { out: new Float32Array(shape.qHeads * shape.headDim), lse: new Float32Array(shape.qHeads), chunkMass: sc.unitMass.subarray(0, n) };
  const args = {
    q,
    qHeads: shape.qHeads,
    sink: { k: mem.tensor(lk.sinkK, Math.min(p.sinks, T)), v: mem.tensor(lk.sinkV, Math.min(p.sinks, T)) },
    tail: { k: tailK, v: tailV },
    tailBase: lk.sealed,
    selection: tokSel,
    pageChunkSize: p.chunkSize,
    dramTier: pages,
    threads: ATTEND_THREADS,
    into,
  };
  const t = performance.now();
  const r = offThread ? await attendFetchedAsync(args) : attendFetched(args);
  const computeMs = performance.now() - t;
  const [dram, tail, hot] = r.pageCounts!;
  const stats: EntryStepStats = {
    chunks: dram! + tail! + hot!,
    hotChunks: hot!,
    dramChunks: dram!,
    ssdChunks: 0,
    tailChunks: tail!,
    ssdReadBytes: 0,
    hotAdmitted: 0,
    dramAdmitted: 0,
    selectMs: a.extendMs + gs.ms,
    fetchMs: 0,
    computeMs,
  };
  return { out: r.out, lse: r.lse, selection: tokSel, bytesScored: gs.bytesScored, stats, commit: commitStep(mem, seq, layer, lk, T, tokSel) };
}

/**
 * Fetch and compute stages of entry (seq, layer) once appended (`a`). `s`: its selection when a
 * stage worker made it (pipelined mode), fetched as one group; omitted, the selection is made
 * here head group by head group (selectAndFetch: with an SSD, groups of config.streamHeads kv
 * heads — the runtime's ssd.streamHeads, default all of them; without one, one group of every
 * head), each group's tier chunks fetched (DRAM pins, SSD reads in flight on the I/O engine) while
 * the next group is selected. Kv heads select independently, so the groups concatenated are the
 * whole selection and the output does not depend on the mode. Then hot-tier admission and
 * attention with q — each kv head once its pages are all there, while other heads' reads are still
 * in flight (a kv head attends the same bits in any call, alone or with others: bit-identical) —
 * and DRAM admission. `offThread`: attention runs off the JS thread (pipelined). Nothing is
 * committed: the caller calls `commit()` once every entry of the step succeeded (the token count
 * advances and the seal this made due starts), so a failed step leaves every sequence where it
 * was; a failure mid-step (select or read) waits for the reads in flight, then releases every pin
 * and the fetch buffer.
 */
export async function fetchAttendEntry(
  mem: KvMemory,
  hot: HotTier | undefined,
  seq: number,
  layer: number,
  a: AppendedEntry,
  q: Float32Array,
  s: EntrySelection | undefined,
  offThread: boolean,
): Promise<EntryResult> {
  const { lk, T, tailK, tailV } = a;
  // A DRAM tier holding every sealed chunk, no hot tier in front: nothing to fetch.
  const resident = hot ? undefined : lk.tiers?.residentPages(0);
  if (resident) return attendResident({ mem, hot, seq, layer, a, q, s }, offThread, resident);
  const { shape, policyOptions: p } = mem.config;
  const { kvHeads: H, qHeads } = shape;
  const cs = p.chunkSize;
  const groups: HeadGroup[] = [];
  // DRAM-tier chunks stay in the arena, pinned until released below; SSD reads land in `reads`.
  const reads = new EntryReads(mem);
  const t1 = performance.now();
  const tail = { k: tailK, v: tailV };
  const hotArg = hot ? { hot: { handle: hot.handle, sequence: seq, layer } } : {};
  let att: EntryAttention | undefined;
  let hotAdmitted = 0;
  /** What attention runs over, once every group's reads are issued (pages placed, maybe not landed). */
  const attention = (sc: StepScratch, nChunks: number): EntryAttention => {
    if (att) return att;
    const tokSel = concatSelections(
      groups.map((g) => g.tokSel),
      H,
    );
    const sel: Selection =
      tokSel.chunkSize === cs
        ? tokSel
        : { chunkSize: cs, tokens: tokSel.tokens, sinkEnd: tokSel.sinkEnd, tailStart: tokSel.tailStart, offsets: sc.chunkOffsets, chunkIds: sc.chunkIds.subarray(0, nChunks) };
    // The masses live in the entry's scratch (reused across steps): every entry of them is written
    // by the attention calls (each head's by the call attending it) before anything reads it.
    // (The scratch is sized by chunks written; units can be more, with several head groups.)
    if (sc.unitMass.length < tokSel.chunkIds.length) sc.unitMass = new Float32Array(tokSel.chunkIds.length);
    const r = { out: new Float32Array(qHeads * shape.headDim), lse: new Float32Array(qHeads), chunkMass: sc.unitMass.subarray(0, tokSel.chunkIds.length) };
    const pages = mergeGroupPages(groups, sc, H, reads.buf);
    return (att = { tokSel, sel, pages, r, pageMass: mem.ssd ? sc.pageMass.subarray(0, pages.ids.length) : undefined, computeMs: 0 });
  };
  /** Where the tier pages lie, as the hot-tier admission reads them. */
  const pageArgs = (pages: StepPages) => ({
    pages: pages.buffers,
    pageOffsets: pages.offsets,
    pageIds: pages.ids,
    pageAt: pages.at,
    pageIn: pages.source,
    tail,
    tailBase: lk.sealed,
  });
  /**
   * The hot tier's admission copies left for the SSD-read pages (hotTierAdmitPages with
   * pageLanding, run while the reads were in flight): made once the reads landed (landHotTier), or
   * undone if they failed (error path below).
   */
  let hotLanding: Int32Array | undefined;
  /**
   * Hot-tier admission of the kv heads in `heads` (every head when undefined). With `landing`
   * (while the SSD reads are in flight): residency is decided for every page now and copied from
   * every page already there; the copies from the pages still being read (those in the fetch
   * buffer) wait in hotLanding. The tier ends exactly as with one admission after the reads.
   */
  const admitHot = (e: EntryAttention, heads: Uint8Array | undefined, landing: boolean): void => {
    if (!hot) return;
    const { pages } = e;
    const r = native.hotTierAdmitPages({
      ...hotArg,
      selection: e.sel,
      tokens: T,
      ...pageArgs(pages),
      ...(landing ? { pageLanding: pages.source.map((b) => (b === 0 ? 1 : 0)) } : {}),
      ...(heads ? { heads } : {}),
    }) as { admitted: number; landing?: Int32Array };
    hotAdmitted += r.admitted;
    if (r.landing?.length) hotLanding = r.landing;
  };
  /** Makes the hot tier's copies from the SSD-read pages (now landed), or frees those slots (`drop`). */
  const landHotTier = (e: EntryAttention, drop: boolean): void => {
    const landing = hotLanding;
    if (!hot || !landing) return;
    hotLanding = undefined;
    native.hotTierLandPages({ ...hotArg, tokens: T, ...pageArgs(e.pages), landing, ...(drop ? { drop: true } : {}) });
  };
  /**
   * Attention of the kv heads in `heads` (every head when undefined) into the entry's result, after
   * their hot-tier admission (unless `admitted`). Each kv head has its own hot-tier residents and
   * attention output, so the heads done in two passes end exactly as in one.
   */
  const attendHeads = async (e: EntryAttention, heads: Uint8Array | undefined, admitted: boolean, landing?: ReadLanding[]): Promise<Uint8Array> => {
    const { pages } = e;
    const mask = heads ? { heads } : {};
    if (!admitted) admitHot(e, heads, false);
    const t = performance.now();
    const args = {
      q,
      qHeads,
      sink: { k: mem.tensor(lk.sinkK, Math.min(p.sinks, T)), v: mem.tensor(lk.sinkV, Math.min(p.sinks, T)) },
      tail,
      tailBase: lk.sealed,
      selection: e.tokSel,
      pageChunkSize: cs,
      fetched: pages.buffers,
      fetchedOffsets: pages.offsets,
      fetchedIds: pages.ids,
      fetchedAt: pages.at,
      fetchedIn: pages.source,
      ...hotArg,
      threads: ATTEND_THREADS,
      into: e.r,
      ...(e.pageMass ? { fetchedMass: e.pageMass } : {}),
      ...mask,
      ...(landing?.length ? { landing } : {}),
    };
    const r = offThread ? await attendFetchedAsync(args) : attendFetched(args);
    e.computeMs += performance.now() - t;
    // The heads attended: with landing, as the call says; else those of the mask.
    return r.attended ?? (heads ? heads.slice() : new Uint8Array(H).fill(1));
  };
  /**
   * DRAM-tier admission of the chunks attention just weighed (the SSD-read pages offered, the
   * resident ones re-scored), once per step: in the callback when every head was attended there
   * (the reads have landed, and the JS thread hears of it only a turn later: the admission fills
   * that gap), else after the reads' promises.
   */
  let dramAdmitted: number | undefined;
  const admitDram = (e: EntryAttention): void => {
    const { pages } = e;
    if (dramAdmitted !== undefined || !pages.placement || !e.pageMass) return;
    dramAdmitted = lk.tiers!.admit({ layer: 0, offsets: pages.offsets, chunkIds: pages.ids, chunkSize: cs, scores: e.pageMass }, reads.buf, pages.placement);
  };
  // The kv heads left for after the reads' promises settle (undefined: every head).
  let rest: Uint8Array | undefined;
  // Whether every head's hot-tier admission ran while the reads were in flight.
  let hotAdmittedEarly = false;
  // Whether every head was attended before the reads' promises settled (they had landed).
  let attendedAll = false;
  try {
    const f = await selectAndFetch({ mem, hot, seq, layer, a, q, s }, groups, reads, async (sc, nChunks) => {
      // While the SSD reads are in flight: hot-tier admission of every kv head, then one attention
      // call over the heads whose pages can land before the promises settle, which attends each as
      // soon as its reads have landed (attendFetched's `landing`: the reads' own thread flags each
      // item, the pool's workers take whichever head is ready). The heads it leaves (entries staged
      // by a prefetch, a failed read) are attended after the promises. A group whose fetch failed
      // before placing its pages leaves everything to the error path.
      if (groups.some((g) => g.tier > 0 && !g.pending)) return;
      // Every head's hot-tier admission now, the copies from pages still being read left for
      // after them: the reads' wait is the step's only idle time on a CPU-bound host.
      const e = attention(sc, nChunks);
      admitHot(e, undefined, true);
      hotAdmittedEarly = true;
      // Every head but those with prefetch-staged entries (copied only after the promises): the
      // call itself waits on the reads' flags, and leaves out a head whose read failed.
      const now = new Uint8Array(H).fill(1);
      for (const g of groups) g.staged?.forEach((x, h) => x && (now[h] = 0));
      const landing = groups.flatMap((g) => (g.reads ? [g.reads] : []));
      const attended = await attendHeads(e, now.includes(0) ? now : undefined, true, landing);
      if (!attended.includes(0)) {
        attendedAll = true;
        // Every read has landed (each head's flag says so); the JS thread hears of it only on a
        // later event-loop turn: the hot-tier copies from the read pages and the DRAM admission
        // run now instead of after that (~1% of the held-out SSD step, bench/runtime-memory.md).
        landHotTier(e, false);
        admitDram(e);
        return;
      }
      rest = attended.map((x) => 1 - x);
    });
    const { sc, nChunks } = f;
    const e = attention(sc, nChunks);
    landHotTier(e, false);
    if (!attendedAll) await attendHeads(e, rest, hotAdmittedEarly);
    const t3 = performance.now();
    const { tokSel, pages, r } = e;
    const stats: EntryStepStats = {
      chunks: nChunks,
      hotChunks: 0,
      dramChunks: 0,
      ssdChunks: 0,
      tailChunks: 0,
      ssdReadBytes: 0,
      hotAdmitted,
      dramAdmitted: 0,
      selectMs: a.extendMs + (s ? s.ms : f.selectMs),
      fetchMs: 0,
      computeMs: e.computeMs,
    };
    addGroupStats(groups, stats);
    // Chunks read from SSD join the DRAM tier if the attention mass their tokens just received
    // beats the least important resident (resident ones get their score refreshed), unless the
    // callback admitted them already.
    admitDram(e);
    stats.dramAdmitted = dramAdmitted ?? 0;
    // Fetch: the wall of select + fetch + attention not spent selecting or attending (the reads
    // neither hid, hot-tier admission).
    stats.fetchMs = t3 - t1 - f.selectMs - e.computeMs;
    // selection: what attention ran over beside sinks and tail (the runtime's attended tokens).
    return { out: r.out, lse: r.lse, selection: tokSel, bytesScored: f.bytesScored, stats, commit: commitStep(mem, seq, layer, lk, T, tokSel) };
  } finally {
    // Hot-tier copies still waiting for reads that failed: those slots are freed (they would
    // otherwise stay resident with no rows); before the pages' buffers are released.
    if (hotLanding && att) {
      try {
        landHotTier(att, true);
      } catch {
        // The step's own error is the one to report; the tier check (hotTier.check) would show this.
      }
    }
    for (const g of groups) g.placement?.release();
    reads.release();
  }
}
