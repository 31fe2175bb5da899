/**
 * One decode step of the runtime's memory model (select → fetch → attend, src/pipeline/step.ts)
 * against native dense attention over the same context, per layer-step, and the same step built
 * from another tree (the "before" of a change) — every figure a ratio to native dense measured in
 * the same process, the processes interleaved in one run (bench/runtime-memory.md has the results).
 *
 * Workload: one layer of the demo's synthetic trace (Llama-3-8B layer shape: 32 query / 8 kv heads,
 * head dim 128, f16), `--context` prompt tokens (default 32768), `--steps` decode steps (default
 * 16; the first is warm-up), budget `--budget` tokens per kv head (default 512 = 1.56%), sequential
 * mode, one sequence. Rows (each a fresh runtime on the same prefill):
 *   dense        attendDense over the contiguous f16 cache (1 thread), the baseline
 *   dram         openRuntime({ dramBudget: 1 GiB }): every sealed chunk in the DRAM tier
 *   dram-chunks  the same with policyOptions.tokenGranular false (whole-chunk selection: isolates
 *                the fetch path from the selection granularity)
 *   dram-hot     dram with a hot tier in front (windows 2: slots per kv head = 2 x budget / chunk),
 *                so the fetch stage also runs hot-tier lookup and admission
 *   ssd-<kind>   (with --io) DRAM tier of ~1/4-1/2 of the KV, SSD extents read with I/O engine <kind>
 *                (uring, pread, mmap; buffered reads so the three read the same way); with --cold
 *                the segment files' pages are dropped from the page cache before every step
 * Reported per row (steps 2..S of every round): median and minimum ms per layer-step, process CPU
 * ms per layer-step, the ratios dense / row of the medians and of the minima (> 1: faster than
 * dense; on a loaded machine the minima are the steadier figure), and for runtime rows each stage's
 * (select / fetch / attend) median and minimum, every round's prefill wall time (index build, SSD
 * write, DRAM-tier fill) and the chunks per step by tier.
 *
 * Run: npm run build:ts && node dist/bench/runtime-step.js [--context N] [--budget K] [--steps S]
 *      [--rounds R] [--before DIST] [--io uring,pread,mmap [--cold]] [--dir /tmp]
 * `--before DIST`: also run the child against another build's dist/ (e.g. a worktree of the base
 * commit, built), alternating with this one, R rounds (default 3).
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { arg, median } from './bench-util.js';

const context = Number(arg('context', '32768'));
const budget = Number(arg('budget', '512'));
const steps = Number(arg('steps', '16'));
const cold = process.argv.includes('--cold');

interface Row {
  row: string;
  medianMs: number;
  minMs: number;
  cpuMs: number;
  /** Runtime rows: median and minimum ms per layer-step of each stage (select, fetch, attend). */
  parts?: [number, number, number];
  partsMin?: [number, number, number];
  /** Runtime rows: wall ms of the prefill (index build, SSD write, DRAM-tier fill). */
  prefillMs?: number;
  extra?: string;
}

