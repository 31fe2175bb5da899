// The pipelined runtime's select stage: selection runs on a piscina stage worker (by index handle,
// through SharedArrayBuffer slots), a worker that dies mid-batch is replaced and the batch selected
// again with outputs equal to a crash-free run, close() joins the worker (no threads, no fds left),
// and the native index stays consistent while a worker selects on it and the owner extends it.
import { readdirSync } from 'node:fs';
import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { openRuntime, type Runtime, type RuntimeOptions } from '../src/runtime/runtime.js';
import type { MemoryRuntime } from '../src/runtime/memory-runtime.js';
import type { StageFault } from '../src/pipeline/stage-contract.js';
import { createPolicy } from '../src/index/policy.js';
import { native } from '../src/native.js';
import type { KvTensor } from '../src/types.js';
import { expectKvdError, randn } from './helpers.js';
import { KvdriveError } from '../src/errors.js';
import { osThreads } from './threads.js';

const shape = { layers: 2, qHeads: 4, kvHeads: 2, headDim: 16 };
const row = shape.kvHeads * shape.headDim;
const PROMPT = 260;
const kvt = (data: Float32Array, tokens: number): KvTensor => ({ data, dtype: 'f32', tokens, heads: shape.kvHeads, dim: shape.headDim });
const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');
const fds = () => readdirSync('/proc/self/fd').length;
const selectPipeline = (rt: Runtime) => (rt as unknown as { memory: MemoryRuntime }).memory.select!.pipeline;

const opts: RuntimeOptions = { shape, budget: 20, microBatch: 2, maxSequences: 5, maxTokens: 400 };

/**
 * 5 sequences, `steps` decode steps over both layers; `before(t)` runs before step t (fault
 * injection). Returns every output as hex, in order.
 */
async function decode(rt: Runtime, steps: number, before?: (t: number) => Promise<void>): Promise<string[]> {
  const seqs = Array.from({ length: 5 }, () => rt.createSequence());
  for (const [i, s] of seqs.entries())
    for (let l = 0; l < shape.layers; l++) await rt.prefill(s, l, kvt(randn(PROMPT * row, 10 * i + l), PROMPT), kvt(randn(PROMPT * row, 10 * i + l + 500), PROMPT));
  const outs: string[] = [];
  for (let t = 0; t < steps; t++) {
    await before?.(t);
    for (let l = 0; l < shape.layers; l++) {
      const batch = seqs.map((s, i) => ({
        seq: s,
        q: randn(shape.qHeads * shape.headDim, 1000 * t + 31 * i + l),
        kNew: randn(row, 2000 * t + 31 * i + l),
        vNew: randn(row, 3000 * t + 31 * i + l),
      }));
      outs.push(...(await rt.attend(l, batch)).map(bits));
    }
  }
  return outs;
}

async function reference(steps: number): Promise<string[]> {
  const rt = await openRuntime({ ...opts, mode: 'sequential' });
  try {
    expect((await rt.stats()).selectStage).toBeUndefined();
    return await decode(rt, steps);
  } finally {
    await rt.close();
  }
}

/** A pipelined decode with `fault` armed in the select worker before step `at`. */
async function withFault(steps: number, at: number, fault: StageFault) {
  const rt = await openRuntime({ ...opts, mode: 'pipelined' });
  try {
    const outs = await decode(rt, steps, async (t) => {
      if (t === at) await selectPipeline(rt).arm(0, 0, fault);
    });
    return { outs, st: await rt.stats() };
  } finally {
    await rt.close();
  }
}

