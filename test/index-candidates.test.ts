import { describe, expect, it } from 'vitest';
import { createPolicy } from '../src/index/policy.js';
import { offloadedPolicyOptions, type PolicyOptions } from '../src/index/options.js';
import { prefixView } from '../src/eval/replay.js';
import { native } from '../src/native.js';
import { expectKvdError } from './helpers.js';
import { traceReplay } from './trace-replay.js';

// candidateExponent: the candidate factors hold where the budget is 1/64 of the context and scale
// by (64 K / T)^(candidateExponent - 1) elsewhere.
const T = 8192;
const SHARE = T / 64; // the budget at which the factors apply unscaled
const shape = { qHeads: 8, kvHeads: 2, headDim: 64 };
const tr = await traceReplay({ T, steps: 1, budget: SHARE, shape, seed: 6 });
const kv = prefixView(tr.k, T);
const q = tr.qAt(0);

/** Vectors scored (centroids plus sketch rows re-ranked) by one offloaded select at `budget`. */
async function scored(budget: number, o: PolicyOptions) {
  const p = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { ...shape, ...o }));
  await p.build(kv, T);
  const sel = p.select(q, budget);
  return { vectors: p.lastSelectStats().vectorsScored, ids: Array.from(sel.chunkIds) };
}

describe('kvdrive candidateExponent (candidates as budget^exponent)', () => {
  it('at a budget of 1/64 of the context the factors apply unscaled: the selection of exponent 1', async () => {
    const half = await scored(SHARE, { candidateExponent: 0.5 });
    const one = await scored(SHARE, { candidateExponent: 1 });
    expect(half).toEqual(one);
  });

  it('a larger budget takes fewer candidates per budget token, a smaller one more', async () => {
    // Only the candidates differ (every centroid is scored either way): 4 x K^0.5 x SHARE^0.5
    // candidate tokens instead of 4 x K, i.e. half at 4 x SHARE and twice at SHARE / 4.
    const o = { candidateFactor: 4, reuseCandidateFactor: 0 };
    const big = [await scored(4 * SHARE, { ...o, candidateExponent: 0.5 }), await scored(4 * SHARE, { ...o, candidateExponent: 1 })];
    const small = [await scored(SHARE / 4, { ...o, candidateExponent: 0.5 }), await scored(SHARE / 4, { ...o, candidateExponent: 1 })];
    expect(big[0]!.vectors).toBeLessThan(big[1]!.vectors);
    expect(small[0]!.vectors).toBeGreaterThan(small[1]!.vectors);
    // Exponent 0 takes the same candidates at every budget (at least the budget itself).
    const flat = [await scored(SHARE / 2, { ...o, candidateExponent: 0 }), await scored(SHARE, { ...o, candidateExponent: 0 })];
    expect(flat[0]!.vectors).toBe(flat[1]!.vectors);
  });

  it('is validated and kvdrive-only', () => {
    for (const bad of [-0.1, 1.5, Number.NaN, '0.5'])
      expectKvdError(() => createPolicy('kvdrive', { ...shape, candidateExponent: bad as number }), 'E_CONFIG', /candidateExponent/);
    expectKvdError(() => createPolicy('quest', { ...shape, candidateExponent: 0.5 }), 'E_CONFIG', /kvdrive-only/);
    // The binding checks it again: it does not trust its caller to have validated.
    for (const bad of [2, -1, Number.NaN, Infinity, '0.5'])
      expectKvdError(() => new native.SelectionIndex({ policy: 'kvdrive', chunkSize: 4, candidateExponent: bad }), 'E_CONFIG', /candidateExponent: expected a number in \[0, 1\]/);
  });
});
