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
 *   a contiguous cache with the same selection, whichever tier served a token) ─▶ DRAM admission of
 *   SSD-read chunks by the attention mass their tokens received ─▶ (once every entry of the step
 *   succeeded) commit: token count + 1, and the seal this made due starts.
 *
 * The token count advances only after attention succeeded, so a failed step retried with the same
 * input gives the output of a clean run. The stages are separate functions: appendEntry (main
 * thread: it mutates tail and index), selectEntry (select-stage.ts: inline in sequential mode, on a
 * piscina stage worker in pipelined mode) and fetchAttendEntry. Both runtime modes run the same
 * three, so their outputs are bit-identical.
 */
import { availableParallelism } from 'node:os';
import { KvdriveError } from '../errors.js';
import { native } from '../native.js';
import type { Selection } from '../index/selection.js';
import type { HotTier } from '../cache/hot-tier.js';
import { attendFetched, attendFetchedAsync, type FetchedAttentionResult } from '../storage/fetched-attention.js';
import type { FetchPlacement } from '../storage/tiered-kv.js';
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
 * Output arrays of one (sequence, layer)'s fetch split (native fetchSplit), reused by its steps: at
 * most one step of a (sequence, layer) runs at a time, and nothing keeps them past the step. Grown
 * (doubled) when a selection names more units than they hold.
 */
interface SplitScratch {
  chunkOffsets: Int32Array;
  chunkIds: Int32Array;
  tierOffsets: Int32Array;
  tierIds: Int32Array;
  tierEntry: Int32Array;
}
const splitScratch = new WeakMap<LayerKv, SplitScratch>();

