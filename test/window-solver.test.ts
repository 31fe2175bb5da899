import { describe, expect, it } from 'vitest';
import { parseProfile, type WindowProfile } from '../src/cache/profile-types.js';
import { parseBytes, parseWindowAllocation, solveWindows } from '../src/cache/window-solver.js';
import { expectKvdError, rng } from './helpers.js';

/**
 * Random profile: costs proportional to the window (per-pair slot size). Fetched bytes fall either
 * by random factors (non-convex, 'rough') or like measured profiles (a decaying curve with a per-pair
 * rate, 'smooth').
 */
function randomProfile(layers: number, kvHeads: number, windows: number[], seed: number, shape: 'rough' | 'smooth' = 'rough'): WindowProfile {
  const r = rng(seed);
  const pairs = [];
  for (let l = 0; l < layers; l++)
    for (let h = 0; h < kvHeads; h++) {
      const slotBytes = 64 * (1 + Math.floor(r() * 4));
      let f = 1000 + Math.floor(r() * 9000);
      const fetched: number[] = [];
      const rate = 0.1 + r();
      const floor = r() * 0.3;
      for (let j = 0; j < windows.length; j++) {
        if (shape === 'smooth') fetched.push(Math.round(f * (floor + (1 - floor) * Math.exp(-rate * windows[j]!))));
        else {
          fetched.push(f);
          f = Math.floor(f * r()); // non-convex, random savings
        }
      }
      pairs.push({ layer: l, head: h, fetchedBytesPerStep: fetched, residentBytes: windows.map((w) => w * slotBytes) });
    }
  return { version: 1, shape: { layers, kvHeads }, windows, pairs };
}

/** Brute force over every combination: least total fetched within budget. */
function bruteForce(p: WindowProfile, budget: number): number {
  let best = Infinity;
  const n = p.pairs.length;
  const idx = new Array<number>(n).fill(0);
  for (;;) {
    let c = 0;
    let f = 0;
    for (let i = 0; i < n; i++) {
      c += p.pairs[i]!.residentBytes[idx[i]!]!;
      f += p.pairs[i]!.fetchedBytesPerStep[idx[i]!]!;
    }
    if (c <= budget && f < best) best = f;
    let k = 0;
    while (k < n && ++idx[k]! === p.windows.length) idx[k++] = 0;
    if (k === n) break;
  }
  return best;
}

