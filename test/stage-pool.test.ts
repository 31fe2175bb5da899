// Stage pools and pipelines over real worker threads. Workers load compiled code: run
// `npm run build:ts` before these tests.
import { describe, expect, it } from 'vitest';
import { availableParallelism } from 'node:os';
import { Pipeline, resolveSpinMicros } from '../src/pipeline/pipeline.js';
import { StagePool } from '../src/pipeline/stage-pool.js';
import { RingQueue } from '../src/pipeline/ring-queue.js';
import { expectKvdError } from './helpers.js';
import { osThreads } from './threads.js';
import { readdirSync } from 'node:fs';
import { distPath, testWorker } from './dist.js';

distPath('src/pipeline/stage-worker.js'); // fail early with the build hint
const fixture = testWorker('stage-fixture.mjs');
const fds = () => readdirSync('/proc/self/fd').length;
const stage = (name: string, mul: number, add: number, extra: Record<string, unknown> = {}) => ({
  name,
  module: fixture,
  init: { mul, add, ...extra },
});

describe('Pipeline of stage pools', () => {
  it('runs many batches through two stages over shared memory, nothing over postMessage per batch', async () => {
    const before = await osThreads();
    const fd0 = fds();
    const arena = new SharedArrayBuffer(8 * 8);
    const p = await Pipeline.start({ stages: [stage('a', 2, 1), stage('b', 3, 0, { arena })], words: 4, capacity: 8 });
    const n = 2000;
    // stage a: c = 2a+1; stage b reads its own a (unchanged) so c = 3a; b also sums c into arena[slot]
    const results = await Promise.all(Array.from({ length: n }, (_, i) => p.submit([0, i, i % 8, 0])));
    results.forEach((r, i) => expect(Array.from(r)).toEqual([0, i, i % 8, 3 * i]));
    const sums = new Float64Array(arena);
    for (let s = 0; s < 8; s++) {
      let want = 0;
      for (let i = s; i < n; i += 8) want += 3 * i;
      expect(sums[s]).toBe(want);
    }
    const st = await p.stats();
    expect(st.completed).toBe(n);
    expect(st.stages.map((s) => [s.stage, s.items, s.errors])).toEqual([
      ['a', n, 0],
      ['b', n, 0],
    ]);
    await p.close();
    expect(await osThreads()).toBe(before);
    expect(fds()).toBe(fd0);
  });

  it('a throwing stage function rejects only its batch with E_WORKER; the next batch succeeds', async () => {
    const p = await Pipeline.start({ stages: [stage('a', 1, 0), stage('b', 1, 5)], words: 4 });
    const ok1 = p.submit([0, 1, 0, 0]);
    const bad = p.submit([1, 42, 0, 0]);
    const ok2 = p.submit([0, 2, 0, 0]);
    await expectKvdError(() => bad, 'E_WORKER', /stage 'a' worker 0: expected the stage function to process batch \d+, got Error: boom 42/);
    expect((await ok1)[3]).toBe(6);
    expect((await ok2)[3]).toBe(7);
    expect((await p.submit([0, 3, 0, 0]))[3]).toBe(8);
    const st = await p.stats();
    expect(st.stages[0]!.errors).toBe(1);
    expect(st.failed).toBe(1);
    await p.close();
  });

  it('a worker that calls process.exit rejects its batch with E_WORKER, is replaced, and the next batch succeeds', async () => {
    const before = await osThreads();
    const fd0 = fds();
    const p = await Pipeline.start({ stages: [stage('a', 1, 0), stage('b', 1, 1)], words: 4 });
    await expectKvdError(() => p.submit([2, 0, 0, 0]), 'E_WORKER', /stage 'a' worker 0: expected it to finish batch \d+, got the worker dying \(exit code 3\)/);
    expect((await p.submit([0, 10, 0, 0]))[3]).toBe(11);
    const st = await p.stats();
    expect(st.stages[0]!.restarts).toBe(1);
    await p.close();
    expect(await osThreads()).toBe(before);
    expect(fds()).toBe(fd0);
  });

  it('an uncaught error inside a worker rejects its batch with E_WORKER and the pool recovers', async () => {
    const p = await Pipeline.start({ stages: [stage('a', 1, 0), stage('b', 1, 1)], words: 4 });
    await expectKvdError(() => p.submit([3, 0, 0, 0]), 'E_WORKER', /stage 'a' worker 0: expected it to finish batch \d+, got the worker dying \(uncaught Error: async boom\)/);
    expect((await p.submit([0, 4, 0, 0]))[3]).toBe(5);
    await p.close();
  });

  it('with two threads in a stage, a death rejects only the dead worker’s batch', async () => {
    const p = await Pipeline.start({ stages: [{ ...stage('a', 1, 0), threads: 2 }], words: 4 });
    const many = Array.from({ length: 200 }, (_, i) => p.submit([0, i, 0, 0]));
    const dead = p.submit([2, 0, 0, 0]);
    await expectKvdError(() => dead, 'E_WORKER', /dying/);
    (await Promise.all(many)).forEach((r, i) => expect(r[3]).toBe(i));
    expect((await p.submit([0, 9, 0, 0]))[3]).toBe(9);
    await p.close();
  });

  it('a replacement that cannot start is fatal: outstanding and later batches fail with E_WORKER', async () => {
    const before = await osThreads();
    const fd0 = fds();
    const starts = new SharedArrayBuffer(4 * 4);
    // stage b's healthy worker then leaves on the aborted rings: that is not a death to replace
    const startsB = new SharedArrayBuffer(4 * 4);
    const p = await Pipeline.start({ stages: [stage('a', 1, 0, { starts, failOnRespawn: true }), stage('b', 1, 0, { starts: startsB })], words: 4 });
    await expectKvdError(() => p.submit([2, 0, 0, 0]), 'E_WORKER', /dying/);
    // the replacement refuses to start; wait until the pipeline knows
    for (let i = 0; i < 200 && Atomics.load(new Int32Array(starts), 0) < 2; i++) await new Promise((r) => setTimeout(r, 10));
    await new Promise((r) => setTimeout(r, 50));
    await expectKvdError(() => p.submit([0, 1, 0, 0]), 'E_WORKER', /expected a replacement worker .* replacement refused/);
    await new Promise((r) => setTimeout(r, 50));
    expect(Atomics.load(new Int32Array(startsB), 0)).toBe(1); // b was never "replaced"
    await p.close();
    expect(await osThreads()).toBe(before);
    expect(fds()).toBe(fd0);
  });

  it('close rejects outstanding batches with E_CLOSED, leaves no threads, and later use fails', async () => {
    const before = await osThreads();
    const fd0 = fds();
    const p = await Pipeline.start({ stages: [stage('a', 1, 0), stage('b', 1, 0)], words: 4, capacity: 2 });
    expect(await osThreads()).toBeGreaterThan(before);
    // settle() observes each rejection now, so none is unhandled while close() runs
    const settle = (x: Promise<Int32Array>) => x.then(() => undefined, (e: unknown) => e);
    const stuck = settle(p.submit([4, 0, 0, 0])); // spins forever inside stage a
    const queued = [1, 2, 3].map((i) => settle(p.submit([0, i, 0, 0])));
    await new Promise((r) => setTimeout(r, 20));
    await p.close(); // terminates the spinning worker after the close timeout
    await expectKvdError(async () => { throw await stuck; }, 'E_CLOSED', /got the pipeline closed first/);
    for (const q of queued) await expectKvdError(async () => { throw await q; }, 'E_CLOSED');
    await expectKvdError(() => p.submit([0, 1, 0, 0]), 'E_CLOSED', /expected an open pipeline/);
    await expectKvdError(() => p.stats(), 'E_CLOSED');
    expect(await osThreads()).toBe(before);
    expect(fds()).toBe(fd0);
  });

  it('control plane: stats and configure reach sleeping workers', async () => {
    const p = await Pipeline.start({ stages: [stage('a', 1, 0)], words: 4, spinMicros: 0 });
    await new Promise((r) => setTimeout(r, 20)); // the worker is asleep in Atomics.wait now
    p.configure({ spinMicros: 10 });
    const st = await p.stats();
    expect(st.stages[0]!.items).toBe(0);
    expect((await p.submit([0, 1, 0, 0]))[3]).toBe(1);
    expect((await p.stats()).stages[0]!.items).toBe(1);
    await p.close();
  });
});

