// Pipelined runtime under churn and faults: sequences join and leave at random while decoding
// (outputs bit-identical to a sequential runtime running the same script), a real stage worker
// killed while the runtime is open (it recovers), back-pressure when the host submits more
// micro-batches than the pipeline holds, and close() leaving no threads or file descriptors.
// Needs `npm run build:ts` (workers load dist/).
import { readdirSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { openRuntime, type Runtime, type RuntimeOptions } from '../src/pipeline/runtime.js';
import { isKvdriveError } from '../src/errors.js';
import type { KvTensor } from '../src/types.js';
import { randn, rng } from './helpers.js';
import { osThreads } from './threads.js';
import { distPath } from './dist.js';

const shape = { layers: 2, qHeads: 4, kvHeads: 2, headDim: 16 };
const row = shape.kvHeads * shape.headDim;
const kvt = (data: Float32Array, tokens: number): KvTensor => ({ data, dtype: 'f32', tokens, heads: shape.kvHeads, dim: shape.headDim });
const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');
const fds = () => readdirSync('/proc/self/fd').length;

/**
 * A seeded churn script: each tick closes some open sequences, opens new ones (random prompt
 * lengths), then queues attend() for every layer over all open sequences WITHOUT awaiting in
 * between (calls are queued in order). Returns every output, keyed by tick/layer/entry.
 */
async function churn(rt: Runtime, seed: number, ticks: number): Promise<string[]> {
  const r = rng(seed);
  const open: { seq: number; id: number }[] = [];
  let nextId = 0;
  const outs: Promise<string[]>[] = [];
  for (let tick = 0; tick < ticks; tick++) {
    for (const s of [...open]) if (r() < 0.3) {
      open.splice(open.indexOf(s), 1);
      await rt.closeSequence(s.seq);
    }
    while (open.length < 5 && r() < 0.6) {
      const seq = rt.createSequence();
      const id = nextId++;
      const T = 40 + Math.floor(r() * 200);
      for (let l = 0; l < shape.layers; l++) void rt.prefill(seq, l, kvt(randn(T * row, 100 * id + l), T), kvt(randn(T * row, 100 * id + 50 + l), T));
      open.push({ seq, id });
    }
    if (open.length === 0) continue;
    for (let l = 0; l < shape.layers; l++) {
      const batch = open.map((s) => ({
        seq: s.seq,
        q: randn(shape.qHeads * shape.headDim, 7 * tick + 1000 * s.id + l),
        kNew: randn(row, 11 * tick + 1000 * s.id + l + 1),
        vNew: randn(row, 13 * tick + 1000 * s.id + l + 2),
      }));
      outs.push(rt.attend(l, batch).then((o) => o.map((x, i) => `${tick}/${l}/${batch[i]!.seq}:${bits(x)}`)));
    }
  }
  return (await Promise.all(outs)).flat();
}

describe('Runtime concurrency and faults', () => {
  it('sequences joining and leaving at random while decoding: pipelined == sequential, bit for bit (with a hot tier)', async () => {
    distPath('src/pipeline/decode-stages.js');
    const opts: RuntimeOptions = { shape, budget: 24, microBatch: 2, maxSequences: 6, maxTokens: 300, hotTier: { windows: 2, maxBytes: 1 << 22 } };
    const seq = await openRuntime({ ...opts, mode: 'sequential' });
    const pip = await openRuntime({ ...opts, mode: 'pipelined' });
    const a = await churn(seq, 3, 12);
    const b = await churn(pip, 3, 12);
    expect(a.length).toBeGreaterThan(30);
    expect(b).toEqual(a);
    // two selection workers, each holding every index and catching up on skipped steps
    const two = await openRuntime({ ...opts, mode: 'pipelined', selectionThreads: 2 });
    expect(await churn(two, 3, 12)).toEqual(a);
    const sel = (await two.stats()).stages!.find((x) => x.stage === 'selection')!;
    expect(sel.threads).toBe(2);
    expect(sel.items).toBe((await pip.stats()).stages!.find((x) => x.stage === 'selection')!.items); // every micro-batch selected once
    await two.close();
    const st = await pip.stats();
    expect(st.hits + st.misses).toBeGreaterThan(0);
    await seq.close();
    await pip.close();
  });

  it('killing the compute worker between steps: it is replaced and outputs stay equal to sequential', async () => {
    const opts: RuntimeOptions = { shape, budget: 16, microBatch: 1, maxSequences: 2, maxTokens: 300 };
    const run = async (rt: Runtime, kill: boolean) => {
      const seqs = [rt.createSequence(), rt.createSequence()];
      for (const [i, s] of seqs.entries()) for (let l = 0; l < 2; l++) await rt.prefill(s, l, kvt(randn(100 * row, i * 10 + l), 100), kvt(randn(100 * row, i * 10 + l + 5), 100));
      const outs: string[] = [];
      for (let t = 0; t < 4; t++) {
        if (kill && t === 2) await rt.killStageWorker('compute');
        const o = await rt.attend(0, seqs.map((s, i) => ({ seq: s, q: randn(64, t * 10 + i), kNew: randn(row, t * 10 + i + 1), vNew: randn(row, t * 10 + i + 2) })));
        outs.push(...o.map(bits));
      }
      return outs;
    };
    const ref = await openRuntime({ ...opts, mode: 'sequential' });
    const pip = await openRuntime({ ...opts, mode: 'pipelined' });
    expect(await run(pip, true)).toEqual(await run(ref, false));
    const compute = (await pip.stats()).stages!.find((s) => s.stage === 'compute')!;
    expect(compute.restarts).toBe(1);
    await ref.close();
    await pip.close();
  });

  it('killing the selection worker (the index owner) mid-decode: the batch it held fails with E_WORKER or completes; the replacement rebuilds the indexes and decoding goes on', async () => {
    const rt = await openRuntime({ shape, budget: 16, mode: 'pipelined', maxSequences: 2, maxTokens: 300 });
    const seqs = [rt.createSequence(), rt.createSequence()];
    for (const [i, s] of seqs.entries()) for (let l = 0; l < 2; l++) await rt.prefill(s, l, kvt(randn(200 * row, i * 10 + l), 200), kvt(randn(200 * row, i * 10 + l + 5), 200));
    const entry = (t: number) => seqs.map((s, i) => ({ seq: s, q: randn(64, t * 10 + i), kNew: randn(row, t + i + 1), vNew: randn(row, t + i + 2) }));
    await rt.attend(0, entry(0));
    const inFlight = rt.attend(0, entry(1)).then(
      () => 'ok',
      (e: unknown) => (isKvdriveError(e, 'E_WORKER') ? 'E_WORKER' : e),
    );
    await rt.killStageWorker('selection');
    expect(['ok', 'E_WORKER']).toContain(await inFlight);
    for (let t = 2; t < 5; t++) {
      const out = await rt.attend(t % 2, entry(t));
      for (const o of out) expect(o.every(Number.isFinite)).toBe(true);
    }
    const sel = (await rt.stats()).stages!.find((s) => s.stage === 'selection')!;
    expect(sel.restarts).toBe(1);
    await rt.close();
  });

  it('back-pressure: 16 micro-batches for 4 arena slots never put more than 4 in flight; nothing is dropped', async () => {
    const opts: RuntimeOptions = { shape, budget: 16, microBatch: 1, maxSequences: 16, maxTokens: 200 };
    const go = async (rt: Runtime) => {
      const seqs = Array.from({ length: 16 }, () => rt.createSequence());
      for (const [i, s] of seqs.entries()) await rt.prefill(s, 0, kvt(randn(80 * row, i), 80), kvt(randn(80 * row, i + 99), 80));
      const o = await rt.attend(0, seqs.map((s, i) => ({ seq: s, q: randn(64, i), kNew: randn(row, i + 1), vNew: randn(row, i + 2) })));
      return { outs: o.map(bits), st: await rt.stats() };
    };
    const pip = await openRuntime({ ...opts, mode: 'pipelined' });
    const ref = await openRuntime({ ...opts, mode: 'sequential' });
    const p = await go(pip);
    const s = await go(ref);
    expect(p.outs).toEqual(s.outs);
    expect(p.st.microBatches).toBe(16);
    expect(p.st.maxInFlight).toBe(4);
    expect(s.st.maxInFlight).toBe(1);
    await pip.close();
    await ref.close();
  });

  it('close() leaves no threads and no file descriptors (pipelined, hot tier, after decoding)', async () => {
    const threads0 = await osThreads();
    const fd0 = fds();
    const rt = await openRuntime({ shape, budget: 16, mode: 'pipelined', maxSequences: 3, maxTokens: 300, hotTier: { windows: 1, maxBytes: 1 << 22 } });
    await churn(rt, 9, 4);
    expect(await osThreads()).toBeGreaterThanOrEqual(threads0 + 3); // three stage workers
    await rt.close();
    expect(await osThreads()).toBe(threads0);
    expect(fds()).toBe(fd0);
  });
});