describe('pipelined runtime: select stage on a piscina worker', () => {
  it('every micro-batch is selected on the stage worker (none inline); outputs equal sequential mode bit for bit', async () => {
    const ref = await reference(3);
    const rt = await openRuntime({ ...opts, mode: 'pipelined' });
    const outs = await decode(rt, 3);
    const st = await rt.stats();
    const stage = (await selectPipeline(rt).stats()).stages[0]!;
    await rt.close();
    expect(outs).toEqual(ref);
    // 3 steps x 2 layers x 5 entries, in micro-batches of 2 (3 per attend)
    expect(st.selectStage).toEqual({ onWorker: 30, inline: 0, retries: 0, restarts: 0 });
    expect(stage.items).toBe(18);
    expect(st.maxInFlight).toBe(3);
  }, 30_000);

  it('a select worker dying right after it took a micro-batch: replaced, the batch selected again, outputs equal a crash-free run', async () => {
    const ref = await reference(4);
    const { outs, st } = await withFault(4, 2, { point: 'popped', action: 'exit', nth: 2 });
    expect(outs).toEqual(ref);
    expect(st.selectStage).toMatchObject({ retries: 1, restarts: 1, inline: 0, onWorker: 40 });
  }, 30_000);

  it('a select worker dying right after it handed a micro-batch on: nothing to redo, outputs equal a crash-free run', async () => {
    const ref = await reference(3);
    const { outs, st } = await withFault(3, 1, { point: 'pushed', action: 'exit' });
    expect(outs).toEqual(ref);
    expect(st.selectStage).toMatchObject({ retries: 0, restarts: 1, inline: 0, onWorker: 30 });
  }, 30_000);

  it('a select worker terminated between steps (killWorker) is replaced; decoding carries on with equal outputs', async () => {
    const ref = await reference(3);
    const rt = await openRuntime({ ...opts, mode: 'pipelined' });
    const outs = await decode(rt, 3, async (t) => {
      if (t === 1) await selectPipeline(rt).killWorker(0);
    });
    const st = await rt.stats();
    await rt.close();
    expect(outs).toEqual(ref);
    expect(st.selectStage).toMatchObject({ retries: 0, restarts: 1, inline: 0 });
  }, 30_000);

  it('a select stage that cannot go on (no replacement worker) falls back to selecting inline: decoding carries on with equal outputs', async () => {
    const ref = await reference(3);
    const rt = await openRuntime({ ...opts, mode: 'pipelined' });
    const outs = await decode(rt, 3, async (t) => {
      // What the pool's onFatal does when a replacement cannot start (test/stage-pool.test.ts
      // covers that path for real): the pipeline stops for good and rejects every submission.
      if (t === 1) (selectPipeline(rt) as unknown as { fail(e: Error): void }).fail(new KvdriveError('E_WORKER', 'test: expected a replacement worker, got none'));
    });
    const st = await rt.stats();
    await rt.close();
    expect(outs).toEqual(ref);
    // step 0 on the worker (2 layers x 5 entries); steps 1-2 inline (20), nothing retried
    expect(st.selectStage).toMatchObject({ onWorker: 10, inline: 20, retries: 0, fallback: 'test: expected a replacement worker, got none' });
  }, 30_000);

  it('close() joins the select worker (replacement included): no threads and no file descriptors left', async () => {
    const threads0 = await osThreads();
    const fd0 = fds();
    const rt = await openRuntime({ ...opts, mode: 'pipelined' });
    expect(await osThreads()).toBeGreaterThan(threads0); // the stage worker runs
    await decode(rt, 2, async (t) => {
      if (t === 1) await selectPipeline(rt).arm(0, 0, { point: 'popped', action: 'exit' });
    });
    expect((await rt.stats()).selectStage!.restarts).toBe(1);
    await rt.close();
    expect(await osThreads()).toBe(threads0);
    expect(fds()).toBe(fd0);
  }, 30_000);
});

