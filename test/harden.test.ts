/**
 * The findings of issue 10 (no input crashes the process), one test each. Inputs that used to crash
 * the process run in a child process, so a regression fails this test instead of killing the runner.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { attendDense, attentionWeights } from '../src/attention/kernels.js';
import { HotTier } from '../src/cache/hot-tier.js';
import { SsdStore } from '../src/storage/ssd-store.js';
import type { Selection } from '../src/index/selection.js';
import { native } from '../src/native.js';
import { distPath } from './dist.js';
import { expectKvdError, randn } from './helpers.js';
import { removeTempDirs, segmentKv, tempDir } from './storage-kv.js';

afterAll(removeTempDirs);

/**
 * Runs `body` (ESM; `api` = the compiled kernels and policies, internal modules since the public API
 * shrank) in a child node; returns exit status and output.
 */
function inChild(body: string): { status: number | null; signal: NodeJS.Signals | null; out: string } {
  const mods = ['src/attention/kernels.js', 'src/index/policy.js'].map((m) => `await import(${JSON.stringify(distPath(m))})`);
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', `const api = { ...(${mods.join('), ...(')}) };\n${body}`], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  return { status: r.status, signal: r.signal, out: `${r.stdout}${r.stderr}` };
}

describe('issue 10 findings', () => {
  it('the attendDense reproducer (tokens*heads*dim wraps size_t) throws E_SHAPE and the process lives', () => {
    const r = inChild(`
      const kv = { data: new Float32Array(0), dtype: 'f32', tokens: 2 ** 40, heads: 256, dim: 65536 };
      try {
        api.attendDense({ q: new Float32Array(256 * 65536), qHeads: 256, k: kv, v: kv, tokens: 64 });
        console.log('no error');
      } catch (e) { console.log('caught', e.name, e.code); }
      // The same parser is behind every KV argument: a policy build and the hot tier take it too.
      try { await api.createPolicy('kvdrive').build(kv, 64); } catch (e) { console.log('caught', e.name, e.code); }
      console.log('alive');`);
    expect(r.signal, r.out).toBeNull();
    expect(r.status, r.out).toBe(0);
    expect(r.out).toContain('caught KvdriveError E_SHAPE\ncaught KvdriveError E_SHAPE\nalive');
  });

  it('an overflowing KV view is E_SHAPE in-process too, naming the product', async () => {
    const kv = { data: new Float32Array(0), dtype: 'f32' as const, tokens: 2 ** 40, heads: 4096, dim: 65536 };
    await expectKvdError(() => attendDense({ q: new Float32Array(1), qHeads: 4096, k: kv, v: kv }), 'E_SHAPE', /tokens\*heads\*dim = 1099511627776\*4096\*65536\): expected more than 2\^64 elements, got 0/);
  });

  it('hotTierAdmitPages rejects negative chunk ids (the map uses -1 for empty) and leaves the tier consistent', async () => {
    const t = new HotTier({ layers: 1, kvHeads: 1, headDim: 4, dtype: 'f32', chunkSize: 4, budget: 8, windows: 2, maxBytes: 1 << 20 });
    try {
      const selection = { chunkSize: 4, tokens: 16, sinkEnd: 0, tailStart: 16, offsets: Int32Array.from([0, 1]), chunkIds: Int32Array.from([-1]) };
      await expectKvdError(
        () => native.hotTierAdmitPages({ hot: { handle: t.handle, layer: 0 }, selection, tokens: 16, pages: new Uint8Array(128), pageOffsets: Int32Array.from([0, 1]), pageIds: Int32Array.from([-1]) }),
        'E_RANGE',
        /chunkIds\[0\] \(kv head 0\): expected a chunk id in \[0, 4\)/,
      );
      // Pool ids are checked the same way.
      await expectKvdError(
        () => native.hotTierAdmitPages({ hot: { handle: t.handle, layer: 0 }, selection: { ...selection, chunkIds: Int32Array.from([1]), poolOffsets: Int32Array.from([0, 1]), poolIds: Int32Array.from([-1]), poolScores: Float32Array.from([1]) }, tokens: 16, pages: new Uint8Array(128), pageOffsets: Int32Array.from([0, 1]), pageIds: Int32Array.from([1]) }),
        'E_RANGE',
        /poolIds\[0\]/,
      );
      expect(t.check()).toBe('');
    } finally {
      t.destroy();
    }
  });

  it('segmentRead checks every item offset before reading any item (SsdStore.readArrays)', async () => {
    const shape = { layers: 1, kvHeads: 1, headDim: 4, dtype: 'f32' as const, chunkSize: 4 };
    const store = await SsdStore.open({ dir: tempDir('harden-read'), shape });
    try {
      await store.writeSegment('a', segmentKv(shape, 16, 1));
      const h = store.segmentHandle('a');
      const req = {
        segments: Int32Array.from([h, h]),
        layers: Int32Array.from([0, 0]),
        heads: Int32Array.from([0, 0]),
        // Item 0 claims 1000 ids of a 3-id array; item 1 goes back to 3.
        itemOffsets: Int32Array.from([0, 1000, 3]),
        chunkIds: Int32Array.from([0, 1, 2]),
        dest: new Uint8Array(3 * store.chunkBytes),
        destOffsets: Float64Array.from([0, store.chunkBytes, 2 * store.chunkBytes]),
      };
      await expectKvdError(() => store.readArrays(req), 'E_RANGE', /segmentRead\.itemOffsets: expected non-decreasing offsets, got offsets\[2\] = 3 < offsets\[1\] = 1000/);
      await expectKvdError(() => store.readArrays({ ...req, itemOffsets: Int32Array.from([0, 2, 3]), destOffsets: Float64Array.from([0, -1, 2 ** 60]) }), 'E_RANGE', /destOffsets\[1\]: expected an integer byte offset/);
    } finally {
      await store.close();
    }
  });

  it('a segment whose index leaves a chunk in no extent (checksums re-sealed) is E_CORRUPT, not a wild read', async () => {
    const shape = { layers: 1, kvHeads: 1, headDim: 4, dtype: 'f32' as const, chunkSize: 4 };
    const dir = tempDir('harden-extents');
    let store = await SsdStore.open({ dir, shape });
    await store.writeSegment('a', segmentKv(shape, 16, 2));
    await store.close();
    const file = join(dir, readdirSync(dir).find((f) => f.endsWith('.kvseg'))!);
    const b = new Uint8Array(readFileSync(file));
    const dv = new DataView(b.buffer);
    const foot = b.length - 64;
    const indexOffset = Number(dv.getBigUint64(foot + 40, true));
    const indexBytes = Number(dv.getBigUint64(foot + 48, true));
    // Region 0: u64 offset, u32 nExtents, u32 nChunks, then extents {u64 offset, u32 bytes, u32 firstPos, u32 chunks, u32 crc}.
    dv.setUint32(indexOffset + 16 + 8, 0, true); // extent 0: 0 bytes
    dv.setUint32(indexOffset + 16 + 16, 0, true); // extent 0: 0 chunks
    dv.setUint32(foot + 56, native.crc32c(b.subarray(indexOffset, indexOffset + indexBytes)), true);
    dv.setUint32(foot + 60, native.crc32c(b.subarray(foot, foot + 60)), true);
    writeFileSync(file, b);
    store = await SsdStore.open({ dir, create: false });
    try {
      expect(store.segments()[0]!.status).toBe('corrupt');
      await expectKvdError(() => store.readChunks('a', 0, 0, [0]), 'E_CORRUPT', /lies in no extent/);
    } finally {
      await store.close();
    }
  });

  it('attendFetchedAsync rejects its promise on bad input instead of throwing synchronously', async () => {
    let p: unknown;
    expect(() => (p = native.attendFetchedAsync({ q: 1 }))).not.toThrow();
    expect(p).toBeInstanceOf(Promise);
    await expectKvdError(() => p, 'E_TYPE', /attendFetchedAsync\.sink: expected \{ k, v \}/);
  });

  it('hot tier stats and residents stay consistent while async fetches run on other threads', async () => {
    // Stats / Residents take each layer's lock (waiting for a running step) instead of reading pair
    // state mid-update. A data race cannot be made to fail on demand; this checks the invariants
    // under concurrency: resident counts agree with the resident lists and never exceed capacity.
    const H = 2, D = 8, T = 4096, cs = 4;
    const t = new HotTier({ layers: 2, kvHeads: H, headDim: D, dtype: 'f32', chunkSize: cs, budget: 256, windows: 2, maxBytes: 1 << 24 });
    try {
      const k = { data: randn(T * H * D, 1), dtype: 'f32' as const, tokens: T, heads: H, dim: D };
      const caps = t.info().capacities;
      for (let round = 0; round < 8; round++) {
        const pending = [0, 1].map((layer) => {
          const offsets = new Int32Array(H + 1);
          const all: number[] = [];
          for (let h = 0; h < H; h++) {
            const set = new Set<number>();
            for (let c = 0; c < 64; c++) set.add((c * 7 + round * 13 + h + layer) % (T / cs));
            all.push(...[...set].sort((x, y) => x - y));
            offsets[h + 1] = all.length;
          }
          const selection = { chunkSize: cs, tokens: T, sinkEnd: 0, tailStart: T, offsets, chunkIds: Int32Array.from(all) } as unknown as Selection;
          return t.fetchAsync({ layer, k, v: k, selection });
        });
        for (let i = 0; i < 20; i++) {
          const s = t.stats();
          for (const p of s.pairs) expect(p.resident).toBeLessThanOrEqual(caps[p.layer * H + p.head]!);
          expect(t.residents(i % 2, i % H).length).toBeLessThanOrEqual(caps[(i % 2) * H + (i % H)]!);
        }
        await Promise.all(pending);
        expect(t.check()).toBe('');
      }
    } finally {
      t.destroy();
    }
  });

  it('attentionWeights with a result beyond 2^31 elements is E_RANGE, not a plain RangeError', async () => {
    const T = 1 << 20;
    const k = { data: new Float32Array(T), dtype: 'f32' as const, tokens: T, heads: 1, dim: 1 };
    await expectKvdError(() => attentionWeights({ q: new Float32Array(65536), qHeads: 65536, k }), 'E_RANGE', /at most 2\^31 elements, got 68719476736/);
  });

  it('messages never read "expected expected" or "got nan"', async () => {
    const kv = { data: new Float32Array(8), dtype: 'f32' as const, tokens: 2, heads: 1, dim: 4 };
    let msg = '';
    try {
      attendDense({ q: new Float32Array(4), qHeads: 1, k: kv, v: kv, tokens: NaN });
    } catch (e) {
      msg = (e as Error).message;
    }
    expect(msg).toMatch(/attendDense\.tokens: expected an integer in \[0, 2\], got NaN$/);
    try {
      await SsdStore.open(7 as never);
    } catch (e) {
      msg = (e as Error).message;
    }
    expect(msg).toBe('SsdStore options: expected object, got 7');
  });
});
