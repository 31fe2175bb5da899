import { openSync, writeSync, closeSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { IoEngine, ioUringAvailable } from '../src/storage/io-engine.js';
import { native } from '../src/native.js';
import { expectKvdError, rng } from './helpers.js';
import { removeTempDirs, tempDir } from './storage-kv.js';

afterAll(removeTempDirs);

const uring = ioUringAvailable();
if (!uring.usable) console.warn(`NOTICE: io_uring unavailable (${uring.reason}); io_uring engine tests skipped`);
const kinds = ['pread', 'mmap', ...(uring.usable ? ['uring'] : [])] as const;

function dataFile(bytes: number, seed: number): { path: string; data: Uint8Array } {
  const r = rng(seed);
  const data = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i++) data[i] = Math.floor(r() * 256);
  const path = join(tempDir('io'), 'data.bin');
  const fd = openSync(path, 'w');
  writeSync(fd, data);
  closeSync(fd);
  return { path, data };
}

const engines: IoEngine[] = [];
afterEach(() => {
  for (const e of engines.splice(0)) e.close();
});
function engine(o: ConstructorParameters<typeof IoEngine>[0]): IoEngine {
  const e = new IoEngine(o);
  engines.push(e);
  return e;
}

describe.each(kinds)('I/O engine %s', (kind) => {
  for (const direct of [false, true]) {
    it(`reads random ranges exactly (direct=${direct})`, async () => {
      const { path, data } = dataFile(3 << 20, 11);
      const e = engine({ kind, queueDepth: 8, maxIoBytes: 64 << 10 });
      expect(e.info.kind).toBe(kind === 'uring' ? 'io_uring' : kind);
      const f = e.open(path, direct);
      const r = rng(3);
      const reads = [];
      let at = 0;
      for (let i = 0; i < 300; i++) {
        const length = 1 + Math.floor(r() * 200_000);
        const offset = Math.floor(r() * (data.length - length));
        reads.push({ file: f.file, offset, length, destOffset: at });
        at += length;
      }
      const dest = new Uint8Array(at);
      const st = await e.read(reads, dest);
      expect(st.bytesRequested).toBe(at);
      for (const q of reads) expect(Buffer.compare(dest.subarray(q.destOffset, q.destOffset + q.length), data.subarray(q.offset, q.offset + q.length))).toBe(0);
      // Cold again (the file's pages dropped from the page cache): the same bytes.
      e.dropCache(f.file);
      dest.fill(0);
      await e.read(reads, dest);
      for (const q of reads) expect(Buffer.compare(dest.subarray(q.destOffset, q.destOffset + q.length), data.subarray(q.offset, q.offset + q.length))).toBe(0);
    });
  }

  it('coalesces neighbouring requests into fewer, larger reads', async () => {
    const { path, data } = dataFile(1 << 20, 12);
    const e = engine({ kind, maxIoBytes: 256 << 10 });
    const f = e.open(path).file;
    // 256 adjacent 4 KiB requests scattered in memory (reverse order): 1 MiB in 4 reads of 256 KiB.
    const reads = Array.from({ length: 256 }, (_, i) => ({ file: f, offset: i * 4096, length: 4096, destOffset: (255 - i) * 4096 }));
    const dest = new Uint8Array(1 << 20);
    const st = await e.read(reads, dest);
    expect(st.requests).toBe(256);
    expect(st.ios).toBe(4);
    for (let i = 0; i < 256; i++) expect(Buffer.compare(dest.subarray((255 - i) * 4096, (256 - i) * 4096), data.subarray(i * 4096, (i + 1) * 4096))).toBe(0);
    const off = engine({ kind, coalesce: false });
    const f2 = off.open(path).file;
    const st2 = await off.read(reads.map((q) => ({ ...q, file: f2 })), dest);
    expect(st2.ios).toBe(256);
  });

  it('E_CORRUPT on a short read, E_IO with errno text, E_RANGE for a bad file id or destination, E_CLOSED after close', async () => {
    const { path } = dataFile(10_000, 13);
    const e = new IoEngine({ kind });
    const f = e.open(path).file;
    const dest = new Uint8Array(8192);
    await expectKvdError(() => e.read([{ file: f, offset: 8000, length: 4000, destOffset: 0 }], dest), 'E_CORRUPT', /short read: .*data\.bin ends at byte 10000, expected at least 12000/);
    await expectKvdError(() => e.read([{ file: 42, offset: 0, length: 10, destOffset: 0 }], dest), 'E_RANGE', /open file id, got 42/);
    await expectKvdError(() => e.read([{ file: f, offset: 0, length: 10, destOffset: 8190 }], dest), 'E_RANGE', /dest\.byteLength 8192/);
    await expectKvdError(() => e.open(join(tempDir('nf'), 'missing.bin')), 'E_NOT_FOUND', /missing\.bin/);
    // A directory opens read-only but cannot be read: the errno text comes through as E_IO.
    const d = e.open(tempDir('dir')).file;
    // (mmap: a directory cannot be mapped.)
    await expectKvdError(() => e.read([{ file: d, offset: 0, length: 10, destOffset: 0 }], dest), 'E_IO', kind === 'mmap' ? /mmap .*kvd-storage-dir.*No such device/ : /reading .*kvd-storage-dir.*Is a directory/);
    e.close();
    await expectKvdError(() => e.read([{ file: f, offset: 0, length: 10, destOffset: 0 }], dest), 'E_CLOSED', /closed/);
  });

  it('serves concurrent callers\' batches: each gets its own bytes and errors; io_uring and mmap run them side by side', async () => {
    const { path, data } = dataFile(2 << 20, 15);
    const e = engine({ kind, queueDepth: 4, maxBatches: 2, maxIoBytes: 64 << 10 });
    expect(e.info.maxBatches).toBe(2);
    const f = e.open(path, true).file;
    const batch = (seed: number) => {
      const r = rng(seed);
      return Array.from({ length: 40 }, (_, i) => ({ file: f, offset: Math.floor(r() * ((2 << 20) - 20_000)), length: 1 + Math.floor(r() * 20_000), destOffset: i * 20_000 }));
    };
    const batches = [batch(1), batch(2), batch(3), batch(4)];
    const dests = batches.map(() => new Uint8Array(40 * 20_000));
    // With the barrier each batch, once served, waits (2 s at most) until two are in flight: an
    // engine that serialises batches never gets there (pread does, by design: not barred here).
    if (kind !== 'pread') native.ioTestHooks({ batchBarrier: 2 });
    let results;
    try {
      results = await Promise.allSettled([
        ...batches.map((b, i) => e.read(b, dests[i]!)),
        e.read([{ file: f, offset: (2 << 20) - 100, length: 4096, destOffset: 0 }], new Uint8Array(4096)), // past the end
      ]);
    } finally {
      native.ioTestHooks({ batchBarrier: 0 });
    }
    batches.forEach((b, i) => {
      expect(results[i]!.status).toBe('fulfilled');
      for (const q of b) expect(Buffer.compare(dests[i]!.subarray(q.destOffset, q.destOffset + q.length), data.subarray(q.offset, q.offset + q.length))).toBe(0);
    });
    expect(results[4]!.status).toBe('rejected');
    expect(((results[4] as PromiseRejectedResult).reason as { code: string }).code).toBe('E_CORRUPT');
    const peak = e.stats().peakBatches;
    if (kind === 'pread') expect(peak).toBe(1);
    else if (kind === 'uring') expect(peak).toBe(2); // maxBatches: a third caller waits for a ring
    else expect(peak).toBeGreaterThanOrEqual(2);
  });

  it('stops submitting when cancelled', async () => {
    const { path } = dataFile(1 << 20, 14);
    const e = engine({ kind, coalesce: false });
    const f = e.open(path).file;
    const flag = native.cancelFlagCreate() as number;
    native.cancelFlagRaise(flag);
    const st = await e.read(Array.from({ length: 16 }, (_, i) => ({ file: f, offset: i * 4096, length: 4096, destOffset: i * 4096 })), new Uint8Array(1 << 16), flag);
    expect(st.cancelled).toBe(true);
    expect(st.ios).toBe(0);
    native.cancelFlagRelease(flag);
  });
});

