// Pipelined runtime under churn: sequences join and leave at random while decoding (outputs
// bit-identical to a sequential runtime running the same script), back-pressure when the host
// submits more micro-batches than run at once, and close() leaving no threads or file descriptors.
import { readdirSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { openRuntime, type Runtime, type RuntimeOptions } from '../src/runtime/runtime.js';
import type { KvTensor } from '../src/types.js';
import { randn, rng } from './helpers.js';
import { osThreads } from './threads.js';

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

describe('Runtime concurrency', () => {
  it('sequences joining and leaving at random while decoding: pipelined == sequential, bit for bit (with a hot tier)', async () => {
    const opts: RuntimeOptions = { shape, budget: 24, microBatch: 2, maxSequences: 6, maxTokens: 300, hotTier: { windows: 2, maxBytes: 1 << 22 } };
    const seq = await openRuntime({ ...opts, mode: 'sequential' });
    const pip = await openRuntime({ ...opts, mode: 'pipelined' });
    const a = await churn(seq, 3, 12);
    const b = await churn(pip, 3, 12);
    expect(a.length).toBeGreaterThan(30);
    expect(b).toEqual(a);
    const st = await pip.stats();
    expect(st.hits + st.misses).toBeGreaterThan(0);
    await seq.close();
    await pip.close();
  });

  it('back-pressure: 16 micro-batches never run more than 4 at once; nothing is dropped', async () => {
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
    await rt.close();
    expect(await osThreads()).toBe(threads0);
    expect(fds()).toBe(fd0);
  });
});
