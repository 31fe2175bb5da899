/**
 * `kvdrive demo`: the main job on a built-in default workload. Generates a synthetic trace with a
 * Llama-3-8B-like per-layer shape (32 query heads, 8 kv heads, head dim 128, f16 KV) at a long
 * context, then decodes every step with dense attention, with kvdrive through the runtime a host
 * embeds (openRuntime, sequential and pipelined, DRAM only) and with the quest and shadowkv policy
 * objects at the same budget, and prints one table: time per layer-step (select / fetch / attend),
 * bytes touched, recall of dense attention mass on the tokens actually attended (and the oracle's),
 * output error, planted needles found.
 */
import type { Command } from 'commander';
import { KvdriveError } from '../errors.js';
import { generateSyntheticTrace } from '../trace/synthetic.js';
import { evaluateTrace, type TraceEvaluation } from '../eval/replay.js';
import { bytes, ms, table } from '../eval/format.js';
import type { PolicyName } from '../index/selection.js';
import { cpuFeatures } from '../native.js';
import { choiceListOption, choiceOption, integerOption } from './options.js';
import { ProgressBar } from './progress.js';
import { runBatchDemo } from './demo-batch.js';
import { parseBytes } from '../cache/window-solver.js';
import { RuntimeRow, renderRuntimeDemo, runRuntimeDemo, warmUpPolicies, warmUpShape, type RuntimeDemoResult } from './demo-runtime.js';
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
  /** With --storage: the prefill's observation window, prompt positions (SnapKV's default size). */
  obsWindow: 32,
  /**
   * With --storage: hot-tier windows (slots per kv head = windows x budget / chunk). A token-granular
   * step touches ~0.6 x budget chunks (~2.4 x budget / chunk), so two windows held less than one
   * step's chunks and the tier re-admitted a third of them every step. Three hold one step and a
   * quarter. Tuned on `--seed 5 --layers 8 --dram-budget 1GiB` (bench/runtime-memory.md).
   */
  hotWindows: 3,
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
  /** With --storage: skip the dense / policy comparison (the whole-context run only). */
  tiersOnly?: boolean;
  /** With --storage: hot-tier window in front of the DRAM tier (0 = none). */
  hotWindows: number;
  /** With --storage: kv heads per streamed select group (RuntimeOptions.ssd.streamHeads). */
  streamHeads?: number;
  /** With --storage: prompt positions whose queries prefill gets as its observation window (0 = none). */
  obsWindow: number;
  /** --pareto: time against recall / oracle per policy at budgets 512..4096 (demo-pareto.ts). */
  pareto?: boolean;
}

/** The --storage row: its selection (index only) measured by the eval, its time from the tiered run. */
interface TieredRow {
  offloaded: TraceEvaluation['policies'][number];
  tiers: RuntimeDemoResult;
  mode: string;
}

type RuntimeSummary = Awaited<ReturnType<RuntimeRow['summary']>>;