describe('crc32c', () => {
  it('matches the RFC 3720 check value and the portable table at every length/alignment', () => {
    expect(native.crc32c(new TextEncoder().encode('123456789'))).toBe(0xe3069283);
    expect(native.crc32c(new TextEncoder().encode('123456789'), true)).toBe(0xe3069283);
    const r = rng(21);
    const big = Uint8Array.from({ length: 3 * 8192 * 2 + 4000 }, () => Math.floor(r() * 256));
    for (const n of [0, 1, 7, 8, 9, 255, 767, 768, 769, 2000, 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 777, big.length - 3])
      for (const off of [0, 3]) {
        const v = big.subarray(off, off + n);
        expect(native.crc32c(v), `length ${n}, offset ${off}`).toBe(native.crc32c(v, true));
      }
  });
});

describe('engine selection', () => {
  it("falls back to pread when io_uring is refused, and 'uring' then fails", () => {
    process.env.KVDRIVE_IO_URING_DISABLE = '1';
    try {
      const e = engine({ kind: 'auto' });
      expect(e.info.kind).toBe('pread');
      expect(e.info.fallbackReason).toMatch(/io_uring/);
      expect(() => new IoEngine({ kind: 'uring' })).toThrow(uring.built ? /io_uring engine: .*ENOSYS/ : /expected a build with liburing/);
    } finally {
      delete process.env.KVDRIVE_IO_URING_DISABLE;
    }
  });

  it('picks io_uring by default where usable; registers fixed buffers', () => {
    const e = engine({});
    expect(e.info.kind).toBe(uring.usable ? 'io_uring' : 'pread');
    if (uring.usable) expect(e.info.fixedBuffers).toBe(true);
  });

  it('validates options', async () => {
    await expectKvdError(() => new IoEngine({ kind: 'spdk' as never }), 'E_CONFIG', /kind/);
    await expectKvdError(() => new IoEngine({ maxIoBytes: 5000 }), 'E_CONFIG', /maxIoBytes.*4096/);
    await expectKvdError(() => new IoEngine({ queueDepth: 1.5 }), 'E_CONFIG', /queueDepth/);
    await expectKvdError(() => new IoEngine({ maxBatches: 0 }), 'E_CONFIG', /maxBatches/);
    await expectKvdError(() => new IoEngine({ bogus: 1 } as never), 'E_CONFIG', /ioEngine options/);
    await expectKvdError(() => new IoEngine({ coalesce: 1 } as never), 'E_CONFIG', /coalesce/);
    // The binding checks again (it does not trust its caller): a boolean option given as anything else.
    for (const key of ['coalesce', 'fixedBuffers'])
      await expectKvdError(() => native.ioEngineCreate({ kind: 'pread', [key]: 'yes' }), 'E_TYPE', new RegExp(`ioEngine options.${key}: expected a boolean`));
  });
});
