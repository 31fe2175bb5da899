// The fetch stage's native passes: fetchSplit (native/cache/fetch_split.cc: selection -> chunks,
// split into hot / tail / tier) and the DRAM tier's lookup and pins (native/cache/dram_tier.cc via
// DramStore.locate / pin / unpin).
import { afterEach, describe, expect, it } from 'vitest';
import { HotTier } from '../src/cache/hot-tier.js';
import { native } from '../src/native.js';
import { DramStore } from '../src/storage/dram-store.js';
import type { StoreShape } from '../src/storage/ssd-store.js';
import { TieredKv } from '../src/storage/tiered-kv.js';
import { expectKvdError, randn, rng } from './helpers.js';

const tiers: HotTier[] = [];
afterEach(() => {
  while (tiers.length) tiers.pop()!.destroy();
});

const H = 2;
const D = 8;
const PAGE = 4;

function outFor(units: number) {
  return { chunkOffsets: new Int32Array(H + 1), chunkIds: new Int32Array(units), tierOffsets: new Int32Array(H + 1), tierIds: new Int32Array(units), tierEntry: new Int32Array(units) };
}

/** A token selection (chunkSize 1) of `tokens` tokens: per kv head the given ascending token ids. */
function tokenSelection(tokens: number, tailStart: number, perHead: number[][]) {
  const offsets = new Int32Array(perHead.length + 1);
  perHead.forEach((ids, h) => (offsets[h + 1] = offsets[h]! + ids.length));
  return { chunkSize: 1, tokens, sinkEnd: 0, tailStart, offsets, chunkIds: Int32Array.from(perHead.flat()) };
}

