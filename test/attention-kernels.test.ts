import { describe, expect, it } from 'vitest';
import { type Dtype } from '../src/index.js';
import { attendDense, attendSparse, mergeAttention, attendDenseAsync, attendSparseAsync, attentionWeights } from '../src/attention/kernels.js';
import { randn } from './helpers.js';
import {
  allChunks,
  randomKv,
  range,
  referenceAttention,
  relErr,
  selectedTokens,
  selectionOf,
  toHtd,
} from './attention-reference.js';

const DTYPES: Dtype[] = ['f32', 'f16', 'bf16'];
const RATIOS = [1, 2, 4, 8];

describe('attendDense / attendSparse', () => {
  for (const dtype of DTYPES) {
    for (const ratio of RATIOS) {
      it(`sparse over every chunk equals dense and the reference (${dtype}, GQA ${ratio})`, () => {
        const kvHeads = 2;
        const qHeads = kvHeads * ratio;
        const dim = 40;
        const tokens = 203; // not a multiple of the chunk size: the last chunk is partial
        const k = randomKv(tokens, kvHeads, dim, dtype, 11 + ratio, 1.5);
        const v = randomKv(tokens, kvHeads, dim, dtype, 23 + ratio);
        const q = randn(qHeads * dim, 5 + ratio);
        const dense = attendDense({ q, qHeads, k: k.tensor, v: v.tensor });
        const sel = allChunks(tokens, kvHeads, 4, 4, tokens - 64);
        const sparse = attendSparse({ q, qHeads, k: k.tensor, v: v.tensor, selection: sel });
        // Same tokens, same order: identical arithmetic (the determinism contract), so well
        // inside the required relative error of 1e-5.
        expect(relErr(sparse.out, dense.out)).toBeLessThan(1e-5);
        expect(Array.from(sparse.out)).toEqual(Array.from(dense.out));
        expect(Array.from(sparse.lse)).toEqual(Array.from(dense.lse));

        const ref = referenceAttention(q, qHeads, k, v, () => range(tokens));
        expect(relErr(dense.out, ref.out)).toBeLessThan(1e-5);
        expect(relErr(dense.lse, ref.lse)).toBeLessThan(1e-5);
      });
    }
  }

  it('attends exactly the selected tokens and reports per-chunk mass', () => {
    const kvHeads = 4;
    const qHeads = 8;
    const dim = 32;
    const tokens = 160;
    const k = randomKv(tokens, kvHeads, dim, 'f16', 3, 2);
    const v = randomKv(tokens, kvHeads, dim, 'f16', 4);
    const q = randn(qHeads * dim, 9);
    // Chunk 0 lies inside the sinks and chunk 39 inside the tail: both clip to nothing.
    const perHead = [[0, 2, 5, 30], [], [1, 3, 4, 39], [7]];
    const sel = selectionOf(perHead, tokens, 4, 6, 140);
    const res = attendSparse({ q, qHeads, k: k.tensor, v: v.tensor, selection: sel });
    const ref = referenceAttention(q, qHeads, k, v, (h) => selectedTokens(sel, h));
    expect(relErr(res.out, ref.out)).toBeLessThan(1e-5);
    expect(relErr(res.lse, ref.lse)).toBeLessThan(1e-5);

    const group = qHeads / kvHeads;
    expect(res.chunkMass.length).toBe(sel.chunkIds.length);
    for (let h = 0; h < kvHeads; h++) {
      for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) {
        const c = sel.chunkIds[i]!;
        let mass = 0;
        for (let j = 0; j < group; j++) {
          const p = ref.probs[h * group + j]!;
          for (let t = Math.max(c * 4, sel.sinkEnd); t < Math.min(c * 4 + 4, sel.tailStart); t++) mass += p.get(t)!;
        }
        expect(res.chunkMass[i]).toBeCloseTo(mass / group, 6);
      }
    }
    expect(res.chunkMass[0]).toBe(0); // chunk 0 of head 0 is inside the sinks
    expect(res.chunkMass[sel.offsets[2]! + 3]).toBe(0); // chunk 39 of head 2 is inside the tail
  });

  it('honours tokens, scale and the head-major layout', () => {
    const kvHeads = 2;
    const qHeads = 4;
    const dim = 24;
    const k = randomKv(100, kvHeads, dim, 'bf16', 31);
    const v = randomKv(100, kvHeads, dim, 'bf16', 32);
    const q = randn(qHeads * dim, 33);
    const res = attendDense({ q, qHeads, k: k.tensor, v: v.tensor, tokens: 70, scale: 0.3 });
    const ref = referenceAttention(q, qHeads, k, v, () => range(70), 0.3);
    expect(relErr(res.out, ref.out)).toBeLessThan(1e-5);
    expect(relErr(res.lse, ref.lse)).toBeLessThan(1e-5);
    const htd = attendDense({ q, qHeads, k: toHtd(k.tensor), v: toHtd(v.tensor), tokens: 70, scale: 0.3 });
    expect(Array.from(htd.out)).toEqual(Array.from(res.out));
  });

  it('gives identical results for any thread count and for the async variants', async () => {
    const kvHeads = 8;
    const qHeads = 32;
    const dim = 64;
    const tokens = 300;
    const k = randomKv(tokens, kvHeads, dim, 'f16', 41);
    const v = randomKv(tokens, kvHeads, dim, 'f16', 42);
    const q = randn(qHeads * dim, 43);
    const one = attendDense({ q, qHeads, k: k.tensor, v: v.tensor });
    const two = attendDense({ q, qHeads, k: k.tensor, v: v.tensor, threads: 2 });
    const three = attendDense({ q, qHeads, k: k.tensor, v: v.tensor, threads: 3 });
    const asyncRes = await attendDenseAsync({ q, qHeads, k: k.tensor, v: v.tensor, threads: 2 });
    for (const r of [two, three, asyncRes]) {
      expect(Array.from(r.out)).toEqual(Array.from(one.out));
      expect(Array.from(r.lse)).toEqual(Array.from(one.lse));
    }
    const sel = selectionOf(range(kvHeads).map((h) => [h, h + 10, h + 20]), tokens, 4, 4, tokens - 64);
    const s1 = attendSparse({ q, qHeads, k: k.tensor, v: v.tensor, selection: sel });
    const s2 = await attendSparseAsync({ q, qHeads, k: k.tensor, v: v.tensor, selection: sel, threads: 2 });
    expect(Array.from(s2.out)).toEqual(Array.from(s1.out));
    expect(Array.from(s2.chunkMass)).toEqual(Array.from(s1.chunkMass));
  });
});

