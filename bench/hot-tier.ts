/**
 * Hot-tier benchmarks (kvdrive.txt §9.3 Table 3, Fig. 15/16): all figures are bytes and hit rates
 * measured by replaying traces through the real selection policies and the real hot tier; ratios
 * are against a baseline measured in the same run.
 *
 * 1. Table-3-like: hit rate of lookahead (LA, pool M = 1.25 K as in the paper, and M = 2 K) vs LRU
 *    vs LFU eviction at the same capacity, window ×1..×4, for each selection policy (kvdrive, quest,
 *    shadowkv). Baseline: LRU.
 * 2. Transfer per step against window size (kvdrive + LA). Baseline: window ×0 (no reuse).
 * 3. 2D window scaling vs uniform windows at equal memory: profile windows ×0..×8, solve the MCKP
 *    (exact) for the bytes a uniform ×N takes, then replay with the solved windows on the real tier.
 *    Baseline: the uniform ×N (measured in the profile). The same windows are also replayed on a
 *    held-out trace (another seed / another story) against its own uniform ×N.
 *
 * 4. Importance-guided warm-up: hit rate and transfer with the tier warmed from the observation
 *    query vs an empty tier. Baseline: empty tier.
 *
 * Traces: a synthetic trace (generated in memory) and, when the stories260K fixture is present, a
 * trace recorded from the real model (sampling with a fixed seed).
 *
 * Run: npm run build:ts && node dist/bench/hot-tier.js [--quick]
 */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { EvictionPolicies, type EvictionPolicy } from '../src/cache/hot-tier.js';
import { measureWindows, profileTotals, profileTrace } from '../src/cache/profiler.js';
import { solveWindows } from '../src/cache/window-solver.js';
import type { PolicyName } from '../src/index/selection.js';
import { loadCheckpoint } from '../src/model/checkpoint.js';
import { generate } from '../src/model/generate.js';
import { loadTokenizer } from '../src/model/tokenizer.js';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { openTrace, type TraceReader } from '../src/trace/trace.js';

const quick = process.argv.includes('--quick');
const here = dirname(fileURLToPath(import.meta.url));

function kib(n: number): string {
  return `${(n / 1024).toFixed(1)} KiB`;
}
function pct(x: number): string {
  return `${(x * 100).toFixed(1)}%`;
}

async function table3(name: string, trace: TraceReader, budget: number) {
  const windows = [1, 2, 3, 4];
  const policies: PolicyName[] = ['kvdrive', 'quest', 'shadowkv'];
  console.log(`\n### ${name}: hit rate by eviction policy (budget ${budget} tokens, pool M = 1.25 K, warm-up on)\n`);
  console.log(`| selection | window | LRU | LFU | LA | LA − LRU | LA, M = 2 K | LA(2K) − LRU |`);
  console.log(`|---|---|---|---|---|---|---|---|`);
  for (const policy of policies) {
    const byEviction = new Map<EvictionPolicy, number[]>();
    for (const eviction of EvictionPolicies) {
      const p = await profileTrace(trace, { windows, budget, policy, eviction });
      byEviction.set(eviction, profileTotals(p).map((t) => t.hitRate));
    }
    const wide = profileTotals(await profileTrace(trace, { windows, budget, policy, eviction: 'lookahead', poolFactor: 2 })).map((t) => t.hitRate);
    windows.forEach((w, j) => {
      const lru = byEviction.get('lru')![j]!;
      const lfu = byEviction.get('lfu')![j]!;
      const la = byEviction.get('lookahead')![j]!;
      const la2 = wide[j]!;
      console.log(
        `| ${policy} | ×${w} | ${pct(lru)} | ${pct(lfu)} | ${pct(la)} | ${((la - lru) * 100).toFixed(1)} pt | ${pct(la2)} | ${((la2 - lru) * 100).toFixed(1)} pt |`,
      );
    });
  }
}

async function warmupEffect(name: string, trace: TraceReader, budget: number) {
  const windows = [1, 2, 4];
  const on = profileTotals(await profileTrace(trace, { windows, budget, warmup: true }));
  const off = profileTotals(await profileTrace(trace, { windows, budget, warmup: false }));
  console.log(`\n### ${name}: importance-guided warm-up (kvdrive + LA, budget ${budget}; baseline: empty tier)\n`);
  console.log(`| window | hit rate, empty start | hit rate, warmed | fetched / step, empty | fetched / step, warmed | warmed / empty |`);
  console.log(`|---|---|---|---|---|---|`);
  windows.forEach((w, j) =>
    console.log(
      `| ×${w} | ${pct(off[j]!.hitRate)} | ${pct(on[j]!.hitRate)} | ${kib(off[j]!.fetchedBytesPerStep)} | ${kib(on[j]!.fetchedBytesPerStep)} | ${(on[j]!.fetchedBytesPerStep / off[j]!.fetchedBytesPerStep).toFixed(3)} |`,
    ),
  );
}

