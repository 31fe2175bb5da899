/**
 * Huge pages for the DRAM tier's arenas, measured in one process: two DRAM-only runtimes over the
 * same prefill, one whose arenas were advised for transparent huge pages when they were allocated
 * (what every runtime does, src/storage/dram-store.ts) and one whose advice was withheld (this
 * bench replaces `native.adviseHugePages` with a no-op while that runtime opens, the only
 * difference between the two). Their attend() calls alternate step by step, the order flipped
 * every step, so a machine that slows down slows both.
 *
 * Workload: one layer of the demo's synthetic trace (Llama-3-8B layer shape: 32 query / 8 kv heads,
 * head dim 128, f16), `--context` prompt tokens (default 131072), `--steps` decode steps (default
 * 60; the first 10 are warm-up), budget 2048 tokens per kv head, sequential mode, one sequence,
 * seed `--seed` (default 5: not the demo's seed 1, nor its held-out 11).
 * Reported per runtime: median and minimum ms per layer-step over the timed steps, the stage means
 * (select / fetch / attend), the process's AnonHugePages after both prefills (/proc/self/status
 * holds no per-mapping figure; smaps_rollup does), and whether the two runtimes' outputs are
 * bit-identical (they must be: the pages change where bytes live, not what they are). Needs
 * transparent huge pages in `madvise` or `always` mode (/sys/kernel/mm/transparent_hugepage/enabled);
 * under `always` both runtimes get them and the bench measures nothing.
 *
 *   npm run build:ts && node dist/bench/huge-pages.js [--context 131072] [--steps 60] [--seed 5]
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { openRuntime } from '../src/runtime/runtime.js';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { toF32 } from '../src/util/f16.js';
import { native } from '../src/native.js';
import { alternateDecode } from './bench-util.js';

const { values: a } = parseArgs({ options: { context: { type: 'string' }, steps: { type: 'string' }, seed: { type: 'string' } } });
const T = Number(a.context ?? 131072);
const S = Number(a.steps ?? 60);
const SEED = Number(a.seed ?? 5);
const WARM = 10;
if (!Number.isInteger(T) || T < 4096) throw new Error(`--context: expected an integer >= 4096, got ${a.context}`);
if (!Number.isInteger(S) || S <= WARM) throw new Error(`--steps: expected an integer > ${WARM}, got ${a.steps}`);
if (!Number.isInteger(SEED) || SEED < 0) throw new Error(`--seed: expected an integer >= 0, got ${a.seed}`);

const readThp = (): string => {
  try {
    return readFileSync('/sys/kernel/mm/transparent_hugepage/enabled', 'utf8').trim();
  } catch {
    return 'unknown';
  }
};
const anonHuge = (): string => /AnonHugePages:\s+(\d+ kB)/.exec(readFileSync('/proc/self/smaps_rollup', 'utf8'))?.[1] ?? '?';

const H = 8, D = 128, QH = 32;
const trace = generateSyntheticTrace({ layers: 1, promptTokens: T, decodeSteps: S, qHeads: QH, kvHeads: H, headDim: D, dtype: 'f16', seed: SEED });
const d = trace.layerData(0);
const advise = native.adviseHugePages;

async function open(huge: boolean) {
  if (!huge) native.adviseHugePages = () => 0;
  try {
    const rt = await openRuntime({
      shape: { layers: 1, qHeads: QH, kvHeads: H, headDim: D }, budget: 2048, mode: 'sequential',
      maxSequences: 1, maxTokens: T + S, dtype: 'f16', dramBudget: 2 * 2 ** 30,
    });
    const seq = rt.createSequence();
    await rt.prefill(seq, 0, { data: d.k, dtype: 'f16', tokens: T, heads: H, dim: D }, { data: d.v, dtype: 'f16', tokens: T, heads: H, dim: D });
    return { name: huge ? 'arenas in huge pages' : 'arenas in 4 KiB pages', rt, seq, times: [] as number[], st0: undefined as undefined | Awaited<ReturnType<typeof rt.stats>> };
  } finally {
    native.adviseHugePages = advise;
  }
}
const runs = [await open(true), await open(false)];
const huge = anonHuge();
const q = toF32(d.q, 'f16');
const slice = (x: Uint16Array | Float32Array, s: number, n: number) => toF32(x.slice(s * n, (s + 1) * n) as Uint16Array, 'f16');
const decoded = await alternateDecode(
  runs,
  (s) => ({ q: q.slice(s * QH * D, (s + 1) * QH * D), kNew: slice(d.kNew, s, H * D), vNew: slice(d.vNew, s, H * D) }),
  S,
  WARM,
  async () => {
    for (const r of runs) r.st0 = await r.rt.stats();
  },
);
runs.forEach((r, i) => (r.times = decoded.times[i]!));
const same = decoded.identical === S;

console.log(`# DRAM-tier arenas in huge pages vs 4 KiB pages (context ${T}, seed ${SEED}, ${S - WARM} timed steps; THP ${readThp()}; AnonHugePages ${huge} after both prefills)`);
console.log('');
console.log('| arenas | ms per layer-step (median / min) | select | fetch | attend |');
console.log('|---|---:|---:|---:|---:|');
for (const r of runs) {
  const st = await r.rt.stats();
  const n = r.times.length;
  const t = [...r.times].sort((x, y) => x - y);
  const per = (k: 'selectionMs' | 'fetchMs' | 'computeMs') => ((st[k] - r.st0![k]) / n).toFixed(2);
  console.log(`| ${r.name} | ${t[n >> 1]!.toFixed(2)} / ${t[0]!.toFixed(2)} | ${per('selectionMs')} | ${per('fetchMs')} | ${per('computeMs')} |`);
  await r.rt.close();
}
console.log('');
console.log(`outputs bit-identical between the two: ${same}`);
