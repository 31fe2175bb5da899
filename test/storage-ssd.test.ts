import { appendFileSync, existsSync, mkdirSync, readFileSync, readdirSync, readSync, symlinkSync, truncateSync, writeFileSync, openSync, writeSync, closeSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { SsdStore, type StoreShape } from '../src/storage/ssd-store.js';
import { ioUringAvailable } from '../src/storage/io-engine.js';
import { native } from '../src/native.js';
import { expectKvdError } from './helpers.js';
import { expectedChunk, randomClusters, segmentKv, removeTempDirs, tempDir } from './storage-kv.js';

afterAll(removeTempDirs);

const shape: StoreShape = { layers: 2, kvHeads: 2, headDim: 8, dtype: 'f16', chunkSize: 4 };
const uring = ioUringAvailable();
const engines = [{ kind: 'pread' as const }, { kind: 'mmap' as const }, ...(uring.usable ? [{ kind: 'uring' as const }] : [])];
if (!uring.usable) console.warn(`NOTICE: io_uring unavailable (${uring.reason}); io_uring store tests skipped`);

/** XORs the byte at `at` of the file with `mask` (a corruption the checksums must catch). */
function flipByte(path: string, at: number, mask: number): void {
  const fd = openSync(path, 'r+');
  try {
    const b = Buffer.alloc(1);
    readSync(fd, b, 0, 1, at);
    b[0] = b[0]! ^ mask;
    writeSync(fd, b, 0, 1, at);
  } finally {
    closeSync(fd);
  }
}

const stores: SsdStore[] = [];
afterEach(async () => {
  for (const s of stores.splice(0)) await s.close();
});
async function openStore(opts: Parameters<typeof SsdStore.open>[0]): Promise<SsdStore> {
  const s = await SsdStore.open(opts);
  stores.push(s);
  return s;
}

describe.each(engines)('SSD store, engine $kind', ({ kind }) => {
  for (const direct of [false, true]) {
    it(`reads back exactly what was written (direct=${direct}), cluster-contiguous`, async () => {
      const dir = tempDir('rw');
      const store = await openStore({ dir, shape, kind, direct, queueDepth: 4 });
      expect(store.engineInfo.kind).toBe(kind === 'uring' ? 'io_uring' : kind);
      const tokens = 64; // 16 chunks
      const data = segmentKv(shape, tokens, 1);
      const clusters = randomClusters(shape, 16, 7);
      await store.writeSegment('s0', { ...data, clusters });
      const data2 = segmentKv(shape, tokens, 2);
      await store.writeSegment('s1', data2);
      // Every chunk of every (layer, head), in a scrambled request order, across both segments.
      const ids = [5, 0, 15, 3, 3, 9, 12, 1];
      const items = [];
      for (let l = 0; l < shape.layers; l++)
        for (let h = 0; h < shape.kvHeads; h++) items.push({ segment: 's0', layer: l, kvHead: h, chunkIds: ids }, { segment: 's1', layer: l, kvHead: h, chunkIds: [...ids].reverse() });
      const dest = new Uint8Array(items.length * ids.length * store.chunkBytes);
      const st = await store.readBatch(items, dest);
      expect(st.chunks).toBe(items.length * ids.length);
      let k = 0;
      for (const it of items)
        for (const j of it.chunkIds) {
          const src = it.segment === 's0' ? data : data2;
          expect(dest.subarray(k * store.chunkBytes, (k + 1) * store.chunkBytes)).toEqual(expectedChunk(shape, src, it.layer, it.kvHead, j));
          k++;
        }
      // One cluster = one extent = one sequential range on disk, in membership order.
      const ext = store.extents('s0', 1, 1);
      const cl = clusters[1 * shape.kvHeads + 1]!;
      expect(Array.from(ext.order)).toEqual(Array.from(cl.chunkIds));
      expect(ext.offsets.length).toBe(cl.offsets.length - 1);
      for (let e = 1; e < ext.offsets.length; e++) expect(ext.offsets[e]).toBe(ext.offsets[e - 1]! + ext.bytes[e - 1]!);
      // Reading one whole cluster costs one run.
      const one = await store.readBatch([{ segment: 's0', layer: 1, kvHead: 1, chunkIds: cl.chunkIds.subarray(cl.offsets[2]!, cl.offsets[3]!) }], new Uint8Array(16 * store.chunkBytes));
      expect(one.extents).toBe(1);
      expect(one.runs).toBe(1);
    });
  }

  it('reopens the store and reads the same bytes', async () => {
    const dir = tempDir('reopen');
    const data = segmentKv(shape, 32, 3);
    const a = await openStore({ dir, shape, kind });
    await a.writeSegment('x', data);
    await a.close();
    const b = await openStore({ dir, kind });
    expect(b.shape).toEqual(shape);
    expect(b.segments().map((s) => [s.id, s.status])).toEqual([['x', 'ok']]);
    const got = await b.readChunks('x', 1, 0, [7, 2]);
    expect(got.subarray(0, b.chunkBytes)).toEqual(expectedChunk(shape, data, 1, 0, 7));
    expect(got.subarray(b.chunkBytes)).toEqual(expectedChunk(shape, data, 1, 0, 2));
  });
});

describe('SSD store integrity and errors', () => {
  it('coalesces neighbouring chunks into one read and keeps separate runs apart', async () => {
    const dir = tempDir('coalesce');
    const store = await openStore({ dir, shape, kind: 'pread', maxIoBytes: 1 << 20 });
    await store.writeSegment('s', { ...segmentKv(shape, 128, 4), extentChunks: 2 }); // 16 extents per region
    const all = Array.from({ length: 32 }, (_, j) => j);
    const st = await store.readBatch([{ segment: 's', layer: 0, kvHead: 0, chunkIds: all }], new Uint8Array(32 * store.chunkBytes));
    expect(st.extents).toBe(16);
    expect(st.runs).toBe(1);
    // 128-byte chunks: the whole region is one 4 KiB page, so chunks with gaps still share one read
    // (a page alignment reads anyway).
    const sparse = await store.readBatch([{ segment: 's', layer: 0, kvHead: 0, chunkIds: [0, 1, 2, 3, 20, 21, 30] }], new Uint8Array(7 * store.chunkBytes));
    expect(sparse.extents).toBe(4); // extents 0, 1, 10, 15
    expect(sparse.runs).toBe(1);
    const off = await openStore({ dir: tempDir('nocoalesce'), shape, kind: 'pread', coalesce: false });
    await off.writeSegment('s', { ...segmentKv(shape, 128, 4), extentChunks: 2 });
    const st2 = await off.readBatch([{ segment: 's', layer: 0, kvHead: 0, chunkIds: all }], new Uint8Array(32 * store.chunkBytes));
    expect(st2.runs).toBe(32); // one read per chunk
  });

  for (const direct of [false, true])
    it(`reads only the requested page-sized chunks of an extent, each verified (direct=${direct})`, async () => {
      // f16, head dim 256, 4 tokens: 4096-byte chunks, so every chunk is one aligned page.
      const big: StoreShape = { layers: 1, kvHeads: 2, headDim: 256, dtype: 'f16', chunkSize: 4 };
      const dir = tempDir('partial');
      let store = await openStore({ dir, shape: big, kind: 'pread', direct, coalesceGapBytes: 0 });
      expect(store.chunkBytes).toBe(4096);
      const data = segmentKv(big, 128, 11); // 32 chunks per region
      await store.writeSegment('p', { ...data, extentChunks: 8 }); // 4 extents of 8 chunks
      const ids = [1, 2, 6, 17, 31];
      const dest = new Uint8Array(ids.length * 4096);
      const st = await store.readBatch([{ segment: 'p', layer: 0, kvHead: 1, chunkIds: ids }], dest);
      ids.forEach((j, k) => expect(dest.subarray(k * 4096, (k + 1) * 4096)).toEqual(expectedChunk(big, data, 0, 1, j)));
      expect(st.extents).toBe(3);
      expect(st.extentBytes).toBe(3 * 8 * 4096); // what whole-extent reads would have transferred
      expect(st.runs).toBe(4); // [1, 2], [6], [17], [31]
      expect(st.bytesRead).toBe(ids.length * 4096); // only the requested pages
      // The store's default gap (32 KiB) reads 2 -> 6 (3 pages apart) as one I/O, not 6 -> 17 (10 pages).
      // (One open store per directory: the gap-less one is closed, and opened again after.)
      await store.close();
      const gapped = await openStore({ dir, kind: 'pread', direct });
      const g = await gapped.readBatch([{ segment: 'p', layer: 0, kvHead: 1, chunkIds: ids }], new Uint8Array(ids.length * 4096));
      expect([g.runs, g.bytesRead]).toEqual([3, (6 + 1 + 1) * 4096]);
      await gapped.close();
      store = await openStore({ dir, kind: 'pread', direct, coalesceGapBytes: 0 });
      // A flipped byte in chunk 6 fails reads of chunk 6 only; its extent neighbours stay readable.
      const ext = store.extents('p', 0, 1);
      flipByte(join(dir, 'p.kvseg'), ext.offsets[0]! + 6 * 4096 + 100, 0x01);
      expect(await store.readChunks('p', 0, 1, [5, 7])).toEqual(new Uint8Array([...expectedChunk(big, data, 0, 1, 5), ...expectedChunk(big, data, 0, 1, 7)]));
      const out = new Uint8Array(2 * 4096);
      await expectKvdError(() => store.readChunks('p', 0, 1, [6, 7], out), 'E_CORRUPT', /p\.kvseg: chunk checksum mismatch in layer 0, kv head 1, extent 0, chunk 6 /);
      expect(out.subarray(0, 4096).every((x) => x === 0)).toBe(true); // the corrupt chunk was never copied out
    });

  for (const kind of ['pread', 'mmap'] as const)
    it(`detects a flipped byte (E_CORRUPT naming file and extent), other segments stay readable (${kind}${kind === 'mmap' ? ': checksums verified on the mapped bytes' : ''})`, async () => {
      const dir = tempDir('crc');
      const store = await openStore({ dir, shape, kind });
      expect(store.engineInfo.kind).toBe(kind);
      const good = segmentKv(shape, 32, 5);
      await store.writeSegment('bad', segmentKv(shape, 32, 6));
      await store.writeSegment('good', good);
      const ext = store.extents('bad', 1, 0);
      flipByte(join(dir, 'bad.kvseg'), ext.offsets[1]! + 5, 0xff);
      // Chunks of extent 0 are fine; extent 1 is not.
      await store.readChunks('bad', 1, 0, [ext.order[0]!]);
      await expectKvdError(() => store.readChunks('bad', 1, 0, [ext.order[ext.firstPos[1]!]!]), 'E_CORRUPT', /bad\.kvseg.*layer 1, kv head 0, extent 1/);
      const got = await store.readChunks('good', 0, 1, [3]);
      expect(got).toEqual(expectedChunk(shape, good, 0, 1, 3));
    });

  for (const kind of ['pread', 'mmap'] as const)
    it(`readArrays' done flag: 1 from the read's thread once every chunk landed, 2 when it failed; a bad flag is refused (${kind})`, async () => {
      const dir = tempDir('done');
      const store = await openStore({ dir, shape, kind });
      const data = segmentKv(shape, 32, 12);
      await store.writeSegment('d', data);
      const h = store.segmentHandle('d');
      const ids = [0, 3, 5];
      const req = (done?: Int32Array) => ({
        segments: Int32Array.from([h]),
        layers: Int32Array.from([1]),
        heads: Int32Array.from([0]),
        itemOffsets: Int32Array.from([0, ids.length]),
        chunkIds: Int32Array.from(ids),
        dest: new Uint8Array(ids.length * store.chunkBytes),
        destOffsets: Float64Array.from(ids, (_, k) => k * store.chunkBytes),
        ...(done ? { done } : {}),
      });
      const done = new Int32Array(new SharedArrayBuffer(4));
      const ok = req(done);
      const reading = store.readArrays(ok);
      // Polled as a runtime step polls it (it may be set before the promise settles).
      while (Atomics.load(done, 0) === 0) await new Promise((r) => setImmediate(r));
      expect(Atomics.load(done, 0)).toBe(1);
      ids.forEach((j, k) => expect(ok.dest.subarray(k * store.chunkBytes, (k + 1) * store.chunkBytes)).toEqual(expectedChunk(shape, data, 1, 0, j)));
      await reading;
      // A failed read leaves 2.
      const ext = store.extents('d', 1, 0);
      flipByte(join(dir, 'd.kvseg'), ext.offsets[0]! + 3, 0xff);
      const failed = new Int32Array(new SharedArrayBuffer(4));
      await expectKvdError(() => store.readArrays(req(failed)), 'E_CORRUPT', /d\.kvseg/);
      expect(Atomics.load(failed, 0)).toBe(2);
      // The flag is checked before anything is read.
      await expectKvdError(() => store.readArrays(req(new Int32Array(0))), 'E_SHAPE', /segmentRead\.done: expected an Int32Array of at least 1 element, got 0/);
      await expectKvdError(() => store.readArrays({ ...req(), done: new Float32Array(1) as unknown as Int32Array }), 'E_DTYPE', /segmentRead\.done/);
    });

  for (const { kind } of engines)
    it(`readArrays' per-item flags: each item's set once its chunks landed, an empty item's at once, a failed item's never (${kind})`, async () => {
      const dir = tempDir('items');
      const store = await openStore({ dir, shape, kind });
      const data = segmentKv(shape, 32, 13);
      await store.writeSegment('d', data);
      const h = store.segmentHandle('d');
      // Items: (layer 1, head 0) chunks 0, 3, 5; (layer 0, head 1) chunk 2; (layer 1, head 1) nothing.
      const items = [
        { layer: 1, head: 0, ids: [0, 3, 5] },
        { layer: 0, head: 1, ids: [2] },
        { layer: 1, head: 1, ids: [] as number[] },
      ];
      const ids = items.flatMap((it) => it.ids);
      const req = (done: Int32Array) => ({
        segments: Int32Array.from(items, () => h),
        layers: Int32Array.from(items, (it) => it.layer),
        heads: Int32Array.from(items, (it) => it.head),
        itemOffsets: Int32Array.from([0, 3, 4, 4]),
        chunkIds: Int32Array.from(ids),
        dest: new Uint8Array(ids.length * store.chunkBytes),
        destOffsets: Float64Array.from(ids, (_, k) => k * store.chunkBytes),
        done,
      });
      const chunkOf = (r: { dest: Uint8Array }, k: number) => r.dest.subarray(k * store.chunkBytes, (k + 1) * store.chunkBytes);
      const done = new Int32Array(new SharedArrayBuffer(4 * (1 + items.length)));
      const ok = req(done);
      const reading = store.readArrays(ok);
      // Item 1's flag, once set, means its chunk is there, whatever the rest of the read is doing.
      while (Atomics.load(done, 2) === 0) await new Promise((r) => setImmediate(r));
      expect(chunkOf(ok, 3)).toEqual(expectedChunk(shape, data, 0, 1, 2));
      await reading;
      expect(Array.from(done)).toEqual([1, 1, 1, 1]);
      ids.slice(0, 3).forEach((j, k) => expect(chunkOf(ok, k)).toEqual(expectedChunk(shape, data, 1, 0, j)));
      // Item 0's chunk 3 corrupt: the read fails (2), item 0 never lands; the empty item lands.
      const ext = store.extents('d', 1, 0);
      const pos = ext.order.indexOf(3);
      let extent = 0;
      while (extent + 1 < ext.firstPos.length && ext.firstPos[extent + 1]! <= pos) extent++;
      flipByte(join(dir, 'd.kvseg'), ext.offsets[extent]! + (pos - ext.firstPos[extent]!) * store.chunkBytes + 7, 0xff);
      const failed = new Int32Array(new SharedArrayBuffer(4 * (1 + items.length)));
      await expectKvdError(() => store.readArrays(req(failed)), 'E_CORRUPT', /d\.kvseg/);
      expect(Atomics.load(failed, 0)).toBe(2);
      expect(Atomics.load(failed, 1)).toBe(0);
      expect(Atomics.load(failed, 3)).toBe(1);
      // Flags for some items only are refused before anything is read.
      await expectKvdError(
        () => store.readArrays(req(new Int32Array(new SharedArrayBuffer(4 * items.length)))),
        'E_SHAPE',
        /segmentRead\.done: expected 1 element \(the end flag\) or at least 1 \+ 3 \(one landing flag per item\), got 3/,
      );
    });

  it('reports a truncated extent file as E_CORRUPT at open and on read, others readable', async () => {
    const dir = tempDir('trunc');
    const a = await openStore({ dir, shape, kind: 'pread' });
    const good = segmentKv(shape, 32, 8);
    await a.writeSegment('t', segmentKv(shape, 32, 9));
    await a.writeSegment('g', good);
    await a.close();
    const path = join(dir, 't.kvseg');
    truncateSync(path, statSync(path).size - 100);
    const b = await openStore({ dir, kind: 'pread' });
    expect(b.segments().find((s) => s.id === 't')!.status).toBe('corrupt');
    await expectKvdError(() => b.readChunks('t', 0, 0, [0]), 'E_CORRUPT', /t\.kvseg/);
    expect(await b.readChunks('g', 1, 1, [1])).toEqual(expectedChunk(shape, good, 1, 1, 1));
  });

  it('refuses a manifest whose segment file points outside the store (E_CORRUPT), touching nothing', async () => {
    const dir = tempDir('escape');
    const a = await openStore({ dir, shape, kind: 'pread' });
    await a.writeSegment('s', segmentKv(shape, 32, 3));
    await a.close();
    const mpath = join(dir, readdirSync(dir).find((f) => f.endsWith('.json'))!);
    const m = JSON.parse(readFileSync(mpath, 'utf8'));
    m.segments[0].file = '../outside.kvseg';
    writeFileSync(mpath, JSON.stringify(m));
    await expectKvdError(() => SsdStore.open({ dir }), 'E_CORRUPT', /segments\.0\.file: expected file '<id>\.kvseg' in the store directory/);
    expect(readdirSync(dir).filter((f) => f.endsWith('.kvseg'))).toEqual(['s.kvseg']);
  });

  for (const kind of ['pread', 'mmap'] as const)
    it(`reports a short read of a file truncated after open as E_CORRUPT (${kind}${kind === 'mmap' ? ': sizes checked before any page is touched, no SIGBUS' : ''})`, async () => {
      const dir = tempDir('short');
      const s = await openStore({ dir, shape, kind });
      await s.writeSegment('t', segmentKv(shape, 32, 9));
      // mmap: map the file first (a read of it), then truncate under the mapping.
      expect((await s.readChunks('t', 0, 0, [0])).length).toBe(s.chunkBytes);
      truncateSync(join(dir, 't.kvseg'), 10);
      await expectKvdError(() => s.readChunks('t', 1, 1, [7]), 'E_CORRUPT', /t\.kvseg: chunk 7 of layer 1, kv head 1 .* is truncated: short read/);
    });


  it('refuses a manifest or segment of another version with E_VERSION', async () => {
    const dir = tempDir('ver');
    const s = await openStore({ dir, shape, kind: 'pread' });
    await s.writeSegment('v', segmentKv(shape, 16, 1));
    await s.close();
    const m = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'));
    writeFileSync(join(dir, 'manifest.json'), JSON.stringify({ ...m, version: 99 }));
    await expectKvdError(() => SsdStore.open({ dir }), 'E_VERSION', /expected manifest version 2, got 99/);
    writeFileSync(join(dir, 'manifest.json'), JSON.stringify(m));
    // Patch the segment footer's version field (bytes 8..11 of the 64-byte footer).
    const path = join(dir, 'v.kvseg');
    const size = statSync(path).size;
    const fd = openSync(path, 'r+');
    const v = Buffer.alloc(4);
    v.writeUInt32LE(7);
    writeSync(fd, v, 0, 4, size - 64 + 8);
    closeSync(fd);
    const r = await openStore({ dir });
    expect(r.segments()[0]!.status).toBe('corrupt');
    await expectKvdError(() => r.readChunks('v', 0, 0, [0]), 'E_VERSION', /expected segment format version 2, got 7/);
    // A version-1 segment (one checksum per extent) is refused with the reason.
    const fd1 = openSync(path, 'r+');
    v.writeUInt32LE(1);
    writeSync(fd1, v, 0, 4, size - 64 + 8);
    closeSync(fd1);
    await r.close();
    const r1 = await openStore({ dir });
    await expectKvdError(() => r1.readChunks('v', 0, 0, [0]), 'E_VERSION', /got 1 \(version 1 kept one checksum per extent.*re-create the store/);
  });

  it('rejects bad input with typed errors', async () => {
    const dir = tempDir('bad');
    const s = await openStore({ dir, shape, kind: 'pread' });
    await s.writeSegment('a', segmentKv(shape, 16, 1));
    await expectKvdError(() => s.readChunks('a', 0, 0, [4]), 'E_RANGE', /chunk ids in \[0, 4\), got 4/);
    await expectKvdError(() => s.readChunks('a', 2, 0, [0]), 'E_RANGE', /layer in \[0, 2\)/);
    await expectKvdError(() => s.readChunks('nope', 0, 0, [0]), 'E_NOT_FOUND', /unknown id/);
    await expectKvdError(() => s.writeSegment('a', segmentKv(shape, 16, 1)), 'E_CONFIG', /not yet in the store/);
    await expectKvdError(() => s.writeSegment('b/c', segmentKv(shape, 16, 1)), 'E_CONFIG', /segment id/);
    await expectKvdError(() => s.writeSegment('b', segmentKv(shape, 18, 1)), 'E_SHAPE', /multiple of chunkSize 4, got 18/);
    await expectKvdError(() => s.writeSegment('b', segmentKv({ ...shape, headDim: 4 }, 16, 1)), 'E_SHAPE', /8 dims/);
    const cl = randomClusters(shape, 4, 1);
    cl[1]!.chunkIds[0] = 9;
    await expectKvdError(() => s.writeSegment('b', { ...segmentKv(shape, 16, 1), clusters: cl }), 'E_RANGE', /chunk id in \[0, 4\), got 9/);
    await expectKvdError(() => SsdStore.open({ dir: tempDir('x'), shape, queueDepth: 0 }), 'E_CONFIG', /queueDepth/);
    await expectKvdError(() => SsdStore.open({ dir: tempDir('y') }), 'E_CONFIG', /shape/);
    await expectKvdError(() => SsdStore.open({ dir: tempDir('z'), create: false }), 'E_NOT_FOUND', /manifest/);
    await s.close();
    await expectKvdError(() => SsdStore.open({ dir, shape: { ...shape, headDim: 16 } }), 'E_CONFIG', /stored shape/);
    await expectKvdError(() => s.readChunks('a', 0, 0, [0]), 'E_CLOSED', /closed/);
    await expectKvdError(() => s.writeSegment('q', segmentKv(shape, 16, 1)), 'E_CLOSED', /closed/);
  });

  // Node 20's recursive mkdir spins forever on such paths (a parent that exists, a child the kernel
  // answers ENOENT for): each open must fail at once with an error naming the directory.
  it('refuses a store directory that cannot be made, promptly: under /proc, behind a dangling link, a file', async () => {
    if (existsSync('/proc/self')) {
      await expectKvdError(() => SsdStore.open({ dir: '/proc/kvdrive-store', shape }), 'E_NOT_FOUND', /creating \/proc\/kvdrive-store: expected a directory that can be made in \/proc/);
      await expectKvdError(() => SsdStore.open({ dir: '/proc/kvdrive-store/a/b', shape }), 'E_NOT_FOUND', /creating \/proc\/kvdrive-store/);
    }
    const root = tempDir('mkdir');
    mkdirSync(root, { recursive: true });
    symlinkSync(join(root, 'missing'), join(root, 'dangling'));
    await expectKvdError(() => SsdStore.open({ dir: join(root, 'dangling'), shape }), 'E_NOT_FOUND', /dangling link/);
    await expectKvdError(() => SsdStore.open({ dir: join(root, 'dangling', 'x', 'y'), shape }), 'E_NOT_FOUND', /dangling/);
    writeFileSync(join(root, 'file'), 'x');
    await expectKvdError(() => SsdStore.open({ dir: join(root, 'file', 'x'), shape }), 'E_IO', /ENOTDIR/);
    // Missing parents are still made.
    const s = await openStore({ dir: join(root, 'p', 'q', 'r'), shape });
    await s.close();
  }, 10_000);

  it("touches no file it did not write: a new store in a used directory, and leftovers at reopen", async () => {
    const dir = tempDir('foreign');
    writeFileSync(join(dir, 'notes.tmp'), 'mine');
    writeFileSync(join(dir, 'data.txt'), 'mine');
    const s = await openStore({ dir, shape });
    await s.writeSegment('a', segmentKv(shape, 16, 1));
    await s.close();
    // Leftovers of an interrupted write beside the user's files: only the store's own go.
    writeFileSync(join(dir, 'b.kvseg.tmp'), 'partial');
    writeFileSync(join(dir, 'c.kvseg'), 'never listed');
    writeFileSync(join(dir, 'manifest.json.tmp'), 'partial');
    const r = await openStore({ dir });
    expect(r.segments().map((x) => x.id)).toEqual(['a']);
    await r.close();
    expect(readdirSync(dir).sort()).toEqual(['LOCK', 'a.kvseg', 'data.txt', 'manifest.json', 'notes.tmp']);
    // Segment files without a manifest: a store that lost it, refused rather than written over.
    const orphan = tempDir('orphan');
    writeFileSync(join(orphan, 'x.kvseg'), 'segment');
    await expectKvdError(() => SsdStore.open({ dir: orphan, shape }), 'E_CONFIG', /1 segment file\(s\) \(x\.kvseg\) and no manifest\.json/);
    expect(readdirSync(orphan)).toEqual(['x.kvseg']);
  });

  it('one open store per directory: a second open is E_BUSY until close; a failed open holds nothing', async () => {
    const dir = tempDir('lock');
    const a = await openStore({ dir, shape });
    await expectKvdError(() => SsdStore.open({ dir, shape }), 'E_BUSY', /expected a store no other runtime has open/);
    await expectKvdError(() => SsdStore.open({ dir }), 'E_BUSY', /LOCK/);
    await a.close();
    await a.close();
    await expectKvdError(() => SsdStore.open({ dir, shape: { ...shape, headDim: 16 } }), 'E_CONFIG', /stored shape/);
    const b = await openStore({ dir });
    await b.close();
    expect(readdirSync(dir).sort()).toEqual(['LOCK', 'manifest.json']);
    // Only descriptors storeLock returned are closed.
    await expectKvdError(() => native.storeUnlock(0), 'E_RANGE', /descriptor storeLock returned/);
    await expectKvdError(() => native.storeUnlock('3'), 'E_TYPE', /descriptor/);
    await expectKvdError(() => native.storeLock(''), 'E_CONFIG', /non-empty path/);
    await expectKvdError(() => native.storeLock(join(dir, 'missing', 'LOCK')), 'E_NOT_FOUND', /opening the store lock/);
  });

  it('reset: an existing store starts empty, in the new shape, its segments deleted and nothing else touched', async () => {
    const dir = tempDir('reset');
    writeFileSync(join(dir, 'mine.txt'), 'x');
    const a = await openStore({ dir, shape });
    await a.writeSegment('a', segmentKv(shape, 16, 1));
    await a.close();
    writeFileSync(join(dir, 'b.kvseg.tmp'), 'partial');
    await expectKvdError(() => SsdStore.open({ dir, reset: true }), 'E_CONFIG', /shape to reset the store to/);
    const wide = { ...shape, headDim: 16 };
    const r = await openStore({ dir, shape: wide, reset: true });
    expect(r.segments()).toEqual([]);
    expect(r.shape).toEqual(wide);
    await r.writeSegment('a', segmentKv(wide, 16, 2));
    await r.close();
    expect(readdirSync(dir).sort()).toEqual(['LOCK', 'a.kvseg', 'manifest.json', 'mine.txt']);
    // Without reset a shape change is refused, naming both shapes.
    await expectKvdError(() => SsdStore.open({ dir, shape }), 'E_CONFIG', /expected the stored shape \{"layers":2,.*"headDim":16.*got \{"layers":2/);
  });

  it('maps ENOSPC to E_NOSPC via the native write hook; nothing listed, others readable', async () => {
    const dir = tempDir('nospc-hook');
    const s = await openStore({ dir, shape, kind: 'pread' });
    const good = segmentKv(shape, 16, 3);
    await s.writeSegment('ok', good);
    native.ioTestHooks({ failWritesAfterBytes: 1000 });
    try {
      await expectKvdError(() => s.writeSegment('full', segmentKv(shape, 64, 4)), 'E_NOSPC', /no space left/);
    } finally {
      native.ioTestHooks({ failWritesAfterBytes: -1 });
    }
    expect(s.segments().map((x) => x.id)).toEqual(['ok']);
    expect(readdirSync(dir).sort()).toEqual(['LOCK', 'manifest.json', 'ok.kvseg']);
    expect(await s.readChunks('ok', 1, 0, [2])).toEqual(expectedChunk(shape, good, 1, 0, 2));
  });
});
