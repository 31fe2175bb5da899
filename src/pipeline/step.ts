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
 * the spans, and, unless a stage worker selected already, makes the selection too, kv head by kv
 * head beside the attention (`select`). The spans, hence the outputs, are those of the fetch path.
 *
 * The token count advances only after attention succeeded, so a failed step retried with the same
 * input gives the output of a clean run. The stages are separate functions: appendEntry
 * (append-stage.ts, on the main thread: it mutates tail and index), selectEntry (select-stage.ts:
 * inline in sequential mode, on a piscina stage worker in pipelined mode) and fetchAttendEntry
 * (here, the fetch through the tiers in tier-fetch.ts). Both runtime modes run the same
 * three, so their outputs are bit-identical. In sequential mode with an SSD and ssd.streamHeads
 * below kvHeads, select and fetch interleave: the kv heads are selected group by group inside fetchAttendEntry, each group's SSD reads in flight while
 * the next group is selected (kv heads select independently: the same selection as one select).
 * The fetch through the tiers (head groups, their fetches, the merged placement) is tier-fetch.ts;
 * this file runs the stages, the attention and the admissions, and commits.
 */
import { availableParallelism } from 'node:os';
import { native } from '../native.js';
import type { Selection } from '../index/selection.js';
import type { HotTier } from '../cache/hot-tier.js';
import { attendFetched, attendFetchedAsync, type DramTierPages, type FetchedAttentionResult, type ReadLanding } from '../storage/fetched-attention.js';
import type { KvMemory, LayerKv } from '../runtime/kv-memory.js';
import type { KvTensor } from '../types.js';
import { appendEntry, type AppendedEntry, type EntryStepStats } from './append-stage.js';
import { selectEntry, type EntrySelection } from './select-stage.js';
import { addGroupStats, concatSelections, EntryReads, mergeGroupPages, scratchFor, selectAndFetch, type EntryStep, type HeadGroup, type StepPages, type StepScratch } from './tier-fetch.js';

/**
 * Workers of the addon's pool one entry's attention may use: every core this process may run on
 * (at most attendFetched's 8). The output does not depend on it (bit-identical at any count); in the
 * pipelined mode concurrent entries share the pool, each caller working on its own entry too.
 */
const ATTEND_THREADS = Math.min(8, availableParallelism());


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
 * What every attention call of an entry's step is given beside its pages and selection: the query,
 * the sinks and the open tail in place, the tiers' page size and the addon's workers.
 */
function attentionInputs(mem: KvMemory, a: AppendedEntry, q: Float32Array) {
  const { lk, T, tailK, tailV } = a;
  const { shape, policyOptions: p } = mem.config;
  return {
    q,
    qHeads: shape.qHeads,
    sink: { k: mem.tensor(lk.sinkK, Math.min(p.sinks, T)), v: mem.tensor(lk.sinkV, Math.min(p.sinks, T)) },
    tail: { k: tailK, v: tailV },
    tailBase: lk.sealed,
    pageChunkSize: p.chunkSize,
    threads: ATTEND_THREADS,
  };
}

/**
 * An entry's attention result arrays for a selection of `units` units: out and lse fresh (the
 * caller keeps them), the mass per unit in the pair's scratch (grown as needed; every entry is
 * written by the attention calls before anything reads it, and nothing keeps it past the step).
 */
function resultArrays(mem: KvMemory, sc: StepScratch, units: number): FetchedAttentionResult {
  const { qHeads, headDim } = mem.config.shape;
  if (sc.unitMass.length < units) sc.unitMass = new Float32Array(units);
  return { out: new Float32Array(qHeads * headDim), lse: new Float32Array(qHeads), chunkMass: sc.unitMass.subarray(0, units) };
}

let selectInAttention = true;
/**
 * Whether a DRAM-only step without a stage worker's selection selects inside its attention call (on
 * by default) or with selectEntry, then attendFetched: the same selection and the same bits either
 * way. For bench/step-switch.ts and the test that compares the two; not part of the public API.
 */
export function setSelectInAttention(on: boolean): void {
  selectInAttention = on;
}