describe('control requests', () => {
  it('reach every worker, finish before the next batch runs, and keep handler error codes', async () => {
    const p = await Pipeline.start({ stages: [{ ...stage('a', 1, 0), threads: 2 }], words: 4 });
    expect((await p.submit([0, 5, 0, 0]))[3]).toBe(5);
    const replies = (await p.control(0, { set: 100 })) as { worker: number; add: number }[];
    expect(replies).toEqual([
      { worker: 0, add: 100 },
      { worker: 1, add: 100 },
    ]);
    const after = await Promise.all([1, 2, 3, 4].map((i) => p.submit([0, i, 0, 0])));
    expect(after.map((r) => r[3])).toEqual([101, 102, 103, 104]);
    await expectKvdError(() => p.control(0, { fail: 'E_SHAPE' }), 'E_SHAPE', /refused E_SHAPE/);
    await expectKvdError(() => p.control(0, { fail: 'E_WHATEVER' }), 'E_WORKER', /control: E_WHATEVER/);
    await expectKvdError(() => p.control(3, {}), 'E_RANGE', /stage: expected an index in \[0, 1\)/);
    await p.close();
  });

  it('a replacement worker replays the control requests of `replay` before taking batches', async () => {
    let add = 0;
    const p = await Pipeline.start({ stages: [{ ...stage('a', 1, 0), replay: () => [{ set: add }] }], words: 4 });
    await p.control(0, { set: 50 });
    add = 50; // what the host records as the stage's state
    expect((await p.submit([0, 1, 0, 0]))[3]).toBe(51);
    await expectKvdError(() => p.submit([2, 0, 0, 0]), 'E_WORKER', /dying/);
    // the replacement starts with init.add = 0 but must see the replayed {set: 50} first
    expect((await p.submit([0, 2, 0, 0]))[3]).toBe(52);
    expect((await p.stats()).stages[0]!.restarts).toBe(1);
    await p.close();
  });

  it('a stage without a control handler answers E_CONFIG', async () => {
    const p = await Pipeline.start({ stages: [stage('a', 1, 0, { plain: true })], words: 4 });
    await expectKvdError(() => p.control(0, {}), 'E_CONFIG', /without/);
    await p.close();
  });
});