describe('window solver (MCKP)', () => {
  it('exact DP equals brute force on random small instances (200 seeds)', () => {
    let worstGap = 0;
    for (let seed = 1; seed <= 200; seed++) {
      const r = rng(seed * 7919);
      const layers = 1 + Math.floor(r() * 2);
      const heads = 1 + Math.floor(r() * 3);
      const p = randomProfile(layers, heads, [0, 1, 2, 3], seed);
      const min = p.pairs.reduce((s, x) => s + Math.min(...x.residentBytes), 0);
      const max = p.pairs.reduce((s, x) => s + Math.max(...x.residentBytes), 0);
      const budget = Math.floor(min + r() * (max - min));
      const exact = solveWindows(p, { budgetBytes: budget, method: 'exact' });
      expect(exact.method).toBe('exact');
      expect(exact.quantised).toBe(false);
      expect(exact.totalCostBytes).toBeLessThanOrEqual(budget);
      expect(exact.predictedFetchedBytesPerStep).toBe(bruteForce(p, budget));
      const greedy = solveWindows(p, { budgetBytes: budget, method: 'greedy' });
      expect(greedy.totalCostBytes).toBeLessThanOrEqual(budget);
      expect(greedy.predictedFetchedBytesPerStep).toBeGreaterThanOrEqual(exact.predictedFetchedBytesPerStep);
      const gap = greedy.predictedFetchedBytesPerStep / Math.max(1, exact.predictedFetchedBytesPerStep) - 1;
      worstGap = Math.max(worstGap, gap);
    }
    console.log(`greedy vs exact on 200 random small instances: worst relative excess transfer ${(worstGap * 100).toFixed(1)}%`);
  });

  it('greedy never exceeds the budget and its mean gap to exact is reported (32×8 pairs, 8 windows)', () => {
    for (const shape of ['rough', 'smooth'] as const) {
      const p = randomProfile(32, 8, [0, 1, 2, 3, 4, 5, 6, 7], 42, shape);
      const max = p.pairs.reduce((s, x) => s + Math.max(...x.residentBytes), 0);
      let gaps = 0;
      let worst = 0;
      for (const frac of [0.1, 0.25, 0.5, 0.75]) {
        const budget = Math.floor(max * frac);
        const g = solveWindows(p, { budgetBytes: budget, method: 'greedy' });
        const e = solveWindows(p, { budgetBytes: budget, method: 'exact' });
        expect(g.totalCostBytes).toBeLessThanOrEqual(budget);
        expect(e.totalCostBytes).toBeLessThanOrEqual(budget);
        expect(g.predictedFetchedBytesPerStep).toBeGreaterThanOrEqual(e.predictedFetchedBytesPerStep);
        const gap = g.predictedFetchedBytesPerStep / e.predictedFetchedBytesPerStep - 1;
        gaps += gap;
        worst = Math.max(worst, gap);
      }
      console.log(`greedy gap to exact on 32×8×8 (${shape} profiles, budgets 10/25/50/75% of max): mean ${((gaps / 4) * 100).toFixed(3)}%, worst ${(worst * 100).toFixed(3)}% more transfer`);
    }
  });

  it('solves a 32 layers × 8 heads × 8 choices instance (time printed, not asserted)', () => {
    const p = randomProfile(32, 8, [0, 1, 2, 3, 4, 5, 6, 7], 7);
    const max = p.pairs.reduce((s, x) => s + Math.max(...x.residentBytes), 0);
    const a = solveWindows(p, { budgetBytes: Math.floor(max / 3), method: 'auto' });
    console.log(`32×8×8 auto (${a.method}): ${a.solveMs.toFixed(1)} ms, ${a.totalCostBytes} of ${a.budgetBytes} bytes`);
    expect(a.windows).toHaveLength(32);
    expect(a.windows[0]).toHaveLength(8);
    // Never worse than the best uniform window at the same bytes.
    expect(a.uniform).not.toBeNull();
    expect(a.predictedFetchedBytesPerStep).toBeLessThanOrEqual(a.uniform!.fetchedBytesPerStep);
  });

  it('exact with a forced coarse quantum stays within budget and is marked quantised', () => {
    const p = randomProfile(2, 3, [0, 1, 2, 3], 3);
    const max = p.pairs.reduce((s, x) => s + Math.max(...x.residentBytes), 0);
    const budget = Math.floor(max / 2) + 13;
    const a = solveWindows(p, { budgetBytes: budget, method: 'exact', maxDpCells: 6 * 20 });
    expect(a.quantised).toBe(true);
    expect(a.totalCostBytes).toBeLessThanOrEqual(budget);
    expect(a.predictedFetchedBytesPerStep).toBeGreaterThanOrEqual(bruteForce(p, budget));
  });

  it('budget below the minimum feasible allocation is E_BUDGET naming the minimum', async () => {
    const p = randomProfile(2, 2, [1, 2], 5);
    const min = p.pairs.reduce((s, x) => s + Math.min(...x.residentBytes), 0);
    await expectKvdError(() => solveWindows(p, { budgetBytes: min - 1 }), 'E_BUDGET', new RegExp(`at least ${min} bytes`));
    await expectKvdError(() => solveWindows(p, { budgetBytes: -1 }), 'E_CONFIG', /budgetBytes/);
    await expectKvdError(() => solveWindows(p, { budgetBytes: 10, method: 'fast' as never }), 'E_CONFIG', /method/);
  });

  it('validates profiles: malformed, wrong pair count, windows not ascending, mismatched lengths', async () => {
    const p = randomProfile(2, 2, [0, 1, 2], 9);
    expect(parseProfile(JSON.parse(JSON.stringify(p))).pairs).toHaveLength(4);
    await expectKvdError(() => parseProfile({ version: 2 }), 'E_CONFIG', /version/);
    await expectKvdError(() => parseProfile({ ...p, pairs: p.pairs.slice(1) }), 'E_SHAPE', /expected 4 entries/);
    await expectKvdError(() => parseProfile({ ...p, windows: [0, 2, 1] }), 'E_CONFIG', /ascending/);
    const bad = JSON.parse(JSON.stringify(p)) as WindowProfile;
    bad.pairs[1]!.residentBytes.pop();
    await expectKvdError(() => parseProfile(bad), 'E_SHAPE', /residentBytes: expected 3 entries/);
    const dup = JSON.parse(JSON.stringify(p)) as WindowProfile;
    dup.pairs[1]!.head = 0;
    await expectKvdError(() => parseProfile(dup), 'E_CONFIG', /appears twice/);
    const out = JSON.parse(JSON.stringify(p)) as WindowProfile;
    out.pairs[1]!.layer = 5;
    await expectKvdError(() => parseProfile(out), 'E_SHAPE', /layer < 2/);
  });

  it('window allocations are validated against the runtime shape', async () => {
    const p = randomProfile(2, 3, [0, 1, 2], 11);
    const a = solveWindows(p, { budgetBytes: 1 << 20 });
    const json = JSON.parse(JSON.stringify(a));
    expect(parseWindowAllocation(json, { layers: 2, kvHeads: 3 })).toEqual(a.windows);
    await expectKvdError(() => parseWindowAllocation(json, { layers: 4, kvHeads: 3 }), 'E_SHAPE', /4 layers × 3 kv heads, got a file for 2 × 3/);
    await expectKvdError(() => parseWindowAllocation({ version: 1 }, { layers: 2, kvHeads: 3 }), 'E_CONFIG', /shape/);
    await expectKvdError(() => parseWindowAllocation({ ...json, windows: [[1, 1, 1]] }, { layers: 2, kvHeads: 3 }), 'E_SHAPE', /2 rows/);
  });

  it('parses byte counts with suffixes and rejects garbage', async () => {
    expect(parseBytes('65536')).toBe(65536);
    expect(parseBytes('64KiB')).toBe(65536);
    expect(parseBytes('1.5MB')).toBe(1_500_000);
    await expectKvdError(() => parseBytes('lots'), 'E_CONFIG', /byte count/);
    expect(parseBytes('2TiB')).toBe(2 ** 41);
    await expectKvdError(() => parseBytes('999999999GiB'), 'E_CONFIG', /at most 9007199254740991 \(8 PiB\), got "999999999GiB"/);
    await expectKvdError(() => parseBytes('99999999999999999999'), 'E_CONFIG', /at most 9007199254740991/);
  });
});
