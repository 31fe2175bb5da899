// Hand-off records under real thread deaths: relay workers (pop from ring a into their record,
// push to ring b) are terminated at random instants while the main thread streams tickets through;
// after each death the rings salvage the dead worker's record. Every ticket must come out of ring b
// exactly once or be reported as held by a dead worker exactly once, and the rings must never
// wedge. Needs `npm run build:ts`.
import { describe, expect, it } from 'vitest';
import { Worker } from 'node:worker_threads';
import { pathToFileURL } from 'node:url';
import { HANDOFF_HEADER_WORDS, HANDOFF_HELD, HANDOFF_IDLE, HandoffRecord, RingQueue } from '../src/pipeline/ring-queue.js';
import { expectKvdError } from './helpers.js';
import { rng } from './helpers.js';
import { distPath, testWorker } from './dist.js';

const ringModule = () => pathToFileURL(distPath('src/pipeline/ring-queue.js')).href;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function relayUnderKills(workers: number, kills: number, seed: number) {
  const words = 3;
  const a = RingQueue.create({ capacity: 8, words, spinMicros: 0 });
  const b = RingQueue.create({ capacity: 8, words, spinMicros: 0 });
  const stride = HANDOFF_HEADER_WORDS + words;
  const control = new SharedArrayBuffer(workers * stride * 4);
  const records = Array.from({ length: workers }, (_, i) => new HandoffRecord(new Int32Array(control), i * stride, words));
  const threads: Worker[] = [];
  const spawn = async (i: number) => {
    records[i]!.reset(i + 1);
    const w = new Worker(testWorker('ring-relay.mjs'), { workerData: { ringModule: ringModule(), a: a.buffer, b: b.buffer, control, at: i * stride } });
    threads[i] = w;
    await new Promise((r) => w.once('message', r));
  };
  for (let i = 0; i < workers; i++) await spawn(i);

  const seen = new Map<number, number>();
  const held: number[] = [];
  let pushed = 0;
  let producing = true;
  const producer = (async () => {
    while (producing) await a.pushAsync([++pushed, pushed * 7, -pushed]);
  })();
  const consumer = (async () => {
    const d = new Int32Array(words);
    while (await b.popAsync(d)) {
      expect([d[1], d[2]]).toEqual([d[0]! * 7, -d[0]!]); // payload intact
      seen.set(d[0]!, (seen.get(d[0]!) ?? 0) + 1);
    }
  })();
  const r = rng(seed);
  for (let k = 0; k < kills; k++) {
    await sleep(1 + r() * 6); // let descriptors flow, then kill at whatever instruction it is
    const i = Math.floor(r() * workers);
    await threads[i]!.terminate();
    const rec = records[i]!;
    a.salvageConsumer(rec);
    b.salvageProducer(rec);
    if (rec.state === HANDOFF_HELD) {
      held.push(rec.desc[0]!);
      rec.set(HANDOFF_IDLE);
    }
    await spawn(i);
  }
  producing = false;
  await producer;
  // everything pushed drains through the live workers: the rings are not wedged
  let delivered = 0;
  while ((delivered = [...seen.values()].reduce((x, n) => x + n, 0)) + held.length < pushed) await sleep(5);
  b.close();
  await consumer;
  a.close();
  await Promise.all(threads.map((w) => w.terminate()));
  return { seen, held, pushed, delivered };
}

describe('ring queue hand-off records', () => {
  for (const workers of [1, 2])
    it(`${workers} relay worker(s) killed at random: every ticket is delivered or reported held, exactly once`, async () => {
      const { seen, held, pushed, delivered } = await relayUnderKills(workers, 30, 17 + workers);
      expect(pushed).toBeGreaterThan(100); // descriptors flowed between the kills
      for (const t of held) seen.set(t, (seen.get(t) ?? 0) + 1);
      expect([...seen].filter(([, n]) => n !== 1)).toEqual([]); // none twice
      expect(seen.size).toBe(pushed); // none lost
      expect(delivered + held.length).toBe(pushed);
    }, 60_000);

  it('validates records', async () => {
    const q = RingQueue.create({ capacity: 2, words: 2 });
    const words = new Int32Array(new SharedArrayBuffer(5 * 4));
    await expectKvdError(() => new HandoffRecord(new Int32Array(5), 0, 2), 'E_TYPE', /SharedArrayBuffer/);
    await expectKvdError(() => new HandoffRecord(words, 1, 2), 'E_RANGE', /hand-off record/);
    const rec = new HandoffRecord(words, 0, 2);
    await expectKvdError(() => q.push(rec.desc, rec), 'E_RANGE', /record id: expected a positive integer/);
    rec.reset(1);
    await expectKvdError(() => q.push([1, 2], rec), 'E_CONFIG', /record.desc/);
    q.push(rec.desc, rec);
    expect(rec.state).toBe(HANDOFF_IDLE);
  });
});
