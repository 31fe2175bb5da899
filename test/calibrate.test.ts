// Calibration pre-run: picks values among the candidates, records every trial, and
// openRuntime({ calibrate }) opens with what it picked. Needs `npm run build:ts` (pipelined trials).
import { describe, expect, it } from 'vitest';
import { calibrate } from '../src/runtime/calibrate.js';
import { openRuntime, type RuntimeOptions } from '../src/runtime/runtime.js';
import { expectKvdError } from './helpers.js';

const shape = { layers: 1, qHeads: 4, kvHeads: 2, headDim: 16 };
const base: RuntimeOptions = { shape, budget: 16, maxSequences: 2, maxTokens: 400 };

describe('calibrate', () => {
  it('sweeps index granularity, hot-tier windows and micro-batch; picks from the candidates by its rules', async () => {
    const r = await calibrate(
      { ...base, hotTier: { windows: 1, maxBytes: 1 << 20 } },
      openRuntime,
      { contextTokens: 256, batch: 2, steps: 2, microBatches: [1, 2], tokensPerCluster: [8, 32], maxWindow: 3 },
    );
    const stages = r.trials.map((t) => t.stage);
    expect(stages.filter((s) => s === 'index').length).toBe(2);
    expect(stages.filter((s) => s === 'microBatch').length).toBe(2);
    const tier = r.trials.filter((t) => t.stage === 'hotTier');
    expect(tier.length).toBeGreaterThanOrEqual(1);
    expect(tier.length).toBeLessThanOrEqual(3);
    expect([8, 32]).toContain(r.tokensPerCluster);
    expect([1, 2]).toContain(r.microBatch);
    // the chosen micro-batch is the trial with the highest throughput
    const mb = r.trials.filter((t) => t.stage === 'microBatch');
    expect(mb.reduce((a, b) => (b.throughput > a.throughput ? b : a)).microBatch).toBe(r.microBatch);
    // the chosen window is the last one that made the step faster
    const w = tier.map((t) => t.window!);
    expect(w).toEqual(w.map((_, i) => i + 1));
    const pick = tier.findIndex((t) => t.window === r.window);
    for (let i = 1; i <= pick; i++) expect(tier[i]!.stepMs).toBeLessThan(tier[i - 1]!.stepMs);
    if (pick + 1 < tier.length) expect(tier[pick + 1]!.stepMs).toBeGreaterThanOrEqual(tier[pick]!.stepMs);
    for (const t of r.trials) {
      expect(t.stepMs).toBeGreaterThan(0);
      expect(t.selectionMs).toBeGreaterThan(0);
      expect(t.computeMs).toBeGreaterThan(0);
    }
    expect(tier.every((t) => t.fetchMs > 0)).toBe(true);
  });

  it('openRuntime({ calibrate }) opens with the chosen configuration', async () => {
    const rt = await openRuntime({ ...base, calibrate: { contextTokens: 128, batch: 2, steps: 1, microBatches: [1, 2], tokensPerCluster: [16] } });
    expect(rt.calibration).toBeDefined();
    expect(rt.microBatch).toBe(rt.calibration!.microBatch);
    expect(rt.calibration!.tokensPerCluster).toBe(16);
    expect(rt.mode).toBe('sequential'); // trials run pipelined; the runtime keeps the requested mode
    await rt.close();
  });

  it('rejects bad options with typed errors', async () => {
    await expectKvdError(() => calibrate(base, openRuntime, { batch: 0 }), 'E_CONFIG', /calibrate options.batch/);
    await expectKvdError(() => calibrate(base, openRuntime, { batch: 3 }), 'E_CONFIG', /at most the runtime's maxSequences = 2, got 3/);
    await expectKvdError(() => calibrate(base, openRuntime, { contextTokens: 399, batch: 2 }), 'E_CONFIG', /contextTokens: expected at most maxTokens - steps - 1/);
    await expectKvdError(() => calibrate(base, openRuntime, { colour: 1 } as never), 'E_CONFIG', /calibrate options/);
    await expectKvdError(() => openRuntime({ ...base, calibrate: 'yes' as never }), 'E_CONFIG', /options.calibrate: expected true, false or CalibrateOptions/);
  });
});
