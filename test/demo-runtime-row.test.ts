/**
 * The default demo's runtime rows (src/cli/demo-runtime.ts RuntimeRow) decode each step when the
 * eval asks for it, right after the policies' step of that step, so every row is timed in the same
 * conditions; a step asked out of order is a typed error, not a silently wrong row.
 */
import { describe, expect, it } from 'vitest';
import { RuntimeRow } from '../src/cli/demo-runtime.js';
import { evaluateTrace, loadReplayLayer, type AttendedSource, type AttendedStep, type ReplayLayer } from '../src/eval/replay.js';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { expectKvdError } from './helpers.js';

const trace = generateSyntheticTrace({ layers: 2, promptTokens: 1024, decodeSteps: 3, qHeads: 8, kvHeads: 2, headDim: 32, seed: 6 });

describe('demo runtime rows', () => {
  it('decode step by step inside the eval loop, both modes bit-identical, every step scored', async () => {
    const rows = [await RuntimeRow.open(trace.meta, trace.dtype, { budget: 64, threads: 2, mode: 'sequential' }), await RuntimeRow.open(trace.meta, trace.dtype, { budget: 64, threads: 2, mode: 'pipelined' })];
    // Records when the eval asks each source for what, around the rows' own calls.
    const calls: string[] = [];
    const spy = (r: RuntimeRow): AttendedSource => ({
      name: r.name,
      prepare: async (layer: ReplayLayer) => {
        await r.prepare(layer);
        // Nothing of the layer is decoded yet: its steps are decoded when asked for, one by one.
        calls.push(`${r.mode} prepare ${layer.layer} (${r.time.layerSteps + r.time.firstSteps} steps decoded)`);
      },
      step: async (l: number, s: number): Promise<AttendedStep> => {
        calls.push(`${r.mode} step ${l}.${s}`);
        return r.step(l, s);
      },
    });
    try {
      const ev = await evaluateTrace(trace, { policies: ['quest'], budget: 64, denseThreads: 2, attended: rows.map(spy) });
      // Rows [sequential, quest, pipelined] (sources and policies alternate, so the two runtime
      // rows never run back to back) take turns going first: step s starts at row s mod 3, so
      // pipelined runs before sequential at steps 1 and 2.
      const stepOrder = (l: number, s: number) => (s % 3 === 0 ? [`sequential step ${l}.${s}`, `pipelined step ${l}.${s}`] : [`pipelined step ${l}.${s}`, `sequential step ${l}.${s}`]);
      expect(calls).toEqual(
        [0, 1].flatMap((l) => [`sequential prepare ${l} (${3 * l} steps decoded)`, `pipelined prepare ${l} (${3 * l} steps decoded)`, ...[0, 1, 2].flatMap((s) => stepOrder(l, s))]),
      );
      rows[1]!.checkIdentical(rows[0]!);
      for (const a of ev.attended) {
        expect(a.recall).toBeGreaterThan(0);
        expect(a.recall).toBeLessThanOrEqual(a.oracleRecall + 1e-6);
      }
      // Time columns: the steps after each layer's first (2 of 3 per layer); the first ones apart.
      for (const r of rows) {
        expect(r.time.layerSteps).toBe(4);
        expect(r.time.firstSteps).toBe(2);
        const sum = await r.summary();
        expect(sum.wallMs).toBeGreaterThan(0);
        expect(sum.firstStepMs).toBeGreaterThan(0);
      }
    } finally {
      for (const r of rows) await r.close();
    }
  });

  it('refuses a step asked out of order or before its layer is prepared (E_INTERNAL)', async () => {
    const row = await RuntimeRow.open(trace.meta, trace.dtype, { budget: 64, threads: 2, mode: 'sequential' });
    try {
      await expectKvdError(() => row.step(0, 0), 'E_INTERNAL', /expected the sequential runtime to be asked for step 0 of its prepared layer none, got layer 0 step 0/);
      await row.prepare(await loadReplayLayer(trace, 1));
      await expectKvdError(() => row.step(1, 1), 'E_INTERNAL', /step 0 of its prepared layer 1, got layer 1 step 1/);
      await expectKvdError(() => row.step(0, 0), 'E_INTERNAL', /got layer 0 step 0/);
      await row.step(1, 0);
      await row.step(1, 1);
      await row.step(1, 2);
      await expectKvdError(() => row.step(1, 3), 'E_INTERNAL', /step 3 of its prepared layer 1, got layer 1 step 3/);
    } finally {
      await row.close();
    }
  });
});
