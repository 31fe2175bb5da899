// kvdrive's token-granular select returns its best `budget` re-ranked tokens two ways: without a pool
// by a radix cut on the scores that marks the ids where they lie (MarkBest, layer_index.cc), with a
// pool by ranking them (radix select + sort) and filling in rank order. Both must give the same
// tokens, ties broken towards the lower token id, also when many scores are exactly equal.
import { describe, expect, it } from 'vitest';
import { createPolicy } from '../src/index/policy.js';
import { offloadedPolicyOptions } from '../src/index/options.js';
import type { KvTensor } from '../src/types.js';

const T = 8192;
const shape = { qHeads: 8, kvHeads: 2, headDim: 64 };

function rng(seed: number) {
  let x = seed >>> 0;
  return () => {
    x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + 0x6b43a9b5) >>> 0;
    return x / 2 ** 31 - 1;
  };
}

// Token-major f32 keys; with `distinct` rows repeated over the context, many tokens share their key
// exactly (and so their sketch row and score).
function keys(distinct: number, seed: number): KvTensor {
  const r = rng(seed);
  const { kvHeads, headDim } = shape;
  const base = Float32Array.from({ length: distinct * kvHeads * headDim }, () => r());
  const data = new Float32Array(T * kvHeads * headDim);
  for (let t = 0; t < T; t++) data.set(base.subarray((t % distinct) * kvHeads * headDim, ((t % distinct) + 1) * kvHeads * headDim), t * kvHeads * headDim);
  return { data, dtype: 'f32', tokens: T, heads: kvHeads, dim: headDim };
}

describe('kvdrive token-granular top-K', () => {
  for (const [name, distinct] of [['distinct keys', T], ['keys repeated every 96 tokens (exact ties)', 96]] as const) {
    it(`the same tokens with and without a pool: ${name}`, async () => {
      const k = keys(distinct, 7);
      const p = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { ...shape }));
      await p.build(k, T);
      const r = rng(11);
      for (const budget of [64, 200, 1000]) {
        const q = Float32Array.from({ length: shape.qHeads * shape.headDim }, () => r());
        const plain = p.select(q, budget);
        const pooled = p.select(q, budget, { pool: 2 * budget });
        expect(plain.chunkSize).toBe(1);
        expect(Array.from(plain.offsets)).toEqual(Array.from(pooled.offsets));
        expect(Array.from(plain.chunkIds)).toEqual(Array.from(pooled.chunkIds));
        for (let h = 0; h < shape.kvHeads; h++) expect(plain.offsets[h + 1]! - plain.offsets[h]!).toBe(budget);
      }
    });
  }
});
