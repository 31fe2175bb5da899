/**
 * The pipeline's win on long contexts with SSD-backed KV (results in bench/pipeline.md §3-4).
 *
 * Both modes run the SAME runtime configuration (Llama-like GQA 32/8 heads, head dim 128, prompts
 * of --context tokens sealed to an SsdStore under a --dram byte DRAM budget, O_DIRECT reads by
 * default) on the same inputs:
 *   sequential: the calling thread does selection, the fetch (waiting for the I/O) and compute in
 *               turn, entry after entry;
 *   pipelined:  micro-batches overlap: selection on the select stage's piscina worker ∥ SSD reads
 *               on the I/O engine's threads ∥ attention off the JS thread (the JS thread appends
 *               and extends the indexes, and dispatches).
 * Modes alternate round by round so load drifts hit both alike. Throughput = sequence-layer steps
 * per second (batch entries / wall time of attend); the figure is pipelined / sequential from the
 * same run; the median wall ms per layer step and the process CPU ms per layer step (all threads,
 * process.cpuUsage: less sensitive to the machine's load than wall time) are given beside it. Stall fraction = share of attend() wall time during which attention compute was not
 * running (RuntimeStats.stallMs / wallMs). `--batches 1,2,4,8` sweeps the batch size (paper Fig. 24).
 *
 * Run: npm run build:ts && node dist/bench/pipeline-win.js [--context 32768] [--budget 1024]
 *      [--batches 4] [--micro 1] [--steps 6] [--rounds 3] [--layers 1] [--direct 1] [--dir /tmp/x]
 *      [--dram 1073741824] [--tier N] [--qd 32] [--json out.json]
 */
import { cpus, loadavg, tmpdir } from 'node:os';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { openRuntime, type Runtime, type RuntimeStats } from '../src/runtime/runtime.js';
import { ioUringAvailable } from '../src/storage/io-engine.js';
import { Worker } from 'node:worker_threads';
import { median, uniform } from './bench-util.js';

/**
 * Cores this process can get right now: the same fixed CPU loop run on 1 thread, then on 2 threads
 * at once; capacity = 2 x t1 / t2 (2.0: two idle cores, 1.0: the machine gives us one core's worth).
 * The pipeline can only beat sequential by using a second core, so every row reports this beside it.
 */
async function capacity(): Promise<number> {
  const code = `const { parentPort } = require('node:worker_threads'); let x = 0; const t = performance.now();
    for (let i = 0; i < 3e7; i++) x = (x * 1664525 + 1013904223) % 4294967296; parentPort.postMessage([performance.now() - t, x]);`;
  const once = () =>
    new Promise<number>((res, rej) => {
      const w = new Worker(code, { eval: true });
      w.once('message', (m: [number, number]) => res(m[0]));
      w.once('error', rej);
    });
  const t1 = await once();
  const t2 = Math.max(...(await Promise.all([once(), once()])));
  return (2 * t1) / t2;
}

const arg = (name: string, dflt: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1]! : dflt;
};
const CONTEXT = Number(arg('context', '32768'));
const BUDGET = Number(arg('budget', '1024'));
const BATCHES = arg('batches', '4').split(',').map(Number);
const MICRO = Number(arg('micro', '1'));
const STEPS = Number(arg('steps', '6'));
const ROUNDS = Number(arg('rounds', '3'));
const LAYERS = Number(arg('layers', '1'));
const DIRECT = arg('direct', '1') === '1';
const JSON_OUT = arg('json', '');
/** --dram B: the runtime's DRAM budget in bytes (the DRAM tier caches part of the sealed KV). */
const DRAM = Number(arg('dram', String(2 ** 30)));
/** --tier N: a hot tier with windows xN in front of compute (SSD reads only its misses). */
const TIER = Number(arg('tier', '0'));
/** --qd N: I/O engine queue depth (reads in flight). */
const QD = Number(arg('qd', '32'));
const shape = { layers: LAYERS, qHeads: 32, kvHeads: 8, headDim: 128 };
const ROW = shape.kvHeads * shape.headDim;
const MAXB = Math.max(...BATCHES);
const root = mkdtempSync(join(arg('dir', tmpdir()), 'kvd-win-'));