describe('async variants', () => {
  it('run concurrently and keep their inputs alive until they settle', async () => {
    const kvHeads = 4;
    const qHeads = 8;
    const dim = 32;
    const tokens = 512;
    const make = (seed: number) => ({
      q: randn(qHeads * dim, seed),
      k: randomKv(tokens, kvHeads, dim, 'bf16', seed + 1).tensor,
      v: randomKv(tokens, kvHeads, dim, 'bf16', seed + 2).tensor,
    });
    // The inputs exist only inside the calls (no JS reference survives), then garbage is made
    // while the workers run; the results must still equal the synchronous ones.
    const pending = [1, 2, 3, 4].map((seed) => {
      const { q, k, v } = make(seed * 10);
      return attendDenseAsync({ q, qHeads, k, v, threads: 1 + (seed % 2) });
    });
    let junk = 0;
    for (let i = 0; i < 40; i++) junk += new Float64Array(1 << 18).length;
    expect(junk).toBeGreaterThan(0);
    const results = await Promise.all(pending);
    results.forEach((r, i) => {
      const { q, k, v } = make((i + 1) * 10);
      const want = attendDense({ q, qHeads, k, v });
      expect(Array.from(r.out)).toEqual(Array.from(want.out));
      expect(Array.from(r.lse)).toEqual(Array.from(want.lse));
    });
  });
});

