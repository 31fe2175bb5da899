import { describe, expect, it } from 'vitest';
import { type PolicyOptions } from '../src/index.js';
import { createPolicy } from '../src/index/policy.js';
import { indexKernelLevel } from '../src/index/kernels.js';
import { attendedMask, massRecall, oracleMask } from '../src/eval/metrics.js';
import { attentionWeights } from '../src/attention/kernels.js';
import type { Dtype, KvTensor } from '../src/types.js';
import { randn } from './helpers.js';

// Keys of `tokens` tokens x `heads` x `dim` in the given storage dtype (f16 / bf16 by rounding /
// truncating the f32 bits), with a few strong keys so the ranking has structure.
function keysOf(tokens: number, heads: number, dim: number, dtype: Dtype, seed: number): KvTensor {
  const f = randn(tokens * heads * dim, seed);
  for (let t = 97; t < tokens; t += 211) for (let i = 0; i < dim; i++) f[(t * heads) * dim + i]! *= 4;
  if (dtype === 'f32') return { data: f, dtype, tokens, heads, dim };
  const u = new Uint32Array(f.buffer);
  const bits = new Uint16Array(f.length);
  const h = new Float32Array(1);
  const hu = new Uint32Array(h.buffer);
  for (let i = 0; i < f.length; i++) {
    if (dtype === 'bf16') bits[i] = u[i]! >>> 16;
    else {
      // f32 -> f16 (normal range, truncating the mantissa: the exact value does not matter here).
      h[0] = f[i]!;
      const x = hu[0]!;
      const exp = ((x >>> 23) & 0xff) - 127 + 15;
      bits[i] = ((x >>> 16) & 0x8000) | (exp <= 0 ? 0 : exp >= 31 ? 0x7bff : (exp << 10) | ((x >>> 13) & 0x3ff));
    }
  }
  return { data: bits, dtype, tokens, heads, dim };
}

describe('kvdrive keyed select (level-3 exact re-rank)', () => {
  const cases: { dtype: Dtype; qHeads: number; kvHeads: number; dim: number; opts: PolicyOptions }[] = [
    { dtype: 'f16', qHeads: 8, kvHeads: 2, dim: 64, opts: {} },
    { dtype: 'bf16', qHeads: 6, kvHeads: 2, dim: 37, opts: { rerankFactor: 2 } },
    { dtype: 'f32', qHeads: 10, kvHeads: 2, dim: 48, opts: { tokenGranular: false } },
  ];
  it.each(cases)('selects the same tokens at every SIMD level ($dtype, group $qHeads/$kvHeads, dim $dim)', async (c) => {
    const T = 3000;
    const k = keysOf(T, c.kvHeads, c.dim, c.dtype, 5);
    const p = createPolicy('kvdrive', { ...c.opts, qHeads: c.qHeads, kvHeads: c.kvHeads, headDim: c.dim });
    await p.build(k, T);
    const q = randn(c.qHeads * c.dim, 9);
    const best = indexKernelLevel('best');
    const want = Array.from(p.select(q, 96, { keys: k }).chunkIds);
    expect(want.length).toBeGreaterThan(0);
    for (const level of ['scalar', 'avx2', 'avx512'] as const) {
      indexKernelLevel(level);
      expect(Array.from(p.select(q, 96, { keys: k }).chunkIds)).toEqual(want);
      // With the lookahead pool (ranked fill) too.
      expect(p.select(q, 96, { keys: k, pool: 160 }).chunkIds.length).toBe(want.length);
    }
    indexKernelLevel('best');
    expect(indexKernelLevel()).toBe(best);
  });

  it('re-ranking every indexed token exactly selects the dense-attention oracle', async () => {
    // candidateFactor and rerankFactor cover the whole context: the level-3 shares are then the
    // dense softmax weights summed over the GQA group, and the best `budget` tokens by them are
    // the oracle set (up to near-ties the ~2 ulp vector exp may order differently).
    const T = 4096;
    const qHeads = 8;
    const kvHeads = 2;
    const dim = 64;
    const budget = 128;
    const k = keysOf(T, kvHeads, dim, 'f16', 21);
    const p = createPolicy('kvdrive', { qHeads, kvHeads, headDim: dim, candidateFactor: 1000, rerankFactor: 1000 });
    await p.build(k, T);
    for (const seed of [1, 2, 3]) {
      const q = randn(qHeads * dim, 30 + seed);
      for (let i = 0; i < q.length; i++) q[i]! *= 2;
      const sel = p.select(q, budget, { keys: k });
      expect(sel.chunkSize).toBe(1);
      const w = attentionWeights({ q, qHeads, k });
      const got = massRecall(w, attendedMask(sel, kvHeads), qHeads, kvHeads, T);
      const oracle = massRecall(w, oracleMask(w, qHeads, kvHeads, T, sel.sinkEnd, sel.tailStart, budget), qHeads, kvHeads, T);
      expect(got).toBeGreaterThan(oracle - 1e-5);
      expect(got).toBeLessThanOrEqual(oracle + 1e-5);
    }
  });
});
