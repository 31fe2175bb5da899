// Ring queue: validation, FIFO/wrap/back-pressure on one thread, then real concurrency between
// workers. Worker tests load the compiled queue: run `npm run build:ts` first.
import { describe, expect, it } from 'vitest';
import { Worker } from 'node:worker_threads';
import { pathToFileURL } from 'node:url';
import { RingQueue } from '../src/pipeline/ring-queue.js';
import { expectKvdError } from './helpers.js';
import { distPath, testWorker } from './dist.js';

const ringModule = () => pathToFileURL(distPath('src/pipeline/ring-queue.js')).href;

type Msg = Record<string, unknown>;

/** Starts a worker and collects its messages; `next()` resolves with the next one. */
function startWorker(script: string, workerData: Msg) {
  const w = new Worker(testWorker(script), { workerData });
  const inbox: Msg[] = [];
  const waiters: ((m: Msg) => void)[] = [];
  let failure: Error | undefined;
  w.on('message', (m: Msg) => {
    const r = waiters.shift();
    if (r) r(m);
    else inbox.push(m);
  });
  w.on('error', (e) => (failure = e));
  const exited = new Promise<number>((res) => w.on('exit', res));
  return {
    worker: w,
    exited,
    pending: () => inbox.length,
    next: () =>
      new Promise<Msg>((res, rej) => {
        if (failure) return rej(failure);
        const m = inbox.shift();
        if (m) res(m);
        else waiters.push(res);
      }),
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('RingQueue validation', () => {
  it('rejects bad options with E_CONFIG', async () => {
    await expectKvdError(() => RingQueue.create({ capacity: 6, words: 2 }), 'E_CONFIG', /capacity: expected a power of two/);
    await expectKvdError(() => RingQueue.create({ capacity: 1, words: 2 }), 'E_CONFIG', /capacity/);
    await expectKvdError(() => RingQueue.create({ capacity: 8, words: 0 }), 'E_CONFIG', /words: expected an integer in \[1, 1024\], got 0/);
    await expectKvdError(() => RingQueue.create({ capacity: 8, words: 2, spinMicros: -1 }), 'E_CONFIG', /spinMicros/);
    await expectKvdError(() => RingQueue.create(null as never), 'E_CONFIG', /options: expected an object/);
  });

  it('rejects foreign buffers and wrong descriptor shapes', async () => {
    await expectKvdError(() => RingQueue.attach(new ArrayBuffer(1024) as never), 'E_TYPE', /SharedArrayBuffer/);
    await expectKvdError(() => RingQueue.attach(new SharedArrayBuffer(1024)), 'E_CONFIG', /made by RingQueue.create/);
    const q = RingQueue.create({ capacity: 4, words: 3 });
    await expectKvdError(() => q.tryPush([1, 2]), 'E_SHAPE', /expected 3 words, got 2/);
    await expectKvdError(() => q.tryPush(5 as never), 'E_TYPE', /descriptor/);
    await expectKvdError(() => q.tryPop(new Int32Array(2)), 'E_SHAPE', /at least 3 words, got 2/);
    await expectKvdError(() => q.tryPop(new Float32Array(3) as never), 'E_TYPE', /Int32Array/);
  });
});

describe('RingQueue on one thread', () => {
  it('is FIFO across many wrap-arounds and reports full instead of dropping', () => {
    const q = RingQueue.create({ capacity: 4, words: 2 });
    const out = new Int32Array(2);
    let pushed = 0;
    let popped = 0;
    for (let round = 0; round < 50; round++) {
      while (q.tryPush([pushed, 1000 - pushed])) pushed++;
      expect(q.size).toBe(4);
      const take = 1 + (round % 4);
      for (let i = 0; i < take; i++) {
        expect(q.tryPop(out)).toBe('item');
        expect(Array.from(out)).toEqual([popped, 1000 - popped]);
        popped++;
      }
    }
    while (q.tryPop(out) === 'item') expect(out[0]).toBe(popped++);
    expect(popped).toBe(pushed);
    expect(q.tryPop(out)).toBe('idle');
  });

  it('keeps order across the 32-bit position wrap', () => {
    const q = RingQueue.create({ capacity: 8, words: 1, startPosition: -5 } as never);
    const out = new Int32Array(1);
    for (let i = 0; i < 40; i++) {
      expect(q.tryPush([i])).toBe(true);
      expect(q.tryPush([i + 1000])).toBe(true);
      expect(q.tryPop(out)).toBe('item');
      expect(out[0]).toBe(i);
      expect(q.tryPop(out)).toBe('item');
      expect(out[0]).toBe(i + 1000);
    }
  });

  it('close: pushes fail with E_CLOSED, consumers drain then see the end', async () => {
    const q = RingQueue.create({ capacity: 4, words: 1 });
    q.tryPush([1]);
    q.tryPush([2]);
    q.close();
    expect(q.closed).toBe(true);
    await expectKvdError(() => q.tryPush([3]), 'E_CLOSED', /expected an open queue, got one that was closed/);
    const out = new Int32Array(1);
    expect(q.tryPop(out)).toBe('item');
    expect(out[0]).toBe(1);
    expect(await q.popAsync(out)).toBe(true);
    expect(out[0]).toBe(2);
    expect(await q.popAsync(out)).toBe(false);
    expect(q.tryPop(out)).toBe('closed');
  });

  it('abort: every operation fails with E_CLOSED', async () => {
    const q = RingQueue.create({ capacity: 4, words: 1 });
    q.tryPush([1]);
    q.abort();
    await expectKvdError(() => q.tryPop(new Int32Array(1)), 'E_CLOSED', /aborted/);
    await expectKvdError(() => q.pushAsync([2]), 'E_CLOSED', /aborted/);
  });
});

describe('RingQueue between threads (compiled dist/)', () => {
  it('hands 2 million descriptors from one worker to another in order, none lost', async () => {
    const count = 2_000_000;
    const q = RingQueue.create({ capacity: 256, words: 4 });
    const consumer = startWorker('ring-peer.mjs', { ringModule: ringModule(), buffer: q.buffer, role: 'consume', strict: true });
    const producer = startWorker('ring-peer.mjs', { ringModule: ringModule(), buffer: q.buffer, role: 'produce', count, id: 3 });
    expect(await producer.next()).toEqual({ done: count });
    q.close();
    const r = await consumer.next();
    expect(r.errors).toEqual([]);
    expect(r.received).toBe(count);
    expect(r.seqSums).toEqual({ 3: (count * (count - 1)) / 2 });
    await Promise.all([producer.exited, consumer.exited]);
  });

  it('with two producers and two consumers, every descriptor arrives exactly once', async () => {
    const count = 200_000;
    const q = RingQueue.create({ capacity: 64, words: 3 });
    const data = { ringModule: ringModule(), buffer: q.buffer };
    const consumers = [0, 1].map(() => startWorker('ring-peer.mjs', { ...data, role: 'consume', strict: false }));
    const producers = [1, 2].map((id) => startWorker('ring-peer.mjs', { ...data, role: 'produce', count, id }));
    for (const p of producers) expect(await p.next()).toEqual({ done: count });
    q.close();
    const results = await Promise.all(consumers.map((c) => c.next()));
    let received = 0;
    const sums: Record<string, number> = { 1: 0, 2: 0 };
    for (const r of results) {
      expect(r.errors).toEqual([]);
      received += r.received as number;
      for (const [id, s] of Object.entries(r.seqSums as Record<string, number>)) sums[id]! += s;
    }
    expect(received).toBe(2 * count);
    expect(sums).toEqual({ 1: (count * (count - 1)) / 2, 2: (count * (count - 1)) / 2 });
  });

  it('close racing two producers: every push that returned is consumed exactly once, the others throw E_CLOSED', async () => {
    for (let round = 0; round < 3; round++) {
      const q = RingQueue.create({ capacity: 16, words: 3, spinMicros: 0 });
      const data = { ringModule: ringModule(), buffer: q.buffer };
      const consumer = startWorker('ring-peer.mjs', { ...data, role: 'consume', strict: true });
      const producers = [1, 2].map((id) => startWorker('ring-peer.mjs', { ...data, role: 'produce', count: -1, id }));
      for (const p of producers) expect(await p.next()).toEqual({ started: true });
      await sleep(5 + 10 * round); // close while both are pushing
      q.close();
      const done = (await Promise.all(producers.map((p) => p.next()))) as { done: number; closedCode: string }[];
      const r = await consumer.next();
      expect(r.errors).toEqual([]);
      for (const d of done) expect(d.closedCode).toBe('E_CLOSED');
      expect(r.received).toBe(done[0]!.done + done[1]!.done);
      for (const d of done) expect(d.done).toBeGreaterThan(0);
      expect(r.seqSums).toEqual({ 1: (done[0]!.done * (done[0]!.done - 1)) / 2, 2: (done[1]!.done * (done[1]!.done - 1)) / 2 });
    }
  });

  it('back-pressure: a worker pushing into a full queue blocks until the main thread pops', async () => {
    const q = RingQueue.create({ capacity: 4, words: 1, spinMicros: 0 });
    for (let i = 0; i < 4; i++) q.tryPush([i]);
    const w = startWorker('ring-sleeper.mjs', { ringModule: ringModule(), buffer: q.buffer, op: 'push' });
    expect(await w.next()).toEqual({ started: true });
    await sleep(50);
    expect(w.pending()).toBe(0); // still blocked: the push neither returned nor dropped
    expect(q.size).toBe(4);
    const out = new Int32Array(1);
    expect(await q.popAsync(out)).toBe(true);
    expect(out[0]).toBe(0);
    expect(await w.next()).toEqual({ result: 'pushed' });
    const rest: number[] = [];
    while (q.tryPop(out) === 'item') rest.push(out[0]!);
    expect(rest).toEqual([1, 2, 3, 7]);
    await w.exited;
  });

  it('back-pressure end to end: a fast worker producer and the main thread consuming via waitAsync', async () => {
    const count = 5000;
    const q = RingQueue.create({ capacity: 4, words: 2 });
    const producer = startWorker('ring-peer.mjs', { ringModule: ringModule(), buffer: q.buffer, role: 'produce', count, id: 9 });
    const out = new Int32Array(2);
    for (let i = 0; i < count; i++) {
      expect(await q.popAsync(out)).toBe(true);
      if (out[1] !== i) expect(out[1]).toBe(i);
      if (i % 1000 === 0) await sleep(5); // let the producer hit the full queue
    }
    expect(await producer.next()).toEqual({ done: count });
    expect(q.tryPop(out)).toBe('idle');
  });

  it('close wakes a consumer sleeping on an empty queue (pop → false)', async () => {
    const q = RingQueue.create({ capacity: 4, words: 1, spinMicros: 0 });
    const w = startWorker('ring-sleeper.mjs', { ringModule: ringModule(), buffer: q.buffer, op: 'pop' });
    expect(await w.next()).toEqual({ started: true });
    await sleep(30);
    expect(w.pending()).toBe(0);
    q.close();
    expect(await w.next()).toEqual({ result: false });
    await w.exited;
  });

  it('close wakes a producer sleeping on a full queue (E_CLOSED)', async () => {
    const q = RingQueue.create({ capacity: 2, words: 1, spinMicros: 0 });
    q.tryPush([1]);
    q.tryPush([2]);
    const w = startWorker('ring-sleeper.mjs', { ringModule: ringModule(), buffer: q.buffer, op: 'push' });
    expect(await w.next()).toEqual({ started: true });
    await sleep(30);
    q.close();
    const m = (await w.next()) as { error: { code: string; message: string } };
    expect(m.error.code).toBe('E_CLOSED');
    // the two queued items are still there to drain
    const out = new Int32Array(1);
    expect(q.tryPop(out)).toBe('item');
    expect(q.tryPop(out)).toBe('item');
    expect(q.tryPop(out)).toBe('closed');
  });

  it('abort wakes a sleeping consumer with E_CLOSED; main-thread popAsync wakes on a worker push', async () => {
    const q = RingQueue.create({ capacity: 4, words: 1, spinMicros: 0 });
    const w = startWorker('ring-sleeper.mjs', { ringModule: ringModule(), buffer: q.buffer, op: 'pop' });
    expect(await w.next()).toEqual({ started: true });
    await sleep(30);
    q.abort();
    const m = (await w.next()) as { error: { code: string } };
    expect(m.error.code).toBe('E_CLOSED');

    const q2 = RingQueue.create({ capacity: 4, words: 1, spinMicros: 0 });
    const out = new Int32Array(1);
    const popped = q2.popAsync(out);
    const p = startWorker('ring-sleeper.mjs', { ringModule: ringModule(), buffer: q2.buffer, op: 'push' });
    expect(await popped).toBe(true);
    expect(out[0]).toBe(7);
    await p.exited;
  });
});