async function setup(mode: 'sequential' | 'pipelined'): Promise<{ rt: Runtime; seqs: number[] }> {
  const maxTokens = CONTEXT + ROUNDS * (STEPS + 2) * BATCHES.length + 16;
  const rt = await openRuntime({
    shape,
    budget: BUDGET,
    mode,
    microBatch: MICRO,
    maxSequences: MAXB,
    maxTokens,
    dramBudget: DRAM + (TIER > 0 ? 2 ** 33 : 0),
    ssd: { dir: join(root, mode), direct: DIRECT, io: { queueDepth: QD } },
    ...(TIER > 0 ? { hotTier: { windows: TIER, maxBytes: 2 ** 33 } } : {}),
  });
  const seqs: number[] = [];
  for (let s = 0; s < MAXB; s++) {
    const seq = rt.createSequence();
    seqs.push(seq);
    for (let l = 0; l < LAYERS; l++) {
      // Keys with cluster structure (a few directions plus noise) so selection is not degenerate.
      const k = uniform(CONTEXT * ROW, 1 + s * 10 + l);
      const dirs = uniform(16 * ROW, 7 + s);
      for (let t = 0; t < CONTEXT; t++) {
        const d = (t * 2654435761) % 16;
        for (let i = 0; i < ROW; i++) k[t * ROW + i] = 0.3 * k[t * ROW + i]! + dirs[d * ROW + i]!;
      }
      const kt = { data: k, dtype: 'f32' as const, tokens: CONTEXT, heads: shape.kvHeads, dim: shape.headDim };
      await rt.prefill(seq, l, kt, { ...kt, data: uniform(CONTEXT * ROW, 100 + s * 10 + l) });
    }
  }
  return { rt, seqs };
}

/** Decode steps over every layer for the first `batch` sequences; returns the wall ms of each attend (and its process CPU ms into `cpu`). */
async function run(rt: Runtime, seqs: number[], batch: number, steps: number, seed: number, cpu: number[] = []): Promise<number[]> {
  const times: number[] = [];
  for (let t = 0; t < steps; t++)
    for (let l = 0; l < LAYERS; l++) {
      const entries = seqs.slice(0, batch).map((seq, i) => ({
        seq,
        q: uniform(shape.qHeads * shape.headDim, seed + t * 97 + i * 13 + l),
        kNew: uniform(ROW, seed + t * 89 + i * 7 + l),
        vNew: uniform(ROW, seed + t * 83 + i * 5 + l),
      }));
      const c0 = process.cpuUsage();
      const t0 = performance.now();
      await rt.attend(l, entries);
      times.push(performance.now() - t0);
      const c = process.cpuUsage(c0);
      cpu.push((c.user + c.system) / 1000);
    }
  return times;
}

const sum = (x: number[]) => x.reduce((a, b) => a + b, 0);
const diff = (b: RuntimeStats, a: RuntimeStats) => ({
  wall: b.wallMs - a.wallMs,
  sel: b.selectionMs - a.selectionMs,
  fetch: b.fetchMs - a.fetchMs,
  comp: b.computeMs - a.computeMs,
  stall: b.stallMs - a.stallMs,
  ssdMiB: (b.ssdBytes - a.ssdBytes) / 2 ** 20,
  readMiB: (b.ssdReadBytes - a.ssdReadBytes) / 2 ** 20,
  steps: b.attendCalls - a.attendCalls,
  hitRate: (b.hits - a.hits) / Math.max(1, b.hits - a.hits + b.misses - a.misses),
});

