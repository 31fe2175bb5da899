import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { DramStore } from '../src/storage/dram-store.js';
import { SlotHeap } from '../src/storage/slot-heap.js';
import { expectedChunk, segmentKv } from './storage-kv.js';
import type { StoreShape } from '../src/storage/ssd-store.js';
import { expectKvdError, recordHugePageAdvice, rng } from './helpers.js';
import { native } from '../src/native.js';
import { KV_ALIGNMENT, kvArray, placedArray } from '../src/util/kv-array.js';

const shape: StoreShape = { layers: 2, kvHeads: 2, headDim: 16, dtype: 'f16', chunkSize: 4 }; // 256-byte chunks

function page(bytes: number, tag: number): Uint8Array {
  const p = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i++) p[i] = (tag * 31 + i) & 0xff;
  return p;
}

describe('slot heap (lazy increases)', () => {
  it('always yields the exact minimum score under random inserts, updates and removals', () => {
    const r = rng(8);
    const n = 300;
    const h = new SlotHeap(n);
    const live = new Map<number, number>();
    for (let op = 0; op < 20000; op++) {
      const slot = Math.floor(r() * n);
      const x = r();
      if (!live.has(slot)) {
        h.insert(slot, x);
        live.set(slot, x);
      } else if (x < 0.15) {
        h.remove(slot);
        live.delete(slot);
      } else {
        const s = Math.floor(r() * 50) / 50; // ties included
        h.update(slot, s);
        live.set(slot, s);
      }
      if (op % 7 === 0 && live.size) {
        const top = h.peek();
        expect(live.get(top)).toBe(Math.min(...live.values()));
      }
    }
    expect(h.size).toBe(live.size);
  });

  it('refresh (native, batched) ends where update one by one does: same scores, same eviction order', () => {
    const r = rng(21);
    const n = 500;
    const a = new SlotHeap(n);
    const b = new SlotHeap(n);
    for (let s = 0; s < n; s++) {
      // Every fifth slot stays out of the heap (a refresh of it only keeps its score).
      if (s % 5 === 4) continue;
      const x = Math.floor(r() * 40) / 40;
      a.insert(s, x);
      b.insert(s, x);
    }
    for (let round = 0; round < 30; round++) {
      // Distinct slots (a lookup's hits), scores read through entries, increases and decreases mixed.
      const slots = Int32Array.from({ length: n }, (_, k) => k).sort(() => r() - 0.5).subarray(0, 1 + Math.floor(r() * 200));
      const scores = Float32Array.from({ length: 300 }, () => Math.floor(r() * 40) / 40);
      const entries = Int32Array.from(slots, () => Math.floor(r() * scores.length));
      a.refresh(slots, entries, scores);
      for (let k = 0; k < slots.length; k++) b.update(slots[k]!, scores[entries[k]!]!);
      for (let s = 0; s < n; s++) expect(a.scoreOf(s)).toBe(b.scoreOf(s));
      if (round % 3 === 2) {
        // Evict a few: the same slots leave in the same order.
        for (let j = 0; j < 5; j++) {
          const top = a.peek();
          expect(top).toBe(b.peek());
          a.remove(top);
          b.remove(top);
        }
      }
    }
  });

  it('refresh checks every slot, entry and score before changing any', async () => {
    const h = new SlotHeap(4);
    h.insert(1, 0.5);
    h.insert(2, 0.25);
    await expectKvdError(() => h.refresh(Int32Array.of(1, 4), Int32Array.of(0, 0), Float32Array.of(0.1)), 'E_RANGE', /slots\[1\]: expected a slot in \[0, 4\), got 4/);
    await expectKvdError(() => h.refresh(Int32Array.of(1, 2), Int32Array.of(0, 3), Float32Array.of(0.1)), 'E_RANGE', /entries\[1\]: expected an index into the 1 scores, got 3/);
    await expectKvdError(() => h.refresh(Int32Array.of(1, 2), Int32Array.of(0, 1), Float32Array.of(0.1, Infinity)), 'E_NONFINITE', /scores\[entries\[1\]\]/);
    await expectKvdError(() => h.refresh(Int32Array.of(1, 2), Int32Array.of(0), Float32Array.of(0.1)), 'E_SHAPE', /entries/);
    expect([h.scoreOf(1), h.scoreOf(2), h.peek()]).toEqual([0.5, 0.25, 2]);
    // The native pass itself: the heap's keys (one per position) are required and sized like it.
    const args = { records: new Float32Array(12), heap: new Int32Array(4), slots: Int32Array.of(1), entries: Int32Array.of(0), scores: Float32Array.of(0.1), out: { slots: new Int32Array(1), scores: new Float32Array(1) } };
    await expectKvdError(() => native.dramHeapRefresh(args), 'E_TYPE', /dramHeapRefresh\.keys: expected a Float32Array/);
    await expectKvdError(() => native.dramHeapRefresh({ ...args, keys: new Float32Array(3) }), 'E_SHAPE', /keys \(one per heap position\)/);
    // The offset (the DRAM tier's GreedyDual L) must be a finite number, and offset + score finite in f32.
    const ok = { ...args, keys: new Float32Array(4) };
    await expectKvdError(() => native.dramHeapRefresh({ ...ok, offset: NaN }), 'E_TYPE', /dramHeapRefresh\.offset: expected a finite number, got NaN/);
    await expectKvdError(() => native.dramHeapRefresh({ ...ok, offset: '1' }), 'E_TYPE', /offset: expected a finite number, got a non-number/);
    await expectKvdError(() => native.dramHeapRefresh({ ...ok, scores: Float32Array.of(3e38), offset: 3e38 }), 'E_NONFINITE', /scores\[entries\[0\]\] \+ offset: expected a finite number, got inf/i);
    // offset + score summed in double and rounded once to f32, as the DRAM tier's priority.
    const h2 = new SlotHeap(4);
    h2.insert(1, 0.5);
    h2.refresh(Int32Array.of(1), Int32Array.of(0), Float32Array.of(0.1), 0.3);
    expect(h2.scoreOf(1)).toBe(Math.fround(0.3 + Math.fround(0.1)));
  });

  it('sifts a 4-ary heap correctly at every size: draining it yields the scores in order', () => {
    const r = rng(3);
    for (const n of [1, 2, 3, 4, 5, 6, 17, 21, 64, 65, 333]) {
      const h = new SlotHeap(n);
      const want: number[] = [];
      for (let s = 0; s < n; s++) {
        const x = Math.floor(r() * 30) / 30; // ties included
        h.insert(s, x);
        want.push(x);
      }
      // Some increases (lazy) and decreases before draining.
      for (let s = 0; s < n; s += 3) {
        const x = Math.floor(r() * 30) / 30;
        h.update(s, x);
        want[s] = x;
      }
      const got: number[] = [];
      while (h.size) {
        const top = h.peek();
        got.push(h.scoreOf(top));
        h.remove(top);
      }
      expect(got, `n ${n}`).toEqual(want.slice().sort((a, b) => a - b).map((x) => Math.fround(x)));
    }
  });
});

