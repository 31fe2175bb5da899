/**
 * `kvdrive demo`: the main job on a built-in default workload. Generates a synthetic trace with a
 * Llama-3-8B-like per-layer shape (32 query heads, 8 kv heads, head dim 128, f16 KV) at a long
 * context, then decodes every step with dense attention and with the three selection policies at
 * the same budget, and prints one table: time per layer-step, bytes touched, recall of dense
 * attention mass (and the oracle's), output error, planted needles found.
 */
import type { Command } from 'commander';
import { generateSyntheticTrace } from '../trace/synthetic.js';
import { evaluateTrace, type TraceEvaluation } from '../eval/replay.js';
import { bytes, ms, table } from '../eval/format.js';
import type { PolicyName } from '../index/selection.js';
import { cpuFeatures } from '../native.js';
import { choiceListOption, choiceOption, integerOption } from './options.js';
import { ProgressBar } from './progress.js';
import { runBatchDemo } from './demo-batch.js';
import { parseBytes } from '../cache/window-solver.js';
import { replayTiered, type TieredReplayResult } from '../eval/tiered-replay.js';
import { runParetoDemo } from './demo-pareto.js';

const POLICIES: readonly PolicyName[] = ['kvdrive', 'quest', 'shadowkv'];

/** The built-in default workload (every field can be overridden by a flag). */
export const DEMO_DEFAULTS = {
  context: 131072,
  layers: 2,
  steps: 8,
  /** 2048 tokens = 1.56% of 128K, the paper's sparsity. */
  budget: 2048,
  qHeads: 32,
  kvHeads: 8,
  headDim: 128,
  dtype: 'f16' as const,
  seed: 1,
  /** Both cores of the reference machine, for dense attention and for every policy alike. */
  threads: 2,
};

interface DemoCliOptions {
  context: number;
  layers: number;
  steps: number;
  budget: number;
  dtype: 'f32' | 'f16' | 'bf16';
  seed: number;
  threads: number;
  policy: PolicyName[];
  json?: boolean;
  /** --batch: run the decode runtime on a batch instead (demo-batch.ts). */
  batch?: number;
  mode: 'sequential' | 'pipelined' | 'both';
  microBatch: number;
  /** SSD store directory: also decode with the kvdrive policy through DRAM+SSD and DRAM-only. */
  storage?: string;
  /** DRAM budget of the DRAM+SSD run (bytes; default a third of the KV). */
  dramBudget?: number;
  /** Lookahead pool tokens per kv head for prefetch (0 = none; default 2 x budget). */
  pool?: number;
  /** Hot-tier window in front of DRAM with --storage (0 = none). */
  hotWindows: number;
  /** --pareto: time against recall / oracle per policy at budgets 512..4096 (demo-pareto.ts). */
  pareto?: boolean;
}

function renderStorage(r: TieredReplayResult, o: DemoCliOptions): string {
  const rows: (string | number)[][] = [['step', 'DRAM+SSD ms/layer-step', 'hot bytes', 'DRAM bytes', 'prefetched bytes', 'SSD bytes', 'SSD device bytes', 'DRAM-only ms/layer-step', 'DRAM-only hot / DRAM bytes']];
  r.tiered.steps.forEach((t, s) => {
    const d = r.dramOnly.steps[s]!;
    rows.push([s, ms(t.ms), bytes(t.hotBytes), bytes(t.dramBytes), bytes(t.prefetchedBytes), bytes(t.ssdBytes), bytes(t.ssdReadBytes), ms(d.ms), `${bytes(d.hotBytes)} / ${bytes(d.dramBytes)}`]);
  });
  const pf = r.tiered.prefetch;
  return [
    '',
    '',
    `storage tiers (kvdrive policy, budget ${o.budget}, pool ${o.pool ?? 0}, hot tier window ${o.hotWindows}): KV ${bytes(r.kvBytes)} on SSD at ${o.storage} (${r.engine}, O_DIRECT), ` +
      `DRAM budget ${bytes(r.tiered.dramBudget)} (${((100 * r.tiered.dramBudget) / r.kvBytes).toFixed(0)}% of the KV); bytes per step are summed over layers`,
    '',
    table(rows),
    '',
    `DRAM+SSD vs DRAM-only throughput: ${r.ratio.toFixed(3)} (${ms(r.tiered.msPerLayerStep)} vs ${ms(r.dramOnly.msPerLayerStep)} per layer-step, steps after the first, same run)`,
    `outputs of DRAM+SSD and DRAM-only: ${r.identical ? 'bit-identical' : 'DIFFERENT (a bug: please report)'}; prefetch: ${pf.issued} issued, ${pf.chunks} chunks, ${bytes(pf.readBytes)} read, ${pf.cancelled} cancelled`,
    `prefill (index build, SSD write, importance warm-up): ${(r.tiered.prefillMs / 1000).toFixed(1)} s.`,
  ].join('\n');
}

