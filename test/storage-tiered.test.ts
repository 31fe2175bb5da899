import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { DramStore } from '../src/storage/dram-store.js';
import { native } from '../src/native.js';
import { SsdStore, type SegmentData, type StoreShape } from '../src/storage/ssd-store.js';
import { chunkRows, TieredKv, type FetchIssued, type FetchRequest } from '../src/storage/tiered-kv.js';
import { attendSparse } from '../src/attention/kernels.js';
import { attendFetched } from '../src/storage/fetched-attention.js';
import { expectKvdError, randn, rng } from './helpers.js';
import { expectedChunk, randomClusters, segmentKv, removeTempDirs, tempDir } from './storage-kv.js';

afterAll(removeTempDirs);

const shape: StoreShape = { layers: 2, kvHeads: 2, headDim: 8, dtype: 'f32', chunkSize: 4 }; // 256-byte chunks
const segTokens = 64; // 16 chunks per segment
const opened: SsdStore[] = [];
afterEach(async () => {
  for (const s of opened.splice(0)) await s.close();
});

async function setup(budgetChunks?: number): Promise<{ ssd: SsdStore; dram?: DramStore; data: SegmentData[] }> {
  const ssd = await SsdStore.open({ dir: tempDir('tiered'), shape, kind: 'pread' });
  opened.push(ssd);
  const data = [segmentKv(shape, segTokens, 1), segmentKv(shape, segTokens, 2)];
  await ssd.writeSegment('a', { ...data[0]!, clusters: randomClusters(shape, 16, 3) });
  await ssd.writeSegment('b', data[1]!);
  // Scores alone (no GreedyDual aging): these tests read the tier's choices off the scores they give.
  const dram = budgetChunks === undefined ? undefined : new DramStore({ budgetBytes: budgetChunks * (ssd.chunkBytes + DramStore.metadataBytesPerSlot), shape, aging: false });
  return { ssd, dram, data };
}

function request(layer: number, perHead: number[][], scores?: number[]): FetchRequest {
  const offsets = new Int32Array(perHead.length + 1);
  perHead.forEach((ids, h) => (offsets[h + 1] = offsets[h]! + ids.length));
  return { layer, offsets, chunkIds: Int32Array.from(perHead.flat()), scores: scores ? Float32Array.from(scores) : undefined };
}

function expectFetched(dest: Uint8Array, req: FetchRequest, data: SegmentData[], cb: number): void {
  for (let h = 0; h < shape.kvHeads; h++)
    for (let i = req.offsets[h]!; i < req.offsets[h + 1]!; i++) {
      const g = req.chunkIds[i]!;
      const want = expectedChunk(shape, data[Math.floor(g / 16)]!, req.layer, h, g % 16);
      expect(Buffer.compare(dest.subarray(i * cb, (i + 1) * cb), want), `entry ${i} (head ${h}, chunk ${g})`).toBe(0);
    }
}