describe('SelectionIndex by handle (native selectIndex)', () => {
  // Small segments: extends keep closing segments (re-clustering, growing the segment list), the
  // mutations a select racing them without the lock would see half done.
  const build = async () => {
    const p = createPolicy('kvdrive', { qHeads: 4, kvHeads: 2, headDim: 16, segmentTokens: 64 });
    const T = 2400;
    const k = kvt(randn(T * row, 77), T);
    await p.build(kvt(k.data.subarray(0, 400 * row), 400), 400);
    return { p, k };
  };

  it('selects what policy.select selects; an unknown handle is E_CLOSED', async () => {
    const { p } = await build();
    const q = randn(64, 5);
    const a = p.select(q, 24);
    const b = native.selectIndex(p.handle(), q, 24);
    expect(Array.from(b.chunkIds)).toEqual(Array.from(a.chunkIds));
    expect(Array.from(b.offsets)).toEqual(Array.from(a.offsets));
    expect(p.handle()).toBe(p.handle());
    await expectKvdError(() => native.selectIndex(0x7ffffff0, q, 24), 'E_CLOSED', /selection index handle/);
    await expectKvdError(() => native.selectIndex(-1, q, 24), 'E_CLOSED', /selectIndex handle/);
    await expectKvdError(() => native.selectIndex(p.handle(), q, 0), 'E_BUDGET', /budget/);
  });

  it('kv head ranges selected one by one and concatenated equal the whole selection; a bad range is E_RANGE', async () => {
    const { p } = await build();
    for (const seed of [5, 6, 7]) {
      const q = randn(64, seed);
      const whole = native.selectIndex(p.handle(), q, 24);
      const ids: number[] = [];
      const offsets = [0];
      let bytes = 0;
      for (let h = 0; h < 2; h++) {
        const g = native.selectIndex(p.handle(), q, 24, undefined, undefined, h, h + 1);
        expect(g.offsets.length).toBe(2);
        ids.push(...g.chunkIds);
        offsets.push(ids.length);
        bytes += g.bytesScored;
        expect([g.tokens, g.sinkEnd, g.tailStart, g.chunkSize]).toEqual([whole.tokens, whole.sinkEnd, whole.tailStart, whole.chunkSize]);
      }
      expect(ids).toEqual(Array.from(whole.chunkIds));
      expect(offsets).toEqual(Array.from(whole.offsets));
      expect(bytes).toBe(whole.bytesScored);
      const both = native.selectIndex(p.handle(), q, 24, undefined, undefined, 0, 2);
      expect(Array.from(both.chunkIds)).toEqual(Array.from(whole.chunkIds));
    }
    const q = randn(64, 5);
    await expectKvdError(() => native.selectIndex(p.handle(), q, 24, undefined, undefined, 2, 3), 'E_RANGE', /headBegin/);
    await expectKvdError(() => native.selectIndex(p.handle(), q, 24, undefined, undefined, 1, 1), 'E_RANGE', /headEnd/);
    await expectKvdError(() => native.selectIndex(p.handle(), q, 24, undefined, undefined, 0, 3), 'E_RANGE', /headEnd/);
    await expectKvdError(() => native.selectIndex(p.handle(), q, 24, undefined, undefined, 0), 'E_TYPE', /headEnd/);
  });

  it('a worker thread selecting by handle while the owner extends: every selection is one the index gives before or after some extend (read/write lock)', async () => {
    const { p, k } = await build();
    const handle = p.handle();
    const stop = new SharedArrayBuffer(4);
    const q = Float32Array.from({ length: 64 }, (_, i) => Math.sin(i));
    const key = (r: { tokens: number; offsets: Int32Array; chunkIds: Int32Array }) => `${r.tokens}|${r.offsets.join(',')}|${r.chunkIds.join(',')}`;
    const src = `
      const { workerData, parentPort } = require('node:worker_threads');
      const m = require(${JSON.stringify(process.cwd() + '/build/Release/kvdrive.node')});
      const stop = new Int32Array(workerData.stop);
      const seen = new Set();
      let n = 0;
      while (Atomics.load(stop, 0) === 0) {
        const r = m.selectIndex(workerData.handle, workerData.q, 24);
        seen.add(r.tokens + '|' + r.offsets.join(',') + '|' + r.chunkIds.join(','));
        if (n++ === 0) parentPort.postMessage('selecting');
      }
      parentPort.postMessage({ n, seen: [...seen] });`;
    const w = new Worker(src, { eval: true, workerData: { handle, stop, q } });
    const next = () => new Promise<unknown>((res, rej) => (w.once('message', res), w.once('error', rej)));
    const first = next();
    // What a select may see: the index's selection at each context length the owner passes through.
    const states = new Set([key(p.select(q, 24))]);
    expect(await first).toBe('selecting');
    const result = next() as Promise<{ n: number; seen: string[] }>;
    for (let T = 401; T <= 2400; T++) {
      p.extend(kvt(k.data.subarray(0, T * row), T), T);
      states.add(key(p.select(q, 24)));
      if (T % 5 === 0) await new Promise((r) => setImmediate(r));
    }
    Atomics.store(new Int32Array(stop), 0, 1);
    const { n, seen } = await result;
    await w.terminate();
    expect(n).toBeGreaterThan(10);
    expect(seen.length).toBeGreaterThan(1); // it selected on more than one state
    expect(seen.filter((s) => !states.has(s))).toEqual([]);
  }, 30_000);
});