function render(ev: TraceEvaluation, o: DemoCliOptions): string {
  const m = ev.meta;
  const head =
    `workload: synthetic trace, ${m.layers} layers x ${m.decodeSteps} decode steps, context ${m.promptTokens} tokens, ` +
    `${m.qHeads} query / ${m.kvHeads} kv heads, head dim ${m.headDim}, ${ev.dtype} KV; ` +
    `budget ${o.budget} tokens per kv head (${((100 * o.budget) / m.promptTokens).toFixed(2)}%) + 4 sinks + 64 local; ` +
    `SIMD ${cpuFeatures().active}`;
  const rows: (string | number)[][] = [
    ['method', 'time/layer-step', 'select', 'attend', 'bytes/layer-step', 'vs dense', 'recall', 'oracle', 'rel error', 'needles', 'index build'],
    ['dense', ms(ev.dense.ms), '-', ms(ev.dense.ms), bytes(ev.dense.bytes), '1.0x', '1.0000', '1.0000', '0', '-', '-'],
  ];
  for (const p of ev.policies) {
    rows.push([
      p.policy,
      ms(p.selectMs + p.attendMs),
      ms(p.selectMs),
      ms(p.attendMs),
      bytes(p.sparseBytes),
      `${(ev.dense.bytes / p.sparseBytes).toFixed(1)}x less`,
      p.recall.toFixed(4),
      p.oracleRecall.toFixed(4),
      p.relError.toExponential(2),
      p.needlesTotal ? `${p.needlesFound}/${p.needlesTotal}` : '-',
      `${(p.buildMs / 1000).toFixed(1)} s`,
    ]);
  }
  const notes = [
    `dense: exact attention over the whole context; policies: selection + exact attention over the selected tokens; ${o.threads} thread(s) for both.`,
    `bytes: K/V rows read by attention plus index vectors scored by selection. recall: share of dense attention mass on the attended tokens;`,
    `oracle: the same for the exact top-${o.budget} tokens (the best any selection can do). needles: planted far-back tokens a retrieval head must find.`,
  ];
  return [head, '', table(rows), '', ...notes].join('\n');
}

