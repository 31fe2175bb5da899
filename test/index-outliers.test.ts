// kvdrive's outlier chunks (outlierFraction: each segment's highest-variance chunks) join a select's
// candidates by their own int8 chunk-mean score, the best ceil(outlierFactor x budget / chunk) of
// those not candidates already, instead of all of them at every budget.
import { describe, expect, it } from 'vitest';
import { createPolicy } from '../src/index/policy.js';
import { offloadedPolicyOptions } from '../src/index/options.js';
import { prefixView } from '../src/eval/replay.js';
import { expectKvdError } from './helpers.js';
import { traceReplay } from './trace-replay.js';

const T = 8192;
const STEPS = 4;
const BUDGET = 128;
const shape = { qHeads: 8, kvHeads: 2, headDim: 64 };
const tr = await traceReplay({ T, steps: STEPS, budget: BUDGET, shape, seed: 3 });
// The runtime's offloaded select: keyless, re-ranking every candidate on the 4-bit sketch.
const offloaded = (o: object) => offloadedPolicyOptions('kvdrive', o);

describe('kvdrive outlier chunks by budget (outlierFactor)', () => {
  it('outlierFactor 0 selects as outlierFraction 0; more outliers re-rank more rows', async () => {
    const none = await tr.replay(offloaded({ outlierFactor: 0 }), false);
    const noFraction = await tr.replay(offloaded({ outlierFraction: 0 }), false);
    const half = await tr.replay(offloaded({ outlierFactor: 0.5 }), false);
    const some = await tr.replay(offloaded({ outlierFactor: 1 }), false);
    const all = await tr.replay(offloaded({ outlierFactor: 1e6 }), false);
    for (let s = 0; s < STEPS; s++) expect(Array.from(none.sels[s]!.chunkIds)).toEqual(Array.from(noFraction.sels[s]!.chunkIds));
    // 2 segments x 31 outlier chunks per kv head; the budget's 128 tokens admit 16 (factor 0.5) and
    // 32 (factor 1) of those that are not candidates already, each re-ranked (4 sketch rows).
    expect(half.stats.bytesScored).toBeGreaterThan(none.stats.bytesScored);
    expect(some.stats.bytesScored).toBeGreaterThan(half.stats.bytesScored);
    console.log(`recall / oracle (needles): no outliers ${none.ratio.toFixed(4)} (${none.found}/${none.total}), ` +
      `outlierFactor 1 ${some.ratio.toFixed(4)} (${some.found}/${some.total}), all ${all.ratio.toFixed(4)} (${all.found}/${all.total})`);
    expect(some.found).toBe(all.found);
    expect(some.ratio).toBeGreaterThan(none.ratio);
  });

  it('a factor that admits every outlier selects as the largest factor', async () => {
    // 31 outlier chunks per segment, 2 segments: 62 per head at most; 4 x 128 / 4 = 128 admitted.
    const four = await tr.replay(offloaded({ outlierFactor: 4 }), false);
    const all = await tr.replay(offloaded({ outlierFactor: 1e6 }), false);
    for (let s = 0; s < STEPS; s++) expect(Array.from(four.sels[s]!.chunkIds)).toEqual(Array.from(all.sels[s]!.chunkIds));
  });

  it('indexBytes counts the outlier chunks\' int8 means, scales and variances', async () => {
    // 8196 tokens: chunks [1, 2033) sealed (sinks 4 = chunk 0, local 64), a full segment of 1023
    // chunks and an open one of 1009, ceil(0.03 x n) = 31 outlier chunks each, per kv head.
    const tokens = T + STEPS;
    const bytes = async (o: object) => {
      const p = createPolicy('kvdrive', offloaded({ ...o, ...shape }));
      await p.build(prefixView(tr.k, tokens), tokens);
      return p.indexBytes();
    };
    const withOutliers = await bytes({});
    const without = await bytes({ outlierFraction: 0 });
    const dim4 = (shape.headDim + 3) & ~3;
    const perSegment = (o: number) => o * 4 + Math.ceil(o / 16) * 16 * dim4 + Math.ceil(o / 16) * 16 * 4 + o * 4;
    expect(withOutliers - without).toBe(shape.kvHeads * 2 * perSegment(31));
  });

  it('typed errors for a bad outlierFactor', () => {
    expectKvdError(() => createPolicy('kvdrive', { outlierFactor: -1 }), 'E_CONFIG', /outlierFactor: expected a number in \[0, 1e6\], got -1/);
    expectKvdError(() => createPolicy('quest', { outlierFactor: 1 }), 'E_CONFIG', /kvdrive-only/);
  });
});