/**
 * Select and compute stages of entry (seq, layer) when its DRAM tier holds every sealed chunk
 * (`pages`, TieredKv.residentPages) and no hot tier sits in front: attention reading each selected
 * page from the tier's arena, looked up by attendFetched itself. Nothing to fetch, pin or admit;
 * the traffic per source comes back from the attention (pageCounts). Same spans as the fetch path,
 * so the same bits.
 *
 * Its selection is `s` (a stage worker's, pipelined with several sequences), or made by the
 * attention call itself (attendFetched's `select`): the same index's same select, kv head by kv
 * head in the same pass over the addon's threads as the attention, each head attended as soon as
 * its own selection is made; the selection and the outputs are those of selectEntry, then
 * attendFetched. The select time is then until the last kv head's selection was made, the compute
 * time the rest of the call (the first heads' attention overlaps the last heads' selects).
 * Measured against select then attend in one process (`node dist/bench/step-switch.js`, switching
 * between them at random steps, a dense pass before each step): ~2% per step in medians
 * (bench/RESULTS.md, "One pass over the pool for the select and the attention").
 */
async function attendResident(entry: EntryStep, offThread: boolean, pages: DramTierPages): Promise<EntryResult> {
  const { mem, seq, layer, a, q, s } = entry;
  const { lk, T } = a;
  let gs: EntrySelection;
  let r: FetchedAttentionResult;
  let computeMs: number;
  if (s || offThread || !selectInAttention) {
    gs = s ?? selectEntry(a.handle, q, mem.config.budget);
    const into = resultArrays(mem, scratchFor(lk, mem.config.shape.kvHeads, 0), gs.selection.chunkIds.length);
    const args = { ...attentionInputs(mem, a, q), selection: gs.selection, dramTier: pages, into };
    const t = performance.now();
    r = offThread ? await attendFetchedAsync(args) : attendFetched(args);
    computeMs = performance.now() - t;
  } else {
    // Selected by the attention call (on this thread's turn: the index is not extended meanwhile).
    const t = performance.now();
    r = attendFetched({ ...attentionInputs(mem, a, q), select: { handle: a.handle, budget: mem.config.budget }, dramTier: pages });
    const wall = performance.now() - t;
    gs = { selection: r.selection!, bytesScored: r.bytesScored!, ms: r.selectMs! };
    computeMs = wall - gs.ms;
  }
  const tokSel = gs.selection;
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
  // A DRAM tier holding every sealed chunk, no hot tier in front: nothing to fetch.
  const resident = hot ? undefined : a.lk.tiers?.residentPages(0);
  if (resident) return attendResident({ mem, hot, seq, layer, a, q, s }, offThread, resident);
  return new TierStep({ mem, hot, seq, layer, a, q, s }, offThread).run();
}

/**
 * One entry's step through the tiers (fetchAttendEntry's path when pages must be fetched): the
 * state that select, fetch, the hot-tier admission, attention and the DRAM admission share, each
 * stage a method. Made and run once per entry and step.
 */
class TierStep {
  private readonly H: number;
  private readonly cs: number;
  /** The entry's head groups, each pushed as soon as it exists, so its pins are released whatever happens. */
  private readonly groups: HeadGroup[] = [];
  /** DRAM-tier chunks stay in the arena, pinned until the end of the step; SSD reads land here. */
  private readonly reads: EntryReads;
  private readonly tail: { k: KvTensor; v: KvTensor };
  private readonly hotArg: { hot?: { handle: number; sequence: number; layer: number } };
  /** What attention runs over, once every group's reads are issued (attention()). */
  private att: EntryAttention | undefined;
  private hotAdmitted = 0;
  /**
   * The hot tier's admission copies left for the SSD-read pages (hotTierAdmitPages with
   * pageLanding, run while the reads were in flight): made once the reads landed (landHotTier), or
   * undone if they failed (run()'s cleanup).
   */
  private hotLanding: Int32Array | undefined;
  /** Chunks the DRAM admission took, once it ran (at most once per step). */
  private dramAdmitted: number | undefined;
  /** The kv heads left for after the reads' promises settle (undefined: every head). */
  private rest: Uint8Array | undefined;
  /** Whether every head's hot-tier admission ran while the reads were in flight. */
  private hotAdmittedEarly = false;
  /** Whether every head was attended before the reads' promises settled (they had landed). */
  private attendedAll = false;

  constructor(
    private readonly entry: EntryStep,
    private readonly offThread: boolean,
  ) {
    const { mem, hot, seq, layer, a } = entry;
    this.H = mem.config.shape.kvHeads;
    this.cs = mem.config.policyOptions.chunkSize;
    this.reads = new EntryReads(mem);
    this.tail = { k: a.tailK, v: a.tailV };
    this.hotArg = hot ? { hot: { handle: hot.handle, sequence: seq, layer } } : {};
  }