/** Child: measures every row against the dist/ rooted at `root`. */
async function child(root: string, io: string[]): Promise<Row[]> {
  const imp = (p: string) => import(pathToFileURL(join(root, p)).href);
  // A --before build from before the front door moved to src/runtime/ has it under src/pipeline/.
  const { openRuntime } = await imp('src/runtime/runtime.js').catch(() => imp('src/pipeline/runtime.js'));
  const { attendDense } = await imp('src/attention/kernels.js');
  const { generateSyntheticTrace } = await imp('src/trace/synthetic.js');
  const { toF32 } = await imp('src/util/f16.js');
  const shape = { layers: 1, qHeads: 32, kvHeads: 8, headDim: 128 };
  const row = shape.kvHeads * shape.headDim;
  const trace = generateSyntheticTrace({ layers: 1, qHeads: 32, kvHeads: 8, headDim: 128, promptTokens: context, decodeSteps: steps, dtype: 'f16' });
  const d = trace.layerData(0);
  const kv = (data: Uint16Array, tokens: number) => ({ data: data.subarray(0, tokens * row), dtype: 'f16', tokens, heads: shape.kvHeads, dim: shape.headDim });
  const K = new Uint16Array((context + steps) * row);
  const V = new Uint16Array((context + steps) * row);
  K.set(d.k);
  V.set(d.v);
  K.set(d.kNew, context * row);
  V.set(d.vNew, context * row);
  const qs = Array.from({ length: steps }, (_, s) => toF32(d.q.subarray(s * shape.qHeads * shape.headDim, (s + 1) * shape.qHeads * shape.headDim), 'f16') as Float32Array);
  // The runtime takes the new token's K/V as f32 (stored back as f16: the same bits as the cache).
  const kNew = Array.from({ length: steps }, (_, s) => toF32(d.kNew.subarray(s * row, (s + 1) * row), 'f16') as Float32Array);
  const vNew = Array.from({ length: steps }, (_, s) => toF32(d.vNew.subarray(s * row, (s + 1) * row), 'f16') as Float32Array);
  const out: Row[] = [];
  const measure = async (name: string, step: (s: number) => Promise<unknown> | unknown, parts?: () => Promise<[number, number, number]>, before?: () => void) => {
    const times: number[] = [];
    const stages: Array<[number, number, number]> = [];
    let cpu = 0;
    let prev = await parts?.();
    for (let s = 0; s < steps; s++) {
      before?.();
      const c = process.cpuUsage();
      const t = performance.now();
      await step(s);
      const dt = performance.now() - t;
      const u = process.cpuUsage(c);
      const now = await parts?.();
      if (s > 0) {
        // the first step is warm-up
        times.push(dt);
        cpu += (u.user + u.system) / 1000;
        if (now && prev) stages.push([now[0] - prev[0], now[1] - prev[1], now[2] - prev[2]]);
      }
      prev = now;
    }
    const p = stages.length ? ([0, 1, 2].map((i) => median(stages.map((x) => x[i]!))) as [number, number, number]) : undefined;
    const pm = stages.length ? ([0, 1, 2].map((i) => Math.min(...stages.map((x) => x[i]!))) as [number, number, number]) : undefined;
    out.push({ row: name, medianMs: median(times), minMs: Math.min(...times), cpuMs: cpu / times.length, parts: p, partsMin: pm });
  };
  await measure('dense', (s) => attendDense({ q: qs[s]!, qHeads: shape.qHeads, k: kv(K, context + s + 1), v: kv(V, context + s + 1), threads: 1 }));
  const runtimeRow = async (name: string, opts: Record<string, unknown>, before?: () => void) => {
    const rt = await openRuntime({ shape, budget, policy: 'kvdrive', dtype: 'f16', maxSequences: 1, maxTokens: context + steps + 64, mode: 'sequential', ...opts });
    const seq = rt.createSequence();
    const p0 = performance.now();
    await rt.prefill(seq, 0, kv(d.k, context), kv(d.v, context));
    const prefillMs = performance.now() - p0;
    await measure(
      name,
      (s) => rt.attend(0, [{ seq, q: qs[s]!, kNew: kNew[s]!, vNew: vNew[s]! }]),
      async () => {
        const st = await rt.stats();
        return [st.selectionMs, st.fetchMs, st.computeMs];
      },
      before,
    );
    const m = (await rt.stats()).memory;
    const last = out[out.length - 1]!;
    last.prefillMs = prefillMs;
    if (m?.traffic) last.extra = `chunks/step ${(m.traffic.chunks / steps).toFixed(0)} (hot ${(m.traffic.hotChunks / steps).toFixed(0)}, dram ${(m.traffic.dramChunks / steps).toFixed(0)}, ssd ${(m.traffic.ssdChunks / steps).toFixed(0)}, tail ${(m.traffic.tailChunks / steps).toFixed(0)}), DRAM tier ${(m.plan.dramTierBytes / 2 ** 20).toFixed(0)} MiB`;
    await rt.close();
  };
  await runtimeRow('dram', { dramBudget: 2 ** 30 });
  await runtimeRow('dram-chunks', { dramBudget: 2 ** 30, policyOptions: { tokenGranular: false } });
  await runtimeRow('dram-hot', { dramBudget: 2 ** 30, hotTier: { windows: 2, maxBytes: 2 ** 27 } });
  const kvBytes = context * row * 2 * 2;
  for (const kind of io) {
    const dir = mkdtempSync(join(arg('dir', tmpdir()), 'kvd-step-'));
    try {
      // Fixed parts (index reserve ~1.4-2.3 KiB per token, tails, fetch buffers ~8 MiB) first; about a
      // quarter of the KV left for the DRAM tier (the row's traffic column says how much exactly).
      // --cold: before each step (untimed) the segment files' pages are dropped from the page cache.
      const { IoEngine } = await imp('src/storage/io-engine.js');
      const dropper = cold ? new IoEngine({ kind: 'pread' }) : undefined;
      const drop = () => {
        for (const f of readdirSync(dir).filter((n) => n.endsWith('.kvseg'))) {
          const { file } = dropper.open(join(dir, f));
          dropper.dropCache(file);
          dropper.closeFile(file);
        }
      };
      // Plus the engine's bounce buffers and rings, which the plan reserves inside dramBudget (builds
      // before that have no info.bufferBytes and keep them outside: 0), so every engine and build
      // gets the same DRAM tier.
      const probe = new IoEngine({ kind });
      const ioReserve: number = probe.info.bufferBytes ?? 0;
      probe.close();
      const dramBudget = Math.round(context * 2400 + 16 * 2 ** 20 + kvBytes / 4) + ioReserve;
      await runtimeRow(`ssd-${kind}${cold ? '-cold' : ''}`, { dramBudget, ssd: { dir, direct: false, io: { kind } } }, dropper ? drop : undefined);
      dropper?.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }
  return out;
}

if (process.argv.includes('--child')) {
  const root = process.argv[process.argv.indexOf('--child') + 1]!;
  const io = arg('io', '').split(',').filter(Boolean);
  process.stdout.write(JSON.stringify(await child(root, io)) + '\n');
} else {
  const self = fileURLToPath(import.meta.url);
  const mine = resolve(dirname(self), '..');
  const before = arg('before', '');
  const rounds = Number(arg('rounds', '3'));
  const builds: Array<[string, string]> = [['this tree', mine], ...(before ? [['before', resolve(before)] as [string, string]] : [])];
  const results = new Map<string, Row[][]>();
  for (let r = 0; r < rounds; r++)
    for (let b = 0; b < builds.length; b++) {
      const [label, root] = builds[(b + r) % builds.length]!;
      const io = label === 'this tree' ? arg('io', '') : '';
      const argv = [self, '--child', root, '--context', String(context), '--budget', String(budget), '--steps', String(steps), ...(io ? ['--io', io] : []), ...(cold ? ['--cold'] : []), '--dir', arg('dir', tmpdir())];
      const rows = JSON.parse(execFileSync(process.execPath, argv, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], maxBuffer: 1 << 24 }).trim().split('\n').pop()!) as Row[];
      if (!results.has(label)) results.set(label, []);
      results.get(label)!.push(rows);
    }
  console.log(`context ${context}, budget ${budget}, ${steps} steps (first is warm-up), ${rounds} rounds; one layer 32/8 heads x 128, f16, sequential`);
  console.log('| build | row | ms/layer-step median | min | CPU ms | dense / row: medians | minima | select / fetch / attend ms: median | min | traffic |');
  console.log('|---|---|---:|---:|---:|---:|---:|---|---|---|');
  for (const [label, runs] of results)
    for (const name of runs[0]!.map((x) => x.row)) {
      const pick = runs.map((rows) => ({ r: rows.find((x) => x.row === name)!, dense: rows.find((x) => x.row === 'dense')! }));
      const ratio = median(pick.map((p) => p.dense.medianMs / p.r.medianMs));
      const ratioMin = Math.min(...pick.map((p) => p.dense.minMs)) / Math.min(...pick.map((p) => p.r.minMs));
      const parts = pick[0]!.r.parts ? [0, 1, 2].map((i) => median(pick.map((p) => p.r.parts![i]!)).toFixed(2)).join(' / ') : '';
      // Every round's prefill (one per round: seconds, in round order).
      const prefill = pick.every((p) => p.r.prefillMs !== undefined) ? `prefill ${pick.map((p) => (p.r.prefillMs! / 1000).toFixed(2)).join(' / ')} s; ` : '';
      const partsMin = pick[0]!.r.partsMin ? [0, 1, 2].map((i) => Math.min(...pick.map((p) => p.r.partsMin![i]!)).toFixed(2)).join(' / ') : '';
      console.log(
        `| ${label} | ${name} | ${median(pick.map((p) => p.r.medianMs)).toFixed(2)} | ${Math.min(...pick.map((p) => p.r.minMs)).toFixed(2)} | ${median(pick.map((p) => p.r.cpuMs)).toFixed(2)} | ` +
          `${ratio.toFixed(3)} | ${ratioMin.toFixed(3)} | ${parts} | ${partsMin} | ${prefill}${pick[0]!.r.extra ?? ''} |`,
      );
    }
}
