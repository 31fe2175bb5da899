// attendFetched (src/storage/fetched-attention.ts), the attention every runtime step computes
// through: a token-granular selection attended from pages spread over several buffers, hot-tier
// slots and the tail read in place equals attendSparse over a contiguous cache bit for bit; it
// checks its pages and selection against the tensors, and hot-tier admission refuses pages that do
// not hold a missed chunk (nothing is ever attended from garbage).
import { describe, expect, it } from 'vitest';
import { HotTier } from '../src/cache/hot-tier.js';
import type { Selection } from '../src/index/selection.js';
import { native, setSimdLevel } from '../src/native.js';
import { attendFetched, attendFetchedAsync } from '../src/storage/fetched-attention.js';
import { attendSparse } from '../src/attention/kernels.js';
import { cpuFeatures } from '../src/index.js';
import type { KvTensor } from '../src/types.js';
import { createPolicy } from '../src/index/policy.js';
import { offloadedPolicyOptions } from '../src/index/options.js';
import { randn } from './helpers.js';

const T = 512;
const qHeads = 4;
const kvHeads = 2;
const D = 16;

/** Page-first page of (kv head h, chunk c) of a token-major tensor pair (cs tokens). */
function page(k: KvTensor, v: KvTensor, h: number, c: number, cs: number): Uint8Array {
  const out = new Float32Array(2 * cs * D);
  for (let r = 0; r < cs; r++) {
    const src = ((c * cs + r) * kvHeads + h) * D;
    out.set(k.data.subarray(src, src + D) as Float32Array, r * D);
    out.set(v.data.subarray(src, src + D) as Float32Array, (cs + r) * D);
  }
  return new Uint8Array(out.buffer);
}

/** "CODE: message" of what f throws, or undefined. */
function code(f: () => unknown): string | undefined {
  try {
    f();
  } catch (e) {
    return `${(e as { code?: string }).code}: ${(e as Error).message}`;
  }
  return undefined;
}

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');

/**
 * Two kv heads' scattered token selections (some in the tail, before tailStart) over one layer of
 * seeded random K / V, and one fetch buffer holding each head's sealed chunks' pages, packed in
 * (head, chunk) order: what the mask and landing tests attend.
 */
function twoHeadCase(seed: number) {
  const k: KvTensor = { data: randn(T * kvHeads * D, seed), dtype: 'f32', tokens: T, heads: kvHeads, dim: D };
  const v: KvTensor = { ...k, data: randn(T * kvHeads * D, seed + 1) };
  const cs = 4;
  const sinkEnd = 4;
  const tailBase = 448;
  const tailStart = 480;
  const perHead = [
    [9, 10, 40, 203, 300, 447, 450],
    [5, 6, 100, 104, 333, 460],
  ];
  const offsets = new Int32Array(kvHeads + 1);
  perHead.forEach((l, h) => (offsets[h + 1] = offsets[h]! + l.length));
  const sel: Selection = { chunkSize: 1, tokens: T, sinkEnd, tailStart, offsets, chunkIds: Int32Array.from(perHead.flat()) };
  const pb = 2 * cs * D * 4;
  const pageOffsets = new Int32Array(kvHeads + 1);
  const ids: number[] = [];
  const pageHead: number[] = [];
  for (let h = 0; h < kvHeads; h++) {
    for (const c of [...new Set(perHead[h]!.map((t) => Math.floor(t / cs)))].filter((c) => c * cs < tailBase)) {
      ids.push(c);
      pageHead.push(h);
    }
    pageOffsets[h + 1] = ids.length;
  }
  const buf = new Uint8Array(ids.length * pb);
  ids.forEach((c, i) => buf.set(page(k, v, pageHead[i]!, c, cs), i * pb));
  const sink = { k: { ...k, tokens: sinkEnd, data: k.data.subarray(0, sinkEnd * kvHeads * D) }, v: { ...v, tokens: sinkEnd, data: v.data.subarray(0, sinkEnd * kvHeads * D) } };
  const tail = { k: { ...k, tokens: T - tailBase, data: k.data.subarray(tailBase * kvHeads * D) }, v: { ...v, tokens: T - tailBase, data: v.data.subarray(tailBase * kvHeads * D) } };
  const q = randn(qHeads * D, seed + 2);
  return { k, v, cs, sinkEnd, tailBase, tailStart, offsets, sel, pb, pageOffsets, ids, pageHead, buf, sink, tail, q };
}