describe('determinism contract', () => {
  it('the same tokens in the same order from another place give bit-identical results', () => {
    // Sparse attention over a token-major cache vs the same rows gathered into a compact
    // head-major arena (as the hot tier holds them), attended as "every chunk" there.
    const kvHeads = 4;
    const qHeads = 16;
    const dim = 64;
    const tokens = 700;
    const k = randomKv(tokens, kvHeads, dim, 'f16', 81, 1.5);
    const v = randomKv(tokens, kvHeads, dim, 'f16', 82);
    const q = randn(qHeads * dim, 83);
    const perHead = range(kvHeads).map((h) => range(40).map((i) => 2 + i * 3 + (h % 3)));
    const sel = selectionOf(perHead, tokens, 4, 4, tokens - 32);
    const direct = attendSparse({ q, qHeads, k: k.tensor, v: v.tensor, selection: sel });

    const slots = 4 + 40 * 4 + 32;
    const gather = (src: Uint16Array): Uint16Array => {
      const out = new Uint16Array(kvHeads * slots * dim);
      for (let h = 0; h < kvHeads; h++)
        selectedTokens(sel, h).forEach((t, slot) => out.set(src.subarray((t * kvHeads + h) * dim, (t * kvHeads + h + 1) * dim), (h * slots + slot) * dim));
      return out;
    };
    const arena = (data: Uint16Array) => ({ data, dtype: 'f16' as const, tokens: slots, heads: kvHeads, dim, layout: 'htd' as const });
    const arenaSel = selectionOf(range(kvHeads).map(() => range(40).map((i) => i + 1)), slots, 4, 4, slots - 32);
    const viaArena = attendSparse({
      q,
      qHeads,
      k: arena(gather(k.tensor.data as Uint16Array)),
      v: arena(gather(v.tensor.data as Uint16Array)),
      selection: arenaSel,
      threads: 2,
    });
    expect(Array.from(viaArena.out)).toEqual(Array.from(direct.out));
    expect(Array.from(viaArena.lse)).toEqual(Array.from(direct.lse));
    expect(Array.from(viaArena.chunkMass)).toEqual(Array.from(direct.chunkMass));
  });
});

describe('scattered rows copied before the kernels, the next block requested during the arithmetic', () => {
  it('many heads per work item, blocks of unequal heads: bit-identical to the same rows walked in place', () => {
    // 8 kv heads on 1 or 2 threads: work items of 4 or 2 heads, so the copy runs from one head's
    // last block into the next head's first; heads select 0, a few, or ~600 scattered single tokens
    // (blocks of 256 rows at dim 128 f16, the last one partial). The oracle: the same rows in a
    // compact head-major arena, one span per head, walked in place.
    const kvHeads = 8, qHeads = 32, dim = 128, tokens = 3000, sinkEnd = 4, tailStart = tokens - 20;
    const k = randomKv(tokens, kvHeads, dim, 'f16', 301, 1.5);
    const v = randomKv(tokens, kvHeads, dim, 'f16', 302);
    const q = randn(qHeads * dim, 303);
    const counts = [600, 3, 0, 517, 256, 600, 1, 257];
    const perHead = counts.map((n, h) => range(n).map((i) => sinkEnd + ((i * 4 + h) % (tailStart - sinkEnd))).sort((a, b) => a - b));
    const sel = selectionOf(perHead.map((ids) => [...new Set(ids)]), tokens, 1, sinkEnd, tailStart);
    const lists = range(kvHeads).map((h) => selectedTokens(sel, h));
    const slots = Math.max(...lists.map((l) => l.length));
    const gather = (src: Uint16Array): Uint16Array => {
      const out = new Uint16Array(kvHeads * slots * dim);
      for (let h = 0; h < kvHeads; h++)
        lists[h]!.forEach((t, slot) => out.set(src.subarray((t * kvHeads + h) * dim, (t * kvHeads + h + 1) * dim), (h * slots + slot) * dim));
      return out;
    };
    const arena = (data: Uint16Array) => ({ data, dtype: 'f16' as const, tokens: slots, heads: kvHeads, dim, layout: 'htd' as const });
    // Every head's rows as one chunk of `slots` tokens (heads with fewer rows: their count, via
    // per-head chunks of size 1 over a prefix).
    const arenaSel = selectionOf(lists.map((l) => range(l.length)), slots, 1, 0, slots);
    arenaSel.tailStart = slots;
    for (const threads of [1, 2]) {
      const direct = attendSparse({ q, qHeads, k: k.tensor, v: v.tensor, selection: sel, threads });
      const inPlace = attendSparse({ q, qHeads, k: arena(gather(k.tensor.data as Uint16Array)), v: arena(gather(v.tensor.data as Uint16Array)), selection: arenaSel, threads });
      expect(Array.from(direct.out), `threads ${threads}`).toEqual(Array.from(inPlace.out));
      expect(Array.from(direct.lse), `threads ${threads}`).toEqual(Array.from(inPlace.lse));
    }
  });
});

