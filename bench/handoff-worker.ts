/**
 * Worker side of bench/ring-queue.bench.ts (compiled to dist/bench/handoff-worker.js). Roles:
 *   echo-ring   pop from `ping`, push the same descriptor to `pong`, until `ping` is closed
 *   echo-port   echo every message on `port`
 *   pinger      run a tinybench suite of round trips against echo workers; post the results
 *   paced-send  push/post `count` timestamped descriptors, busy-waiting `gapMicros` between sends
 *   paced-recv  receive them and record one-way latency (µs) per item; post the samples
 * Timestamps are process.hrtime (CLOCK_MONOTONIC, the same clock in every thread) in ns, split into
 * two Int32 words.
 */
import { parentPort, workerData, type MessagePort } from 'node:worker_threads';
import { Bench } from 'tinybench';
import { HANDOFF_HEADER_WORDS, HandoffRecord, RingQueue } from '../src/pipeline/ring-queue.js';

export interface EchoRing {
  ping: SharedArrayBuffer;
  pong: SharedArrayBuffer;
  spinMicros: number;
  /** Echo through a hand-off record (as stage workers do: pop lock, claims, push lock). */
  record?: boolean;
}

const nowNs = () => Number(process.hrtime.bigint());
const TWO32 = 2 ** 32;

function busyWaitMicros(us: number): void {
  const end = nowNs() + us * 1000;
  while (nowNs() < end);
}

async function echoRing(d: EchoRing): Promise<void> {
  const ping = RingQueue.attach(d.ping, { spinMicros: d.spinMicros });
  const pong = RingQueue.attach(d.pong, { spinMicros: d.spinMicros });
  if (!d.record) {
    const desc = new Int32Array(ping.words);
    while (ping.pop(desc)) pong.push(desc);
    return;
  }
  const words = new Int32Array(new SharedArrayBuffer((HANDOFF_HEADER_WORDS + ping.words) * 4));
  const record = new HandoffRecord(words, 0, ping.words);
  record.reset(1);
  const opts = { record };
  for (;;) {
    const s = ping.popWait(record.desc, Infinity, opts);
    if (s === 'closed') return;
    if (s === 'item') pong.push(record.desc, record);
  }
}

/** Round-trip tasks for a tinybench run: each task is one ping and its pong. */
export function roundTripTasks(
  bench: Bench,
  rings: { name: string; ring: EchoRing }[],
  port: MessagePort | undefined,
  blocking: boolean,
): void {
  for (const { name, ring } of rings) {
    const ping = RingQueue.attach(ring.ping, { spinMicros: ring.spinMicros });
    const pong = RingQueue.attach(ring.pong, { spinMicros: ring.spinMicros });
    const d = new Int32Array(ping.words);
    if (blocking) {
      bench.add(name, () => {
        ping.push(d);
        pong.pop(d);
      });
    } else {
      bench.add(name, async () => {
        ping.tryPush(d);
        await pong.popAsync(d);
      });
    }
  }
  if (port) {
    let resolve: (() => void) | undefined;
    port.on('message', () => resolve?.());
    bench.add('postMessage', () =>
      new Promise<void>((r) => {
        resolve = r;
        port.postMessage(0);
      }),
    );
  }
}

async function pinger(d: { rings: { name: string; ring: EchoRing }[]; port: MessagePort; timeMs: number }): Promise<void> {
  const bench = new Bench({ time: d.timeMs, warmupTime: 100 });
  roundTripTasks(bench, d.rings, d.port, true);
  await bench.run();
  parentPort!.postMessage(
    bench.tasks.map((t) => {
      const r = t.result as { latency?: { p50: number; p99: number; mean: number; samplesCount: number } };
      return { name: t.name, p50: r.latency!.p50, p99: r.latency!.p99, mean: r.latency!.mean, samples: r.latency!.samplesCount };
    }),
  );
  d.port.close();
}

async function pacedSend(d: { ring?: SharedArrayBuffer; port?: MessagePort; spinMicros: number; count: number; gapMicros: number }): Promise<void> {
  const q = d.ring ? RingQueue.attach(d.ring, { spinMicros: d.spinMicros }) : undefined;
  const desc = new Int32Array(2);
  for (let i = 0; i < d.count; i++) {
    busyWaitMicros(d.gapMicros);
    const t = nowNs();
    if (q) {
      desc[0] = Math.floor(t / TWO32);
      desc[1] = t % TWO32 | 0;
      q.push(desc);
    } else d.port!.postMessage(t);
  }
  if (q) q.close();
  else d.port!.postMessage(-1);
  parentPort!.postMessage('sent');
  d.port?.close();
}

async function pacedRecv(d: { ring?: SharedArrayBuffer; port?: MessagePort; spinMicros: number; count: number }): Promise<void> {
  const lat = new Float64Array(d.count);
  let n = 0;
  if (d.ring) {
    const q = RingQueue.attach(d.ring, { spinMicros: d.spinMicros });
    const desc = new Int32Array(2);
    while (q.pop(desc)) {
      const t = nowNs();
      lat[n++] = (t - (desc[0]! * TWO32 + (desc[1]! >>> 0))) / 1000;
    }
  } else {
    await new Promise<void>((done) => {
      d.port!.on('message', (t: number) => {
        if (t < 0) {
          d.port!.close();
          return done();
        }
        lat[n++] = (nowNs() - t) / 1000;
      });
    });
  }
  parentPort!.postMessage(lat.subarray(0, n));
}

if (parentPort && workerData?.role) {
  const d = workerData;
  if (d.role === 'echo-ring') await echoRing(d);
  else if (d.role === 'echo-port') (d.port as MessagePort).on('message', (m) => (d.port as MessagePort).postMessage(m));
  else if (d.role === 'pinger') await pinger(d);
  else if (d.role === 'paced-send') await pacedSend(d);
  else if (d.role === 'paced-recv') await pacedRecv(d);
}