function render(ev: TraceEvaluation, o: DemoCliOptions, runtimeRows: RuntimeSummary[], rt?: TieredRow): string {
  const m = ev.meta;
  const head =
    `workload: synthetic trace, ${m.layers} layers x ${m.decodeSteps} decode steps, context ${m.promptTokens} tokens, ` +
    `${m.qHeads} query / ${m.kvHeads} kv heads, head dim ${m.headDim}, ${ev.dtype} KV; ` +
    `budget ${o.budget} tokens per kv head (${((100 * o.budget) / m.promptTokens).toFixed(2)}%) + 4 sinks + 64 local; ` +
    `SIMD ${cpuFeatures().active}`;
  const rows: (string | number)[][] = [
    ['method', 'time/layer-step', 'select', 'fetch', 'attend', 'bytes/layer-step', 'vs dense', 'recall', 'oracle', 'rel error', 'needles', 'index build'],
    ['dense', ms(ev.dense.ms), '-', '-', ms(ev.dense.ms), bytes(ev.dense.bytes), '1.0x', '1.0000', '1.0000', '0', '-', '-'],
  ];
  // One row: its label and times, then the selection's bytes and quality from the eval.
  type PolicyEval = TraceEvaluation['attended'][number];
  const row = (label: string, total: number, select: number, fetch: number | undefined, attend: number, p: PolicyEval, build: string) => [
    label,
    ms(total),
    ms(select),
    fetch === undefined ? '-' : ms(fetch),
    ms(attend),
    bytes(p.sparseBytes),
    `${(ev.dense.bytes / p.sparseBytes).toFixed(1)}x less`,
    p.recall.toFixed(4),
    p.oracleRecall.toFixed(4),
    p.relError.toExponential(2),
    p.needlesTotal ? `${p.needlesFound}/${p.needlesTotal}` : '-',
    build,
  ];
  runtimeRows.forEach((r, i) =>
    rows.push(row(`kvdrive (runtime, ${r.mode})`, r.wallMs, r.selectMs, r.fetchMs, r.computeMs, ev.attended[i]!, `${(r.prefillMs / 1000).toFixed(1)} s (prefill)`)),
  );
  for (const p of ev.policies) rows.push(row(p.policy, p.selectMs + p.attendMs, p.selectMs, undefined, p.attendMs, p, `${(p.buildMs / 1000).toFixed(1)} s`));
  if (rt) {
    const st = rt.tiers.stats;
    const per = (x: number) => x / Math.max(1, st.attendCalls);
    const label = `kvdrive via runtime (${rt.mode}, ${o.hotWindows > 0 ? 'hot+' : ''}DRAM+SSD)`;
    rows.push(row(label, per(st.wallMs), per(st.selectionMs), per(st.fetchMs), per(st.computeMs), rt.offloaded, `${(rt.tiers.prefillMs / 1000).toFixed(1)} s (prefill)`));
  }
  const notes = [
    `dense: exact attention over the whole context; policies: selection + exact attention over the selected tokens; ${o.threads} thread(s) for both.`,
    `time: mean per layer-step over ${o.steps > 1 ? "the steps after each layer's first (every row alike; recall and error count every step)" : 'the one step'}.`,
    ...(runtimeRows.length
      ? [
          `kvdrive (runtime, mode): openRuntime as a host embeds it (memory model, DRAM only: ${bytes(runtimeRows[0]!.dramBudgetBytes)} default budget, ${ev.dtype} KV); time = whole attend() ` +
            `(select: index extend + select on its key sketch, starting from the previous step's selection, until the last kv head's selection is made; fetch: none here, the DRAM tier holds every sealed chunk and attention reads each selected one in place, looking it up itself; attend: the rest of the attention, whose first kv heads run beside the last heads' selects in one call); the modes' outputs are bit-identical (checked). ` +
            `One sequence is one micro-batch, so pipelined has nothing to overlap and runs it as sequential does; \`--batch N\` shows the overlap across sequences. ` +
            `Each runtime first decodes a throwaway sequence (${warmUpShape(m).tokens} random tokens, ${warmUpShape(m).steps} steps, not timed), so V8 has compiled the step's JS before the timed steps; ` +
            `each policy object (quest, shadowkv) first indexes, selects and attends over one of the same shape, so every row times steady steps. ` +
            `Each step runs after that step's dense pass (caches cold, as between the layers of a real decode), the rows taking turns going first, the two runtime rows never back to back.` +
            (o.steps > 1
              ? ` Each layer's first step (not in the time columns: no previous selection to start from; the garbage of generating and prefilling the layer is collected there) took ${runtimeRows.map((r) => `${ms(r.firstStepMs)} ${r.mode}`).join(', ')}.`
              : ''),
        ]
      : []),
    `bytes: K/V rows read by attention plus index vectors scored by selection. recall: share of dense attention mass on the attended tokens (the runtime's own);`,
    `oracle: the same for the exact top-${o.budget} tokens (the best any selection can do). needles: planted far-back tokens a retrieval head must find.`,
    ...(rt
      ? [`kvdrive via runtime: the offloaded decode (openRuntime with dramBudget + SSD; time = whole attend incl. fetch, mean over all layer-steps); it selects from the index alone, so its recall is the eval's without the keys.`]
      : []),
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
    .option('--storage <dir>', 'SSD store directory: also decode through the runtime memory model, layers streamed in, sealed to SSD (segments are deleted afterwards)')
    .option('--dram-budget <bytes>', 'with --storage: DRAM budget of the memory model, e.g. 4GiB (default 1GiB)', (v: string) => parseBytes(v, '--dram-budget'))
    .option('--hot-windows <n>', 'with --storage: hot tier in front, slots per kv head = n x budget / chunk, inside the DRAM budget (0 = none)', integerOption('--hot-windows', 0, 64), DEMO_DEFAULTS.hotWindows)
    .option('--stream-heads <n>', 'with --storage: a sequential step selects n kv heads at a time, their SSD reads in flight while the next are selected (default: all, no streaming)', integerOption('--stream-heads', 1, DEMO_DEFAULTS.kvHeads))
    .option('--obs-window <n>', "with --storage: hand prefill the queries of the prompt's last n positions (what a host's prefill computes), which rank the chunks the DRAM tier keeps and warm the hot tier (0 = none)", integerOption('--obs-window', 0, 4096), DEMO_DEFAULTS.obsWindow)
    .option('--tiers-only', 'with --storage: skip the dense / policy comparison table')
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
      let tiers: RuntimeDemoResult | undefined;
      const runtimeOpts = { dir: o.storage ?? '', dramBudget: o.dramBudget ?? 2 ** 30, budget: o.budget, mode: o.mode === 'pipelined' ? ('pipelined' as const) : ('sequential' as const), hotWindows: o.hotWindows, streamHeads: o.streamHeads, obsWindow: Math.min(o.obsWindow, o.context) };
      if (o.storage !== undefined) tiers = await runRuntimeDemo(trace, runtimeOpts);
      if (o.tiersOnly) {
        if (!tiers) throw new KvdriveError('E_CONFIG', 'demo --tiers-only: expected --storage, got none');
        if (o.json) process.stdout.write(JSON.stringify({ budget: o.budget, tiers: { ...tiers, stats: undefined, memoryStats: tiers.stats.memory } }) + '\n');
        else process.stdout.write(renderRuntimeDemo(tiers, runtimeOpts) + '\n');
        return;
      }
      // kvdrive runs through the runtime a host embeds (both modes, same inputs); quest and
      // shadowkv as policy objects. Every row is scored against the same dense reference.
      const viaRuntime = o.policy.includes('kvdrive');
      const policies = o.policy.filter((p) => p !== 'kvdrive');
      const modes = ['sequential', 'pipelined'] as const;
      const bar = new ProgressBar(o.layers * (o.steps + 2) + (viaRuntime ? modes.length * o.layers * o.steps : 0), 'demo');
      let phase = '';
      const rows: RuntimeRow[] = [];
      let ev: TraceEvaluation;
      let runtimeRows: RuntimeSummary[];
      try {
        if (viaRuntime)
          for (const mode of modes) rows.push(await RuntimeRow.open(trace.meta, trace.dtype, { budget: o.budget, threads: o.threads, mode, onStep: (what) => bar.tick(what) }));
        await warmUpPolicies(policies, trace.meta, trace.dtype, o.budget, o.threads);
        ev = await evaluateTrace(trace, {
          policies,
          budget: o.budget,
          denseThreads: o.threads,
          attended: rows,
          onPhase: (what) => {
            if (phase) bar.tick(what);
            else bar.tick(what, 0);
            phase = what;
          },
          onStep: (l, s) => bar.tick(`layer ${l} step ${s}`),
        });
        for (const r of rows.slice(1)) r.checkIdentical(rows[0]!);
        runtimeRows = await Promise.all(rows.map((r) => r.summary()));
      } finally {
        for (const r of rows) await r.close();
      }
      bar.finish();
      // With --storage: the recall kvdrive eval --offloaded reports on this trace and budget (the
      // same selection as the runtime's, from the index alone), beside the runtime's own.
      const offloaded =
        tiers && viaRuntime
          ? (await evaluateTrace(trace, { policies: ['kvdrive'], budget: o.budget, denseThreads: o.threads, offloaded: true })).policies[0]!
          : undefined;
      const own = ev.attended[0];
      const recallLine =
        offloaded && own
          ? `\nrecall of the runtime's attended tokens: ${own.recall.toFixed(4)} (${own.recallVsOracle.toFixed(3)} x oracle); kvdrive eval --offloaded on the same trace and budget: ${offloaded.recall.toFixed(4)} (${offloaded.recallVsOracle.toFixed(3)} x oracle)`
          : '';
      const row = offloaded && tiers ? { offloaded, tiers, mode: runtimeOpts.mode } : undefined;
      const runtime = runtimeRows.map((r, i) => ({ ...r, eval: ev.attended[i] }));
      if (o.json)
        process.stdout.write(
          JSON.stringify({ ...ev, budget: o.budget, runtime, ...(tiers ? { tiers: { ...tiers, stats: undefined, memoryStats: tiers.stats.memory }, offloaded } : {}) }) + '\n',
        );
      else process.stdout.write(render(ev, o, runtimeRows, row) + (tiers ? renderRuntimeDemo(tiers, runtimeOpts) : '') + recallLine + '\n');
    });
}
