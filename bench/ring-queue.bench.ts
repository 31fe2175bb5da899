/**
 * Descriptor hand-off latency between threads, in one run (results in bench/pipeline.md):
 *   1. worker ↔ worker round trip (stage to stage): ring spin-then-wait, ring pure wait, postMessage
 *   2. main ↔ worker round trip (submit/complete): ring spin + waitAsync, ring pure waitAsync,
 *      postMessage
 *   3. paced one-way worker → worker (a descriptor every G µs, so a sleeper has time to fall
 *      asleep): same three strategies, G = 20 µs and 200 µs
 * Hand-off latency = round trip / 2 in 1–2. Ratios are against postMessage measured in the same run.
 * In 1–2 a fourth variant echoes through a HandoffRecord (pop and push under the ring's side locks,
 * with claims), which is how stage workers hand descriptors on; compare it with 'ring pure wait'.
 *
 * Run: npm run build:ts && node dist/bench/ring-queue.bench.js [--time 500] [--spin 50]
 */
import { MessageChannel, Worker } from 'node:worker_threads';
import { fileURLToPath } from 'node:url';
import { Bench } from 'tinybench';
import { RingQueue } from '../src/pipeline/ring-queue.js';
import { roundTripTasks, type EchoRing } from './handoff-worker.js';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const TIME_MS = arg('time', 500);
const SPIN = arg('spin', 50);
const PACED_COUNT = arg('paced', 2000);
const workerFile = fileURLToPath(new URL('./handoff-worker.js', import.meta.url));

function start(data: Record<string, unknown>, transfer: unknown[] = []): { w: Worker; msg: Promise<unknown>; exit: Promise<number> } {
  const w = new Worker(workerFile, { workerData: data, transferList: transfer as never });
  const msg = new Promise<unknown>((r) => w.once('message', r));
  const exit = new Promise<number>((r) => w.once('exit', r));
  w.on('error', (e) => {
    console.error(e);
    process.exitCode = 1;
  });
  return { w, msg, exit };
}

const mkRing = (spinMicros: number, record = false): EchoRing => ({
  ping: RingQueue.create({ capacity: 8, words: 4 }).buffer,
  pong: RingQueue.create({ capacity: 8, words: 4 }).buffer,
  spinMicros,
  record,
});

function closeRing(r: EchoRing): void {
  RingQueue.attach(r.ping).close();
}

interface Row {
  name: string;
  p50: number;
  p99: number;
  mean: number;
  samples: number;
}

const us = (ms: number) => (ms * 1000).toFixed(1);

function table(title: string, rows: Row[], baseline: string, halve: boolean): void {
  const base = rows.find((r) => r.name === baseline)!;
  console.log(`\n### ${title}\n`);
  console.log(`| strategy | ${halve ? 'hand-off (RTT/2)' : 'one-way'} p50 µs | p99 µs | mean µs | ratio vs ${baseline} (p50) | samples |`);
  console.log('|---|---|---|---|---|---|');
  const f = halve ? 0.5 : 1;
  for (const r of rows)
    console.log(`| ${r.name} | ${us(r.p50 * f)} | ${us(r.p99 * f)} | ${us(r.mean * f)} | ${(r.p50 / base.p50).toFixed(3)} | ${r.samples} |`);
}

async function workerToWorker(): Promise<Row[]> {
  const spin = mkRing(SPIN);
  const wait = mkRing(0);
  const rec = mkRing(0, true);
  const ch = new MessageChannel();
  const echoes = [start({ role: 'echo-ring', ...spin }), start({ role: 'echo-ring', ...wait }), start({ role: 'echo-port', port: ch.port2 }, [ch.port2]), start({ role: 'echo-ring', ...rec })];
  const pinger = start(
    {
      role: 'pinger',
      timeMs: TIME_MS,
      rings: [
        { name: `ring spin ${SPIN}µs then wait`, ring: spin },
        { name: 'ring pure wait', ring: wait },
        { name: 'ring pure wait, echo via hand-off record', ring: rec },
      ],
      port: ch.port1,
    },
    [ch.port1],
  );
  const rows = (await pinger.msg) as Row[];
  closeRing(spin);
  closeRing(wait);
  closeRing(rec);
  await echoes[2]!.w.terminate(); // the port echo has no loop to leave
  await Promise.all([echoes[0]!.exit, echoes[1]!.exit, echoes[3]!.exit, pinger.exit]);
  return rows;
}

