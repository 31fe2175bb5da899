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
 * input gives the output of a clean run. The sequential and the pipelined runtime both run this
 * function (pipelined: micro-batches of different sequences overlap, I/O and attention off the JS
 * thread), so their outputs are bit-identical.
 */
import { KvdriveError } from '../errors.js';
import { native } from '../native.js';
import type { Selection } from '../index/selection.js';
import type { HotTier } from '../cache/hot-tier.js';
import { attendFetched, attendFetchedAsync, type FetchedAttentionResult } from '../storage/fetched-attention.js';
import type { FetchPlacement } from '../storage/tiered-kv.js';
import type { KvMemory } from '../runtime/kv-memory.js';

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

/** Widens a token-granular selection to the store's chunks (the tiers hold whole chunks). */
function toChunks(sel: Selection, chunkSize: number, heads: number): Selection {
  if (sel.chunkSize === chunkSize) return sel;
  if (chunkSize % sel.chunkSize !== 0)
    throw new KvdriveError('E_INTERNAL', `step: expected a selection chunk size dividing ${chunkSize}, got ${sel.chunkSize}`);
  const f = chunkSize / sel.chunkSize;
  const offsets = new Int32Array(heads + 1);
  const ids: number[] = [];
  for (let h = 0; h < heads; h++) {
    let last = -1;
    for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) {
      const c = Math.floor(sel.chunkIds[i]! / f);
      if (c !== last && c * chunkSize < sel.tailStart) ids.push((last = c));
    }
    offsets[h + 1] = ids.length;
  }
  return { chunkSize, tokens: sel.tokens, sinkEnd: sel.sinkEnd, tailStart: sel.tailStart, offsets, chunkIds: Int32Array.from(ids) };
}

/**
 * Attends entry (seq, layer) for query q with the new token's kRow / vRow (host dtype, kvHeads x
 * headDim). `offThread`: I/O and attention run off the JS thread (pipelined). Nothing is committed:
 * the caller calls `commit()` once every entry of the step succeeded (the token count advances and
 * the seal this made due starts), so a failed step leaves every sequence where it was.
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
): Promise<{ out: Float32Array; lse: Float32Array; selection: Selection; bytesScored: number; stats: EntryStepStats; commit: () => void }> {
  const lk = mem.layer(seq, layer);
  const { shape, policyOptions: p, budget, maxTokens } = mem.config;
  const { kvHeads: H, headDim: D, qHeads } = shape;
  const cs = p.chunkSize;
  const row = H * D;
  await mem.settleSeal(seq, layer, lk);
  const at = lk.tokens;
  const T = at + 1;
  if (T > maxTokens) throw new KvdriveError('E_BUDGET', `attend seq ${seq} layer ${layer} context: expected at most maxTokens = ${maxTokens} tokens, got ${T}`);
  const slot = at - lk.sealed;
  if (slot >= mem.tailCapacity) throw new KvdriveError('E_INTERNAL', `step: expected the tail to hold token ${at} (capacity ${mem.tailCapacity} from ${lk.sealed}), got it full`);
  // Append (not committed: a failed step leaves tokens unchanged and a retry rewrites the same rows).
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
  // What is attended (single tokens for kvdrive: the budget counts tokens) and the chunks holding it.
  const tokSel = lk.policy!.select(q, budget);
  const bytesScored = lk.policy!.lastSelectStats().bytesScored;
  const sel = toChunks(tokSel, cs, H);
  const t1 = performance.now();

  // Per kv head the selected chunks that are sealed and not resident in the hot tier: fetched
  // through the tiers (ascending per head). Chunks still in the tail are read there in place.
  const sealedChunks = lk.sealed / cs;
  const tierOff = new Int32Array(H + 1);
  const tierIds: number[] = [];
  const tierSel: number[] = []; // chunk-selection entry of each tier entry
  let hotChunks = 0;
  let tailChunks = 0;
  for (let h = 0; h < H; h++) {
    const res = hot ? hot.residents(layer, h, seq) : undefined;
    let r = 0;
    for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) {
      const c = sel.chunkIds[i]!;
      if (res) {
        while (r < res.length && res[r]! < c) r++;
        if (r < res.length && res[r] === c) {
          hotChunks++;
          continue;
        }
      }
      if (c >= sealedChunks) {
        tailChunks++;
        continue;
      }
      tierIds.push(c);
      tierSel.push(i);
    }
    tierOff[h + 1] = tierIds.length;
  }
  const tierReq = { layer: 0, offsets: tierOff, chunkIds: Int32Array.from(tierIds), chunkSize: cs };
  const stats: EntryStepStats = {
    chunks: sel.chunkIds.length,
    hotChunks,
    dramChunks: 0,
    ssdChunks: 0,
    tailChunks,
    ssdReadBytes: 0,
    hotAdmitted: 0,
    dramAdmitted: 0,
    selectMs: t1 - t0,
    fetchMs: 0,
    computeMs: 0,
  };
  // SSD reads land in `readBuf` (sized for them alone); DRAM-tier chunks stay in the arena, pinned
  // until released below.
  let readBuf = new Uint8Array(0);
  let placement: FetchPlacement | undefined;
  if (tierIds.length) {
    const f = await lk.tiers!.fetchInPlace(tierReq, (bytes) => (readBuf = new Uint8Array(bytes)));
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
    };
    const r: FetchedAttentionResult = offThread ? await attendFetchedAsync(args) : attendFetched(args);
    const t3 = performance.now();
    // Chunks read from SSD join the DRAM tier if the attention mass their tokens just received
    // beats the least important resident (resident ones get their score refreshed).
    if (placement && mem.ssd) {
      const chunkMass = massPerChunk(tokSel, r.chunkMass, sel, cs, H);
      const scores = Float32Array.from(tierSel, (i) => chunkMass[i]!);
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
}

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