describe('tiered KV fetch', () => {
  it('fetchInPlace leaves DRAM hits in the arena (pinned: never evicted until released) and packs only SSD reads', async () => {
    const { ssd, dram, data } = await setup(6);
    const kv = new TieredKv({ ssd, dram, segments: ['a', 'b'], promote: false });
    dram!.warm('a', data[0]!, Float32Array.from({ length: 2 * 2 * 16 }, (_, i) => (i === 16 || i === 21 ? 10 : i === 0 ? 5 : i < 4 ? 1 : 0)));
    const req = request(0, [[0, 5, 17], [0, 5, 16]]);
    let asked = -1;
    const { stats, placement } = await kv.fetchInPlace(req, (bytes) => new Uint8Array((asked = bytes)));
    expect(stats.dramChunks).toBe(3); // chunk 0 of head 0 and chunks 0, 5 of head 1 (layer 0) are resident
    expect(placement.inDest).toBe(3);
    expect(asked).toBe(3 * kv.chunkBytes);
    const cb = kv.chunkBytes;
    const dest = new Uint8Array(asked);
    const again = await kv.fetchInPlace(req, dest);
    for (let h = 0, i = 0; h < shape.kvHeads; h++)
      for (; i < req.offsets[h + 1]!; i++) {
        const g = req.chunkIds[i]!;
        const src = again.placement.source[i]!;
        const buf = src >= 1 ? again.placement.arenas[src - 1]! : dest;
        const at = again.placement.at[i]!;
        expect(Buffer.compare(buf.subarray(at, at + cb), expectedChunk(shape, data[Math.floor(g / 16)]!, 0, h, g % 16)), `entry ${i}`).toBe(0);
      }
    // Pinned (twice: two fetches) slots are not evicted by a more important newcomer; released, they are.
    const slot0 = dram!.lookup('a', 0, 0, 0);
    const fill = (n: number) => dram!.put('b', 1, 1, Array.from({ length: n }, (_, j) => j), Array(n).fill(100), new Uint8Array(n * cb), Array.from({ length: n }, (_, j) => j * cb));
    expect(fill(6)).toBe(3); // the 3 unpinned residents evicted; then the least important is pinned: refused
    expect(dram!.lookup('a', 0, 0, 0)).toBe(slot0);
    expect(() => dram!.removeSegment('a')).toThrow(/pinned/);
    placement.release();
    again.placement.release();
    again.placement.release(); // idempotent
    expect(dram!.put('b', 1, 1, [10], [200], new Uint8Array(cb), [0])).toBe(1);
    expect(dram!.lookup('a', 0, 0, 0)).toBe(-1);
    // pinInPlace: false (a DRAM tier that never evicts): the same placement, no pin taken.
    const unpinned = new TieredKv({ ssd, dram, segments: ['a', 'b'], promote: false, pinInPlace: false });
    const pinsBefore = Uint16Array.from((dram as unknown as { pins: Uint16Array }).pins);
    const third = await unpinned.fetchInPlace(req, (bytes) => new Uint8Array(bytes));
    expect((dram as unknown as { pins: Uint16Array }).pins).toEqual(pinsBefore);
    expect(third.stats.dramChunks).toBeGreaterThan(0);
    third.placement.release();
    await unpinned.close();
    await expectKvdError(() => kv.fetchInPlace(req, new Uint8Array(cb)), 'E_SHAPE', /at least \d chunks/);
  });

  it("admit with fetchInPlace's placement: residents re-scored at their arena slots, SSD reads offered, as a lookup would", async () => {
    const { ssd, dram, data } = await setup(6);
    const kv = new TieredKv({ ssd, dram, segments: ['a', 'b'], promote: false });
    dram!.warm('a', data[0]!, Float32Array.from({ length: 2 * 2 * 16 }, (_, i) => (i === 16 || i === 21 ? 10 : i === 0 ? 5 : i < 4 ? 1 : 0)));
    const req = request(0, [[0, 5, 17], [0, 5, 16]], [0.25, 3, 4, 0.5, 0.75, 2]);
    let dest = new Uint8Array(0);
    // Fetched without scores (a step learns them by attending), admitted with them.
    const { placement } = await kv.fetchInPlace({ ...req, scores: undefined }, (bytes) => (dest = new Uint8Array(bytes)));
    // Residents: head 0 chunk 0, head 1 chunks 0 and 5 (entries 0, 3, 4); the rest came from SSD.
    expect(Array.from(placement.source).map((x) => x >= 1)).toEqual([true, false, false, true, true, false]);
    // A placement naming a position that is no slot is refused before any score changes.
    const forged = { ...placement, at: Float64Array.from(placement.at, (x, i) => (i === 3 ? x + 1 : x)) };
    await expectKvdError(() => kv.admit(req, dest, forged), 'E_RANGE', /srcAt entry 3: expected an arena slot's place \(a multiple of \d+ bytes, slot below 6\)/);
    await expectKvdError(() => kv.admit(req, dest, { ...placement, arenas: [new Uint8Array(64)] }), 'E_CONFIG', /srcAt: expected a placement this TieredKv's fetchInPlace made/);
    const far = { ...placement, at: Float64Array.from(placement.at, (x, i) => (i === 3 ? 2 ** 40 * kv.chunkBytes : x)) };
    await expectKvdError(() => kv.admit(req, dest, far), 'E_RANGE', /srcAt entry 3: .*got "block 0, byte 2814/);
    expect(dram!.scoreOf(dram!.lookup('a', 0, 0, 0))).toBe(5);
    expect(kv.admit(req, dest, placement)).toBe(3);
    expect([dram!.lookup('a', 0, 0, 0), dram!.lookup('a', 0, 1, 0), dram!.lookup('a', 0, 1, 5)].map((slot) => dram!.scoreOf(slot))).toEqual([0.25, 0.5, 0.75]);
    expect(dram!.scoreOf(dram!.lookup('a', 0, 0, 5))).toBe(3);
    expect(dram!.scoreOf(dram!.lookup('b', 0, 0, 1))).toBe(4);
    placement.release();
  });

  it('fetchInPlace says, within the call, where every page will be and which kv heads still wait for reads (onIssued)', async () => {
    const { ssd, dram, data } = await setup(6);
    const kv = new TieredKv({ ssd, dram, segments: ['a', 'b'], promote: false });
    // Resident: chunks 0-3 of head 0 and chunks 0, 5 of head 1 (layer 0).
    dram!.warm('a', data[0]!, Float32Array.from({ length: 2 * 2 * 16 }, (_, i) => (i === 16 || i === 21 ? 10 : i === 0 ? 5 : i < 4 ? 1 : 0)));
    const req = request(0, [[0, 1, 2], [0, 5, 17]]);
    let early: (Omit<FetchIssued, 'pending' | 'staged'> & { pending: number[]; staged: number[] }) | undefined;
    let dest = new Uint8Array(0);
    const p = kv.fetchInPlace(req, (bytes) => (dest = new Uint8Array(bytes)), (issued) => (early = { ...issued, pending: Array.from(issued.pending), staged: Array.from(issued.staged) }));
    expect(early?.pending).toEqual([0, 1]); // head 1's chunk 17 (segment b) is being read
    expect(early?.staged).toEqual([0, 0]);
    expect(Array.from(early!.placement.source)).toEqual([1, 1, 1, 1, 1, 0]);
    // The read's own flags: one item (segment b, kv head 1), set by the read's thread once it landed,
    // before the promise may settle; then the end flag (1: every item landed).
    const { done, itemHead } = early!.reads!;
    expect(Array.from(itemHead)).toEqual([1]);
    while (Atomics.load(done, 0) === 0) await new Promise((r) => setImmediate(r));
    expect(Array.from(done)).toEqual([1, 1]);
    const { stats, placement } = await p;
    expect(placement).toBe(early!.placement);
    expect(stats.ssdChunks).toBe(1);
    const cb = kv.chunkBytes;
    expect(Buffer.compare(dest.subarray(placement.at[5]!, placement.at[5]! + cb), expectedChunk(shape, data[1]!, 0, 1, 1))).toBe(0);
    placement.release();
    let pending: number[] = [];
    const hits = await kv.fetchInPlace(request(0, [[0], [5]]), new Uint8Array(0), (i) => (pending = Array.from(i.pending)));
    expect(pending).toEqual([0, 0]);
    hits.placement.release();
  });

  it('a DRAM tier in several arena blocks: pages addressed by (block, offset), attention over them equals attendSparse bit for bit', async () => {
    const { ssd, data } = await setup();
    const cb = ssd.chunkBytes;
    // 3 slots per block (the block size need not be a multiple of the chunk), 20 slots: 7 blocks.
    const dram = new DramStore({ budgetBytes: 20 * (cb + DramStore.metadataBytesPerSlot), shape, blockBytes: 3 * cb + 17 });
    expect(dram.arenas.map((a) => a.length)).toEqual([...Array(6).fill(3 * cb), 2 * cb]);
    const kv = new TieredKv({ ssd, dram, segments: ['a'] });
    // Layer 1's chunks warmed first (scores above layer 0's): spread over every block.
    dram.warm('a', data[0]!, Float32Array.from({ length: 2 * 2 * 16 }, (_, i) => (i >= 32 ? 1 + ((i * 7) % 11) : 0)));
    const layer = 1;
    const { k, v } = data[0]!.layers[layer]!;
    const T = segTokens;
    const sinkEnd = 4;
    const tailBase = 60; // tokens [60, 64) are the tail, read from memory
    const perHead = [
      [5, 6, 9, 13, 22, 30, 41, 42, 57],
      [4, 17, 18, 19, 33, 50, 51, 59],
    ];
    const offsets = new Int32Array(3);
    perHead.forEach((l, h) => (offsets[h + 1] = offsets[h]! + l.length));
    const selection = { chunkSize: 1, tokens: T, sinkEnd, tailStart: tailBase, offsets, chunkIds: Int32Array.from(perHead.flat()) };
    const chunksPerHead = perHead.map((l) => [...new Set(l.map((t) => Math.floor(t / 4)))]);
    const req = request(layer, chunksPerHead, chunksPerHead.flat().map((_, i) => 1 + i));
    const q = randn(4 * shape.headDim, 21);
    const want = attendSparse({ q, qHeads: 4, k, v, selection });
    const slice = (t: typeof k, from: number, to: number) => ({ ...t, tokens: to - from, data: t.data.subarray(from * 2 * 8, to * 2 * 8) });
    const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');
    const blocksSeen = new Set<number>();
    for (let round = 0; round < 3; round++) {
      let dest = new Uint8Array(0);
      const { stats, placement } = await kv.fetchInPlace(req, (bytes) => (dest = new Uint8Array(bytes)));
      for (const s of placement.source) blocksSeen.add(s);
      if (round === 0) expect(stats.ssdChunks).toBeGreaterThan(0);
      try {
        const got = attendFetched({
          q,
          qHeads: 4,
          sink: { k: slice(k, 0, sinkEnd), v: slice(v, 0, sinkEnd) },
          tail: { k: slice(k, tailBase, T), v: slice(v, tailBase, T) },
          tailBase,
          selection,
          pageChunkSize: 4,
          fetched: [dest, ...placement.arenas],
          fetchedOffsets: req.offsets,
          fetchedIds: req.chunkIds,
          fetchedAt: placement.at,
          fetchedIn: placement.source,
        });
        expect(bits(got.out), `round ${round}`).toBe(bits(want.out));
        expect(bits(got.lse)).toBe(bits(want.lse));
      } finally {
        placement.release();
      }
    }
    expect(blocksSeen.size).toBeGreaterThanOrEqual(4); // the fetch buffer and at least three arena blocks
    // copyOut (fetch without placement) gathers across blocks as well.
    const dest = new Uint8Array(req.chunkIds.length * cb);
    const st = await kv.fetch(req, dest);
    expect(st.dramChunks).toBeGreaterThan(0);
    expectFetched(dest, req, data, cb);
  });

  it('serves DRAM hits and SSD misses exactly, promotes misses, reports bytes per tier', async () => {
    const { ssd, dram, data } = await setup(24);
    const kv = new TieredKv({ ssd, dram, segments: ['a', 'b'] });
    expect(kv.totalChunks).toBe(32);
    // Warm a few chunks of segment a into DRAM.
    dram!.warm('a', data[0]!, Float32Array.from({ length: 2 * 2 * 16 }, (_, i) => ((i % 16) % 5 === 0 ? 10 : 0)));
    const req = request(1, [[0, 5, 17, 31, 10], [3, 16, 30]], [1, 2, 3, 4, 5, 6, 7, 8]);
    const dest = new Uint8Array(8 * kv.chunkBytes);
    const st = await kv.fetch(req, dest);
    expectFetched(dest, req, data, kv.chunkBytes);
    expect(st.chunks).toBe(8);
    expect(st.dramChunks + st.ssdChunks).toBe(8);
    expect(st.dramChunks).toBe(3); // chunks 0, 5, 10 of segment a, layer 1, head 0 were warmed
    expect(st.ssdChunks).toBe(5);
    expect(st.ssdBytes).toBe(st.ssdChunks * kv.chunkBytes);
    expect(st.ssdReadBytes).toBeGreaterThanOrEqual(st.ssdBytes);
    expect(st.promoted).toBe(st.ssdChunks);
    // Same step again: everything is resident now.
    dest.fill(0);
    const again = await kv.fetch(req, dest);
    expectFetched(dest, req, data, kv.chunkBytes);
    expect(again.dramChunks).toBe(8);
    expect(again.ssdBytes).toBe(0);
    expect(dram!.stats().reservedBytes).toBeLessThanOrEqual(dram!.budgetBytes);
    // Row views of the page-first layout, and the native span accessor agrees with them.
    const rows = chunkRows(dest, 0, shape);
    expect(rows.k.length).toBe(shape.chunkSize * shape.headDim);
    expect(Array.from(rows.k.subarray(0, 8))).toEqual(Array.from((data[0]!.layers[1]!.k.data as Float32Array).subarray(0, 8)));
    const spans = native.fetchBufferSpans(dest, 2, 3, shape.chunkSize, shape.headDim, shape.dtype) as Float64Array;
    for (let i = 0; i < 3; i++) {
      const r = chunkRows(dest, 2 + i, shape);
      expect(Array.from(spans.subarray(i * 5, i * 5 + 5))).toEqual([r.k.byteOffset - dest.byteOffset, r.v.byteOffset - dest.byteOffset, shape.chunkSize, shape.headDim, shape.headDim]);
    }
  });

  it('works SSD-only and keeps the DRAM budget under a long replay', async () => {
    const { ssd, dram, data } = await setup(10);
    const only = new TieredKv({ ssd, segments: ['a', 'b'] });
    const r = rng(4);
    const tiered = new TieredKv({ ssd, dram, segments: ['b', 'a'] });
    for (let step = 0; step < 20; step++) {
      const perHead = [0, 1].map(() => [...new Set(Array.from({ length: 6 }, () => Math.floor(r() * 32)))]);
      const req = request(step % 2, perHead, perHead.flat().map(() => r()));
      const dest = new Uint8Array(req.chunkIds.length * ssd.chunkBytes);
      const s1 = await only.fetch(req, dest);
      expect(s1.ssdChunks).toBe(req.chunkIds.length);
      expectFetched(dest, req, data, ssd.chunkBytes);
      const s2 = await tiered.fetch(req, dest);
      const swapped = [data[1]!, data[0]!]; // segment chain b, a
      expectFetched(dest, req, swapped, ssd.chunkBytes);
      expect(s2.dramChunks + s2.ssdChunks).toBe(req.chunkIds.length);
      const ds = dram!.stats();
      expect(ds.residentChunks).toBeLessThanOrEqual(ds.capacityChunks);
      expect(ds.reservedBytes).toBeLessThanOrEqual(ds.budgetBytes);
    }
    expect(tiered.totals().dramChunks).toBeGreaterThan(0);
  });

  it('prefetches into staging, serves the next fetch from it, and cancels', async () => {
    const { ssd, dram, data } = await setup(4);
    const kv = new TieredKv({ ssd, dram, segments: ['a', 'b'], stagingBuffers: 1, stagingBytes: 16 * ssd.chunkBytes, promote: false });
    const req = request(0, [[1, 2, 3, 20], [7, 8, 25, 26]]);
    const p = kv.prefetch(req)!;
    expect(p.chunks).toBe(8);
    expect(kv.prefetch(req)).toBeUndefined(); // the only staging buffer is taken
    await p.done;
    const dest = new Uint8Array(8 * kv.chunkBytes);
    // In place, the staged entries land only once the call copies them (after the promise): both
    // heads are pending and staged, and nothing is read from SSD (no landing flags).
    let issued: FetchIssued | undefined;
    const inPlace = await kv.fetchInPlace(req, (bytes) => new Uint8Array(bytes), (i) => (issued = i));
    expect(Array.from(issued!.pending)).toEqual([1, 1]);
    expect(Array.from(issued!.staged)).toEqual([1, 1]);
    expect(issued!.reads).toBeUndefined();
    expect(inPlace.stats.prefetchedChunks).toBe(8);
    inPlace.placement.release();
    const p2 = kv.prefetch(req)!;
    await p2.done;
    const st = await kv.fetch(req, dest);
    expectFetched(dest, req, data, kv.chunkBytes);
    expect(st.prefetchedChunks).toBe(8);
    expect(st.ssdChunks).toBe(0);
    expect(kv.pendingPrefetches).toBe(0);
    // Cancelled prefetches stage nothing; the fetch reads from SSD itself.
    const q = kv.prefetch(req)!;
    await kv.cancel(q);
    expect(kv.pendingPrefetches).toBe(0);
    const st2 = await kv.fetch(req, dest);
    expect(st2.prefetchedChunks).toBe(0);
    expect(st2.ssdChunks).toBe(8);
    expectFetched(dest, req, data, kv.chunkBytes);
    // A prefetch for another layer is not used by this layer's fetch.
    const other = kv.prefetch(request(1, [[1], [2]]))!;
    await other.done;
    const st3 = await kv.fetch(req, dest);
    expect(st3.prefetchedChunks).toBe(0);
    expect(kv.pendingPrefetches).toBe(1);
    await kv.close();
    expect(kv.pendingPrefetches).toBe(0);
  });

  it('reads through native segment handles from a worker thread (process-global registry)', async () => {
    const { ssd, data } = await setup();
    const addon = resolve(dirname(fileURLToPath(import.meta.url)), '..', 'build', 'Release', 'kvdrive.node');
    const code = `
      const { parentPort, workerData: w } = require('node:worker_threads');
      const n = require(w.addon);
      const dest = new Uint8Array(w.cb * 2);
      n.segmentRead({ segments: new Int32Array([w.h]), layers: new Int32Array([1]), heads: new Int32Array([0]),
        itemOffsets: new Int32Array([0, 2]), chunkIds: new Int32Array([3, 9]), dest, destOffsets: new Float64Array([0, w.cb]) })
        .then(() => parentPort.postMessage(dest), (e) => parentPort.postMessage(e.code + ': ' + e.message));`;
    const worker = new Worker(code, { eval: true, workerData: { addon, h: ssd.segmentHandle('b'), cb: ssd.chunkBytes } });
    const got = await new Promise<unknown>((res, rej) => {
      worker.once('message', res);
      worker.once('error', rej);
    });
    await worker.terminate();
    expect(got).toBeInstanceOf(Uint8Array);
    const want = Buffer.concat([expectedChunk(shape, data[1]!, 1, 0, 3), expectedChunk(shape, data[1]!, 1, 0, 9)]);
    expect(Buffer.compare(got as Uint8Array, want)).toBe(0);
  });

  it('rejects bad requests with typed errors', async () => {
    const { ssd, dram } = await setup(4);
    const kv = new TieredKv({ ssd, dram, segments: ['a', 'b'] });
    const dest = new Uint8Array(64 * kv.chunkBytes);
    await expectKvdError(() => kv.fetch(request(0, [[32], []]), dest), 'E_RANGE', /chunk id in \[0, 32\).*got 32/);
    await expectKvdError(() => kv.fetch(request(2, [[0], []]), dest), 'E_RANGE', /layer/);
    await expectKvdError(() => kv.fetch(request(0, [[0]]), dest), 'E_SHAPE', /offsets \(kvHeads\+1\): expected 3 elements, got 2/);
    await expectKvdError(() => kv.fetch({ ...request(0, [[0], []]), chunkSize: 8 }, dest), 'E_CONFIG', /chunk size 4/);
    await expectKvdError(() => kv.fetch(request(0, [[0, 1], []]), new Uint8Array(10)), 'E_SHAPE', /at least 2 chunks/);
    await expectKvdError(() => kv.fetch(request(0, [[0], []], [NaN]), dest), 'E_NONFINITE', /scores/);
    await expectKvdError(() => new TieredKv({ ssd, segments: ['a', 'zz'] }), 'E_NOT_FOUND', /zz/);
    await expectKvdError(() => new TieredKv({ ssd, segments: [] }), 'E_CONFIG', /segments/);
    await ssd.close();
    await expectKvdError(() => kv.fetch(request(0, [[0], []]), dest), 'E_CLOSED', /closed/);
    await kv.close();
    await expectKvdError(() => kv.fetch(request(0, [[0], []]), dest), 'E_CLOSED', /TieredKv/);
  });
  it('admit() places fetched chunks into DRAM by score after the fact (promote: false), updating residents', async () => {
    const { ssd, dram, data } = await setup(4);
    const kv = new TieredKv({ ssd, dram, segments: ['a', 'b'], promote: false });
    const req = request(0, [[1, 20], [2, 3]], [0.5, 0.1, 0.9, 0.2]);
    const dest = new Uint8Array(4 * kv.chunkBytes);
    const st = await kv.fetch(req, dest);
    expect(st.ssdChunks).toBe(4);
    expect(st.promoted).toBe(0);
    expect(dram!.stats().residentChunks).toBe(0);
    await expectKvdError(() => kv.admit({ ...req, scores: undefined }, dest), 'E_CONFIG', /importance scores/);
    await expectKvdError(() => kv.admit(req, new Uint8Array(10)), 'E_SHAPE', /at least 4 chunks/);
    expect(kv.admit(req, dest)).toBe(4);
    // Now a DRAM hit for all four; a better chunk evicts the least important (score 0.1: chunk 20 of head 0).
    const again = new Uint8Array(4 * kv.chunkBytes);
    expect((await kv.fetch(req, again)).dramChunks).toBe(4);
    expectFetched(again, req, data, kv.chunkBytes);
    const better = request(0, [[7], []], [0.3]);
    const d2 = new Uint8Array(kv.chunkBytes);
    await kv.fetch(better, d2);
    expect(kv.admit(better, d2)).toBe(1);
    expect(dram!.lookup('b', 0, 0, 4)).toBe(-1);
    expect(dram!.lookup('a', 0, 0, 7)).toBeGreaterThanOrEqual(0);
    // Re-admitting residents only updates their scores (nothing new admitted).
    expect(kv.admit(req, again)).toBe(0);
  });
});