async function mainToWorker(): Promise<Row[]> {
  const spin = mkRing(SPIN);
  const wait = mkRing(0);
  const rec = mkRing(0, true);
  const ch = new MessageChannel();
  const echoes = [start({ role: 'echo-ring', ...spin }), start({ role: 'echo-ring', ...wait }), start({ role: 'echo-port', port: ch.port2 }, [ch.port2]), start({ role: 'echo-ring', ...rec })];
  const bench = new Bench({ time: TIME_MS, warmupTime: 100 });
  roundTripTasks(
    bench,
    [
      { name: `ring spin ${SPIN}µs then waitAsync`, ring: spin },
      { name: 'ring pure waitAsync', ring: wait },
      { name: 'ring pure waitAsync, echo via hand-off record', ring: rec },
    ],
    ch.port1,
    false,
  );
  await bench.run();
  closeRing(spin);
  closeRing(wait);
  closeRing(rec);
  ch.port1.close();
  await echoes[2]!.w.terminate();
  await Promise.all([echoes[0]!.exit, echoes[1]!.exit, echoes[3]!.exit]);
  return bench.tasks.map((t) => {
    const l = (t.result as { latency: { p50: number; p99: number; mean: number; samplesCount: number } }).latency;
    return { name: t.name, p50: l.p50, p99: l.p99, mean: l.mean, samples: l.samplesCount };
  });
}

function quantile(sorted: Float64Array, q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
}

async function paced(gapMicros: number): Promise<Row[]> {
  const rows: Row[] = [];
  const variants: [string, number | 'port'][] = [
    [`ring spin ${SPIN}µs then wait`, SPIN],
    ['ring pure wait', 0],
    ['postMessage', 'port'],
  ];
  for (const [name, mode] of variants) {
    let recv, send;
    if (mode === 'port') {
      const ch = new MessageChannel();
      recv = start({ role: 'paced-recv', port: ch.port1, count: PACED_COUNT, spinMicros: 0 }, [ch.port1]);
      send = start({ role: 'paced-send', port: ch.port2, count: PACED_COUNT, gapMicros, spinMicros: 0 }, [ch.port2]);
    } else {
      const ring = RingQueue.create({ capacity: 8, words: 2 }).buffer;
      recv = start({ role: 'paced-recv', ring, count: PACED_COUNT, spinMicros: mode });
      send = start({ role: 'paced-send', ring, count: PACED_COUNT, gapMicros, spinMicros: mode });
    }
    const lat = (await recv.msg) as Float64Array;
    await send.msg;
    await Promise.all([recv.exit, send.exit]);
    const skip = Math.floor(lat.length / 10); // warm-up
    const s = Float64Array.from(lat.subarray(skip)).sort();
    const mean = s.reduce((a, b) => a + b, 0) / s.length;
    rows.push({ name, p50: quantile(s, 0.5) / 1000, p99: quantile(s, 0.99) / 1000, mean: mean / 1000, samples: s.length });
  }
  return rows;
}

const loadBefore = (await import('node:os')).loadavg()[0]!.toFixed(2);
console.log(`# ring-queue hand-off bench (node ${process.version}, ${(await import('node:os')).cpus().length} CPUs, load avg ${loadBefore}, tinybench time ${TIME_MS} ms/task)`);
const ww = await workerToWorker();
table('worker ↔ worker round trip (stage → stage)', ww, 'postMessage', true);
const mw = await mainToWorker();
table('main ↔ worker round trip (submit → complete)', mw, 'postMessage', true);
for (const gap of [20, 200]) table(`paced one-way worker → worker, one descriptor every ${gap} µs`, await paced(gap), 'postMessage', false);

// Share of a 1 ms layer step: a pipelined micro-batch crosses 4 hand-offs (main→S, S→F, F→C, C→main).
const pick = (rows: Row[], match: (name: string) => boolean) => rows.find((r) => match(r.name))!.p50 / 2;
const perStep = (prefix: string, record: boolean) => {
  const m = (n: string) => n.startsWith(prefix) && n.includes('hand-off record') === record;
  return pick(ww, m) * 2 + pick(mw, m) * 2;
};
console.log('\n### Share of a 1 ms layer step (4 hand-offs per micro-batch: 2 main↔worker + 2 worker↔worker, p50)\n');
console.log('| strategy | µs per micro-batch | share of 1 ms |');
console.log('|---|---|---|');
for (const [p, rec] of [['ring spin', false], ['ring pure', false], ['ring pure', true], ['postMessage', false]] as const)
  console.log(`| ${p}${rec ? ' (workers via hand-off records)' : ''} | ${(perStep(p, rec) * 1000).toFixed(1)} | ${(perStep(p, rec) * 100).toFixed(1)}% |`);