describe('attendFetched', () => {
  // Pages of 4 tokens (the runtime's: a power of two) and of 6 (any multiple of the selection's unit).
  for (const [cs, tailBase] of [
    [4, 448],
    [6, 444],
  ] as const) {
    it(`token-granular: selected tokens read from pages (of ${cs} tokens) in several buffers, hot-tier slots and the tail in place equal attendSparse bit for bit`, () => {
      const k: KvTensor = { data: randn(T * kvHeads * D, 11), dtype: 'f32', tokens: T, heads: kvHeads, dim: D };
      const v: KvTensor = { ...k, data: randn(T * kvHeads * D, 12) };
      const sinkEnd = 4;
      // tokens [tailBase, 512) are the open tail (sealed: [0, tailBase))
      const tailStart = 496;
      const tokSel = (ids: number[][]): Selection => {
        const offsets = new Int32Array(kvHeads + 1);
        ids.forEach((l, h) => (offsets[h + 1] = offsets[h]! + l.length));
        return { chunkSize: 1, tokens: T, sinkEnd, tailStart, offsets, chunkIds: Int32Array.from(ids.flat()) };
      };
      // Scattered tokens (several in one chunk, some in the tail region before tailStart, one in the sinks' range clipped away).
      const sel = tokSel([
        [2, 9, 10, 11, 40, 41, 203, 300, 447, 448, 450, 470, 495],
        [5, 6, 7, 8, 100, 101, 102, 103, 104, 333, 460],
      ]);
      const q = randn(qHeads * D, 13);
      const want = attendSparse({ q, qHeads, k, v, selection: sel });
      const sink = { k: { ...k, tokens: sinkEnd, data: k.data.subarray(0, sinkEnd * kvHeads * D) }, v: { ...v, tokens: sinkEnd, data: v.data.subarray(0, sinkEnd * kvHeads * D) } };
      const tail = { k: { ...k, tokens: T - tailBase, data: k.data.subarray(tailBase * kvHeads * D) }, v: { ...v, tokens: T - tailBase, data: v.data.subarray(tailBase * kvHeads * D) } };
      // Pages of the sealed chunks holding selected tokens, alternately in two buffers at odd slots.
      const offsets = new Int32Array(kvHeads + 1);
      const ids: number[] = [];
      const at: number[] = [];
      const inBuf: number[] = [];
      const bufs = [new Uint8Array(64 * 2 * cs * D * 4), new Uint8Array(64 * 2 * cs * D * 4)];
      const pb = 2 * cs * D * 4;
      for (let h = 0; h < kvHeads; h++) {
        const chunks = [...new Set(Array.from(sel.chunkIds.subarray(sel.offsets[h]!, sel.offsets[h + 1]!), (t) => Math.floor(t / cs)))].filter((c) => c * cs < tailBase);
        for (const c of chunks) {
          const b = ids.length % 2;
          const slot = 3 + 2 * ids.length;
          bufs[b]!.set(page(k, v, h, c, cs), slot * pb);
          ids.push(c);
          at.push(slot * pb);
          inBuf.push(b);
        }
        offsets[h + 1] = ids.length;
      }
      const pages = { fetched: bufs, fetchedOffsets: offsets, fetchedIds: Int32Array.from(ids), fetchedAt: Float64Array.from(at), fetchedIn: Uint8Array.from(inBuf) };
      const o = { q, qHeads, sink, tail, tailBase, selection: sel, pageChunkSize: cs, ...pages };
      const got = attendFetched(o);
      expect(bits(got.out)).toBe(bits(want.out));
      expect(bits(got.lse)).toBe(bits(want.lse));
      expect(bits(got.chunkMass)).toBe(bits(want.chunkMass));
      // With a hot tier holding some of the chunks, read from their slots: still the same bits.
      const tier = new HotTier({ layers: 1, kvHeads, headDim: D, dtype: 'f32', chunkSize: cs, budget: 64, windows: 1, maxBytes: 1 << 24 });
      const chunkSel: Selection = { chunkSize: cs, tokens: T, sinkEnd, tailStart, offsets, chunkIds: Int32Array.from(ids) };
      native.hotTierAdmitPages({ hot: { handle: tier.handle, layer: 0 }, selection: chunkSel, tokens: T, pages: bufs, pageOffsets: offsets, pageIds: Int32Array.from(ids), pageAt: Float64Array.from(at), pageIn: Uint8Array.from(inBuf), tail, tailBase });
      const hot = attendFetched({ ...o, fetched: new Uint8Array(0), fetchedOffsets: new Int32Array(kvHeads + 1), fetchedIds: new Int32Array(0), fetchedAt: new Float64Array(0), fetchedIn: new Uint8Array(0), hot: { handle: tier.handle, layer: 0 } });
      expect(bits(hot.out)).toBe(bits(want.out));
      tier.destroy();
      // Pages must lie inside their buffers; a page list must come with a finer selection.
      expect(() => attendFetched({ ...o, fetchedAt: Float64Array.from(at, (x, i) => (i === 2 ? bufs[0]!.length - 8 : x)) })).toThrow(/fetchedAt\[2\]: expected an integer byte offset/);
      expect(() => attendFetched({ ...o, fetchedIn: Uint8Array.from(inBuf, (b, i) => (i === 1 ? 2 : b)) })).toThrow(/fetchedIn\[1\]: expected a buffer index in \[0, 2\)/);
      expect(() => attendFetched({ q, qHeads, sink, tail, tailBase, selection: sel, pageChunkSize: cs, fetched: bufs[0]! })).toThrow(/fetchedOffsets: expected the page lists/);
      expect(() => attendFetched({ ...o, pageChunkSize: 6, selection: { ...sel, chunkSize: 4, offsets: Int32Array.of(0, 1, 1), chunkIds: Int32Array.of(1) } })).toThrow(/pageChunkSize: expected a multiple of selection.chunkSize 4/);
    });
  }

  it('kv-head masks: heads attended in two calls into one result (fetchedMass: each page\'s mass) equal one call bit for bit, a skipped head\'s pages are never read; hot-tier admission by mask ends as one call; bad masks and result arrays are typed errors', () => {
    const { k, v, cs, sinkEnd, tailBase, tailStart, offsets, sel, pb, pageOffsets, ids, pageHead, buf, sink, tail, q } = twoHeadCase(21);
    const o = { q, qHeads, sink, tail, tailBase, selection: sel, pageChunkSize: cs, fetched: buf, fetchedOffsets: pageOffsets, fetchedIds: Int32Array.from(ids), threads: 2 };
    const wholeMass = new Float32Array(ids.length);
    const whole = attendFetched({ ...o, fetchedMass: wholeMass });
    // fetchedMass: per page, the sum of the masses of its selected units (in selection order); units in the tail count in no page.
    const wantMass = new Float32Array(ids.length);
    for (let h = 0; h < kvHeads; h++)
      for (let i = offsets[h]!; i < offsets[h + 1]!; i++) {
        const p = ids.findIndex((c, e) => pageHead[e] === h && c === Math.floor(sel.chunkIds[i]! / cs));
        if (p >= 0) wantMass[p]! += whole.chunkMass[i]!;
      }
    expect(bits(wholeMass)).toBe(bits(wantMass));
    expect(wantMass.every((m) => m > 0)).toBe(true);
    // Head 0 while head 1's pages are still garbage (NaN): they are not read.
    const head1 = buf.subarray(pageOffsets[1]! * pb);
    new Float32Array(head1.buffer, head1.byteOffset, head1.byteLength / 4).fill(NaN);
    const into = { out: new Float32Array(qHeads * D), lse: new Float32Array(qHeads), chunkMass: new Float32Array(sel.chunkIds.length) };
    const mass = new Float32Array(ids.length).fill(-1);
    const r0 = attendFetched({ ...o, heads: Uint8Array.of(1, 0), into, fetchedMass: mass });
    expect(mass[ids.length - 1]).toBe(-1); // head 1's pages: not written
    expect(r0.out).toBe(into.out);
    expect(into.lse[qHeads - 1]).toBe(0); // head 1's query heads not written yet
    ids.forEach((c, i) => pageHead[i] === 1 && buf.set(page(k, v, 1, c, cs), i * pb));
    attendFetched({ ...o, heads: Uint8Array.of(0, 1), into, fetchedMass: mass });
    expect(bits(mass)).toBe(bits(wantMass));
    expect(bits(into.out)).toBe(bits(whole.out));
    expect(bits(into.lse)).toBe(bits(whole.lse));
    expect(bits(into.chunkMass)).toBe(bits(whole.chunkMass));

    // Hot-tier admission of head 1 then head 0 leaves what one call leaves: attention from the tier alone gives the same bits.
    const chunkSel: Selection = { chunkSize: cs, tokens: T, sinkEnd, tailStart, offsets: pageOffsets, chunkIds: Int32Array.from(ids) };
    const admit = { selection: chunkSel, tokens: T, pages: buf, pageOffsets, pageIds: Int32Array.from(ids), tail, tailBase };
    const tiers = [0, 1].map(() => new HotTier({ layers: 1, kvHeads, headDim: D, dtype: 'f32', chunkSize: cs, budget: 64, windows: 1, maxBytes: 1 << 24 }));
    const one = native.hotTierAdmitPages({ hot: { handle: tiers[0]!.handle, layer: 0 }, ...admit }) as { admitted: number };
    let admitted = 0;
    for (const heads of [Uint8Array.of(0, 1), Uint8Array.of(1, 0)])
      admitted += (native.hotTierAdmitPages({ hot: { handle: tiers[1]!.handle, layer: 0 }, ...admit, heads }) as { admitted: number }).admitted;
    expect(admitted).toBe(one.admitted);
    expect(admitted).toBe(ids.length);
    const noPages = { fetched: new Uint8Array(0), fetchedOffsets: new Int32Array(kvHeads + 1), fetchedIds: new Int32Array(0) };
    for (const t of tiers) expect(bits(attendFetched({ ...o, ...noPages, hot: { handle: t.handle, layer: 0 } }).out)).toBe(bits(whole.out));


    // Admission while some pages are still being read (pageLanding: every other page, its bytes
    // NaN until it "lands"): the same residents and counters as one admission after the reads; the
    // copies from the landing pages are made by hotTierLandPages, after which attention from the
    // tier alone gives the same bits. With drop: true those slots are freed instead.
    const landing = Uint8Array.from(ids, (_, i) => i % 2);
    const garbage = Uint8Array.from(buf);
    ids.forEach((_, i) => landing[i] && new Float32Array(garbage.buffer, i * pb, pb / 4).fill(NaN));
    const late = [0, 1].map(() => new HotTier({ layers: 1, kvHeads, headDim: D, dtype: 'f32', chunkSize: cs, budget: 64, windows: 1, maxBytes: 1 << 24 }));
    for (const [n, t] of late.entries()) {
      const r = native.hotTierAdmitPages({ hot: { handle: t.handle, layer: 0 }, ...admit, pages: garbage, pageLanding: landing }) as { admitted: number; bytesAdmitted: number; landing: Int32Array };
      expect(r.admitted).toBe(one.admitted);
      expect(r.landing.length).toBe(4 * landing.reduce((a, b) => a + b, 0)); // (kv head, slot, chunk, from) per landing page
      for (let h = 0; h < kvHeads; h++) expect(t.residents(0, h)).toEqual(tiers[0]!.residents(0, h));
      expect(t.stats()).toEqual(tiers[0]!.stats());
      native.hotTierLandPages({ hot: { handle: t.handle, layer: 0 }, tokens: T, pages: buf, pageOffsets, pageIds: Int32Array.from(ids), tail, tailBase, landing: r.landing, ...(n === 1 ? { drop: true } : {}) });
      expect(t.check()).toBe('');
      if (n === 0) expect(bits(attendFetched({ ...o, ...noPages, hot: { handle: t.handle, layer: 0 } }).out)).toBe(bits(whole.out));
      else {
        // Dropped: the landing pages' chunks left the tier; attention reads them from the pages.
        expect([0, 1].reduce((a, h) => a + t.residents(0, h).length, 0)).toBe(ids.length - landing.reduce((a, b) => a + b, 0));
        expect(bits(attendFetched({ ...o, hot: { handle: t.handle, layer: 0 } }).out)).toBe(bits(whole.out));
      }
      expect(code(() => native.hotTierLandPages({ hot: { handle: t.handle, layer: 0 }, tokens: T, pages: buf, pageOffsets, pageIds: Int32Array.from(ids), landing: Int32Array.of(0, 0, 99, 0) }))).toMatch(/^E_INTERNAL: hot tier: a landing copy names slot 0 for chunk 99/);
      // A free slot (chunk -1) named for a drop: refused, the tier unchanged.
      const free = t.info().slotsPerStep - 1;
      expect(code(() => native.hotTierLandPages({ hot: { handle: t.handle, layer: 0 }, tokens: T, pages: buf, pageOffsets, pageIds: Int32Array.from(ids), landing: Int32Array.of(0, free, -1, 0), drop: true }))).toMatch(/^E_INTERNAL: hot tier: a landing copy names slot \d+ for chunk -1/);
      expect(t.check()).toBe('');
      expect(code(() => native.hotTierLandPages({ hot: { handle: t.handle, layer: 0 }, tokens: T, pages: buf, pageOffsets, pageIds: Int32Array.from(ids), landing: Int32Array.of(5, 0, 0, 0) }))).toMatch(/^E_RANGE: hotTierLandPages.landing\[0\]: expected a kv head in \[0, 2\), got 5/);
      expect(code(() => native.hotTierLandPages({ hot: { handle: t.handle, layer: 0 }, tokens: T, pages: buf, pageOffsets, pageIds: Int32Array.from(ids), landing: Int32Array.of(0, 0, 0) }))).toMatch(/^E_SHAPE: hotTierLandPages.landing: expected \(kv head, slot, chunk, from\) quads, got 3 numbers/);
      expect(code(() => native.hotTierAdmitPages({ hot: { handle: t.handle, layer: 0 }, ...admit, pageLanding: new Uint8Array(1) }))).toMatch(/^E_SHAPE: hotTierAdmitPages.pageLanding/);
      t.destroy();
    }

    expect(code(() => attendFetched({ ...o, heads: Uint8Array.of(1) }))).toMatch(/^E_SHAPE: attendFetched.heads \(one per kv head\): expected 2 elements, got 1/);
    expect(code(() => attendFetched({ ...o, heads: Uint8Array.of(1, 2) }))).toMatch(/^E_RANGE: attendFetched.heads\[1\]: expected 0 \(skip the kv head\) or 1 \(process it\), got 2/);
    expect(code(() => attendFetched({ ...o, heads: Int32Array.of(1, 0) as unknown as Uint8Array }))).toMatch(/^E_DTYPE: attendFetched.heads: expected a Uint8Array/);
    expect(code(() => attendFetched({ ...o, into: { ...into, out: new Float32Array(qHeads * D - 1) } }))).toMatch(/^E_SHAPE: attendFetched.into.out \(qHeads x dim\): expected 64 elements, got 63/);
    expect(code(() => attendFetched({ ...o, into: { ...into, chunkMass: new Float32Array(1) } }))).toMatch(/^E_SHAPE: attendFetched.into.chunkMass/);
    expect(code(() => attendFetched({ ...o, into: { ...into, lse: new Float64Array(qHeads) as unknown as Float32Array } }))).toMatch(/^E_DTYPE: attendFetched.into.lse/);
    expect(code(() => attendFetched({ ...o, into: 3 as unknown as typeof into }))).toMatch(/^E_TYPE: attendFetched.into: expected \{ out, lse, chunkMass \}/);
    expect(code(() => attendFetched({ ...o, fetchedMass: new Float32Array(ids.length + 1) }))).toMatch(/^E_SHAPE: attendFetched.fetchedMass \(one per page entry\)/);
    expect(code(() => attendFetched({ ...o, fetchedMass: new Uint8Array(4 * ids.length) as unknown as Float32Array }))).toMatch(/^E_DTYPE: attendFetched.fetchedMass/);
    expect(code(() => native.hotTierAdmitPages({ hot: { handle: tiers[0]!.handle, layer: 0 }, ...admit, heads: new Uint8Array(3) }))).toMatch(/^E_SHAPE: hotTierAdmitPages.heads/);
    expect(code(() => native.hotTierAdmitPages({ hot: { handle: tiers[0]!.handle, layer: 0 }, ...admit, heads: Uint8Array.of(0, 7) }))).toMatch(/^E_RANGE: hotTierAdmitPages.heads\[1\]/);
    for (const t of tiers) t.destroy();
  });

  it('on the thread pool: bit-identical at every thread count and to attendSparse, past one KV-length part per head; a NaN row is named in any part', () => {
    // 2 kv heads x ~9000 selected tokens: more than kSinglePartTokens (8192) per head, so each head is cut
    // into KV-length parts attended on different workers and merged by log-sum-exp.
    const TT = 20000;
    const cs = 4;
    const k: KvTensor = { data: randn(TT * kvHeads * D, 21), dtype: 'f32', tokens: TT, heads: kvHeads, dim: D };
    const v: KvTensor = { ...k, data: randn(TT * kvHeads * D, 22) };
    const sinkEnd = 4;
    const tailBase = 19968;
    const tailStart = 19984;
    const offsets = new Int32Array(kvHeads + 1);
    const ids: number[] = [];
    for (let h = 0; h < kvHeads; h++) {
      for (let t = sinkEnd; t < tailStart; t++) if ((t * 7 + h * 3) % 9 < 4) ids.push(t);
      offsets[h + 1] = ids.length;
    }
    expect(offsets[1]!).toBeGreaterThan(8192);
    const sel: Selection = { chunkSize: 1, tokens: TT, sinkEnd, tailStart, offsets, chunkIds: Int32Array.from(ids) };
    // Every sealed chunk of each head as a page, packed in (head, chunk) order in one buffer.
    const sealed = tailBase / cs;
    const pb = 2 * cs * D * 4;
    const buf = new Uint8Array(kvHeads * sealed * pb);
    const pOff = Int32Array.of(0, sealed, 2 * sealed);
    const pIds = new Int32Array(kvHeads * sealed);
    for (let h = 0; h < kvHeads; h++)
      for (let c = 0; c < sealed; c++) {
        buf.set(page(k, v, h, c, cs), (h * sealed + c) * pb);
        pIds[h * sealed + c] = c;
      }
    const sink = { k: { ...k, tokens: sinkEnd, data: k.data.subarray(0, sinkEnd * kvHeads * D) }, v: { ...v, tokens: sinkEnd, data: v.data.subarray(0, sinkEnd * kvHeads * D) } };
    const tail = { k: { ...k, tokens: TT - tailBase, data: k.data.subarray(tailBase * kvHeads * D) }, v: { ...v, tokens: TT - tailBase, data: v.data.subarray(tailBase * kvHeads * D) } };
    const q = randn(qHeads * D, 23);
    const o = { q, qHeads, sink, tail, tailBase, selection: sel, pageChunkSize: cs, fetched: buf, fetchedOffsets: pOff, fetchedIds: pIds };
    // At every SIMD level the machine offers (scalar fallback included), against attendSparse at that level.
    try {
      for (const level of cpuFeatures().levels) {
        expect(setSimdLevel(level)).toBe(level);
        const want = attendSparse({ q, qHeads, k, v, selection: sel });
        for (const threads of [1, 2, 3, 8]) {
          const got = attendFetched({ ...o, threads });
          expect(bits(got.out)).toBe(bits(want.out));
          expect(bits(got.lse)).toBe(bits(want.lse));
          expect(bits(got.chunkMass)).toBe(bits(want.chunkMass));
        }
        // Gated by landed reads (one work item per part and head): the same bits.
        const landed = { done: Int32Array.of(1, 1, 1), itemHead: Int32Array.of(0, 1) };
        const gated = attendFetched({ ...o, threads: 2, landing: [landed] });
        expect(Array.from(gated.attended!)).toEqual([1, 1]);
        expect(bits(gated.out)).toBe(bits(want.out));
        expect(bits(gated.chunkMass)).toBe(bits(want.chunkMass));
      }
    } finally {
      setSimdLevel('best');
    }
    // One head past a part, one within it: the short head is listed by the worker attending it, the
    // long one before the heads are cut (attention_split.h's HeadLister); the same bits either way.
    const shortIds = [...ids.slice(0, offsets[1]!), ...ids.slice(offsets[1]!, offsets[1]! + 700)];
    const mixed: Selection = { ...sel, offsets: Int32Array.of(0, offsets[1]!, offsets[1]! + 700), chunkIds: Int32Array.from(shortIds) };
    const wantMixed = attendSparse({ q, qHeads, k, v, selection: mixed });
    for (const threads of [1, 2, 3]) {
      const got = attendFetched({ ...o, selection: mixed, threads });
      expect(bits(got.out)).toBe(bits(wantMixed.out));
      expect(bits(got.lse)).toBe(bits(wantMixed.lse));
      expect(bits(got.chunkMass)).toBe(bits(wantMixed.chunkMass));
    }
    const gatedMixed = attendFetched({ ...o, selection: mixed, threads: 2, landing: [{ done: Int32Array.of(1, 1, 1), itemHead: Int32Array.of(0, 1) }] });
    expect(bits(gatedMixed.out)).toBe(bits(wantMixed.out));
    expect(() => attendFetched({ ...o, threads: 9 })).toThrow(/threads: expected an integer in \[1, 8\]/);
    // A NaN key in a page of head 1, token 19000 (in its second part): named by kv head, token and tier.
    const bad = buf.slice();
    const f = new Float32Array(bad.buffer);
    f[((1 * sealed + Math.floor(19000 / cs)) * pb + (19000 % cs) * D * 4) / 4] = NaN;
    const badIds = ids.slice(offsets[1]!);
    expect(badIds).toContain(19000);
    for (const threads of [1, 2])
      expect(() => attendFetched({ ...o, fetched: bad, threads })).toThrow(/k: kv head 1, token 19000 \(fetched chunk\): NaN\/Inf in the key row/);
  });

  it('landing: one call attends each kv head once its reads have landed (the reads\' own flags), never before; a head whose read failed is left out; bad flags are typed errors', async () => {
    const { cs, pb, pageOffsets, ids, buf: pages, sink, tail, tailBase, sel, q } = twoHeadCase(31);
    const base = { q, qHeads, sink, tail, tailBase, selection: sel, pageChunkSize: cs, fetchedOffsets: pageOffsets, fetchedIds: Int32Array.from(ids), threads: 2 };
    const whole = attendFetched({ ...base, fetched: pages });
    // The fetch buffer as a read fills it: head 0's pages there, head 1's NaN until "its read lands".
    const buf = Uint8Array.from(pages);
    const head1 = buf.subarray(pageOffsets[1]! * pb);
    new Float32Array(head1.buffer, head1.byteOffset, head1.byteLength / 4).fill(NaN);
    // One read of two items (head 0's pages, head 1's), as TieredKv.fetchInPlace hands them.
    const done = new Int32Array(new SharedArrayBuffer(4 * 3));
    Atomics.store(done, 1, 1);
    const landing = [{ done, itemHead: Int32Array.of(0, 1) }];
    const pending = attendFetchedAsync({ ...base, fetched: buf, landing });
    let settled = false;
    void pending.then(() => (settled = true));
    await new Promise((r) => setTimeout(r, 50));
    expect(settled).toBe(false); // head 1 still being read: the call waits for it
    buf.set(pages.subarray(pageOffsets[1]! * pb), pageOffsets[1]! * pb);
    Atomics.store(done, 2, 1); // the page bytes first, then the item's flag (as the read's thread does)
    Atomics.store(done, 0, 1);
    const got = await pending;
    expect(Array.from(got.attended!)).toEqual([1, 1]);
    expect(bits(got.out)).toBe(bits(whole.out));
    expect(bits(got.lse)).toBe(bits(whole.lse));
    expect(bits(got.chunkMass)).toBe(bits(whole.chunkMass));

    // The read ends without head 1's item (it failed): head 0 is attended, head 1 left out (its rows not written).
    const failed = new Int32Array(new SharedArrayBuffer(4 * 3));
    Atomics.store(failed, 1, 1);
    const into = { out: new Float32Array(qHeads * D), lse: new Float32Array(qHeads), chunkMass: new Float32Array(sel.chunkIds.length) };
    const half = attendFetchedAsync({ ...base, fetched: buf.map((x, i) => (i < pageOffsets[1]! * pb ? x : 255)), into, landing: [{ done: failed, itemHead: Int32Array.of(0, 1) }] });
    await new Promise((r) => setTimeout(r, 20));
    Atomics.store(failed, 0, 2);
    const r = await half;
    expect(Array.from(r.attended!)).toEqual([1, 0]);
    const g = qHeads / kvHeads;
    expect(bits(into.out.subarray(0, g * D))).toBe(bits(whole.out.subarray(0, g * D)));
    expect(into.out.subarray(g * D).every((x) => x === 0)).toBe(true);
    expect(into.lse[qHeads - 1]).toBe(0);
    // Flags that never come: past landingTimeoutMs the pending head is left out, not waited on forever.
    const t0 = performance.now();
    const stuck = attendFetched({ ...base, fetched: buf, landing: [{ done: Int32Array.of(0, 1, 0), itemHead: Int32Array.of(0, 1) }], landingTimeoutMs: 30 });
    expect(Array.from(stuck.attended!)).toEqual([1, 0]);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(25);
    // A masked-out head is not attended either (and not waited on).
    const masked = attendFetched({ ...base, fetched: pages, heads: Uint8Array.of(1, 0), landing: [{ done: Int32Array.of(0, 1, 0), itemHead: Int32Array.of(0, 1) }] });
    expect(Array.from(masked.attended!)).toEqual([1, 0]);

    const o = { ...base, fetched: pages };
    expect(code(() => attendFetched({ ...o, landing: 1 as unknown as [] }))).toMatch(/^E_TYPE: attendFetched.landing: expected an array of \{ done: Int32Array, itemHead: Int32Array \}/);
    expect(code(() => attendFetched({ ...o, landing: [3 as unknown as { done: Int32Array; itemHead: Int32Array }] }))).toMatch(/^E_TYPE: attendFetched.landing\[0\]: expected \{ done: Int32Array, itemHead: Int32Array \}/);
    expect(code(() => attendFetched({ ...o, landing: [{ done: Int32Array.of(1, 1), itemHead: Int32Array.of(0, 1) }] }))).toMatch(/^E_SHAPE: attendFetched.landing\[0\].done: expected at least 1 \+ 2 elements/);
    expect(code(() => attendFetched({ ...o, landing: [{ done: Int32Array.of(1, 1, 1), itemHead: Int32Array.of(0, 2) }] }))).toMatch(/^E_RANGE: attendFetched.landing\[0\].itemHead\[1\]: expected a kv head in \[0, 2\), got 2/);
    expect(code(() => attendFetched({ ...o, landing: [{ done: new Uint32Array(3) as unknown as Int32Array, itemHead: Int32Array.of(0, 1) }] }))).toMatch(/^E_DTYPE: attendFetched.landing\[0\].done: expected an Int32Array/);
    const many = Array.from({ length: 1025 }, () => ({ done: Int32Array.of(1), itemHead: new Int32Array(0) }));
    expect(code(() => attendFetched({ ...o, landing: many }))).toMatch(/^E_SHAPE: attendFetched.landing: expected at most 1024 reads, got 1025/);
    expect(code(() => attendFetched({ ...o, landing: [{ done: Int32Array.of(1), itemHead: 7 as unknown as Int32Array }] }))).toMatch(/^E_TYPE: attendFetched.landing\[0\].itemHead/);
    expect(code(() => attendFetched({ ...o, landingTimeoutMs: 5 }))).toMatch(/^E_CONFIG: attendFetched.landingTimeoutMs: expected it only with landing/);
    expect(code(() => attendFetched({ ...o, landing: [], landingTimeoutMs: -1 }))).toMatch(/^E_RANGE: attendFetched.landingTimeoutMs/);
  });

  it('an output that overflows f32 from finite values is an E_NONFINITE error naming the kv head, not a crash', () => {
    // q = 0: every logit is 0, so each selected token has weight 1 and the weighted sum of value
    // rows of 3e38 overflows to Inf although no row holds a NaN/Inf (there is no row to name).
    const TT = 64;
    const cs = 4;
    const k: KvTensor = { data: randn(TT * kvHeads * D, 31), dtype: 'f32', tokens: TT, heads: kvHeads, dim: D };
    const v: KvTensor = { ...k, data: new Float32Array(TT * kvHeads * D).fill(3e38) };
    const sinkEnd = 4;
    const tailBase = 48;
    const ids = [8, 9, 10, 11, 20, 21, 30];
    const offsets = Int32Array.of(0, ids.length, 2 * ids.length);
    const sel: Selection = { chunkSize: 1, tokens: TT, sinkEnd, tailStart: tailBase, offsets, chunkIds: Int32Array.from([...ids, ...ids]) };
    const pages = [2, 5, 7];
    const pb = 2 * cs * D * 4;
    const buf = new Uint8Array(kvHeads * pages.length * pb);
    pages.forEach((c, i) => {
      for (let h = 0; h < kvHeads; h++) buf.set(page(k, v, h, c, cs), (h * pages.length + i) * pb);
    });
    const sink = { k: { ...k, tokens: sinkEnd, data: k.data.subarray(0, sinkEnd * kvHeads * D) }, v: { ...v, tokens: sinkEnd, data: v.data.subarray(0, sinkEnd * kvHeads * D) } };
    const tail = { k: { ...k, tokens: TT - tailBase, data: k.data.subarray(tailBase * kvHeads * D) }, v: { ...v, tokens: TT - tailBase, data: v.data.subarray(tailBase * kvHeads * D) } };
    const o = { q: new Float32Array(qHeads * D), qHeads, sink, tail, tailBase, selection: sel, pageChunkSize: cs, fetched: buf, fetchedOffsets: Int32Array.of(0, 3, 6), fetchedIds: Int32Array.from([...pages, ...pages]) };
    for (const threads of [1, 2]) {
      let err: unknown;
      try {
        attendFetched({ ...o, threads });
      } catch (e) {
        err = e;
      }
      expect(err).toMatchObject({ code: 'E_NONFINITE' });
      expect(String(err)).toMatch(/v: kv head 0: attention output overflowed f32/);
    }
  });

  it('dramTier: pages looked up in a DRAM tier\'s slot maps (two segments, two arena blocks) equal the page-list path and attendSparse bit for bit, with the traffic per source; bad chains and slots are typed errors', async () => {
    const cs = 4;
    const { k, v, sinkEnd, tailBase, sel, sink, tail, q, ids, pageHead, buf, pb, pageOffsets } = twoHeadCase(41);
    const want = attendSparse({ q, qHeads, k, v, selection: sel });
    // The chain: segments of 48 and 64 chunks (tailBase 448 = 112 chunks sealed); slot maps of one
    // layer; slots handed out in a scrambled order over two arena blocks of 100 slots.
    const segChunks = [48, 64];
    const segStart = Int32Array.of(0, 48, 112);
    const segOf = (c: number) => (c < 48 ? 0 : 1);
    const maps = segChunks.map((n) => new Int32Array(kvHeads * n).fill(-1));
    const perBlock = 100;
    const arenas = [new Uint8Array(perBlock * pb), new Uint8Array(perBlock * pb)];
    ids.forEach((c, i) => {
      const h = pageHead[i]!;
      const s = segOf(c);
      const slot = (37 * i + 11) % 200;
      maps[s]![h * segChunks[s]! + c - segStart[s]!] = slot;
      arenas[Math.floor(slot / perBlock)]!.set(buf.subarray(i * pb, (i + 1) * pb), (slot % perBlock) * pb);
    });
    const dramTier = { segStart, maps, layer: 0, arenas, slotsPerBlock: perBlock };
    const o = { q, qHeads, sink, tail, tailBase, selection: sel, pageChunkSize: cs };
    const lists = attendFetched({ ...o, fetched: buf, fetchedOffsets: pageOffsets, fetchedIds: Int32Array.from(ids) });
    // Distinct pages per head: sealed ones from the tier, the rest (from 448 on) in the tail.
    const tailPages = [0, 1].reduce((n, h) => n + new Set(Array.from(sel.chunkIds.subarray(sel.offsets[h]!, sel.offsets[h + 1]!)).filter((t) => t >= tailBase).map((t) => Math.floor(t / cs))).size, 0);
    for (const threads of [1, 2]) {
      for (const got of [attendFetched({ ...o, dramTier, threads }), await attendFetchedAsync({ ...o, dramTier, threads })]) {
        expect(bits(got.out)).toBe(bits(want.out));
        expect(bits(got.lse)).toBe(bits(want.lse));
        expect(bits(got.chunkMass)).toBe(bits(lists.chunkMass));
        expect(Array.from(got.pageCounts!)).toEqual([ids.length, tailPages, 0]);
      }
    }
    // A kv-head mask counts and writes only the heads attended.
    const only1 = attendFetched({ ...o, dramTier, heads: Uint8Array.of(0, 1) });
    expect(only1.pageCounts![0]).toBe(pageOffsets[2]! - pageOffsets[1]!);
    expect(bits(only1.out.subarray((qHeads / kvHeads) * D))).toBe(bits(want.out.subarray((qHeads / kvHeads) * D)));

    const err = (x: object) => code(() => attendFetched({ ...o, dramTier, ...x }));
    const c0 = ids[0]!; // head 0's first page (segment 0)
    expect(err({ fetched: buf })).toMatch(/^E_CONFIG: .*fetched: expected no page lists/);
    expect(err({ dramTier: 1 })).toMatch(/^E_TYPE: .*dramTier: expected/);
    expect(err({ dramTier: { ...dramTier, arenas: [] } })).toMatch(/^E_SHAPE: .*arenas/);
    expect(err({ dramTier: { ...dramTier, arenas: [new Float32Array(4)] } })).toMatch(/^E_DTYPE: .*arenas\[0\]/);
    expect(err({ dramTier: { ...dramTier, slotsPerBlock: 0 } })).toMatch(/^E_RANGE: .*slotsPerBlock/);
    expect(err({ dramTier: { ...dramTier, layer: -1 } })).toMatch(/^E_RANGE: .*layer/);
    expect(err({ dramTier: { ...dramTier, maps: [maps[0]!, Array.from(maps[1]!)] } })).toMatch(/^E_TYPE: .*maps\[1\]/);
    expect(err({ dramTier: { ...dramTier, segStart: undefined } })).toMatch(/^E_TYPE: .*segStart/);
    // A chain that ends before tailBase: the selected pages past its end are named.
    expect(err({ dramTier: { ...dramTier, segStart: Int32Array.of(0, 48, 100) } })).toMatch(/^E_RANGE: .*lies past the DRAM tier's chain \(100 chunks\)/);
    expect(err({ dramTier: { ...dramTier, segStart: Int32Array.of(1, 48, 112) } })).toMatch(/^E_RANGE: .*segStart/);
    expect(err({ dramTier: { ...dramTier, maps: [maps[0]!] } })).toMatch(/^E_SHAPE: .*maps/);
    expect(err({ dramTier: { ...dramTier, maps: [maps[0]!.subarray(0, 10), maps[1]!] } })).toMatch(/^E_RANGE: .*slot map holding layer 0, kv head 0, chunk/);
    expect(err({ dramTier: { ...dramTier, layer: 1 } })).toMatch(/^E_RANGE: .*slot map holding layer 1/);
    // The same chain cut into three segments where the maps say so (segment 1 split at chunk 80):
    // each chunk is found in its own segment's map, bit for bit the same output.
    const split = [maps[0]!, new Int32Array(kvHeads * 32), new Int32Array(kvHeads * 32)];
    for (let h = 0; h < kvHeads; h++)
      for (let c = 48; c < 112; c++) split[c < 80 ? 1 : 2]![h * 32 + (c < 80 ? c - 48 : c - 80)] = maps[1]![h * 64 + c - 48]!;
    expect(bits(attendFetched({ ...o, dramTier: { ...dramTier, segStart: Int32Array.of(0, 48, 80, 112), maps: split } }).out)).toBe(bits(want.out));
    // The chain shorter than the sealed tokens: a selected page past it.
    const short = { segStart: Int32Array.of(0, 48), maps: [maps[0]!], layer: 0, arenas, slotsPerBlock: perBlock };
    expect(err({ dramTier: short })).toMatch(/^E_RANGE: .*lies past the DRAM tier's chain \(48 chunks\)/);
    const edited = (slot: number) => {
      const m = maps.map((x) => x.slice());
      m[0]![c0 - 0] = slot;
      return { dramTier: { ...dramTier, maps: m } };
    };
    expect(err(edited(-1))).toMatch(new RegExp(`^E_RANGE: .*chunk ${c0} of kv head 0 is selected but not resident in the DRAM tier`));
    expect(err(edited(200))).toMatch(/^E_RANGE: .*slot 200 of chunk \d+ lies outside the arenas/);
    await expect(attendFetchedAsync({ ...o, dramTier, ...edited(-1) })).rejects.toMatchObject({ code: 'E_RANGE' });
  });

  it('rejects a staged buffer or selection that does not match the tensors', () => {
    const k: KvTensor = { data: randn(T * kvHeads * D, 1), dtype: 'f32', tokens: T, heads: kvHeads, dim: D };
    const v: KvTensor = { ...k, data: randn(T * kvHeads * D, 2) };
    const sel: Selection = { chunkSize: 4, tokens: T, sinkEnd: 4, tailStart: T - 16, offsets: Int32Array.of(0, 1, 1), chunkIds: Int32Array.of(3) };
    const sink = { k, v };
    const o = { q: new Float32Array(qHeads * D), qHeads, sink, tail: sink, tailBase: T - 16, selection: sel, fetched: new Uint8Array(10) };
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
  });

  it('hot-tier admission from pages that lack a missed chunk is refused', () => {
    const tier = new HotTier({ layers: 2, kvHeads, headDim: D, dtype: 'f32', chunkSize: 4, budget: 16, windows: 1, maxBytes: 1 << 24 });
    const sel: Selection = { chunkSize: 4, tokens: T, sinkEnd: 4, tailStart: T - 16, offsets: Int32Array.of(0, 1, 1), chunkIds: Int32Array.of(3) };
    expect(() =>
      native.hotTierAdmitPages({ hot: { handle: tier.handle, layer: 0 }, selection: sel, tokens: T, pages: new Uint8Array(512), pageOffsets: Int32Array.of(0, 1, 1), pageIds: Int32Array.of(5) }),
    ).toThrow(/chunk 3 of kv head 0 must be admitted but the page source does not hold it/);
    // Kv heads admit on the addon's pool: with both heads lacking a page, the error is head 0's
    // whichever thread failed first.
    const both: Selection = { ...sel, offsets: Int32Array.of(0, 1, 2), chunkIds: Int32Array.of(3, 2) };
    for (let i = 0; i < 20; i++)
      expect(() =>
        native.hotTierAdmitPages({ hot: { handle: tier.handle, layer: 1 }, selection: both, tokens: T, pages: new Uint8Array(512), pageOffsets: Int32Array.of(0, 1, 1), pageIds: Int32Array.of(5) }),
      ).toThrow(/chunk 3 of kv head 0 must be admitted/);
    tier.destroy();
  });
  it('select: each kv head selected inside the call (the runtime\'s sequential step) equals selectIndex, then attendFetched with its selection, bit for bit, at any thread count and past one part; misuse is typed', async () => {
    // A layer of TT tokens, its index built as the runtime builds one (offloaded: key sketch, token
    // ids), a DRAM tier holding every sealed chunk (one segment, slot h x chunks + c).
    const TT = 12000;
    const cs = 4;
    const k: KvTensor = { data: randn(TT * kvHeads * D, 31), dtype: 'f32', tokens: TT, heads: kvHeads, dim: D };
    const v: KvTensor = { ...k, data: randn(TT * kvHeads * D, 32) };
    const policy = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { qHeads, kvHeads, headDim: D, chunkSize: cs, segmentTokens: 1024, threads: 2 }));
    await policy.build(k, TT);
    const handle = policy.handle();
    const q = randn(qHeads * D, 33);
    const probe = native.selectIndex(handle, q, 64) as Selection;
    const tailBase = probe.tailStart;
    const chunks = tailBase / cs;
    const pb = 2 * cs * D * 4;
    const arena = new Uint8Array(kvHeads * chunks * pb);
    const map = new Int32Array(kvHeads * chunks);
    for (let h = 0; h < kvHeads; h++)
      for (let c = 0; c < chunks; c++) {
        map[h * chunks + c] = h * chunks + c;
        arena.set(page(k, v, h, c, cs), (h * chunks + c) * pb);
      }
    const dramTier = { segStart: Int32Array.of(0, chunks), maps: [map], layer: 0, arenas: [arena], slotsPerBlock: kvHeads * chunks };
    const sinkEnd = probe.sinkEnd;
    const sink = { k: { ...k, tokens: sinkEnd, data: k.data.subarray(0, sinkEnd * kvHeads * D) }, v: { ...v, tokens: sinkEnd, data: v.data.subarray(0, sinkEnd * kvHeads * D) } };
    const tail = { k: { ...k, tokens: TT - tailBase, data: k.data.subarray(tailBase * kvHeads * D) }, v: { ...v, tokens: TT - tailBase, data: v.data.subarray(tailBase * kvHeads * D) } };
    const o = { q, qHeads, sink, tail, tailBase, pageChunkSize: cs, dramTier };
    // 256: every head within one part (selected inside the call); 9000: past it (selected first).
    for (const budget of [256, 9000]) {
      const sel = native.selectIndex(handle, q, budget) as Selection;
      const want = attendFetched({ ...o, selection: sel });
      for (const threads of [1, 2, 3]) {
        const got = attendFetched({ ...o, select: { handle, budget, chunkMass: true }, threads });
        expect(got.selection!.chunkSize).toBe(sel.chunkSize);
        expect(Array.from(got.selection!.offsets)).toEqual(Array.from(sel.offsets));
        expect(Array.from(got.selection!.chunkIds)).toEqual(Array.from(sel.chunkIds));
        expect([got.selection!.tokens, got.selection!.sinkEnd, got.selection!.tailStart]).toEqual([sel.tokens, sel.sinkEnd, sel.tailStart]);
        expect(bits(got.out)).toBe(bits(want.out));
        expect(bits(got.lse)).toBe(bits(want.lse));
        expect(bits(got.chunkMass)).toBe(bits(want.chunkMass));
        expect(Array.from(got.pageCounts!)).toEqual(Array.from(want.pageCounts!));
        expect(got.bytesScored).toBeGreaterThan(0);
        expect(got.selectMs).toBeGreaterThanOrEqual(0);
      }
      // Without chunkMass the result leaves it out (the rest is the same).
      const lean = attendFetched({ ...o, select: { handle, budget } });
      expect(lean.chunkMass).toBeUndefined();
      expect(bits(lean.out)).toBe(bits(want.out));
      expect(Array.from(lean.selection!.chunkIds)).toEqual(Array.from(sel.chunkIds));
    }
    const err = (x: object) => code(() => attendFetched({ ...o, select: { handle, budget: 256 }, ...x }));
    expect(err({ selection: probe })).toMatch(/^E_CONFIG: .*a selection or a select, got both/);
    expect(err({ dramTier: undefined, fetched: arena })).toMatch(/^E_CONFIG: .*dramTier: expected it with select/);
    expect(err({ heads: Uint8Array.of(1, 1) })).toMatch(/^E_CONFIG: .*heads: expected none with select/);
    expect(err({ select: { handle: 999999, budget: 256 } })).toMatch(/^E_CLOSED: /);
    expect(err({ select: { handle, budget: 0 } })).toMatch(/^E_RANGE: .*budget/);
    expect(err({ select: { handle, budget: 256, chunkMass: 1 } })).toMatch(/^E_TYPE: attendFetched.select.chunkMass: expected a boolean/);
    expect(err({ select: 5 })).toMatch(/^E_TYPE: .*select: expected \{ handle, budget \}/);
    expect(err({ tail: { k: { ...tail.k, tokens: 2, data: tail.k.data.subarray(0, 2 * kvHeads * D) }, v: { ...tail.v, tokens: 2, data: tail.v.data.subarray(0, 2 * kvHeads * D) } } })).toMatch(/^E_RANGE: .*the index's context/);
    expect(err({ select: undefined })).toMatch(/^E_TYPE: .*selection/);
    await expect(attendFetchedAsync({ ...o, select: { handle, budget: 256 } })).rejects.toMatchObject({ code: 'E_CONFIG', message: expect.stringMatching(/select: expected a selection/) });
    // A NaN key in the DRAM tier's page of a token the select picks: named by kv head, token and tier.
    const sel = native.selectIndex(handle, q, 256) as Selection;
    const t = sel.chunkIds[sel.offsets[1]! + 3]!; // kv head 1's fourth selected token
    expect(t).toBeLessThan(tailBase);
    const bad = arena.slice();
    new Float32Array(bad.buffer)[((1 * chunks + Math.floor(t / cs)) * pb + (t % cs) * D * 4) / 4] = NaN;
    expect(code(() => attendFetched({ ...o, dramTier: { ...dramTier, arenas: [bad] }, select: { handle, budget: 256 }, threads: 2 }))).toMatch(
      new RegExp(`^E_NONFINITE: .*k: kv head 1, token ${t} \\(DRAM-tier slot\\): NaN/Inf in the key row`),
    );
  });
});