const t0 = performance.now();
const uring = ioUringAvailable();
console.log(
  `# pipeline win: layers ${LAYERS}, GQA ${shape.qHeads}/${shape.kvHeads}, headDim ${shape.headDim}, context ${CONTEXT}, budget ${BUDGET}, microBatch ${MICRO}, ` +
    `SSD ${DIRECT ? 'O_DIRECT' : 'page cache'}, DRAM budget ${DRAM} B, queue depth ${QD}, hot tier ${TIER > 0 ? `windows x${TIER}` : 'none'} (io_uring ${uring.usable ? 'usable' : `not usable: ${uring.reason}`}); ${cpus().length} CPUs, load avg ${loadavg()[0]!.toFixed(2)}`,
);
const seq = await setup('sequential');
const pip = await setup('pipelined');
console.log(`# setup (prefill + SSD seal of ${MAXB} sequences x 2 runtimes): ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
console.log('| batch | sequential steps/s | pipelined steps/s | throughput ratio pip/seq | median ms per layer step seq / pip | CPU ms per layer step seq / pip | stall fraction seq / pip | sequential selection / fetch / compute ms per layer step | pipelined selection / fetch / compute ms per layer step | SSD MiB per layer step, payload / read: seq; pip | hot-tier hit rate | load | cores available before / after |');
console.log('|---|---|---|---|---|---|---|---|---|---|---|---|---|');
const rows: unknown[] = [];
for (const batch of BATCHES) {
  await run(seq.rt, seq.seqs, batch, 1, 1); // warm-up
  await run(pip.rt, pip.seqs, batch, 1, 1);
  const capBefore = await capacity();
  const s0 = await seq.rt.stats();
  const p0 = await pip.rt.stats();
  const ts: number[] = [];
  const tp: number[] = [];
  const cs: number[] = [];
  const cp: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    // alternate which mode goes first so a load change inside a round does not favour one
    const order = r % 2 === 0 ? ([seq, pip] as const) : ([pip, seq] as const);
    for (const m of order) (m === seq ? ts : tp).push(...(await run(m.rt, m.seqs, batch, STEPS, 1000 + r * 31, m === seq ? cs : cp)));
  }
  const s = diff(await seq.rt.stats(), s0);
  const p = diff(await pip.rt.stats(), p0);
  const cap = [capBefore, await capacity()];
  const thrS = (batch * ts.length) / (sum(ts) / 1000);
  const thrP = (batch * tp.length) / (sum(tp) / 1000);
  const per = (x: number, n: number) => (x / n).toFixed(1);
  const row = {
    batch,
    seqStepsPerS: thrS,
    pipStepsPerS: thrP,
    ratio: thrP / thrS,
    medianMs: [median(ts), median(tp)],
    cpuMs: [sum(cs) / cs.length, sum(cp) / cp.length],
    stallSeq: s.stall / s.wall,
    stallPip: p.stall / p.wall,
    seq: s,
    pip: p,
    load: loadavg()[0],
    capacity: cap,
  };
  rows.push(row);
  console.log(
    `| ${batch} | ${thrS.toFixed(1)} | ${thrP.toFixed(1)} | **${row.ratio.toFixed(2)}×** | ${row.medianMs[0]!.toFixed(1)} / ${row.medianMs[1]!.toFixed(1)} | ` +
      `${row.cpuMs[0]!.toFixed(1)} / ${row.cpuMs[1]!.toFixed(1)} | ${row.stallSeq.toFixed(2)} / ${row.stallPip.toFixed(2)} | ` +
      `${per(s.sel, s.steps)} / ${per(s.fetch, s.steps)} / ${per(s.comp, s.steps)} | ${per(p.sel, p.steps)} / ${per(p.fetch, p.steps)} / ${per(p.comp, p.steps)} | ` +
      `${per(s.ssdMiB, s.steps)} / ${per(s.readMiB, s.steps)}; ${per(p.ssdMiB, p.steps)} / ${per(p.readMiB, p.steps)} | ${s.hitRate.toFixed(2)} | ${loadavg()[0]!.toFixed(1)} | ${cap[0]!.toFixed(2)} / ${cap[1]!.toFixed(2)} |`,
  );
}
const stage = (await pip.rt.stats()).selectStage;
if (stage) console.log(`\n# pipelined select stage: ${stage.onWorker} entries selected on the worker, ${stage.inline} inline, ${stage.retries} retries, ${stage.restarts} restarts`);
await seq.rt.close();
await pip.rt.close();
rmSync(root, { recursive: true, force: true });
if (JSON_OUT) writeFileSync(JSON_OUT, JSON.stringify({ context: CONTEXT, budget: BUDGET, micro: MICRO, direct: DIRECT, rows }, null, 1));
console.log(`\n# total ${((performance.now() - t0) / 1000).toFixed(1)} s`);