describe('validation', () => {
  it("spinMicros 'auto' spins only when every thread can have its own core", async () => {
    expect(resolveSpinMicros('auto', availableParallelism())).toBe(50);
    expect(resolveSpinMicros('auto', availableParallelism() + 1)).toBe(0);
    expect(resolveSpinMicros(7, 1000)).toBe(7);
    await expectKvdError(() => resolveSpinMicros(-1, 1), 'E_CONFIG', /spinMicros: expected 'auto' or a number/);
    await expectKvdError(() => Pipeline.start({ stages: [stage('a', 1, 0)], words: 4, spinMicros: 'fast' as never }), 'E_CONFIG', /spinMicros/);
  });

  it('rejects bad pipeline and stage options with typed errors', async () => {
    await expectKvdError(() => Pipeline.start({ stages: [], words: 4 }), 'E_CONFIG', /stages: expected a non-empty array/);
    await expectKvdError(() => Pipeline.start({ stages: [stage('a', 1, 0)], words: 0 }), 'E_CONFIG', /words/);
    await expectKvdError(() => Pipeline.start({ stages: [stage('a', 1, 0)], words: 4, capacity: 3 }), 'E_CONFIG', /capacity/);
    await expectKvdError(() => Pipeline.start({ stages: [{ ...stage('a', 1, 0), threads: 0 }], words: 4 }), 'E_CONFIG', /threads: expected an integer in \[1, 16\], got 0/);
    await expectKvdError(() => Pipeline.start({ stages: [{ name: 'a', module: 'rel/path.js' }], words: 4 }), 'E_CONFIG', /module: expected an absolute path/);
    const p = await Pipeline.start({ stages: [stage('a', 1, 0)], words: 4 });
    await expectKvdError(() => p.submit([1, 2]), 'E_SHAPE', /expected 4 int32 words/);
    await p.close();
  });

  it('a stage whose createStage throws fails start with E_WORKER and leaves no threads', async () => {
    const before = await osThreads();
    const fd0 = fds();
    await expectKvdError(() => Pipeline.start({ stages: [stage('a', 1, 0, { failInit: true })], words: 4 }), 'E_WORKER', /expected createStage to succeed, got Error: init refused/);
    expect(await osThreads()).toBe(before);
    expect(fds()).toBe(fd0);
  });

  it('a worker that exits during start-up fails start with E_WORKER and is not restarted', async () => {
    const before = await osThreads();
    const fd0 = fds();
    await expectKvdError(() => Pipeline.start({ stages: [stage('a', 1, 0, { exitInit: true })], words: 4 }), 'E_WORKER', /expected it to start, got exit code 5/);
    expect(await osThreads()).toBe(before);
    expect(fds()).toBe(fd0);
  });

  it('StagePool.close terminates a worker stuck in its stage function after closeTimeoutMs', async () => {
    const input = RingQueue.create({ capacity: 4, words: 5 });
    const output = RingQueue.create({ capacity: 4, words: 5 });
    const errors: number[] = [];
    const pool = await StagePool.start({ ...stage('s', 1, 0), input, output, onBatchError: (t) => errors.push(t), closeTimeoutMs: 100 });
    input.tryPush([7, 4, 0, 0, 0]);
    await new Promise((r) => setTimeout(r, 20));
    await pool.close();
    expect(pool.spawned).toBe(1);
    expect(errors).toEqual([]); // a requested shutdown is not a death
  });
});
