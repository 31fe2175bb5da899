// The worker / ring faults of a stage pool, each provoked at an exact point of the worker loop by
// fault injection (StageFault): a death after popping a descriptor, a death after handing one on,
// and a control message posted while the worker is about to sleep. Needs `npm run build:ts`.
import { describe, expect, it } from 'vitest';
import { readdirSync } from 'node:fs';
import { Pipeline } from '../src/pipeline/pipeline.js';
import { StagePool } from '../src/pipeline/stage-pool.js';
import { RingQueue } from '../src/pipeline/ring-queue.js';
import { expectKvdError } from './helpers.js';
import { osThreads } from './threads.js';
import { distPath, testWorker } from './dist.js';

distPath('src/pipeline/stage-worker.js');
const fixture = testWorker('stage-fixture.mjs');
const stage = (name: string, add: number) => ({ name, module: fixture, init: { mul: 1, add } });
const fds = () => readdirSync('/proc/self/fd').length;

/** Resolves once word 0 of `gate` is non-zero. */
async function arrived(gate: SharedArrayBuffer): Promise<void> {
  const g = new Int32Array(gate);
  while (Atomics.load(g, 0) === 0) {
    const w = Atomics.waitAsync(g, 0, 0, 50);
    if (w.async) await w.value;
  }
}

describe('stage worker faults', () => {
  it('a worker dying right after it popped a descriptor rejects that batch with E_WORKER (attend does not hang) and the pool recovers', async () => {
    const p = await Pipeline.start({ stages: [{ ...stage('a', 0), faults: [{ point: 'popped', action: 'exit', nth: 2 }] }, stage('b', 1)], words: 4 });
    expect((await p.submit([0, 1, 0, 0]))[3]).toBe(2);
    await expectKvdError(() => p.submit([0, 2, 0, 0]), 'E_WORKER', /stage 'a' worker 0: expected it to finish batch \d+, got the worker dying/);
    expect((await p.submit([0, 3, 0, 0]))[3]).toBe(4);
    const st = await p.stats();
    expect(st.stages[0]!.restarts).toBe(1);
    expect([st.completed, st.failed]).toEqual([2, 1]);
    await p.close();
  }, 15_000);

  it('a worker dying right after it handed a descriptor on does not reject it: the next stage finishes the batch', async () => {
    const gate = new SharedArrayBuffer(8);
    const p = await Pipeline.start({
      stages: [{ ...stage('a', 10), faults: [{ point: 'pushed', action: 'exit' }] }, { name: 'b', module: fixture, init: { mul: 1, add: 1, gate } }],
      words: 4,
    });
    const pools = (p as unknown as { pools: StagePool[] }).pools;
    const batch = p.submit([5, 5, 0, 0]).then((r) => r[3], (e: unknown) => e);
    await arrived(gate); // stage b holds the batch (its arena slot, in the runtime) ...
    while (pools[0]!.restartCount === 0) await new Promise((r) => setTimeout(r, 10)); // ... when a's death is handled
    await new Promise((r) => setTimeout(r, 50));
    Atomics.store(new Int32Array(gate), 1, 1);
    // stage a: c = a + 10, stage b: c = a + 1 (from the same a): 6 proves b finished it
    expect(await batch).toBe(6);
    const st = await p.stats();
    expect([st.completed, st.failed]).toEqual([1, 0]);
    expect((await p.submit([0, 7, 0, 0]))[3]).toBe(8);
    await p.close();
  }, 15_000);

  it('a control message posted between the worker’s control check and its ring wait wakes it (no lost wake-up)', async () => {
    const input = RingQueue.create({ capacity: 4, words: 5, spinMicros: 0 });
    const output = RingQueue.create({ capacity: 4, words: 5, spinMicros: 0 });
    const gate = new SharedArrayBuffer(8);
    // A worker that missed the wake-up would sleep a whole idle slice: a minute here.
    const pool = await StagePool.start({
      ...stage('s', 0),
      input,
      output,
      spinMicros: 0,
      idleSliceMs: 60_000,
      onBatchError: () => {},
      faults: [{ point: 'beforeWait', action: 'gate', gate }],
    });
    await arrived(gate); // the worker checked its control word and stands before the wait
    const stats = pool.stats(); // posts, announces, wakes
    await new Promise((r) => setTimeout(r, 20));
    Atomics.store(new Int32Array(gate), 1, 1); // let it go on into the wait
    expect((await stats).items).toBe(0);
    await pool.close();
  }, 10_000);

  it('a worker exceeding its resourceLimits dies like a crash: its batch fails with E_WORKER, a replacement takes over', async () => {
    const p = await Pipeline.start({ stages: [{ ...stage('a', 1), resourceLimits: { maxOldGenerationSizeMb: 24 } }], words: 4 });
    await expectKvdError(() => p.submit([6, 1, 0, 0]), 'E_WORKER', /stage 'a' worker 0: expected it to finish batch \d+, got the worker dying \(uncaught .*memory/i);
    expect((await p.submit([0, 2, 0, 0]))[3]).toBe(3);
    expect((await p.stats()).stages[0]!.restarts).toBe(1);
    await p.close();
    await expectKvdError(() => Pipeline.start({ stages: [{ ...stage('a', 1), resourceLimits: { maxOldGenerationSizeMb: -1 } }], words: 4 }), 'E_CONFIG', /resourceLimits: expected an object of positive numbers/);
  }, 20_000);

  it('after deaths and replacements, close() leaves no threads and no file descriptors', async () => {
    const threads0 = await osThreads();
    const fd0 = fds();
    const p = await Pipeline.start({ stages: [{ ...stage('a', 0), threads: 2 }, stage('b', 0)], words: 4 });
    await expectKvdError(() => p.submit([2, 0, 0, 0]), 'E_WORKER', /dying/);
    await expectKvdError(() => p.submit([3, 0, 0, 0]), 'E_WORKER', /dying/);
    expect((await p.submit([0, 4, 0, 0]))[3]).toBe(4);
    await p.stats();
    await p.close();
    expect(await osThreads()).toBe(threads0);
    expect(fds()).toBe(fd0);
  }, 15_000);
});