function scratchFor(lk: LayerKv, heads: number, units: number): SplitScratch {
  let s = splitScratch.get(lk);
  if (!s || s.chunkIds.length < units) {
    const cap = Math.max(units, 2 * (s?.chunkIds.length ?? 0));
    s = { chunkOffsets: new Int32Array(heads + 1), chunkIds: new Int32Array(cap), tierOffsets: new Int32Array(heads + 1), tierIds: new Int32Array(cap), tierEntry: new Int32Array(cap) };
    splitScratch.set(lk, s);
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
 * thread's turn: append, select inline (selectEntry), fetch + compute. `offThread`: I/O and
 * attention run off the JS thread.
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
  return fetchAttendEntry(mem, hot, seq, layer, a, q, selectEntry(a.handle, q, mem.config.budget), offThread);
}

/**
 * Fetch and compute stages of entry (seq, layer) once appended (`a`) and selected (`s`, by
 * selectEntry, inline or on a stage worker): the selected chunks are fetched through the tiers and
 * attended with q. `offThread`: I/O and attention run off the JS thread (pipelined). Nothing is
 * committed: the caller calls `commit()` once every entry of the step succeeded (the token count
 * advances and the seal this made due starts), so a failed step leaves every sequence where it was.
 */
export async function fetchAttendEntry(
  mem: KvMemory,
  hot: HotTier | undefined,
  seq: number,
  layer: number,
  a: AppendedEntry,
  q: Float32Array,
  s: EntrySelection,
  offThread: boolean,
): Promise<EntryResult> {
  const { lk, T, tailK, tailV } = a;
  const { shape, policyOptions: p } = mem.config;
  const { kvHeads: H, qHeads } = shape;
  const cs = p.chunkSize;
  // What is attended (single tokens for kvdrive: the budget counts tokens) and the chunks holding it.
  const tokSel = s.selection;
  const bytesScored = s.bytesScored;
  const t1 = performance.now();

  // One native pass (native/cache/fetch_split.cc): the selection widened to the tiers' chunks (the
  // chunks holding a selected token, before the tail) and split per kv head into hot-tier
  // residents, chunks still in the tail (read there in place) and the rest, fetched through the
  // tiers (ascending per head; tierEntry: each one's entry in the chunk selection).
  const sp = scratchFor(lk, H, tokSel.chunkIds.length);
  const split = native.fetchSplit({
    selection: tokSel,
    kvHeads: H,
    pageChunkSize: cs,
    sealed: lk.sealed,
    ...(hot ? { hot: { handle: hot.handle, sequence: seq, layer } } : {}),
    out: sp,
  }) as { chunks: number; hot: number; tail: number; tier: number };
  const sel: Selection =
    tokSel.chunkSize === cs
      ? tokSel
      : { chunkSize: cs, tokens: tokSel.tokens, sinkEnd: tokSel.sinkEnd, tailStart: tokSel.tailStart, offsets: sp.chunkOffsets, chunkIds: sp.chunkIds.subarray(0, split.chunks) };
  const nTier = split.tier;
  const tierOff = sp.tierOffsets;
  const tierIds = sp.tierIds.subarray(0, nTier);
  const hotChunks = split.hot;
  const tailChunks = split.tail;
  const tierReq = { layer: 0, offsets: tierOff, chunkIds: tierIds, chunkSize: cs };
  const stats: EntryStepStats = {
    chunks: sel.chunkIds.length,
    hotChunks,
    dramChunks: 0,
    ssdChunks: 0,
    tailChunks,
    ssdReadBytes: 0,
    hotAdmitted: 0,
    dramAdmitted: 0,
    selectMs: a.extendMs + s.ms,
    fetchMs: 0,
    computeMs: 0,
  };
  // SSD reads land packed in `readBuf`, one of the memory's fetch buffers (reused across steps,
  // returned below); DRAM-tier chunks stay in the arena, pinned until released below.
  let readBuf: Uint8Array = NO_READS;
  let placement: FetchPlacement | undefined;
  try {
    if (tierIds.length) {
      const f = await lk.tiers!.fetchInPlace(tierReq, (bytes) => (readBuf = mem.acquireFetchBuffer(bytes)));
      stats.dramChunks = f.stats.dramChunks;
      stats.ssdChunks = f.stats.ssdChunks;
      stats.ssdReadBytes = f.stats.ssdReadBytes;
      placement = f.placement;
    }
    try {
      const pages = {
        buffers: [readBuf, ...(placement ? placement.arenas : [])],
        offsets: tierOff,
        ids: tierReq.chunkIds,
        at: placement ? placement.at : new Float64Array(0),
        source: placement ? placement.source : new Uint8Array(0),
      };
      const tail = { k: tailK, v: tailV };
      if (hot) {
        const r = native.hotTierAdmitPages({
          hot: { handle: hot.handle, sequence: seq, layer },
          selection: sel,
          tokens: T,
          pages: pages.buffers,
          pageOffsets: pages.offsets,
          pageIds: pages.ids,
          pageAt: pages.at,
          pageIn: pages.source,
          tail,
          tailBase: lk.sealed,
        }) as { admitted: number };
        stats.hotAdmitted = r.admitted;
      }
      const t2 = performance.now();
      const args = {
        q,
        qHeads,
        sink: { k: mem.tensor(lk.sinkK, Math.min(p.sinks, T)), v: mem.tensor(lk.sinkV, Math.min(p.sinks, T)) },
        tail,
        tailBase: lk.sealed,
        selection: tokSel,
        pageChunkSize: cs,
        fetched: pages.buffers,
        fetchedOffsets: pages.offsets,
        fetchedIds: pages.ids,
        fetchedAt: pages.at,
        fetchedIn: pages.source,
        ...(hot ? { hot: { handle: hot.handle, sequence: seq, layer } } : {}),
        threads: ATTEND_THREADS,
      };
      const r: FetchedAttentionResult = offThread ? await attendFetchedAsync(args) : attendFetched(args);
      const t3 = performance.now();
      // Chunks read from SSD join the DRAM tier if the attention mass their tokens just received
      // beats the least important resident (resident ones get their score refreshed).
      if (placement && mem.ssd) {
        const chunkMass = massPerChunk(tokSel, r.chunkMass, sel, cs, H);
        const scores = Float32Array.from(sp.tierEntry.subarray(0, nTier), (i) => chunkMass[i]!);
        stats.dramAdmitted = lk.tiers!.admit({ ...tierReq, scores }, readBuf, placement);
      }
      stats.fetchMs = t2 - t1;
      stats.computeMs = t3 - t2;
      const commit = () => {
        lk.tokens = T;
        mem.startSeal(seq, layer, lk);
      };
      // selection: what attention ran over beside sinks and tail (the runtime's attended tokens).
      return { out: r.out, lse: r.lse, selection: tokSel, bytesScored, stats, commit };
    } finally {
      placement?.release();
    }
  } finally {
    if (readBuf !== NO_READS) mem.releaseFetchBuffer(readBuf);
  }
}

/** The fetch buffer of an entry that read nothing from SSD. */
const NO_READS = new Uint8Array(0);

/** Attention mass of each entry of the chunk selection `sel`: the sum over the tokens of `tokSel` in that chunk. */
function massPerChunk(tokSel: Selection, tokMass: Float32Array, sel: Selection, chunkSize: number, heads: number): Float32Array {
  if (tokSel === sel) return tokMass;
  const f = chunkSize / tokSel.chunkSize;
  const out = new Float32Array(sel.chunkIds.length);
  for (let h = 0; h < heads; h++) {
    let j = sel.offsets[h]!;
    for (let i = tokSel.offsets[h]!; i < tokSel.offsets[h + 1]!; i++) {
      const c = Math.floor(tokSel.chunkIds[i]! / f);
      while (j < sel.offsets[h + 1]! && sel.chunkIds[j]! < c) j++;
      if (j < sel.offsets[h + 1]! && sel.chunkIds[j] === c) out[j]! += tokMass[i]!;
    }
  }
  return out;
}
