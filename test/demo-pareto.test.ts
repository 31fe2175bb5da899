/** `kvdrive demo --pareto` (src/cli/demo-pareto.ts): one row per (policy, budget), and the per-budget verdicts. */
import { describe, expect, it } from 'vitest';
import { dominates, KEYLESS, renderPareto, runPareto, type ParetoResult, type ParetoRow } from '../src/cli/demo-pareto.js';

describe('pareto sweep', () => {
  it('times and scores every policy (kvdrive also keyless) at every budget', async () => {
    const r = await runPareto({ context: 2048, layers: 1, steps: 3, dtype: 'f16', seed: 2, threads: 2, policy: ['kvdrive', 'quest', 'shadowkv'], budgets: [64, 128] });
    expect(r.rows.map((x) => `${x.policy}/${x.budget}`)).toEqual(['kvdrive', KEYLESS, 'quest', 'shadowkv'].flatMap((p) => [`${p}/64`, `${p}/128`]));
    for (const x of r.rows) {
      for (const t of [x.selectMs, x.attendMs, x.cpuMs]) expect(Number.isFinite(t) && t > 0).toBe(true);
      expect(x.totalMs).toBeCloseTo(x.selectMs + x.attendMs, 9);
      expect(x.recall).toBeGreaterThan(0);
      expect(x.recall).toBeLessThanOrEqual(x.oracleRecall + 1e-6);
    }
    // A larger budget attends more of the mass.
    for (const p of ['kvdrive', 'quest', 'shadowkv']) {
      const [a, b] = r.rows.filter((x) => x.policy === p);
      expect(b!.recall).toBeGreaterThanOrEqual(a!.recall - 1e-6);
    }
    const text = renderPareto(r);
    expect(text).toMatch(/mean wall time per layer-step over the steps after each layer's first/);
    expect(text).toMatch(/kvdrive against quest and shadowkv, per budget: 64: /);
  });

  it('a verdict needs the policy faster and more accurate than every baseline at that budget', () => {
    const row = (policy: string, budget: number, totalMs: number, recallVsOracle: number): ParetoRow => ({
      policy, budget, selectMs: totalMs, attendMs: 0, totalMs, cpuMs: totalMs, recall: recallVsOracle, oracleRecall: 1, recallVsOracle, needlesFound: 0, needlesTotal: 0,
    });
    const r: ParetoResult = {
      context: 1, layers: 1, steps: 2, seed: 1, threads: 1, denseMs: 10,
      rows: [row('kvdrive', 1, 2, 0.99), row('quest', 1, 3, 0.8), row('shadowkv', 1, 1, 0.8), row('kvdrive', 2, 2, 0.9), row('quest', 2, 3, 0.95), row('shadowkv', 2, 4, 0.8)],
    };
    expect(dominates(r, 'kvdrive', ['quest', 'shadowkv'])).toEqual([
      { budget: 1, faster: false, moreAccurate: true },
      { budget: 2, faster: true, moreAccurate: false },
    ]);
  });
});
