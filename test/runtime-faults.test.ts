// Stage worker crashes inside a decode step of a real runtime (fault injection at an exact point of
// the worker loop): a worker that dies after handing its micro-batch on does not fail the step, and
// every output — of that step and of all later ones, served by the replacement — equals a run
// without the crash; a worker that dies holding a micro-batch fails that step with E_WORKER (it
// does not hang) and decoding goes on. Needs `npm run build:ts`.
import { describe, expect, it } from 'vitest';
import { openRuntime, type Runtime, type RuntimeOptions } from '../src/pipeline/runtime.js';
import type { KvTensor } from '../src/types.js';
import { expectKvdError, randn } from './helpers.js';
import { distPath } from './dist.js';
import { osThreads } from './threads.js';
import { readdirSync } from 'node:fs';

distPath('src/pipeline/decode-stages.js');
const shape = { layers: 2, qHeads: 4, kvHeads: 2, headDim: 16 };
const row = shape.kvHeads * shape.headDim;
const kvt = (data: Float32Array, tokens: number): KvTensor => ({ data, dtype: 'f32', tokens, heads: shape.kvHeads, dim: shape.headDim });
const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');
const PROMPT = 150; // kvdrive seals a 4-token chunk into the index every 4 decode steps
const STEPS = 40;
const CRASH_STEP = 30; // after several chunks were sealed by extends: a replacement must rebuild the same index

type Stage = 'selection' | 'fetch' | 'compute';

/** Decodes STEPS steps of both layers for two sequences; arms `crash` before CRASH_STEP (layer 0). */
async function decode(rt: Runtime, crash?: { stage: Stage; at: 'now' | 'popped' | 'pushed' }): Promise<string[]> {
  const seqs = [rt.createSequence(), rt.createSequence()];
  for (const [i, s] of seqs.entries())
    for (let l = 0; l < shape.layers; l++) await rt.prefill(s, l, kvt(randn(PROMPT * row, i * 10 + l), PROMPT), kvt(randn(PROMPT * row, i * 10 + l + 5), PROMPT));
  const outs: string[] = [];
  for (let t = 0; t < STEPS; t++)
    for (let l = 0; l < shape.layers; l++) {
      if (crash && t === CRASH_STEP && l === 0) await rt.killStageWorker(crash.stage, crash.at);
      const batch = seqs.map((s, i) => ({ seq: s, q: randn(64, t * 100 + l * 10 + i), kNew: randn(row, t * 100 + l * 10 + i + 1), vNew: randn(row, t * 100 + l * 10 + i + 2) }));
      outs.push(...(await rt.attend(l, batch)).map(bits));
    }
  return outs;
}

const restarts = async (rt: Runtime, stage: Stage) => (await rt.stats()).stages!.find((s) => s.stage === stage)!.restarts;

describe('stage worker crashes inside a decode step', () => {
  const base: RuntimeOptions = { shape, budget: 16, microBatch: 1, maxSequences: 2, maxTokens: 300 };
  const cases: [Stage, 'now' | 'pushed', RuntimeOptions][] = [
    ['selection', 'pushed', base],
    ['selection', 'now', base],
    ['compute', 'pushed', base],
    ['fetch', 'pushed', { ...base, hotTier: { windows: 1, maxBytes: 1 << 22 } }],
  ];
  for (const [stage, at, opts] of cases)
    it(`the ${stage} worker dying ${at === 'now' ? 'between steps' : 'right after handing a micro-batch on'}: outputs equal a run without the crash`, async () => {
      const ref = await openRuntime({ ...opts, mode: 'sequential' });
      const want = await decode(ref);
      await ref.close();
      const rt = await openRuntime({ ...opts, mode: 'pipelined' });
      const got = await decode(rt, { stage, at });
      expect(await restarts(rt, stage)).toBe(1);
      await rt.close();
      expect(got.length).toBe(STEPS * shape.layers * 2);
      expect(got).toEqual(want);
    }, 30_000);

  it('the compute worker dying right after it popped a micro-batch fails that step with E_WORKER, and decoding goes on; close() then leaves no threads or descriptors', async () => {
    const threads0 = await osThreads();
    const fd0 = readdirSync('/proc/self/fd').length;
    const rt = await openRuntime({ ...base, mode: 'pipelined' });
    const seqs = [rt.createSequence(), rt.createSequence()];
    for (const [i, s] of seqs.entries()) for (let l = 0; l < 2; l++) await rt.prefill(s, l, kvt(randn(PROMPT * row, i + l), PROMPT), kvt(randn(PROMPT * row, i + l + 5), PROMPT));
    const entry = (t: number) => seqs.map((s, i) => ({ seq: s, q: randn(64, t * 10 + i), kNew: randn(row, t + i + 1), vNew: randn(row, t + i + 2) }));
    await rt.attend(0, entry(0));
    await rt.killStageWorker('compute', 'popped');
    await expectKvdError(() => rt.attend(1, entry(1)), 'E_WORKER', /stage 'compute' worker 0: expected it to finish batch \d+, got the worker dying \(exit code 7\)/);
    for (let t = 2; t < 5; t++) for (const o of await rt.attend(t % 2, entry(t))) expect(o.every(Number.isFinite)).toBe(true);
    expect(await restarts(rt, 'compute')).toBe(1);
    await rt.close();
    expect(await osThreads()).toBe(threads0);
    expect(readdirSync('/proc/self/fd').length).toBe(fd0);
  }, 30_000);
});