describe('scattered rows copied before the kernels', () => {
  // Single-token spans (a token-granular selection) are copied a block at a time into a scratch
  // buffer and attended there; one long span (dense) is walked in place. Every token selected, the
  // two read the same rows in the same order, so the results must be bit-identical: row sizes that
  // are whole 64-byte lines (copied inline) and not (memcpy), several blocks per head, and rows so
  // wide that a block is a single tile.
  const cases: { dtype: Dtype; dim: number; tokens: number }[] = [
    { dtype: 'f16', dim: 128, tokens: 700 }, // 256 B rows, blocks of 256 rows: 3 per head
    { dtype: 'bf16', dim: 160, tokens: 300 }, // 320 B rows
    { dtype: 'f32', dim: 40, tokens: 333 }, // 160 B rows: not whole lines
    { dtype: 'f32', dim: 2048, tokens: 90 }, // 8 KiB rows: 16-row blocks
  ];
  for (const { dtype, dim, tokens } of cases) {
    it(`single-token spans equal dense bit for bit (${dtype}, dim ${dim}, ${tokens} tokens)`, () => {
      const kvHeads = 2;
      const qHeads = 8;
      const k = randomKv(tokens, kvHeads, dim, dtype, 91 + dim, 1.5);
      const v = randomKv(tokens, kvHeads, dim, dtype, 92 + dim);
      const q = randn(qHeads * dim, 93 + dim);
      const dense = attendDense({ q, qHeads, k: k.tensor, v: v.tensor });
      const sel = allChunks(tokens, kvHeads, 1, 4, tokens - 16);
      for (const threads of [1, 2]) {
        const sparse = attendSparse({ q, qHeads, k: k.tensor, v: v.tensor, selection: sel, threads });
        expect(Array.from(sparse.out)).toEqual(Array.from(dense.out));
        expect(Array.from(sparse.lse)).toEqual(Array.from(dense.lse));
      }
    });
  }
});

describe('mergeAttention', () => {
  it('merging two disjoint halves equals attention over the whole', () => {
    const kvHeads = 2;
    const qHeads = 8;
    const dim = 48;
    const tokens = 256;
    const k = randomKv(tokens, kvHeads, dim, 'f32', 51, 1.5);
    const v = randomKv(tokens, kvHeads, dim, 'f32', 52);
    const q = randn(qHeads * dim, 53);
    const whole = attendDense({ q, qHeads, k: k.tensor, v: v.tensor });
    const first = attendDense({ q, qHeads, k: k.tensor, v: v.tensor, tokens: 100 });
    // Second part: a selection with no chunks and the tail starting at 100 attends [100, 256).
    const tail = selectionOf([[], []], tokens, 4, 0, 100);
    const second = attendSparse({ q, qHeads, k: k.tensor, v: v.tensor, selection: tail });
    mergeAttention(first.out, first.lse, second.out, second.lse, qHeads, dim);
    expect(relErr(first.out, whole.out)).toBeLessThan(1e-5);
    expect(relErr(first.lse, whole.lse)).toBeLessThan(1e-5);
  });

  it('treats attention over no tokens (lse -Infinity) as the identity', () => {
    const kvHeads = 1;
    const qHeads = 2;
    const dim = 8;
    const k = randomKv(20, kvHeads, dim, 'f32', 61);
    const v = randomKv(20, kvHeads, dim, 'f32', 62);
    const q = randn(qHeads * dim, 63);
    const empty = attendDense({ q, qHeads, k: k.tensor, v: v.tensor, tokens: 0 });
    expect(Array.from(empty.lse)).toEqual([-Infinity, -Infinity]);
    expect(Array.from(empty.out).every((x) => x === 0)).toBe(true);
    const full = attendDense({ q, qHeads, k: k.tensor, v: v.tensor });
    const out = full.out.slice();
    const lse = full.lse.slice();
    mergeAttention(out, lse, empty.out, empty.lse, qHeads, dim);
    expect(Array.from(out)).toEqual(Array.from(full.out));
    mergeAttention(empty.out, empty.lse, full.out, full.lse, qHeads, dim);
    expect(relErr(empty.out, full.out)).toBeLessThan(1e-6);
  });
});

