// Attention split by KV length (native/attention/attention_split.h): heads longer than 8192 tokens are
// cut every 2048 tokens, attended part by part on the thread pool and merged through their log-sum-exp. The result must
// match the float64 reference, be bit-identical for every thread count, and a selection that covers
// every chunk must still reproduce dense attention bit for bit (same cut points). Per-chunk mass is
// re-weighted per query head across parts.
import { describe, expect, it } from 'vitest';
import { attendDense, attendDenseAsync, attendSparse } from '../src/attention/kernels.js';
import { expectKvdError, randn } from './helpers.js';
import { allChunks, randomKv, range, referenceAttention, relErr, selectedTokens, selectionOf, toHtd } from './attention-reference.js';

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');

describe('attention split by KV length', () => {
  const kvHeads = 2;
  const qHeads = 6;
  const dim = 16;
  const tokens = 8192 * 2 + 777; // nine parts of 2048 per head, the last one partial
  const k = randomKv(tokens, kvHeads, dim, 'f16', 71, 1.5);
  const v = randomKv(tokens, kvHeads, dim, 'f16', 72);
  const q = randn(qHeads * dim, 73);

  it('dense over nine parts matches the reference and is bit-identical at 1, 2, 3 and 8 threads', async () => {
    const one = attendDense({ q, qHeads, k: k.tensor, v: v.tensor, threads: 1 });
    const ref = referenceAttention(q, qHeads, k, v, () => range(tokens));
    expect(relErr(one.out, ref.out)).toBeLessThan(1e-5);
    expect(relErr(one.lse, ref.lse)).toBeLessThan(1e-5);
    for (const threads of [2, 3, 8]) {
      const r = attendDense({ q, qHeads, k: k.tensor, v: v.tensor, threads });
      expect(bits(r.out)).toBe(bits(one.out));
      expect(bits(r.lse)).toBe(bits(one.lse));
    }
    const a = await attendDenseAsync({ q, qHeads, k: toHtd(k.tensor), v: toHtd(v.tensor), threads: 2 });
    expect(bits(a.out)).toBe(bits(one.out));
  });

  it('a selection of every chunk reproduces dense bit for bit at every thread count', () => {
    const dense = attendDense({ q, qHeads, k: k.tensor, v: v.tensor, threads: 2 });
    const sel = allChunks(tokens, kvHeads, 16, 4, tokens - 64);
    for (const threads of [1, 2, 4]) {
      const s = attendSparse({ q, qHeads, k: k.tensor, v: v.tensor, selection: sel, threads });
      expect(bits(s.out)).toBe(bits(dense.out));
      expect(bits(s.lse)).toBe(bits(dense.lse));
    }
  });

  it('span lists past their per-thread keep size (2^18 spans), then a small call, then a large one again: each equals dense bit for bit', () => {
    // Every token its own span: 2 x 140000 spans > kKeepSpans (native/attention/span_lists.h), so the
    // small call in between gives the grown storage back and the last call grows it again.
    const big = 140000;
    const bk = randomKv(big, kvHeads, dim, 'f16', 81);
    const bv = randomKv(big, kvHeads, dim, 'f16', 82);
    const bigDense = attendDense({ q, qHeads, k: bk.tensor, v: bv.tensor, threads: 2 });
    const bigSel = allChunks(big, kvHeads, 1, 4, big - 64);
    const small = attendDense({ q, qHeads, k: k.tensor, v: v.tensor, threads: 2 });
    const smallSel = allChunks(tokens, kvHeads, 16, 4, tokens - 64);
    for (const [kk, vv, sel, want] of [
      [bk, bv, bigSel, bigDense],
      [k, v, smallSel, small],
      [bk, bv, bigSel, bigDense],
    ] as const) {
      const s = attendSparse({ q, qHeads, k: kk.tensor, v: vv.tensor, selection: sel, threads: 2 });
      expect(bits(s.out)).toBe(bits(want.out));
      expect(bits(s.lse)).toBe(bits(want.lse));
    }
  });

  it('a NaN in a later part names its kv head and token, at every thread count', async () => {
    const data = Uint16Array.from(k.tensor.data as Uint16Array);
    data[(12000 * kvHeads + 1) * dim + 5] = 0x7e00; // f16 NaN: token 12000 (second part), kv head 1
    const bad = { ...k.tensor, data };
    for (const threads of [1, 2])
      await expectKvdError(() => attendDense({ q, qHeads, k: bad, v: v.tensor, threads }), 'E_NONFINITE', /attendDense: k: kv head 1, token 12000:/);
  });

  it('per-chunk mass across parts equals the reference mass (and does not depend on threads)', () => {
    // Every other chunk of 16 tokens: ~8.6K tokens per head (with the 4 sinks first), so five parts of
    // 2048, chunks cut at the seams.
    const chunk = 16;
    const nChunks = Math.floor((tokens - 64) / chunk);
    const perHead = range(kvHeads).map((h) => range(nChunks).filter((c) => (c + h) % 2 === 0 && c > 0));
    const sel = selectionOf(perHead, tokens, chunk, 4, tokens - 64);
    const s1 = attendSparse({ q, qHeads, k: k.tensor, v: v.tensor, selection: sel, threads: 1 });
    const s2 = attendSparse({ q, qHeads, k: k.tensor, v: v.tensor, selection: sel, threads: 2 });
    expect(bits(s2.chunkMass)).toBe(bits(s1.chunkMass));
    expect(bits(s2.out)).toBe(bits(s1.out));
    const ref = referenceAttention(q, qHeads, k, v, (h) => selectedTokens(sel, h));
    expect(relErr(s1.out, ref.out)).toBeLessThan(1e-5);
    const group = qHeads / kvHeads;
    const want = new Float64Array(sel.chunkIds.length);
    for (let h = 0; h < kvHeads; h++)
      for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) {
        const c = sel.chunkIds[i]!;
        let m = 0;
        for (let j = 0; j < group; j++)
          for (let t = c * chunk; t < (c + 1) * chunk; t++) m += ref.probs[h * group + j]!.get(t) ?? 0;
        want[i] = m / group;
      }
    expect(relErr(s1.chunkMass, want)).toBeLessThan(1e-4);
  });
});