describe('fetchSplit', () => {
  it('widens a token selection to page chunks before the tail and splits hot / tail / tier like a per-unit reference', async () => {
    const r = rng(5);
    const tokens = 200;
    const tailStart = 180;
    const sealed = 160; // chunks 0..39 sealed; 40..44 in the open tail
    const perHead = [0, 1].map(() => [...new Set(Array.from({ length: 90 }, () => Math.floor(r() * tokens)))].sort((a, b) => a - b));
    const sel = tokenSelection(tokens, tailStart, perHead);
    // A hot tier holding some chunks of each head (placed by warm-up).
    const hot = new HotTier({ layers: 1, kvHeads: H, headDim: D, dtype: 'f32', chunkSize: PAGE, budget: 64, windows: 2, maxBytes: 1 << 24 });
    tiers.push(hot);
    const kv = { data: randn(tokens * H * D, 3), dtype: 'f32' as const, tokens, heads: H, dim: D };
    const warmIds = [[1, 7, 12, 41], [3, 7, 30]];
    hot.warm({ layer: 0, k: kv, v: kv, offsets: Int32Array.of(0, 4, 7), chunkIds: Int32Array.from(warmIds.flat()) });
    const out = outFor(sel.chunkIds.length);
    const got = native.fetchSplit({ selection: sel, kvHeads: H, pageChunkSize: PAGE, sealed, hot: { handle: hot.handle, layer: 0 }, out }) as { chunks: number; hot: number; tail: number; tier: number };

    // Reference: per head the distinct chunks floor(t / PAGE) with chunk * PAGE < tailStart; a
    // resident is hot, a chunk at or after sealed / PAGE is in the tail, the rest go to the tiers.
    let chunks = 0, nHot = 0, nTail = 0;
    const tier: number[][] = [];
    for (let h = 0; h < H; h++) {
      const cs = [...new Set(perHead[h]!.map((t) => Math.floor(t / PAGE)))].filter((c) => c * PAGE < tailStart);
      expect(Array.from(out.chunkIds.subarray(out.chunkOffsets[h]!, out.chunkOffsets[h + 1]!)), `chunks of head ${h}`).toEqual(cs);
      chunks += cs.length;
      const resident = new Set(Array.from(hot.residents(0, h)));
      tier.push([]);
      for (const c of cs) {
        if (resident.has(c)) nHot++;
        else if (c >= sealed / PAGE) nTail++;
        else tier[h]!.push(c);
      }
      expect(Array.from(out.tierIds.subarray(out.tierOffsets[h]!, out.tierOffsets[h + 1]!)), `tier chunks of head ${h}`).toEqual(tier[h]);
    }
    expect(got).toEqual({ chunks, hot: nHot, tail: nTail, tier: tier.flat().length });
    expect(nHot).toBeGreaterThan(0);
    expect(nTail).toBeGreaterThan(0);
    // tierEntry: each tier chunk's entry in the chunk lists.
    for (let k = 0; k < got.tier; k++) expect(out.chunkIds[out.tierEntry[k]!]).toBe(out.tierIds[k]);

    // One kv head at a time (headBase: the head's index in the hot tier, as a step selecting head
    // group by head group splits each group): the same chunks and split as the whole call's slice.
    for (let h = 0; h < H; h++) {
      const one = tokenSelection(tokens, tailStart, [perHead[h]!]);
      const o1 = outFor(one.chunkIds.length);
      const g1 = native.fetchSplit({ selection: one, kvHeads: 1, headBase: h, pageChunkSize: PAGE, sealed, hot: { handle: hot.handle, layer: 0 }, out: o1 }) as typeof got;
      expect(Array.from(o1.chunkIds.subarray(0, g1.chunks)), `head ${h} alone`).toEqual(Array.from(out.chunkIds.subarray(out.chunkOffsets[h]!, out.chunkOffsets[h + 1]!)));
      expect(Array.from(o1.tierIds.subarray(0, g1.tier)), `head ${h} alone: tier`).toEqual(tier[h]);
    }
    await expectKvdError(() => native.fetchSplit({ selection: sel, kvHeads: H, headBase: 1, pageChunkSize: PAGE, sealed, hot: { handle: hot.handle, layer: 0 }, out }), 'E_SHAPE', /at least 3 kv heads/);
  });

  it('takes a page-granular selection whole (no tail filter), and without a hot tier nothing is hot', () => {
    const sel = { chunkSize: PAGE, tokens: 64, sinkEnd: 0, tailStart: 48, offsets: Int32Array.of(0, 3, 5), chunkIds: Int32Array.of(0, 5, 11, 2, 9) };
    const out = outFor(5);
    const got = native.fetchSplit({ selection: sel, kvHeads: H, pageChunkSize: PAGE, sealed: 40, out });
    expect(got).toEqual({ chunks: 5, hot: 0, tail: 1, tier: 4 });
    expect(Array.from(out.chunkIds.subarray(0, 5))).toEqual([0, 5, 11, 2, 9]);
    expect(Array.from(out.tierIds.subarray(0, 4))).toEqual([0, 5, 2, 9]);
    expect(Array.from(out.tierOffsets)).toEqual([0, 2, 4]);
    expect(Array.from(out.tierEntry.subarray(0, 4))).toEqual([0, 1, 3, 4]);
  });

  it('rejects bad arguments with typed errors before writing anything', async () => {
    const sel = tokenSelection(64, 60, [[1, 2, 30], [5]]);
    const out = outFor(4);
    out.chunkIds.fill(-7);
    await expectKvdError(() => native.fetchSplit({ selection: sel, kvHeads: H, pageChunkSize: 4, sealed: 32, out: { ...out, tierIds: new Int32Array(3) } }), 'E_SHAPE', /tierIds.*at least 4/);
    await expectKvdError(() => native.fetchSplit({ selection: sel, kvHeads: H, pageChunkSize: 4, sealed: 30, out }), 'E_CONFIG', /multiple of pageChunkSize/);
    await expectKvdError(() => native.fetchSplit({ selection: { ...tokenSelection(64, 60, [[1, 2], [5]]), chunkSize: 3 }, kvHeads: H, pageChunkSize: 4, sealed: 32, out }), 'E_CONFIG', /multiple of selection.chunkSize/);
    await expectKvdError(() => native.fetchSplit({ selection: sel, kvHeads: 3, pageChunkSize: 4, sealed: 32, out }), 'E_SHAPE');
    await expectKvdError(() => native.fetchSplit({ selection: sel, kvHeads: H, pageChunkSize: 4, sealed: 32, out: { ...out, chunkOffsets: new Float64Array(3) } }), 'E_DTYPE');
    const hot = new HotTier({ layers: 1, kvHeads: H, headDim: D, dtype: 'f32', chunkSize: 8, budget: 64, windows: 1, maxBytes: 1 << 24 });
    tiers.push(hot);
    await expectKvdError(() => native.fetchSplit({ selection: sel, kvHeads: H, pageChunkSize: 4, sealed: 32, hot: { handle: hot.handle, layer: 0 }, out }), 'E_SHAPE', /chunk 4/);
    await expectKvdError(() => native.fetchSplit({ selection: sel, kvHeads: H, pageChunkSize: 8, sealed: 32, hot: { handle: hot.handle, layer: 1 }, out }), 'E_RANGE');
    expect(Array.from(out.chunkIds)).toEqual([-7, -7, -7, -7]);
  });
});