  async run(): Promise<EntryResult> {
    const { mem, seq, layer, a, s } = this.entry;
    const t1 = performance.now();
    try {
      const f = await selectAndFetch(this.entry, this.groups, this.reads, (sc, nChunks) => this.whileReading(sc, nChunks));
      const { sc, nChunks } = f;
      const e = this.attention(sc, nChunks);
      this.landHotTier(e, false);
      if (!this.attendedAll) await this.attendHeads(e, this.rest, this.hotAdmittedEarly);
      const t3 = performance.now();
      const { tokSel, r } = e;
      const stats: EntryStepStats = {
        chunks: nChunks,
        hotChunks: 0,
        dramChunks: 0,
        ssdChunks: 0,
        tailChunks: 0,
        ssdReadBytes: 0,
        hotAdmitted: this.hotAdmitted,
        dramAdmitted: 0,
        selectMs: a.extendMs + (s ? s.ms : f.selectMs),
        fetchMs: 0,
        computeMs: e.computeMs,
      };
      addGroupStats(this.groups, stats);
      // Chunks read from SSD join the DRAM tier if the attention mass their tokens just received
      // beats the least important resident (resident ones get their score refreshed), unless the
      // callback admitted them already.
      this.admitDram(e);
      stats.dramAdmitted = this.dramAdmitted ?? 0;
      // Fetch: the wall of select + fetch + attention not spent selecting or attending (the reads
      // neither hid, hot-tier admission).
      stats.fetchMs = t3 - t1 - f.selectMs - e.computeMs;
      // selection: what attention ran over beside sinks and tail (the runtime's attended tokens).
      return { out: r.out, lse: r.lse, selection: tokSel, bytesScored: f.bytesScored, stats, commit: commitStep(mem, seq, layer, a.lk, a.T, tokSel) };
    } finally {
      // Hot-tier copies still waiting for reads that failed: those slots are freed (they would
      // otherwise stay resident with no rows); before the pages' buffers are released.
      if (this.hotLanding && this.att) {
        try {
          this.landHotTier(this.att, true);
        } catch {
          // The step's own error is the one to report; the tier check (hotTier.check) would show this.
        }
      }
      for (const g of this.groups) g.placement?.release();
      this.reads.release();
    }
  }

  /**
   * While the SSD reads are in flight (selectAndFetch's callback): hot-tier admission of every kv
   * head, then one attention call over the heads whose pages can land before the promises settle,
   * which attends each as soon as its reads have landed (attendFetched's `landing`: the reads' own
   * thread flags each item, the pool's workers take whichever head is ready). The heads it leaves
   * (entries staged by a prefetch, a failed read) are attended after the promises. A group whose
   * fetch failed before placing its pages leaves everything to the error path.
   */
  private async whileReading(sc: StepScratch, nChunks: number): Promise<void> {
    if (this.groups.some((g) => g.tier > 0 && !g.pending)) return;
    // Every head's hot-tier admission now, the copies from pages still being read left for after
    // them: the reads' wait is the step's only idle time on a CPU-bound host.
    const e = this.attention(sc, nChunks);
    this.admitHot(e, undefined, true);
    this.hotAdmittedEarly = true;
    // Every head but those with prefetch-staged entries (copied only after the promises): the call
    // itself waits on the reads' flags, and leaves out a head whose read failed.
    const now = new Uint8Array(this.H).fill(1);
    for (const g of this.groups) g.staged?.forEach((x, h) => x && (now[h] = 0));
    const landing = this.groups.flatMap((g) => (g.reads ? [g.reads] : []));
    const attended = await this.attendHeads(e, now.includes(0) ? now : undefined, true, landing);
    if (!attended.includes(0)) {
      this.attendedAll = true;
      // Every read has landed (each head's flag says so); the JS thread hears of it only on a later
      // event-loop turn: the hot-tier copies from the read pages and the DRAM admission run now
      // instead of after that (~1% of the held-out SSD step, bench/runtime-memory.md).
      this.landHotTier(e, false);
      this.admitDram(e);
      return;
    }
    this.rest = attended.map((x) => 1 - x);
  }

  /** What attention runs over, once every group's reads are issued (pages placed, maybe not landed). */
  private attention(sc: StepScratch, nChunks: number): EntryAttention {
    if (this.att) return this.att;
    const { mem } = this.entry;
    const tokSel = concatSelections(
      this.groups.map((g) => g.tokSel),
      this.H,
    );
    const cs = this.cs;
    const sel: Selection =
      tokSel.chunkSize === cs
        ? tokSel
        : { chunkSize: cs, tokens: tokSel.tokens, sinkEnd: tokSel.sinkEnd, tailStart: tokSel.tailStart, offsets: sc.chunkOffsets, chunkIds: sc.chunkIds.subarray(0, nChunks) };
    // The masses live in the entry's scratch (reused across steps): every entry of them is written
    // by the attention calls (each head's by the call attending it) before anything reads it.
    // (The scratch is sized by chunks written; units can be more, with several head groups.)
    const r = resultArrays(mem, sc, tokSel.chunkIds.length);
    const pages = mergeGroupPages(this.groups, sc, this.H, this.reads.buf);
    return (this.att = { tokSel, sel, pages, r, pageMass: mem.ssd ? sc.pageMass.subarray(0, pages.ids.length) : undefined, computeMs: 0 });
  }

