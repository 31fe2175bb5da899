/**
 * Decode from the storage tiers (src/storage/tiered-attention.ts): outputs bit-identical whichever
 * tier served the chunks, the DRAM budget held during decode, a corrupt extent failing only the
 * reads that touch it, and prefetch/cancel driven by the lookahead pool.
 */
import { closeSync, openSync, readSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { attendSparse } from '../src/attention/kernels.js';
import { DramStore } from '../src/storage/dram-store.js';
import { SsdStore, type StoreShape } from '../src/storage/ssd-store.js';
import { attendFetched, TieredAttention } from '../src/storage/tiered-attention.js';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { HotTier } from '../src/cache/hot-tier.js';
import { native } from '../src/native.js';
import { layerKvWithNew, type TraceLayer } from '../src/trace/trace.js';
import type { Selection } from '../src/index/selection.js';
import type { KvTensor } from '../src/types.js';
import { expectKvdError } from './helpers.js';
import { removeTempDirs, tempDir } from './storage-kv.js';

afterAll(removeTempDirs);

const L = 2;
const T = 512;
const S = 4;
const qHeads = 4;
const kvHeads = 2;
const D = 16;
const policy = { segmentTokens: 128, local: 16, sinks: 4 };

async function traceLayers(dtype: 'f32' | 'f16') {
  const tr = generateSyntheticTrace({ layers: L, promptTokens: T, decodeSteps: S, qHeads, kvHeads, headDim: D, dtype, seed: 7 });
  const layers: TraceLayer[] = [];
  for (let l = 0; l < L; l++) layers.push(await tr.layer(l));
  return layers;
}

function token(t: KvTensor, i: number): KvTensor {
  const row = t.heads * t.dim;
  return { ...t, tokens: 1, data: t.data.subarray(i * row, (i + 1) * row) };
}

const kvBytes = (shape: StoreShape) => L * T * kvHeads * D * 2 * (shape.dtype === 'f32' ? 4 : 2);

async function open(tag: string, dtype: 'f32' | 'f16', budgetBytes: number, pool?: number, hot?: HotTier) {
  const shape: StoreShape = { layers: L, kvHeads, headDim: D, dtype, chunkSize: 4 };
  const dir = tempDir(tag);
  const ssd = await SsdStore.open({ dir, shape, kind: 'pread' });
  const dram = new DramStore({ budgetBytes, shape });
  const ta = TieredAttention.open({ ssd, dram, sequence: 'seq', qHeads, budget: 32, pool, maxDecodeTokens: S, policy, hotTier: hot });
  return { shape, dir, ssd, dram, ta };
}

const hotTier = (dtype: 'f32' | 'f16') => new HotTier({ layers: L, kvHeads, headDim: D, dtype, chunkSize: 4, budget: 32, windows: 2, maxBytes: 1 << 24 });

describe('tiered decode', () => {
  it('gives outputs bit-identical to attendSparse over the contiguous cache, from DRAM and from SSD', async () => {
    for (const dtype of ['f32', 'f16'] as const) {
      const layers = await traceLayers(dtype);
      // All in DRAM (warmed by importance) vs DRAM of one chunk (everything read from SSD).
      const inDram = await open(`dram-${dtype}`, dtype, 4 * kvBytes({ layers: L, kvHeads, headDim: D, dtype, chunkSize: 4 }), 0);
      const tiny = await open(`ssd-${dtype}`, dtype, 2 * 1024 + 64, 0);
      // Hot tier (2 x 8 slots per kv head, warmed by importance) in front of a small DRAM tier.
      const tier = hotTier(dtype);
      const withHot = await open(`hot-${dtype}`, dtype, 8 * 1024, 0, tier);
      const obs = (l: number) => ({ q: layers[l]!.q.subarray(0, qHeads * D), qHeads, positions: Int32Array.of(T) });
      const pre = await inDram.ta.prefill(layers.map((x, l) => ({ k: x.k, v: x.v, obs: obs(l) })));
      expect(pre.segments).toBe(T / policy.segmentTokens);
      expect(pre.dramWarmed).toBe(L * kvHeads * (T / 4));
      await tiny.ta.prefill(layers.map((x) => ({ k: x.k, v: x.v })));
      const hp = await withHot.ta.prefill(layers.map((x, l) => ({ k: x.k, v: x.v, obs: obs(l) })));
      expect(hp.hotWarmed).toBe(L * kvHeads * 16);
      let hotBytes = 0;
      for (let s = 0; s < S; s++)
        for (let l = 0; l < L; l++) {
          const x = layers[l]!;
          const q = x.q.subarray(s * qHeads * D, (s + 1) * qHeads * D);
          const a = await inDram.ta.step(l, q, token(x.kNew, s), token(x.vNew, s));
          expect(a.stats.ssdBytes).toBe(0);
          expect(a.stats.dramBytes).toBe(a.stats.chunks * inDram.ssd.chunkBytes);
          // The same selection from SSD-read chunks (the step appends token s to that instance's tail).
          await advance(tiny.ta, l, x, s);
          const b = await tiny.ta.attendSelection(l, q, a.selection);
          expect(b.stats.ssdBytes + b.stats.dramBytes).toBe(a.stats.chunks * inDram.ssd.chunkBytes);
          if (s === 0 && l === 0) expect(b.stats.ssdBytes).toBeGreaterThan(0);
          // And from the contiguous cache (prompt + new tokens 0..s).
          const full = layerKvWithNew(x);
          const c = attendSparse({ q, qHeads, k: full.k, v: full.v, selection: a.selection });
          expect(Buffer.from(a.out.buffer).equals(Buffer.from(c.out.buffer))).toBe(true);
          expect(Buffer.from(b.out.buffer).equals(Buffer.from(c.out.buffer))).toBe(true);
          expect(Buffer.from(a.lse.buffer).equals(Buffer.from(c.lse.buffer))).toBe(true);
          expect(Array.from(b.chunkMass)).toEqual(Array.from(c.chunkMass));
          // And through the hot tier (residents from slots, the rest from DRAM/SSD, admitted).
          const h = await withHot.ta.step(l, q, token(x.kNew, s), token(x.vNew, s));
          expect(Array.from(h.selection.chunkIds)).toEqual(Array.from(a.selection.chunkIds));
          expect(Buffer.from(h.out.buffer).equals(Buffer.from(c.out.buffer))).toBe(true);
          expect(h.stats.hotBytes + h.stats.dramBytes + h.stats.ssdBytes + h.stats.prefetchedBytes).toBe(a.stats.chunks * inDram.ssd.chunkBytes);
          hotBytes += h.stats.hotBytes;
          expect(tier.check()).toBe('');
        }
      expect(hotBytes).toBeGreaterThan(0);
      expect(tier.stats().total.admitted).toBeGreaterThan(0);
      await inDram.ta.close();
      await tiny.ta.close();
      await withHot.ta.close();
      await withHot.ssd.close();
      tier.destroy();
      await inDram.ssd.close();
      await tiny.ssd.close();
    }
  });

  it('never exceeds the DRAM budget during decode (KV 3x the budget), prefetches from the pool', async () => {
    const layers = await traceLayers('f16');
    const budget = Math.floor(kvBytes({ layers: L, kvHeads, headDim: D, dtype: 'f16', chunkSize: 4 }) / 3);
    const t = await open('budget', 'f16', budget, 64);
    const obs = (l: number) => ({ q: layers[l]!.q.subarray(0, qHeads * D), qHeads, positions: Int32Array.of(T) });
    const pre = await t.ta.prefill(layers.map((x, l) => ({ k: x.k, v: x.v, obs: obs(l) })));
    expect(pre.dramWarmed).toBeGreaterThan(0);
    expect(t.dram.stats().residentChunks).toBeLessThan(L * kvHeads * (T / 4));
    let ssd = 0;
    let prefetched = 0;
    for (let s = 0; s < S; s++)
      for (let l = 0; l < L; l++) {
        const x = layers[l]!;
        const r = await t.ta.step(l, x.q.subarray(s * qHeads * D, (s + 1) * qHeads * D), token(x.kNew, s), token(x.vNew, s));
        const st = t.dram.stats();
        expect(st.reservedBytes).toBeLessThanOrEqual(budget);
        expect(st.usedBytes).toBeLessThanOrEqual(st.capacityChunks * t.ssd.chunkBytes);
        ssd += r.stats.ssdBytes;
        prefetched += r.stats.prefetchedBytes;
        expect(r.stats.dramBytes + r.stats.ssdBytes + r.stats.prefetchedBytes).toBe(r.stats.chunks * t.ssd.chunkBytes);
      }
    const pt = t.ta.tiers.prefetchTotals();
    expect(pt.issued).toBeGreaterThan(0);
    // A prefetch none of whose chunks the next selection needs is cancelled, and the step still works.
    const x = layers[0]!;
    expect(t.ta.tiers.pendingPrefetches).toBeGreaterThan(0);
    const q = x.q.subarray((S - 1) * qHeads * D, S * qHeads * D);
    const none: Selection = { chunkSize: 4, tokens: T + S, sinkEnd: 4, tailStart: T - 16, offsets: Int32Array.of(0, 0, 0), chunkIds: new Int32Array(0) };
    const r = await t.ta.attendSelection(0, q, none);
    expect(r.stats.prefetchCancelled).toBe(true);
    expect(t.ta.tiers.prefetchTotals().cancelled).toBe(pt.cancelled + 1);
    const full = layerKvWithNew(x);
    expect(Buffer.from(r.out.buffer).equals(Buffer.from(attendSparse({ q, qHeads, k: full.k, v: full.v, selection: none }).out.buffer))).toBe(true);
    expect(ssd + prefetched).toBeGreaterThan(0);
    await t.ta.close();
    await t.ssd.close();
  });

  it('a corrupt extent fails the reads that touch it with E_CORRUPT; other extents and segments keep working', async () => {
    const layers = await traceLayers('f32');
    const t = await open('corrupt', 'f32', 2 * 1024 + 64, 0);
    await t.ta.prefill(layers.map((x) => ({ k: x.k, v: x.v })));
    const seg = t.ta.segments[1]!;
    const ext = t.ssd.extents(seg, 0, 0);
    const file = join(t.dir, t.ssd.segments().find((x) => x.id === seg)!.file);
    const fd = openSync(file, 'r+');
    const at = ext.offsets[0]! + 3;
    const b = Buffer.alloc(1);
    readSync(fd, b, 0, 1, at);
    b[0] = b[0]! ^ 0xff;
    writeSync(fd, b, 0, 1, at);
    closeSync(fd);
    const first = 128 / 4; // segment 1 starts at chunk 32
    const bad = first + ext.order[ext.firstPos[0]!]!;
    const okOther = first + ext.order[ext.firstPos[1]!]!;
    const x = layers[0]!;
    await advance(t.ta, 0, x, 0);
    const q = x.q.subarray(0, qHeads * D);
    const sel = (h0: number[]): Selection => ({
      chunkSize: 4, tokens: T + 1, sinkEnd: 4, tailStart: T - 16,
      offsets: Int32Array.of(0, h0.length, h0.length + 1), chunkIds: Int32Array.from([...h0, 10]),
    });
    await expectKvdError(() => t.ta.attendSelection(0, q, sel([5, bad].sort((a, c) => a - c))), 'E_CORRUPT', /extent/);
    const full = layerKvWithNew(x);
    for (const ids of [[5, 9], [5, okOther], [okOther, 100]]) {
      const s2 = sel(ids.sort((a, c) => a - c));
      const r = await t.ta.attendSelection(0, q, s2);
      const c = attendSparse({ q, qHeads, k: full.k, v: full.v, selection: s2 });
      expect(Buffer.from(r.out.buffer).equals(Buffer.from(c.out.buffer))).toBe(true);
    }
    await t.ta.close();
    await t.ssd.close();
  });

  it('works without sinks, and a failed step can be retried', async () => {
    const layers = await traceLayers('f32');
    const shape: StoreShape = { layers: L, kvHeads, headDim: D, dtype: 'f32', chunkSize: 4 };
    const dir = tempDir('nosink');
    const ssd = await SsdStore.open({ dir, shape, kind: 'pread' });
    const dram = new DramStore({ budgetBytes: 4096, shape });
    const ta = TieredAttention.open({ ssd, dram, sequence: 's', qHeads, budget: 32, maxDecodeTokens: S, policy: { ...policy, sinks: 0 } });
    await ta.prefill(layers.map((x) => ({ k: x.k, v: x.v })));
    // Corrupt every extent of layer 1 (all segments): any step of layer 1 reads one.
    for (const seg of ta.segments) {
      const fd = openSync(join(dir, ssd.segments().find((x) => x.id === seg)!.file), 'r+');
      for (let h = 0; h < kvHeads; h++) {
        const ext = ssd.extents(seg, 1, h);
        for (let e = 0; e < ext.offsets.length; e++) writeSync(fd, Buffer.from([0xab, 0xcd]), 0, 2, ext.offsets[e]! + 1);
      }
      closeSync(fd);
    }
    const x0 = layers[0]!;
    const q0 = x0.q.subarray(0, qHeads * D);
    const a = await ta.step(0, q0, token(x0.kNew, 0), token(x0.vNew, 0));
    expect(a.selection.sinkEnd).toBe(0);
    const full = layerKvWithNew(x0);
    expect(Buffer.from(a.out.buffer).equals(Buffer.from(attendSparse({ q: q0, qHeads, k: full.k, v: full.v, selection: a.selection }).out.buffer))).toBe(true);
    const x1 = layers[1]!;
    const q1 = x1.q.subarray(0, qHeads * D);
    // More failed attempts than maxDecodeTokens: a failed step consumes no position (else E_BUDGET).
    for (let i = 0; i <= S; i++) await expectKvdError(() => ta.step(1, q1, token(x1.kNew, 0), token(x1.vNew, 0)), 'E_CORRUPT', /extent/);
    // Layer 0 keeps working.
    await advance(ta, 0, x0, 1);
    await ta.close();
    await ssd.close();
  });

  it('rejects bad options and inputs with typed errors', async () => {
    const shape: StoreShape = { layers: L, kvHeads, headDim: D, dtype: 'f32', chunkSize: 4 };
    const ssd = await SsdStore.open({ dir: tempDir('opts'), shape, kind: 'pread' });
    const dram = new DramStore({ budgetBytes: 1 << 20, shape });
    const base = { ssd, dram, sequence: 'x', qHeads, budget: 32, maxDecodeTokens: 2 };
    expect(() => new DramStore({ budgetBytes: 1, shape })).toThrow(/E_BUDGET|chunk/);
    await expectKvdError(() => TieredAttention.open({ ...base, qHeads: 3 }), 'E_SHAPE', /multiple of kvHeads/);
    await expectKvdError(() => TieredAttention.open({ ...base, budget: 2 }), 'E_BUDGET', /at least one chunk/);
    await expectKvdError(() => TieredAttention.open({ ...base, pool: 8 }), 'E_BUDGET', /pool/);
    await expectKvdError(() => TieredAttention.open({ ...base, sequence: 'a b' }), 'E_CONFIG', /sequence/);
    await expectKvdError(() => TieredAttention.open({ ...base, policy: { chunkSize: 8 } }), 'E_CONFIG', /chunk size 4/);
    const wrongTier = new HotTier({ layers: L, kvHeads, headDim: D, dtype: 'f16', chunkSize: 4, budget: 32, windows: 1, maxBytes: 1 << 24 });
    await expectKvdError(() => TieredAttention.open({ ...base, hotTier: wrongTier }), 'E_SHAPE', /hotTier/);
    wrongTier.destroy();
    const smallTier = new HotTier({ layers: L, kvHeads, headDim: D, dtype: 'f32', chunkSize: 4, budget: 16, windows: 1, maxBytes: 1 << 24 });
    await expectKvdError(() => TieredAttention.open({ ...base, hotTier: smallTier }), 'E_BUDGET', /hotTier budget/);
    await expectKvdError(() => TieredAttention.open({ ...base, hotTier: smallTier, budget: 16, hotSequence: 1 }), 'E_RANGE', /hotSequence/);
    // Admission from pages that lack a miss is refused (nothing silently attended from garbage).
    const sel1: Selection = { chunkSize: 4, tokens: T, sinkEnd: 4, tailStart: T - 16, offsets: Int32Array.of(0, 1, 1), chunkIds: Int32Array.of(3) };
    expect(() =>
      native.hotTierAdmitPages({ hot: { handle: smallTier.handle, layer: 0 }, selection: sel1, tokens: T, pages: new Uint8Array(512), pageOffsets: Int32Array.of(0, 1, 1), pageIds: Int32Array.of(5) }),
    ).toThrow(/chunk 3 of kv head 0 must be admitted but the page source does not hold it/);
    smallTier.destroy();
    const ta = TieredAttention.open(base);
    const layers = await traceLayers('f32');
    await expectKvdError(() => ta.step(0, new Float32Array(qHeads * D), token(layers[0]!.kNew, 0), token(layers[0]!.vNew, 0)), 'E_CONFIG', /prefill/);
    await expectKvdError(() => ta.prefill([{ k: layers[0]!.k, v: layers[0]!.v }]), 'E_SHAPE', /2 layers/);
    await ta.prefill(layers.map((x) => ({ k: x.k, v: x.v })));
    await expectKvdError(() => ta.step(0, new Float32Array(3), token(layers[0]!.kNew, 0), token(layers[0]!.vNew, 0)), 'E_SHAPE', /step q/);
    await expectKvdError(() => ta.step(0, layers[0]!.q.subarray(0, qHeads * D), layers[0]!.kNew, layers[0]!.vNew), 'E_SHAPE', /one token/);
    await expectKvdError(() => ta.step(5, layers[0]!.q.subarray(0, qHeads * D), token(layers[0]!.kNew, 0), token(layers[0]!.vNew, 0)), 'E_RANGE', /layer/);
    for (let s = 0; s < 2; s++) await advance(ta, 0, layers[0]!, s);
    await expectKvdError(() => ta.step(0, layers[0]!.q.subarray(0, qHeads * D), token(layers[0]!.kNew, 0), token(layers[0]!.vNew, 0)), 'E_BUDGET', /maxDecodeTokens/);
    // attendFetched checks its buffer and selection against the tensors.
    const k = layers[0]!.k;
    const sel: Selection = { chunkSize: 4, tokens: T, sinkEnd: 4, tailStart: T - 16, offsets: Int32Array.of(0, 1, 1), chunkIds: Int32Array.of(3) };
    const sink = { k, v: layers[0]!.v };
    const o = { q: new Float32Array(qHeads * D), qHeads, sink, tail: sink, tailBase: 0, selection: sel, fetched: new Uint8Array(10) };
    expect(() => attendFetched(o)).toThrow(/at least 512 bytes/);
    expect(() => attendFetched({ ...o, fetched: new Uint8Array(512), fetchedOffsets: Int32Array.of(0, 1, 1), fetchedIds: Int32Array.of(4) })).toThrow(
      /chunk 3 of kv head 0 is selected but neither fetched nor resident/,
    );
    try {
      attendFetched({ ...o, fetched: new Uint8Array(512), tailBase: T - 8 });
      expect.unreachable();
    } catch (e) {
      expect((e as { code: string }).code).toBe('E_RANGE');
    }
    await ta.close();
    await expectKvdError(() => ta.step(0, new Float32Array(qHeads * D), token(layers[0]!.kNew, 0), token(layers[0]!.vNew, 0)), 'E_CLOSED', /closed/);
    await ssd.close();
  });
});

/** Runs step s of layer l only to append its token to the tail (the output is not checked here). */
async function advance(ta: TieredAttention, l: number, x: TraceLayer, s: number): Promise<void> {
  await ta.step(l, x.q.subarray(s * qHeads * D, (s + 1) * qHeads * D), token(x.kNew, s), token(x.vNew, s));
}
