import { describe, expect, it } from 'vitest';
import { attendedMask, kthLargest, massRecall, MetricsScratch, oracleMask, relativeError, StepOracle } from '../src/eval/metrics.js';
import { rng } from './helpers.js';

describe('eval metrics', () => {
  it('kthLargest matches a sort', () => {
    const r = rng(7);
    for (let trial = 0; trial < 50; trial++) {
      const n = 1 + Math.floor(r() * 300);
      const xs = Float32Array.from({ length: n }, () => Math.floor(r() * 20)); // many ties
      const sorted = Array.from(xs).sort((a, b) => b - a);
      const k = 1 + Math.floor(r() * n);
      expect(kthLargest(xs, k)).toBe(sorted[k - 1]);
    }
  });

  it('oracle takes exactly the top-K tokens by group-summed mass, plus sinks and tail', () => {
    // 2 query heads on 1 kv head, 10 tokens, sinks [0,1), tail [8,10), budget 3.
    const T = 10;
    const w = new Float32Array(2 * T);
    const a = [0.1, 0.05, 0.2, 0.01, 0.3, 0.02, 0.04, 0.03, 0.15, 0.1];
    const b = [0.1, 0.3, 0.0, 0.05, 0.2, 0.01, 0.04, 0.2, 0.05, 0.05];
    w.set(a, 0);
    w.set(b, T);
    const m = oracleMask(w, 2, 1, T, 1, 8, 3);
    // group sums over [1,8): t1 .35, t2 .2, t3 .06, t4 .5, t5 .03, t6 .08, t7 .23 -> top3 = 4, 1, 7
    expect(Array.from(m)).toEqual([1, 1, 0, 0, 1, 0, 0, 1, 1, 1]);
    const rec = massRecall(w, m, 2, 1, T);
    const expectA = 0.1 + 0.05 + 0.3 + 0.03 + 0.15 + 0.1;
    const expectB = 0.1 + 0.3 + 0.2 + 0.2 + 0.05 + 0.05;
    expect(rec).toBeCloseTo((expectA + expectB) / 2, 6);
  });

  it('attendedMask clips chunks to [sinkEnd, tailStart)', () => {
    const sel = {
      chunkSize: 4, tokens: 20, sinkEnd: 2, tailStart: 14,
      offsets: Int32Array.from([0, 2]), chunkIds: Int32Array.from([0, 3]),
    };
    const m = attendedMask(sel, 1);
    expect(Array.from(m)).toEqual([1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]);
  });

  it('the masks and the oracle through a reused scratch equal fresh ones, call after call', () => {
    const r = rng(11);
    const scratch = new MetricsScratch();
    const kvHeads = 2, qHeads = 4;
    // Growing and shrinking token counts: the scratch's larger buffers must not leak old marks.
    for (const T of [40, 64, 24, 64]) {
      const w = Float32Array.from({ length: qHeads * T }, () => r());
      const sel = {
        chunkSize: 4, tokens: T, sinkEnd: 2, tailStart: T - 6,
        offsets: Int32Array.from([0, 2, 3]), chunkIds: Int32Array.from([1, 4, 3]),
      };
      expect(Array.from(attendedMask(sel, kvHeads, scratch))).toEqual(Array.from(attendedMask(sel, kvHeads)));
      const fresh = oracleMask(w, qHeads, kvHeads, T, 2, T - 6, 5);
      expect(Array.from(oracleMask(w, qHeads, kvHeads, T, 2, T - 6, 5, scratch))).toEqual(Array.from(fresh));
      const xs = w.subarray(0, T);
      expect(kthLargest(xs, 3, scratch.floats('copy', T))).toBe(kthLargest(xs, 3));
      expect(Array.from(xs)).toEqual(Array.from(w.subarray(0, T))); // the input is never reordered
    }
  });

  it("StepOracle gives each (budget, sinks, tail) the oracle's recall, whatever was asked before", () => {
    const r = rng(5);
    const T = 50, kvHeads = 2, qHeads = 4;
    const w = Float32Array.from({ length: qHeads * T }, () => r());
    const direct = (b: number, s0: number, t0: number) => massRecall(w, oracleMask(w, qHeads, kvHeads, T, s0, t0, b), qHeads, kvHeads, T);
    const o = new StepOracle(w, qHeads, kvHeads, T, new MetricsScratch());
    for (const [b, s0, t0] of [[5, 2, 40], [9, 2, 40], [5, 0, 50], [5, 2, 40], [9, 2, 40]] as const) expect(o.recall(b, s0, t0)).toBe(direct(b, s0, t0));
    expect(o.recall(9, 2, 40)).toBeGreaterThan(o.recall(5, 2, 40));
  });

  it('relativeError is 0 for equal vectors and scale-free', () => {
    const x = Float32Array.from([1, 2, 3]);
    expect(relativeError(x, x)).toBe(0);
    expect(relativeError(Float32Array.from([1.1, 2, 3]), x)).toBeCloseTo(0.1 / Math.sqrt(14), 6);
  });
});