async function transferAndScaling(name: string, trace: TraceReader, budget: number, holdout: TraceReader, holdoutName: string) {
  const windows = [0, 1, 2, 3, 4, 5, 6, 7, 8];
  const p = await profileTrace(trace, { windows, budget, policy: 'kvdrive', eviction: 'lookahead' });
  const totals = profileTotals(p);
  const base = totals[0]!.fetchedBytesPerStep;
  console.log(`\n### ${name}: transfer per decode step against window (kvdrive + LA, budget ${budget})\n`);
  console.log(`| window | resident (K/V slots) | fetched / step | vs ×0 | hit rate |`);
  console.log(`|---|---|---|---|---|`);
  for (const t of totals)
    console.log(`| ×${t.window} | ${kib(t.residentBytes)} | ${kib(t.fetchedBytesPerStep)} | ${(t.fetchedBytesPerStep / base).toFixed(3)} | ${pct(t.hitRate)} |`);

  console.log(`\n### ${name}: 2D window scaling vs uniform windows at equal memory\n`);
  console.log(`Solved on this trace's profile; "held-out" replays the same windows on ${holdoutName}.\n`);
  console.log(`| memory (= uniform ×N) | uniform fetched / step | 2D predicted | 2D measured (real tier) | 2D / uniform | held-out uniform | held-out 2D | held-out 2D / uniform | 2D windows used | solve time | greedy / exact |`);
  console.log(`|---|---|---|---|---|---|---|---|---|---|---|`);
  const hold = profileTotals(await profileTrace(holdout, { windows: [1, 2, 3, 4], budget, policy: 'kvdrive', eviction: 'lookahead' }));
  for (const n of [1, 2, 3, 4]) {
    const j = windows.indexOf(n);
    const budgetBytes = totals[j]!.residentBytes;
    const a = solveWindows(p, { budgetBytes, method: 'exact' });
    const g = solveWindows(p, { budgetBytes, method: 'greedy' });
    const m = await measureWindows(trace, a.windows, { budget, policy: 'kvdrive', eviction: 'lookahead' });
    const uni = totals[j]!.fetchedBytesPerStep;
    const hm = await measureWindows(holdout, a.windows, { budget, policy: 'kvdrive', eviction: 'lookahead' });
    const hu = hold[n - 1]!.fetchedBytesPerStep;
    const used = [...new Set(a.windows.flat())].sort((x, y) => x - y).map((w) => `×${w}`).join(' ');
    console.log(
      `| ${kib(budgetBytes)} (×${n}) | ${kib(uni)} | ${kib(a.predictedFetchedBytesPerStep)} | ${kib(m.fetchedBytesPerStep)} | ${(m.fetchedBytesPerStep / uni).toFixed(3)} | ${kib(hu)} | ${kib(hm.fetchedBytesPerStep)} | ${(hm.fetchedBytesPerStep / hu).toFixed(3)} | ${used} | ${a.solveMs.toFixed(1)} ms | ${(g.predictedFetchedBytesPerStep / a.predictedFetchedBytesPerStep).toFixed(4)} |`,
    );
  }
}

async function main() {
  const synthOpts = quick
    ? { layers: 2, qHeads: 8, kvHeads: 2, headDim: 64, promptTokens: 4096, decodeSteps: 32, seed: 7, dtype: 'f16' as const }
    : { layers: 4, qHeads: 8, kvHeads: 4, headDim: 64, promptTokens: 16384, decodeSteps: 64, seed: 7, dtype: 'f16' as const, needlesPerLayer: 4 };
  const synth = generateSyntheticTrace(synthOpts);
  const synthBudget = quick ? 64 : 256;
  const m = synth.meta;
  const synthName = `synthetic (L${m.layers}, Hq ${m.qHeads}/Hkv ${m.kvHeads}, D ${m.headDim}, T ${m.promptTokens}, ${m.decodeSteps} steps, f16)`;
  const t0 = performance.now();
  await table3(synthName, synth, synthBudget);
  await warmupEffect(synthName, synth, synthBudget);
  const synthHold = generateSyntheticTrace({ ...synthOpts, seed: 8 });
  await transferAndScaling(synthName, synth, synthBudget, synthHold, 'the same generator with seed 8');

  const fixture = [process.env.KVDRIVE_FIXTURES, resolve(here, '..', '..', '..', 'shared', 'fixtures'), resolve(here, '..', '..', 'shared', 'fixtures')]
    .filter((p): p is string => !!p)
    .find((p) => existsSync(join(p, 'stories260K', 'stories260K.bin')));
  if (!fixture) {
    console.log('\nNOTICE: stories260K fixture not found; the real-model tables are skipped.');
  } else {
    const dir = mkdtempSync(join(tmpdir(), 'kvd-bench-'));
    try {
      const path = join(dir, 'stories.safetensors');
      const model = loadCheckpoint(join(fixture, 'stories260K', 'stories260K.bin'));
      const tokenizer = loadTokenizer(join(fixture, 'stories260K', 'tok512.bin'), { vocabSize: model.config.vocabSize });
      await generate({ model, tokenizer, steps: 512, seed: 1, traceOut: path, tracePromptTokens: 256 });
      const path2 = join(dir, 'stories2.safetensors');
      await generate({ model, tokenizer, steps: 512, seed: 2, traceOut: path2, tracePromptTokens: 256 });
      const tr = await openTrace(path);
      const tr2 = await openTrace(path2);
      const sm = tr.meta;
      const name = `stories260K recorded (L${sm.layers}, Hq ${sm.qHeads}/Hkv ${sm.kvHeads}, D ${sm.headDim}, T ${sm.promptTokens}, ${sm.decodeSteps} steps, ${tr.dtype})`;
      await table3(name, tr, 32);
      await warmupEffect(name, tr, 32);
      await transferAndScaling(name, tr, 32, tr2, `another story (sampling seed 2, ${tr2.meta.decodeSteps} steps)`);
      await tr.close();
      await tr2.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }
  console.log(`\n(total bench time ${((performance.now() - t0) / 1000).toFixed(1)} s)`);
}

await main();
