/**
 * Throughput of a batch of sequences decoded through the runtime, DRAM+SSD against DRAM-only, in
 * both modes, every configuration's attend() calls interleaved in one process (so load drifts hit
 * them alike). Results in bench/pipeline.md ("Batch throughput: DRAM+SSD against DRAM-only").
 *
 * Workload: the demo's synthetic trace (Llama-3-8B layer shape: 32 query / 8 kv heads, head dim
 * 128, f16), `--layers` layers of `--context` prompt tokens (default 2 x 65536, seed 11: the
 * held-out shape of issue 8's ratio), `--batch` sequences (default 4) each prefilled with the same
 * layers (separate sequences: nothing is shared), budget 2048, a hot tier of 3 windows per sequence.
 * DRAM+SSD runtimes get `--dram-budget` bytes per sequence (default 512 MiB) and O_DIRECT reads;
 * DRAM-only runtimes hold every chunk.
 *
 * Rows (`--rows`, default all four): seq-dram, pip-dram, seq-ssd, pip-ssd (sequential / pipelined
 * mode). Reported per sequence-layer step (one entry of an attend() call), steps after the first:
 * wall ms, process CPU ms (all threads), and the ratio of each DRAM+SSD row to the DRAM-only row of
 * the same mode and to the fastest DRAM-only row. Outputs are checked bit-identical across rows.
 *
 * Run: npm run build:ts && node dist/bench/tier-throughput.js [--context 65536] [--layers 2]
 *      [--batch 4] [--steps 24] [--seed 11] [--dram-budget 536870912]
 *      [--rows seq-dram,pip-dram,seq-ssd,pip-ssd] [--dist DIR] [--dir /tmp]
 * `--dist DIR`: import the runtime from another build's dist/ (the "before" of a change; run the
 * two builds in alternating processes).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import type { Runtime, RuntimeOptions } from '../src/runtime/runtime.js';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { HotTier } from '../src/cache/hot-tier.js';
import { toF32 } from '../src/util/f16.js';

const { values: a } = parseArgs({
  options: {
    context: { type: 'string', default: '65536' },
    layers: { type: 'string', default: '2' },
    batch: { type: 'string', default: '4' },
    steps: { type: 'string', default: '24' },
    seed: { type: 'string', default: '11' },
    'dram-budget': { type: 'string', default: String(512 * 2 ** 20) },
    rows: { type: 'string', default: 'seq-dram,pip-dram,seq-ssd,pip-ssd' },
    dist: { type: 'string' },
    dir: { type: 'string', default: tmpdir() },
  },
});
const T = Number(a.context), L = Number(a.layers), B = Number(a.batch), S = Number(a.steps);
const budget = 2048;
const shape = { layers: L, qHeads: 32, kvHeads: 8, headDim: 128 };
const row = shape.kvHeads * shape.headDim;
const qLen = shape.qHeads * shape.headDim;
const perSeqBudget = Number(a['dram-budget']);
const seed = Number(a.seed);
const whole = (x: number, min: number) => Number.isInteger(x) && x >= min;
if (!(whole(T, 1) && whole(L, 1) && whole(B, 1) && whole(S, 2) && whole(perSeqBudget, 1) && whole(seed, 0)))
  throw new Error(
    `expected whole numbers: --context, --layers, --batch, --dram-budget >= 1, --steps >= 2, --seed >= 0; got ${[a.context, a.layers, a.batch, a['dram-budget'], a.steps, a.seed].join(', ')}`,
  );

const distRoot = a.dist ? resolve(a.dist) : undefined;
const { openRuntime } = (await import(distRoot ? pathToFileURL(join(distRoot, 'src/runtime/runtime.js')).href : '../src/runtime/runtime.js')) as {
  openRuntime: (o: RuntimeOptions) => Promise<Runtime>;
};

const trace = generateSyntheticTrace({ ...shape, promptTokens: T, decodeSteps: S, dtype: 'f16', seed });
// The hot tier's bytes for one sequence at this budget and window count, times the batch.
const probe = new HotTier({ layers: L, kvHeads: shape.kvHeads, headDim: shape.headDim, dtype: 'f16', chunkSize: 4, budget, windows: 3, maxBytes: 2 ** 52 });
const hotBytes = probe.info().bytes * B;
probe.destroy();

interface Row {
  name: string;
  rt: Runtime;
  seqs: number[];
  ssd: boolean;
  ms: number;
  cpu: number;
  n: number;
}
const root = mkdtempSync(join(a.dir, 'kvd-tier-throughput-'));
const rows: Row[] = [];
try {
  for (const name of a.rows.split(',')) {
    const [m, tier] = name.split('-');
    if (!(m === 'seq' || m === 'pip') || !(tier === 'dram' || tier === 'ssd')) throw new Error(`--rows: expected seq|pip-dram|ssd names, got ${name}`);
    const ssd = tier === 'ssd';
    const base: RuntimeOptions = {
      shape,
      budget,
      mode: m === 'seq' ? 'sequential' : 'pipelined',
      maxSequences: B,
      maxTokens: T + S,
      dtype: 'f16',
      hotTier: { windows: 3, maxBytes: hotBytes },
    };
    // DRAM-only: room for every sequence's f16 K + V (B x L x T rows of K and V, 2 bytes each)
    // twice over (the index, tails and hot tier fit in the second copy) plus 1 GiB.
    const kvBytes = B * L * T * row * 2 * 2;
    const rt = await openRuntime(
      ssd ? { ...base, dramBudget: B * perSeqBudget, ssd: { dir: join(root, name), direct: true } } : { ...base, dramBudget: 2 * kvBytes + 2 ** 30 },
    );
    const seqs: number[] = [];
    rows.push({ name, rt, seqs, ssd, ms: 0, cpu: 0, n: 0 });
    for (let b = 0; b < B; b++) {
      const seq = rt.createSequence();
      seqs.push(seq);
      for (let l = 0; l < L; l++) {
        const d = trace.layerData(l);
        const kv = (data: Uint16Array) => ({ data, dtype: 'f16' as const, tokens: T, heads: shape.kvHeads, dim: shape.headDim });
        await rt.prefill(seq, l, kv(d.k as Uint16Array), kv(d.v as Uint16Array), trace.observationQueries(l, 32));
      }
    }
  }
  const inputs = Array.from({ length: L }, (_, l) => {
    const d = trace.layerData(l);
    return Array.from({ length: S }, (_, s) => ({
      q: toF32(d.q.subarray(s * qLen, (s + 1) * qLen), 'f16'),
      kNew: toF32(d.kNew.subarray(s * row, (s + 1) * row), 'f16'),
      vNew: toF32(d.vNew.subarray(s * row, (s + 1) * row), 'f16'),
    }));
  });
  let identical = true;
  for (let s = 0; s < S; s++)
    for (let l = 0; l < L; l++) {
      let first: Float32Array[] | undefined;
      // Rotate the order every step: no row always runs right after another one.
      for (let i = 0; i < rows.length; i++) {
        const r = rows[(i + s) % rows.length]!;
        const c0 = process.cpuUsage();
        const t0 = performance.now();
        const out = await r.rt.attend(l, r.seqs.map((seq) => ({ seq, ...inputs[l]![s]! })));
        if (s > 0) {
          r.ms += performance.now() - t0;
          const c = process.cpuUsage(c0);
          r.cpu += (c.user + c.system) / 1000;
          r.n += r.seqs.length;
        }
        if (!first) first = out;
        else if (out.some((o, b) => Buffer.compare(Buffer.from(o.buffer, o.byteOffset, o.byteLength), Buffer.from(first![b]!.buffer, first![b]!.byteOffset, first![b]!.byteLength)) !== 0)) identical = false;
      }
    }
  const per = (r: Row) => r.ms / r.n;
  const dram = rows.filter((r) => !r.ssd);
  const best = dram.length ? Math.min(...dram.map(per)) : NaN;
  console.log(`context ${T}, ${L} layers, batch ${B}, steps ${S} (first not timed), seed ${seed}, DRAM+SSD budget ${perSeqBudget / 2 ** 20} MiB per sequence${distRoot ? `, runtime from ${distRoot}` : ''}`);
  console.log('| row | ms per entry | CPU ms per entry | DRAM-only (same mode) / row | fastest DRAM-only / row |');
  console.log('|---|---:|---:|---:|---:|');
  for (const r of rows) {
    const same = dram.find((d) => d.name.split('-')[0] === r.name.split('-')[0]);
    console.log(`| ${r.name} | ${per(r).toFixed(2)} | ${(r.cpu / r.n).toFixed(2)} | ${same ? (per(same) / per(r)).toFixed(3) : '-'} | ${(best / per(r)).toFixed(3)} |`);
  }
  console.log(`outputs ${identical ? 'bit-identical across rows' : 'DIFFERENT across rows (a bug)'}`);
  if (!identical) process.exitCode = 1;
} finally {
  for (const r of rows) await r.rt.close();
  rmSync(root, { recursive: true, force: true });
}