describe('attentionWeights', () => {
  it('returns per-head softmax probabilities matching the reference', () => {
    const kvHeads = 2;
    const qHeads = 4;
    const dim = 16;
    const tokens = 90;
    const k = randomKv(tokens, kvHeads, dim, 'f16', 71, 2);
    const v = randomKv(tokens, kvHeads, dim, 'f16', 72);
    const q = randn(qHeads * dim, 73);
    const w = attentionWeights({ q, qHeads, k: k.tensor, tokens: 80 });
    expect(w.length).toBe(qHeads * 80);
    const ref = referenceAttention(q, qHeads, k, v, () => range(80));
    for (let h = 0; h < qHeads; h++) {
      let sum = 0;
      for (let t = 0; t < 80; t++) {
        sum += w[h * 80 + t]!;
        expect(Math.abs(w[h * 80 + t]! - ref.probs[h]!.get(t)!)).toBeLessThan(1e-6);
      }
      expect(sum).toBeCloseTo(1, 5);
    }
  });

  it('writes into the caller\'s array when given one, the same values; E_SHAPE for another length', () => {
    const k = randomKv(50, 2, 16, 'f16', 81, 2);
    const q = randn(4 * 16, 82);
    const fresh = attentionWeights({ q, qHeads: 4, k: k.tensor, tokens: 40 });
    const into = new Float32Array(4 * 40).fill(NaN);
    const got = attentionWeights({ q, qHeads: 4, k: k.tensor, tokens: 40, into });
    expect(got).toBe(into);
    expect(Array.from(into)).toEqual(Array.from(fresh));
    expect(() => attentionWeights({ q, qHeads: 4, k: k.tensor, tokens: 40, into: new Float32Array(4 * 41) })).toThrow(
      expect.objectContaining({ code: 'E_SHAPE', message: expect.stringMatching(/into \(qHeads x tokens\): expected 160 elements, got 164/) }),
    );
    expect(() => attentionWeights({ q, qHeads: 4, k: k.tensor, into: new Uint8Array(200) as never })).toThrow(expect.objectContaining({ code: 'E_DTYPE' }));
  });

  it('rejects an `into` that shares memory with q or k (E_CONFIG), leaving q and k as they were', () => {
    // One buffer holding q, then an f32 key cache, then spare room: views of it that overlap.
    const T = 40, H = 2, D = 16, Q = 4;
    const qLen = Q * D, kLen = T * H * D, n = Q * T;
    const buf = new Float32Array(qLen + kLen + n);
    buf.set(randn(qLen + kLen, 83));
    const q = buf.subarray(0, qLen);
    const kData = buf.subarray(qLen, qLen + kLen);
    const tensor = { data: kData, dtype: 'f32' as const, tokens: T, heads: H, dim: D };
    const before = Float32Array.from(buf.subarray(0, qLen + kLen));
    for (const [at, what] of [[0, /overlapping q/], [qLen + 8, /overlapping k\.data/], [qLen + kLen - n + 1, /overlapping k\.data/]] as const)
      expect(() => attentionWeights({ q, qHeads: Q, k: tensor, into: buf.subarray(at, at + n) })).toThrow(
        expect.objectContaining({ code: 'E_CONFIG', message: expect.stringMatching(what) }),
      );
    expect(Array.from(buf.subarray(0, qLen + kLen))).toEqual(Array.from(before));
    // Right after k: no overlap, the same values as a fresh array.
    const fresh = attentionWeights({ q, qHeads: Q, k: tensor });
    expect(Array.from(attentionWeights({ q, qHeads: Q, k: tensor, into: buf.subarray(qLen + kLen) }))).toEqual(Array.from(fresh));
  });
});
