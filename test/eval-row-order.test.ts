// The order the eval and the Pareto sweep run their timed rows in (src/eval/replay.ts): rows of the
// same code never back to back, and rows with the same neighbours running after the same rows
// equally often, so that no row is timed with its code or data left warm more than another.
import { describe, expect, it } from 'vitest';
import { alternate, isTimedStep, summarize, turnOrder, type LayerResult } from '../src/eval/replay.js';

describe('timed row order', () => {
  it('alternate interleaves two lists and keeps the longer one\'s rest', () => {
    expect(alternate(['a0', 'a1'], ['b0', 'b1', 'b2'])).toEqual(['a0', 'b0', 'a1', 'b1', 'b2']);
    expect(alternate(['a0', 'a1', 'a2'], ['b0'])).toEqual(['a0', 'b0', 'a1', 'a2']);
    expect(alternate([], ['b0'])).toEqual(['b0']);
  });

  it('turnOrder visits every row once per step and lets each go first equally often', () => {
    const n = 4;
    const first = new Array(n).fill(0);
    for (let s = 0; s < 2 * n; s++) {
      const o = turnOrder(n, s);
      expect([...o].sort()).toEqual([0, 1, 2, 3]);
      first[o[0]!]++;
    }
    expect(first).toEqual([2, 2, 2, 2]);
  });

  it('over two rounds, rows 0 and 2 of [a0, b0, a1, b1] run after the same rows equally often', () => {
    const n = 4;
    const after = (row: number) => {
      const count = new Map<string, number>();
      for (let s = 0; s < 2 * n; s++) {
        const o = turnOrder(n, s);
        const i = o.indexOf(row);
        const prev = i === 0 ? 'dense' : `row ${o[i - 1]}`;
        count.set(prev, (count.get(prev) ?? 0) + 1);
      }
      return Object.fromEntries([...count].sort());
    };
    // Never after the other a-row; after the dense pass twice and after each b-row three times,
    // both (rotation alone: row 0 always after row 3, row 2 always after row 1).
    expect(after(0)).toEqual({ dense: 2, 'row 1': 3, 'row 3': 3 });
    expect(after(2)).toEqual(after(0));
  });

  it('time means count the steps after each layer\'s first (one-step layers: that step); recall counts every step', () => {
    expect([0, 1, 2].map((s) => isTimedStep(s, 3))).toEqual([false, true, true]);
    expect(isTimedStep(0, 1)).toBe(true);
    const step = (ms: number, recall: number) => ({ recall, oracleRecall: 1, relError: 0, sparseBytes: 0, selectMs: ms, attendMs: ms / 2 });
    const layer = (l: number, steps: ReturnType<typeof step>[]): LayerResult => ({ layer: l, steps, buildMs: 0, indexBytes: 0, needlesFound: 0, needlesTotal: 0 });
    // Each layer's first step is slow (100 ms); the others take 2 and 4 ms.
    const r = summarize('kvdrive', 8, [layer(0, [step(100, 0.5), step(2, 1), step(4, 1)]), layer(1, [step(100, 0.5), step(2, 1), step(4, 1)])]);
    expect(r.selectMs).toBe(3);
    expect(r.attendMs).toBe(1.5);
    expect(r.layers.map((l) => l.selectMs)).toEqual([3, 3]);
    expect(r.recall).toBeCloseTo(5 / 6, 12);
    expect(summarize('quest', 8, [layer(0, [step(7, 1)])]).selectMs).toBe(7);
  });
});