  /** Where the tier pages lie, as the hot-tier admission reads them. */
  private pageArgs(pages: StepPages) {
    return {
      pages: pages.buffers,
      pageOffsets: pages.offsets,
      pageIds: pages.ids,
      pageAt: pages.at,
      pageIn: pages.source,
      tail: this.tail,
      tailBase: this.entry.a.lk.sealed,
    };
  }

  /**
   * Hot-tier admission of the kv heads in `heads` (every head when undefined). With `landing`
   * (while the SSD reads are in flight): residency is decided for every page now and copied from
   * every page already there; the copies from the pages still being read (those in the fetch
   * buffer) wait in hotLanding. The tier ends exactly as with one admission after the reads.
   */
  private admitHot(e: EntryAttention, heads: Uint8Array | undefined, landing: boolean): void {
    if (!this.entry.hot) return;
    const { pages } = e;
    const r = native.hotTierAdmitPages({
      ...this.hotArg,
      selection: e.sel,
      tokens: this.entry.a.T,
      ...this.pageArgs(pages),
      ...(landing ? { pageLanding: pages.source.map((b) => (b === 0 ? 1 : 0)) } : {}),
      ...(heads ? { heads } : {}),
    }) as { admitted: number; landing?: Int32Array };
    this.hotAdmitted += r.admitted;
    if (r.landing?.length) this.hotLanding = r.landing;
  }

  /** Makes the hot tier's copies from the SSD-read pages (now landed), or frees those slots (`drop`). */
  private landHotTier(e: EntryAttention, drop: boolean): void {
    const landing = this.hotLanding;
    if (!this.entry.hot || !landing) return;
    this.hotLanding = undefined;
    native.hotTierLandPages({ ...this.hotArg, tokens: this.entry.a.T, ...this.pageArgs(e.pages), landing, ...(drop ? { drop: true } : {}) });
  }

  /**
   * Attention of the kv heads in `heads` (every head when undefined) into the entry's result, after
   * their hot-tier admission (unless `admitted`). Each kv head has its own hot-tier residents and
   * attention output, so the heads done in two passes end exactly as in one.
   */
  private async attendHeads(e: EntryAttention, heads: Uint8Array | undefined, admitted: boolean, landing?: ReadLanding[]): Promise<Uint8Array> {
    const { pages } = e;
    const { mem, a, q } = this.entry;
    if (!admitted) this.admitHot(e, heads, false);
    const t = performance.now();
    const args = {
      ...attentionInputs(mem, a, q),
      selection: e.tokSel,
      fetched: pages.buffers,
      fetchedOffsets: pages.offsets,
      fetchedIds: pages.ids,
      fetchedAt: pages.at,
      fetchedIn: pages.source,
      ...this.hotArg,
      into: e.r,
      ...(e.pageMass ? { fetchedMass: e.pageMass } : {}),
      ...(heads ? { heads } : {}),
      ...(landing?.length ? { landing } : {}),
    };
    const r = this.offThread ? await attendFetchedAsync(args) : attendFetched(args);
    e.computeMs += performance.now() - t;
    // The heads attended: with landing, as the call says; else those of the mask.
    return r.attended ?? (heads ? heads.slice() : new Uint8Array(this.H).fill(1));
  }

  /**
   * DRAM-tier admission of the chunks attention just weighed (the SSD-read pages offered, the
   * resident ones re-scored), once per step: in the callback when every head was attended there
   * (the reads have landed, and the JS thread hears of it only a turn later: the admission fills
   * that gap), else after the reads' promises.
   */
  private admitDram(e: EntryAttention): void {
    const { pages } = e;
    if (this.dramAdmitted !== undefined || !pages.placement || !e.pageMass) return;
    this.dramAdmitted = this.entry.a.lk.tiers!.admit({ layer: 0, offsets: pages.offsets, chunkIds: pages.ids, chunkSize: this.cs, scores: e.pageMass }, this.reads.buf, pages.placement);
  }
}