const shape: StoreShape = { layers: 1, kvHeads: H, headDim: D, dtype: 'f32', chunkSize: PAGE };

/** A DRAM store holding every chunk of one 16-chunk segment 's' (both heads). */
function fullStore(): DramStore {
  const cb = 2 * PAGE * D * 4;
  const dram = new DramStore({ budgetBytes: 40 * (cb + DramStore.metadataBytesPerSlot), shape, blockBytes: 8 * cb });
  dram.addSegment('s', 16 * PAGE);
  const src = new Uint8Array(16 * cb).map((_, i) => i % 251);
  for (let h = 0; h < H; h++) dram.put('s', 0, h, Array.from({ length: 16 }, (_, i) => i), Array(16).fill(1), src, Array.from({ length: 16 }, (_, i) => i * cb));
  return dram;
}

describe('DRAM tier lookups and pins (dram_tier.cc)', () => {
  it('a rejected pin or unpin changes no pin; pins keep pinned slots from eviction until unpinned', async () => {
    const dram = fullStore();
    const a = dram.lookup('s', 0, 0, 3);
    const b = dram.lookup('s', 0, 1, 4);
    dram.pin(Int32Array.of(a, b));
    // Unpinning a twice: the second fails and the first is rolled back.
    await expectKvdError(() => dram.unpin(Int32Array.of(a, a)), 'E_INTERNAL', /no pin|unpinned more often/);
    await expectKvdError(() => dram.pin(Int32Array.of(a, 1 << 20)), 'E_RANGE', /expected slots in/);
    dram.unpin(Int32Array.of(a, b));
    await expectKvdError(() => dram.unpin(Int32Array.of(a)), 'E_INTERNAL', /no pin/);
  });

  it('fetchInPlace placements stay valid while another is outstanding, and their arrays are reused once released', async () => {
    const dram = fullStore();
    const kv = new TieredKv({ dram, segments: ['s'], promote: false });
    const req = (ids: number[][]) => ({ layer: 0, offsets: Int32Array.of(0, ids[0]!.length, ids[0]!.length + ids[1]!.length), chunkIds: Int32Array.from(ids.flat()) });
    const first = await kv.fetchInPlace(req([[1, 2, 9], [0]]), new Uint8Array(0));
    const firstAt = Array.from(first.placement.at);
    const firstSource = Array.from(first.placement.source);
    const second = await kv.fetchInPlace(req([[15], [14, 13]]), new Uint8Array(0));
    expect(Array.from(first.placement.at)).toEqual(firstAt);
    expect(Array.from(first.placement.source)).toEqual(firstSource);
    // Every entry points at its chunk's slot in the arena (blocks of 8 slots).
    const check = (p: typeof first.placement, ids: number[][]) =>
      ids.forEach((list, h) =>
        list.forEach((c, j) => {
          const i = (h === 0 ? 0 : ids[0]!.length) + j;
          const slot = dram.lookup('s', 0, h, c);
          expect(p.source[i]).toBe(1 + dram.blockOf(slot));
          expect(p.at[i]).toBe(dram.offsetOf(slot));
        }),
      );
    check(first.placement, [[1, 2, 9], [0]]);
    check(second.placement, [[15], [14, 13]]);
    first.placement.release();
    second.placement.release();
    const third = await kv.fetchInPlace(req([[4], [5]]), new Uint8Array(0));
    expect([first.placement.at.buffer, second.placement.at.buffer]).toContain(third.placement.at.buffer);
    third.placement.release();
    // All pins released: every chunk can be evicted again.
    for (let h = 0; h < H; h++) for (let c = 0; c < 16; c++) expect(dram.evict('s', 0, h, c)).toBe(true);
  });

  it('residentPages: the chain and arenas of a DRAM tier that holds everything and never moves it; none where pages may move; a bad layer or a closed tier is a typed error', async () => {
    const dram = fullStore();
    const resident = new TieredKv({ dram, segments: ['s'], promote: false, pinInPlace: false });
    const pages = resident.residentPages(0)!;
    expect(Array.from(pages.segStart)).toEqual([0, 16]);
    expect(pages.maps[0]).toBe(dram.slotMap('s').slots);
    expect(pages.arenas).toBe(dram.arenas);
    expect(pages.slotsPerBlock).toBe(dram.slotsPerBlock);
    // Pinned in place (an SSD-backed tier's default): its pages may be evicted between steps.
    expect(new TieredKv({ dram, segments: ['s'], promote: false }).residentPages(0)).toBeUndefined();
    await expectKvdError(() => resident.residentPages(1), 'E_RANGE', /layer/);
    await expectKvdError(() => resident.residentPages(-1), 'E_RANGE', /layer/);
    await resident.close();
    await expectKvdError(() => resident.residentPages(0), 'E_CLOSED');
  });

  it('dramLocate rejects a slot map that does not cover the chain and pins nothing', async () => {
    const dram = fullStore();
    const kv = new TieredKv({ dram, segments: ['s'], promote: false });
    const chain = { segStart: Int32Array.of(0, 16), maps: [dram.slotMap('s').slots.subarray(0, 20)] };
    const n = 4;
    const out = { slots: new Int32Array(n), entries: new Int32Array(n), misses: new Int32Array(n) };
    const req = { layer: 0, offsets: Int32Array.of(0, 2, 4), chunkIds: Int32Array.of(1, 2, 3, 9) };
    // Head 1's chunks lie past the truncated map: E_RANGE, and head 0's hits are not left pinned.
    await expectKvdError(() => DramStore.locate(dram, req, chain, out, { kvHeads: H, chunkBytes: kv.chunkBytes, pin: true }), 'E_RANGE', /slot map holding/);
    // A chain of 4 chunks: chunk 9 lies past it; segStart not starting at 0 or decreasing; a map per segment.
    await expectKvdError(() => DramStore.locate(dram, req, { ...chain, segStart: Int32Array.of(0, 4) }, out, { kvHeads: H, chunkBytes: kv.chunkBytes, pin: true }), 'E_RANGE', /chunk/);
    await expectKvdError(() => DramStore.locate(dram, req, { ...chain, segStart: Int32Array.of(1, 16) }, out, { kvHeads: H, chunkBytes: kv.chunkBytes, pin: true }), 'E_RANGE', /starting at 0/);
    await expectKvdError(() => DramStore.locate(dram, req, { ...chain, segStart: Int32Array.of(0, 16, 8) }, out, { kvHeads: H, chunkBytes: kv.chunkBytes, pin: true }), 'E_RANGE', /non-decreasing/);
    await expectKvdError(() => DramStore.locate(dram, req, { ...chain, segStart: Int32Array.of(0, 8, 16) }, out, { kvHeads: H, chunkBytes: kv.chunkBytes, pin: true }), 'E_SHAPE', /one per segment/);
    for (let h = 0; h < H; h++) for (let c = 0; c < 16; c++) expect(dram.evict('s', 0, h, c)).toBe(true);
  });
});
