/**
 * One decode step of one (sequence, layer) over the memory model (kv-memory.ts):
 *
 *   append the new token to the open tail (not committed) ─▶ extend the index from the tail ─▶
 *   select (the index alone: it never needs the sealed keys) ─▶ fetch the selected chunks: hot-tier
 *   residents stay where they are; sealed chunks come from the DRAM tier, else SSD (TieredKv);
 *   chunks still in the tail are packed from it ─▶ hot-tier admission ─▶ exact attention over sinks
 *   + fetched / hot chunks + tail (attendFetched: bit-identical to attendSparse over a contiguous
 *   cache, whichever tier served a chunk) ─▶ DRAM admission of SSD-read chunks by the attention mass
 *   they received ─▶ (once every entry of the step succeeded) commit: token count + 1, and the
 *   seal this made due starts.
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
import type { KvMemory } from './kv-memory.js';

/** Traffic and time of one step of one entry. */
export interface EntryStepStats {
  /** Selected chunks (all kv heads) and where they came from. */
  chunks: number;
  hotChunks: number;
  dramChunks: number;
  ssdChunks: number;
  tailChunks: number;
  /** Bytes the device transferred for the SSD reads (whole extents). */
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
  const cb = mem.chunkBytes;
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
  const sel = toChunks(lk.policy!.select(q, budget), cs, H);
  const bytesScored = lk.policy!.lastSelectStats().bytesScored;
  const t1 = performance.now();

  // What must be staged page-first: per kv head the selected chunks not resident in the hot tier;
  // of those, `tier` (sealed, via TieredKv) and the rest from the tail. Both lists ascending per head.
  const sealedChunks = lk.sealed / cs;
  const needOff = new Int32Array(H + 1);
  const needIds: number[] = [];
  const needSel: number[] = []; // selection entry of each need entry
  const tierOff = new Int32Array(H + 1);
  const tierIds: number[] = [];
  const tierNeed: number[] = []; // need entry of each tier entry
  const tailNeed: number[] = [];
  for (let h = 0; h < H; h++) {
    const res = hot ? hot.residents(layer, h, seq) : undefined;
    let r = 0;
    for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) {
      const c = sel.chunkIds[i]!;
      if (res) {
        while (r < res.length && res[r]! < c) r++;
        if (r < res.length && res[r] === c) continue;
      }
      if (c < sealedChunks) {
        tierNeed.push(needIds.length);
        tierIds.push(c);
      } else tailNeed.push(needIds.length);
      needIds.push(c);
      needSel.push(i);
    }
    needOff[h + 1] = needIds.length;
    tierOff[h + 1] = tierIds.length;
  }
  const fetched = new Uint8Array(needIds.length * cb);
  const tierBuf = tierIds.length ? new Uint8Array(tierIds.length * cb) : undefined;
  const tierReq = { layer: 0, offsets: tierOff, chunkIds: Int32Array.from(tierIds), chunkSize: cs };
  const stats: EntryStepStats = {
    chunks: sel.chunkIds.length,
    hotChunks: sel.chunkIds.length - needIds.length,
    dramChunks: 0,
    ssdChunks: 0,
    tailChunks: tailNeed.length,
    ssdReadBytes: 0,
    hotAdmitted: 0,
    dramAdmitted: 0,
    selectMs: t1 - t0,
    fetchMs: 0,
    computeMs: 0,
  };
  if (tierBuf) {
    const f = await lk.tiers!.fetch(tierReq, tierBuf);
    stats.dramChunks = f.dramChunks;
    stats.ssdChunks = f.ssdChunks;
    stats.ssdReadBytes = f.ssdReadBytes;
    native.copyChunks(
      tierBuf,
      Float64Array.from(tierNeed, (_, j) => j * cb),
      fetched,
      Float64Array.from(tierNeed, (n) => n * cb),
      cb,
    );
  }
  // Tail chunks, page-first: chunkSize K rows then chunkSize V rows of kv head h.
  if (tailNeed.length) {
    const es = mem.config.dtype === 'f32' ? 4 : 2;
    const tk = new Uint8Array(lk.tailK.buffer, lk.tailK.byteOffset, lk.tailK.byteLength);
    const tv = new Uint8Array(lk.tailV.buffer, lk.tailV.byteOffset, lk.tailV.byteLength);
    const rb = D * es;
    let h = 0;
    for (const n of tailNeed) {
      while (n >= needOff[h + 1]!) h++;
      const c = needIds[n]!;
      const base = n * cb;
      for (let r = 0; r < cs; r++) {
        const src = ((c * cs + r - lk.sealed) * H + h) * rb;
        fetched.set(tk.subarray(src, src + rb), base + r * rb);
        fetched.set(tv.subarray(src, src + rb), base + (cs + r) * rb);
      }
    }
  }
  const pageOffsets = needOff;
  const pageIds = Int32Array.from(needIds);
  if (hot) {
    const r = native.hotTierAdmitPages({ hot: { handle: hot.handle, sequence: seq, layer }, selection: sel, tokens: T, pages: fetched, pageOffsets, pageIds }) as { admitted: number };
    stats.hotAdmitted = r.admitted;
  }
  const t2 = performance.now();
  const args = {
    q,
    qHeads,
    sink: { k: mem.tensor(lk.sinkK, Math.min(p.sinks, T)), v: mem.tensor(lk.sinkV, Math.min(p.sinks, T)) },
    tail: { k: tailK, v: tailV },
    tailBase: lk.sealed,
    selection: sel,
    fetched,
    fetchedOffsets: pageOffsets,
    fetchedIds: pageIds,
    ...(hot ? { hot: { handle: hot.handle, sequence: seq, layer } } : {}),
  };
  const r: FetchedAttentionResult = offThread ? await attendFetchedAsync(args) : attendFetched(args);
  const t3 = performance.now();
  // Chunks read from SSD join the DRAM tier if the attention mass they just received beats the
  // least important resident (resident ones get their score refreshed).
  if (tierBuf && mem.ssd) {
    const scores = Float32Array.from(tierNeed, (n) => r.chunkMass[needSel[n]!]!);
    stats.dramAdmitted = lk.tiers!.admit({ ...tierReq, scores }, tierBuf);
  }
  stats.fetchMs = t2 - t1;
  stats.computeMs = t3 - t2;
  const commit = () => {
    lk.tokens = T;
    mem.startSeal(seq, layer, lk);
  };
  // selection: what attention ran over beside sinks and tail (the runtime's attended tokens).
  return { out: r.out, lse: r.lse, selection: sel, bytesScored, stats, commit };
}