describe('DRAM store', () => {
  it('asks for huge pages on every arena before writing it (attention reads its rows at random)', async () => {
    let d: DramStore | undefined;
    const advised = await recordHugePageAdvice(() => (d = new DramStore({ budgetBytes: 40 * (256 + DramStore.metadataBytesPerSlot), shape, blockBytes: 7 * 256 })));
    expect(advised.length).toBe(d!.arenas.length);
    advised.forEach((a, i) => expect(a).toBe(d!.arenas[i]));
    // The binding itself: whole 2 MiB pages inside the view only, any TypedArray, shared or not.
    const big = new Uint8Array(new SharedArrayBuffer(9 << 20), 4096, (8 << 20) + 100);
    const bytes = native.adviseHugePages(big) as number;
    expect(bytes % (2 << 20)).toBe(0);
    expect(bytes).toBeLessThanOrEqual(big.byteLength);
    let thp = 'never';
    try {
      thp = /\[(\w+)\]/.exec(readFileSync('/sys/kernel/mm/transparent_hugepage/enabled', 'utf8'))?.[1] ?? 'never';
    } catch {
      // no THP in this kernel: nothing is advised
    }
    // 8 MiB + 100 bytes from an offset of 4 KiB hold at least three whole aligned 2 MiB pages.
    if (thp !== 'never') expect(bytes).toBeGreaterThanOrEqual(3 * (2 << 20));
    expect(native.adviseHugePages(new Float64Array(4))).toBe(0);
  });

  it('places its arenas on page boundaries, as every KV array read at random is (kv-array.ts)', () => {
    const d = new DramStore({ budgetBytes: 40 * (256 + DramStore.metadataBytesPerSlot), shape, blockBytes: 7 * 256 });
    for (const a of d.arenas) expect(native.alignmentGap(a, KV_ALIGNMENT)).toBe(0);
    // V8 puts a large buffer's first byte 16 bytes past a page: what the placement corrects.
    for (const make of [(n: number) => new Uint8Array(n), (n: number) => new Uint8Array(new SharedArrayBuffer(n))]) {
      const raw = make(8 << 20);
      const gap = native.alignmentGap(raw, KV_ALIGNMENT) as number;
      expect(gap).toBeGreaterThanOrEqual(0);
      expect(gap).toBeLessThan(KV_ALIGNMENT);
      expect(native.alignmentGap(raw.subarray(gap), KV_ALIGNMENT)).toBe(0);
      expect(native.alignmentGap(raw.subarray(gap + 16), 64)).toBe(48);
    }
    for (const [a, shared] of [[placedArray(Uint16Array, 3 << 20), false], [placedArray(Float32Array, 1000, true), true], [kvArray('f16', 4097), false]] as const) {
      expect(native.alignmentGap(a, KV_ALIGNMENT)).toBe(0);
      expect(a.buffer instanceof SharedArrayBuffer).toBe(shared);
      expect(a.every((x) => x === 0)).toBe(true);
    }
    expect(placedArray(Uint8Array, 0).length).toBe(0);
    for (const bad of [0, 3, 1.5, 2 ** 22, NaN]) expect(() => native.alignmentGap(new Uint8Array(8), bad)).toThrow(expect.objectContaining({ code: 'E_RANGE' }));
    expect(() => native.alignmentGap([1, 2], 64)).toThrow(expect.objectContaining({ code: 'E_TYPE' }));
    expect(() => native.alignmentGap(new Uint8Array(8))).toThrow(expect.objectContaining({ code: 'E_TYPE' }));
  });

  // One arena block (the default 1 GiB), and blocks of 7 chunks (+ 100 bytes left unused in each):
  // every slot lies whole in one block and reads back what was put.
  it.each([{ blockBytes: undefined, blocks: 1 }, { blockBytes: 7 * 256 + 100, blocks: 6 }])('never exceeds its budget and keeps the most important chunks (blockBytes $blockBytes)', ({ blockBytes, blocks }) => {
    const budget = 40 * (256 + DramStore.metadataBytesPerSlot) + 100;
    const d = new DramStore({ budgetBytes: budget, shape, ...(blockBytes ? { blockBytes } : {}) });
    expect(d.capacityChunks).toBe(40);
    expect(d.arenas.length).toBe(blocks);
    expect(d.arenas.reduce((n, a) => n + a.length, 0)).toBe(40 * 256);
    d.addSegment('s', 4 * 64); // 64 chunks per (layer, head), 256 in all
    const r = rng(5);
    const scores = new Map<number, number>();
    for (let round = 0; round < 3; round++) {
      for (let k = 0; k < 256; k++) {
        const score = r();
        const layer = k >> 7;
        const head = (k >> 6) & 1;
        const chunk = k & 63;
        d.put('s', layer, head, [chunk], [score], page(256, k), [0]);
        if (d.lookup('s', layer, head, chunk) >= 0) scores.set(k, score);
        const st = d.stats();
        expect(st.residentChunks).toBeLessThanOrEqual(st.capacityChunks);
        expect(st.reservedBytes).toBeLessThanOrEqual(budget);
      }
    }
    // Resident: 40 chunks whose scores are >= every evicted-or-rejected chunk's last offered score.
    const resident: number[] = [];
    for (let k = 0; k < 256; k++) if (d.lookup('s', k >> 7, (k >> 6) & 1, k & 63) >= 0) resident.push(k);
    expect(resident.length).toBe(40);
    const minResident = Math.min(...resident.map((k) => d.scoreOf(d.lookup('s', k >> 7, (k >> 6) & 1, k & 63))));
    const st = d.stats();
    expect(st.evicted + st.rejected).toBeGreaterThan(0);
    // The bytes of each resident chunk are the ones put, in place and gathered by copyOut.
    for (const k of resident) expect(d.chunk(d.lookup('s', k >> 7, (k >> 6) & 1, k & 63))).toEqual(page(256, k));
    const slots = Int32Array.from(resident, (k) => d.lookup('s', k >> 7, (k >> 6) & 1, k & 63));
    const out = new Uint8Array(resident.length * 256);
    d.copyOut(slots, out, Float64Array.from(resident, (_, i) => i * 256));
    resident.forEach((k, i) => expect(out.subarray(i * 256, (i + 1) * 256)).toEqual(page(256, k)));
    // A newcomer scoring below the least important resident chunk is rejected, above it admitted.
    const outside = [...Array(256).keys()].find((k) => !resident.includes(k))!;
    expect(d.put('s', outside >> 7, (outside >> 6) & 1, [outside & 63], [minResident - 1], page(256, 0), [0])).toBe(0);
    expect(d.put('s', outside >> 7, (outside >> 6) & 1, [outside & 63], [minResident + 1], page(256, 0), [0])).toBe(1);
    expect(d.stats().residentChunks).toBe(40);
  });

  it('re-scoring changes which chunk is evicted', () => {
    const d = new DramStore({ budgetBytes: 2 * (256 + DramStore.metadataBytesPerSlot), shape, shared: false });
    d.addSegment('s', 16);
    d.put('s', 0, 0, [0, 1], [1, 2], page(512, 1), [0, 256]);
    d.setScores('s', 0, 0, [0, 1], [5, 0.5]);
    d.put('s', 0, 0, [2], [3], page(256, 2), [0]);
    expect(d.lookup('s', 0, 0, 1)).toBe(-1);
    expect(d.lookup('s', 0, 0, 0)).toBeGreaterThanOrEqual(0);
    expect(d.lookup('s', 0, 0, 2)).toBeGreaterThanOrEqual(0);
  });

  it('refreshScores re-scores a lookup\'s hits like setSlotScore, and checks every slot and score before changing any', async () => {
    const d = new DramStore({ budgetBytes: 3 * (256 + DramStore.metadataBytesPerSlot), shape, shared: false });
    d.addSegment('s', 16);
    d.put('s', 0, 0, [0, 1, 2], [1, 2, 3], page(768, 1), [0, 256, 512]);
    const slots = Int32Array.from([0, 1, 2], (c) => d.lookup('s', 0, 0, c));
    // Entries name positions in a request's scores (a fetch's hits: entries 4, 0, 2 of 5).
    d.refreshScores(slots, Int32Array.of(4, 0, 2), Float32Array.of(0.5, 9, 7, 9, 6));
    expect([0, 1, 2].map((c) => d.scoreOf(d.lookup('s', 0, 0, c)))).toEqual([6, 0.5, 7]);
    // Chunk 1 is now the least important: the next admission evicts it.
    expect(d.put('s', 0, 0, [3], [1], page(256, 2), [0])).toBe(1);
    expect([0, 1, 2, 3].map((c) => d.lookup('s', 0, 0, c) >= 0)).toEqual([true, false, true, true]);
    const live = Int32Array.from([0, 2], (c) => d.lookup('s', 0, 0, c));
    await expectKvdError(() => d.refreshScores(live, Int32Array.of(0), Float32Array.of(1)), 'E_SHAPE', /entries/);
    await expectKvdError(() => d.refreshScores(Int32Array.of(live[0]!, 3), Int32Array.of(0, 0), Float32Array.of(1)), 'E_RANGE', /slots\[1\]: expected a slot in \[0, 3\)/);
    await expectKvdError(() => d.refreshScores(live, Int32Array.of(0, 1), Float32Array.of(1, NaN)), 'E_NONFINITE', /scores\[entries\[1\]\]/);
    await expectKvdError(() => d.refreshScores(live, Int32Array.of(0, 5), Float32Array.of(1)), 'E_RANGE', /entries\[1\]: expected an index into the 1 scores, got 5/);
    // Nothing changed by the rejected calls.
    expect([0, 2].map((c) => d.scoreOf(d.lookup('s', 0, 0, c)))).toEqual([6, 7]);
  });

  it('a pinned least-important chunk does not refuse admissions: the next one is evicted, the pinned one competes again once unpinned', () => {
    // Scores alone (no aging), so the expectations read off the scores given.
    const d = new DramStore({ budgetBytes: 3 * (256 + DramStore.metadataBytesPerSlot), shape, shared: false, aging: false });
    d.addSegment('s', 32);
    d.put('s', 0, 0, [0, 1, 2], [1, 2, 3], page(768, 1), [0, 256, 512]);
    const least = Int32Array.of(d.lookup('s', 0, 0, 0));
    d.pin(least); // a step attends chunk 0 in place
    expect(d.put('s', 0, 0, [3], [5], page(256, 2), [0])).toBe(1);
    expect([0, 1, 2, 3].map((c) => d.lookup('s', 0, 0, c) >= 0)).toEqual([true, false, true, true]);
    // Still pinned: below chunk 2's score a newcomer is refused, above it chunk 2 goes.
    expect(d.put('s', 0, 0, [4], [2.5], page(256, 3), [0])).toBe(0);
    d.unpin(least);
    // Unpinned, chunk 0 (score 1) is again the least important: it goes first.
    expect(d.put('s', 0, 0, [5], [4], page(256, 4), [0])).toBe(1);
    expect([0, 2, 3, 5].map((c) => d.lookup('s', 0, 0, c) >= 0)).toEqual([false, true, true, true]);
    expect(d.chunk(d.lookup('s', 0, 0, 5))).toEqual(page(256, 4));
  });

  it('GreedyDual aging: a chunk scored high once and never again ages out as evictions raise L; without aging it keeps its slot', () => {
    const held = (d: DramStore, chunks: number[]) => chunks.map((c) => d.lookup('s', 0, 0, c) >= 0);
    for (const aging of [true, false]) {
      const d = new DramStore({ budgetBytes: 2 * (256 + DramStore.metadataBytesPerSlot), shape, shared: false, aging });
      d.addSegment('s', 64);
      // Chunk 0 scored 0.5 (a prefill's observation window liked it), chunk 1 0.1.
      d.put('s', 0, 0, [0, 1], [0.5, 0.1], page(512, 1), [0, 256]);
      // Then a stream of chunks scored 0.3, each attended once.
      const admitted: number[] = [];
      for (let c = 2; c < 8; c++) admitted.push(d.put('s', 0, 0, [c], [0.3], page(256, c), [0]));
      if (aging) {
        // Chunk 1 goes first (L = 0.1); chunk 2 then holds 0.1 + 0.3 = 0.4 < chunk 0's 0.5, so chunk 3
        // (0.1 + 0.3 = 0.4, not above 0.4) is refused; ... the rising L lets each newcomer in once it
        // is above the older priorities, and chunk 0 (never attended again) is evicted in turn.
        expect(held(d, [0, 1])).toEqual([false, false]);
        expect(admitted.filter((x) => x === 1).length).toBeGreaterThanOrEqual(3);
        expect(d.stats().evicted).toBeGreaterThanOrEqual(3);
      } else {
        // Scores alone: chunk 1 goes, chunk 2 takes its slot, and no 0.3 ever beats chunk 0's 0.5 or
        // chunk 2's 0.3 again.
        expect(held(d, [0, 1, 2])).toEqual([true, false, true]);
        expect(admitted).toEqual([1, 0, 0, 0, 0, 0]);
      }
    }
  });

  it('GreedyDual priorities are rebased once L reaches rebaseAt: the same choices as without the rebase, priorities lowered by L', () => {
    // Scores of 0.4: each newcomer (L + 0.4) beats the older resident, L rises by ~0.1 per eviction
    // and passes rebaseAt (1) several times over 38 evictions.
    const d = new DramStore({ budgetBytes: 2 * (256 + DramStore.metadataBytesPerSlot), shape, shared: false });
    d.addSegment('s', 256);
    d.put('s', 0, 0, [0, 1], [0.1, 0.2], page(512, 1), [0, 256]);
    for (let c = 2; c < 40; c++) {
      expect(d.put('s', 0, 0, [c], [0.4], page(256, c), [0])).toBe(1);
      // The two newest chunks are the residents, the newest with the higher priority, both below rebaseAt + 1.
      const a = d.lookup('s', 0, 0, c - 1);
      const b = d.lookup('s', 0, 0, c);
      expect(a >= 0 && b >= 0).toBe(true);
      expect(d.scoreOf(b)).toBeGreaterThan(d.scoreOf(a));
      expect(d.scoreOf(b)).toBeLessThan(DramStore.rebaseAt + 1);
    }
    expect(d.stats().evicted).toBe(38);
  });

  it('warms from KV in memory by importance, page-first', () => {
    const d = new DramStore({ budgetBytes: 10 * (256 + DramStore.metadataBytesPerSlot), shape });
    const data = segmentKv(shape, 32, 3); // 8 chunks per (layer, head), 32 in all
    d.addSegment('w', 32);
    const scores = Float32Array.from({ length: 32 }, (_, i) => (i * 7) % 32);
    expect(d.warm('w', data, scores)).toBe(10);
    const slots: number[] = [];
    for (let k = 0; k < 32; k++) {
      const slot = d.lookup('w', k >> 4, (k >> 3) & 1, k & 7);
      expect(slot >= 0).toBe(scores[k]! >= 22);
      if (slot >= 0) expect(d.chunk(slot)).toEqual(expectedChunk(shape, data, k >> 4, (k >> 3) & 1, k & 7));
      if (slot >= 0) slots.push(slot);
    }
    // Admitted in (layer, head, chunk) order, not score order: slots ascend as the chunks do.
    expect(slots).toEqual([...slots].sort((a, b) => a - b));
  });

  it('RSS growth stays within the configured budget plus stated overhead', () => {
    const big: StoreShape = { layers: 4, kvHeads: 8, headDim: 128, dtype: 'f16', chunkSize: 4 }; // 2 KiB chunks
    const budget = 48 << 20;
    (globalThis as { gc?: () => void }).gc?.();
    const before = process.memoryUsage().rss;
    const d = new DramStore({ budgetBytes: budget, shape: big });
    // Offer 3x the budget: 3 segments of 8192 chunks per (layer, head)... in batches of 1024 chunks.
    const src = page(1024 * 2048, 9);
    const offs = Float64Array.from({ length: 1024 }, (_, i) => i * 2048);
    const r = rng(1);
    const perRegion = 2048;
    for (let s = 0; s < 3; s++) {
      d.addSegment(`seg${s}`, perRegion * 4);
      for (let l = 0; l < 4; l++)
        for (let h = 0; h < 8; h++)
          for (let c = 0; c < perRegion; c += 1024) {
            const ids = Int32Array.from({ length: 1024 }, (_, i) => c + i);
            d.put(`seg${s}`, l, h, ids, Float32Array.from({ length: 1024 }, () => r()), src, offs);
          }
    }
    const st = d.stats();
    const growth = process.memoryUsage().rss - before;
    const offered = 3 * 4 * 8 * perRegion * 2048;
    expect(offered).toBeGreaterThan(2.9 * budget);
    expect(st.residentChunks).toBe(st.capacityChunks);
    // Stated overhead outside the budget: segment slot maps, the 2 MiB source page and the
    // per-call typed arrays, plus 16 MiB for V8 heap / allocator slack.
    const allowance = st.indexBytes + src.byteLength + (16 << 20);
    console.log(`DRAM tier RSS: +${(growth / 2 ** 20).toFixed(1)} MiB for a ${(budget / 2 ** 20).toFixed(0)} MiB budget (offered ${(offered / 2 ** 20).toFixed(0)} MiB; index ${(st.indexBytes / 2 ** 20).toFixed(2)} MiB)`);
    expect(growth).toBeLessThanOrEqual(budget + allowance);
    // The measurement is real: the arena pages were touched.
    expect(growth).toBeGreaterThan(0.8 * st.usedBytes);
  });

  it('rejects bad input with typed errors', async () => {
    const d = new DramStore({ budgetBytes: 1 << 16, shape });
    d.addSegment('s', 16);
    await expectKvdError(() => new DramStore({ budgetBytes: 100, shape }), 'E_BUDGET', /at least one chunk/);
    // More arena blocks than pages can be addressed through is refused before anything is allocated.
    await expectKvdError(() => new DramStore({ budgetBytes: 300 * (256 + DramStore.metadataBytesPerSlot), shape, blockBytes: 256 }), 'E_BUDGET', /at most 255 arena blocks of 256 bytes \(255 chunks\)/);
    await expectKvdError(() => new DramStore({ budgetBytes: 1 << 16, shape, blockBytes: 255 }), 'E_CONFIG', /blockBytes: expected at least one chunk \(256 bytes\)/);
    await expectKvdError(() => new DramStore({ budgetBytes: 1 << 16, shape, blockBytes: 2 * DramStore.maxBlockBytes }), 'E_CONFIG', /blockBytes/);
    await expectKvdError(() => new DramStore({ budgetBytes: -1, shape }), 'E_CONFIG', /budgetBytes/);
    await expectKvdError(() => new DramStore({ budgetBytes: 1 << 20, shape: { ...shape, dtype: 'f8' as never } }), 'E_CONFIG', /shape\.dtype/);
    await expectKvdError(() => d.lookup('nope', 0, 0, 0), 'E_NOT_FOUND', /unknown id/);
    await expectKvdError(() => d.lookup('s', 0, 0, 4), 'E_RANGE', /\[0, 4\), got 4/);
    await expectKvdError(() => d.lookup('s', 0, 2, 0), 'E_RANGE', /kv head in \[0, 2\)/);
    await expectKvdError(() => d.put('s', 0, 0, [0], [NaN], page(256, 0), [0]), 'E_NONFINITE', /score/);
    await expectKvdError(() => d.put('s', 0, 0, [0], [1], page(100, 0), [0]), 'E_RANGE', /srcOffsets\[0\]/);
    expect(d.lookup('s', 0, 0, 0)).toBe(-1); // nothing half-admitted
    await expectKvdError(() => d.addSegment('s', 16), 'E_CONFIG', /not registered yet/);
    await expectKvdError(() => d.addSegment('t', 6), 'E_SHAPE', /multiple of chunkSize 4/);
  });

  // (After the RSS test: tens of MiB these allocate would be collected inside its window.)
  it('warm: ties at the cut go to the lower entries, and a segment larger than one staging batch lands whole', () => {
    // 64 KiB chunks (f32, 64 tokens x dim 128): warm packs 64 chunks per batch (4 MiB staging), so
    // 150 chunks per (layer, head) take three batches in each of the four regions.
    const wide: StoreShape = { layers: 2, kvHeads: 2, headDim: 128, dtype: 'f32', chunkSize: 64 };
    const chunkBytes = 2 * 64 * 128 * 4;
    const chunks = 150;
    const data = segmentKv(wide, chunks * 64, 5);
    // Room for 500 of the 600 chunks; scores 0..9 repeating, so the cut (score 1) falls inside a tie.
    const d = new DramStore({ budgetBytes: 500 * (chunkBytes + DramStore.metadataBytesPerSlot), shape: wide, shared: false });
    d.addSegment('w', chunks * 64);
    const scores = Float32Array.from({ length: 4 * chunks }, (_, k) => k % 10);
    expect(d.warm('w', data, scores)).toBe(500);
    // Above the cut: every entry; at it (score 1, 60 entries): the first 500 - 480 = 20.
    let tiesTaken = 0;
    for (let k = 0; k < 4 * chunks; k++) {
      const [layer, head, chunk] = [Math.floor(k / (2 * chunks)), Math.floor(k / chunks) % 2, k % chunks];
      const slot = d.lookup('w', layer, head, chunk);
      if (scores[k]! > 1) expect(slot).toBeGreaterThanOrEqual(0);
      else if (scores[k]! < 1) expect(slot).toBe(-1);
      else {
        expect(slot >= 0).toBe(tiesTaken < 20);
        if (slot >= 0) tiesTaken++;
      }
      // Buffer comparison: toEqual walks 64 KiB element by element (seconds per chunk).
      if (slot >= 0) expect(Buffer.from(d.chunk(slot)).equals(Buffer.from(expectedChunk(wide, data, layer, head, chunk)))).toBe(true);
    }
    expect(tiesTaken).toBe(20);
  });

  it('warm: bad scores, tensors or segments are typed errors before any chunk is admitted', () => {
    const d = new DramStore({ budgetBytes: 10 * (256 + DramStore.metadataBytesPerSlot), shape });
    const data = segmentKv(shape, 32, 3);
    d.addSegment('w', 32);
    const scores = new Float32Array(32).fill(1);
    scores[17] = NaN;
    expect(() => d.warm('w', data, scores)).toThrow(expect.objectContaining({ code: 'E_NONFINITE' }));
    expect(d.stats().residentChunks).toBe(0);
    const short = { layers: data.layers.map((l) => ({ ...l, k: { ...l.k, data: l.k.data.subarray(0, l.k.data.length - 1) } })) };
    expect(() => d.warm('w', short, new Float32Array(32).fill(1))).toThrow(expect.objectContaining({ code: 'E_SHAPE' }));
    const ones = new Float32Array(32).fill(1);
    // Another dtype, a layer missing, a score per chunk missing, a segment never registered.
    const wrongDtype = { layers: data.layers.map((l) => ({ ...l, v: { ...l.v, dtype: 'bf16' as const } })) };
    expect(() => d.warm('w', wrongDtype, ones)).toThrow(expect.objectContaining({ code: 'E_SHAPE', message: expect.stringMatching(/f16/) }));
    expect(() => d.warm('w', { layers: data.layers.slice(0, 1) }, ones)).toThrow(expect.objectContaining({ code: 'E_SHAPE' }));
    expect(() => d.warm('w', data, ones.subarray(0, 31))).toThrow(expect.objectContaining({ code: 'E_SHAPE' }));
    expect(() => d.warm('nope', data, ones)).toThrow(expect.objectContaining({ code: 'E_NOT_FOUND' }));
    expect(d.stats().residentChunks).toBe(0);
  });
});