export function register(program: Command): void {
  program
    .command('demo')
    .description('dense attention vs the kvdrive, quest and shadowkv selection policies on a long-context synthetic workload')
    .option('--context <tokens>', 'prompt tokens of the synthetic trace', integerOption('--context', 256, 1 << 22), DEMO_DEFAULTS.context)
    .option('--layers <n>', 'layers to decode', integerOption('--layers', 1, 128), DEMO_DEFAULTS.layers)
    .option('--steps <n>', 'decode steps per layer', integerOption('--steps', 1, 4096), DEMO_DEFAULTS.steps)
    .option('--budget <tokens>', 'tokens per kv head beside sinks and local window', integerOption('--budget', 1, 2 ** 31 - 1, 'E_BUDGET'), DEMO_DEFAULTS.budget)
    .option('--dtype <dtype>', 'KV storage dtype: f32, f16, bf16', choiceOption('--dtype', ['f32', 'f16', 'bf16'] as const, 'E_DTYPE'), DEMO_DEFAULTS.dtype)
    .option('--seed <n>', 'trace seed', integerOption('--seed', 0, 2 ** 32 - 1), DEMO_DEFAULTS.seed)
    .option('--threads <n>', 'threads for dense attention, selection and sparse attention', integerOption('--threads', 1, 8), DEMO_DEFAULTS.threads)
    .option('--policy <names>', 'policies to compare (comma-separated)', choiceListOption('--policy', POLICIES, 'E_POLICY'), [...POLICIES])
    .option('--json', 'print one JSON object instead of the table')
    .option('--batch <n>', 'decode a batch of n sequences with the runtime and show the per-stage time breakdown', integerOption('--batch', 1, 64))
    .option('--mode <mode>', 'with --batch: sequential, pipelined or both', choiceOption('--mode', ['sequential', 'pipelined', 'both'] as const), 'both')
    .option('--micro-batch <n>', 'with --batch: entries per micro-batch', integerOption('--micro-batch', 1, 64), 1)
    .option('--storage <dir>', 'SSD store directory: also decode the kvdrive policy through DRAM+SSD and DRAM-only tiers (segments are deleted afterwards)')
    .option('--dram-budget <bytes>', 'DRAM budget of the DRAM+SSD run, e.g. 256MiB (default: a third of the KV)', (v: string) => parseBytes(v, '--dram-budget'))
    .option('--hot-windows <n>', 'hot tier in front of DRAM with --storage: slots per kv head = n x budget / chunk (0 = none)', integerOption('--hot-windows', 0, 64), 2)
    .option('--pool <tokens>', 'lookahead pool per kv head driving prefetch with --storage (default 0 = no prefetch)', integerOption('--pool', 0, 2 ** 30, 'E_BUDGET'))
    .option('--pareto', 'time per layer-step beside recall / oracle for every policy at budgets 512, 1024, 2048, 4096')
    .action(async (o: DemoCliOptions, cmd: Command) => {
      if (o.pareto) return runParetoDemo(o);
      if (o.batch !== undefined) {
        // The batch runtime holds f32 KV for every sequence in DRAM: a shorter default context.
        const context = cmd.getOptionValueSource('context') === 'default' ? 8192 : o.context;
        return runBatchDemo({ ...o, batch: o.batch, context });
      }
      const trace = generateSyntheticTrace({
        layers: o.layers,
        promptTokens: o.context,
        decodeSteps: o.steps,
        qHeads: DEMO_DEFAULTS.qHeads,
        kvHeads: DEMO_DEFAULTS.kvHeads,
        headDim: DEMO_DEFAULTS.headDim,
        dtype: o.dtype,
        seed: o.seed,
      });
      const bar = new ProgressBar(o.layers * (o.steps + 2), 'demo');
      let phase = '';
      const ev = await evaluateTrace(trace, {
        policies: o.policy,
        budget: o.budget,
        denseThreads: o.threads,
        onPhase: (what) => {
          if (phase) bar.tick(what);
          else bar.tick(what, 0);
          phase = what;
        },
        onStep: (l, s) => bar.tick(`layer ${l} step ${s}`),
      });
      bar.finish();
      let tiers: TieredReplayResult | undefined;
      if (o.storage !== undefined) {
        const sbar = new ProgressBar(2 * o.layers * o.steps, 'tiers');
        tiers = await replayTiered(trace, { dir: o.storage, dramBudget: o.dramBudget, budget: o.budget, pool: o.pool, hotWindows: o.hotWindows, onStep: (run, l, s) => sbar.tick(`${run} layer ${l} step ${s}`) });
        sbar.finish();
      }
      if (o.json) process.stdout.write(JSON.stringify({ ...ev, budget: o.budget, ...(tiers ? { tiers } : {}) }) + '\n');
      else process.stdout.write(render(ev, o) + (tiers ? renderStorage(tiers, o) : '') + '\n');
    });
}
