/**
 * `kvdrive eval --trace F`: replays a recorded trace through a selection policy and reports, per
 * layer and overall, the recall of dense attention mass, the oracle's recall at the same budget
 * (exact top-K tokens: the best any policy can do), relative output error against dense attention,
 * and selection time.
 */
import type { Command } from 'commander';
import { openTrace } from '../trace/trace.js';
import { evaluateTrace, type TraceEvaluation } from '../eval/replay.js';
import { ms, table } from '../eval/format.js';
import type { PolicyName } from '../index/selection.js';
import { choiceListOption, integerOption } from './options.js';
import { ProgressBar } from './progress.js';

const POLICIES: readonly PolicyName[] = ['kvdrive', 'quest', 'shadowkv'];

interface EvalCliOptions {
  trace: string;
  policy: PolicyName[];
  budget: number;
  json?: boolean;
  /** Select without the full keys, as the offloaded runtime does. */
  offloaded?: boolean;
  /** kvdrive's key-sketch bits (4 or 8); default: the offloaded runtime's. */
  sketchBits?: number;
  threads: number;
}

function report(ev: TraceEvaluation): string {
  const lines: string[] = [];
  const m = ev.meta;
  lines.push(
    `trace: ${m.layers} layers, ${m.qHeads}/${m.kvHeads} heads, dim ${m.headDim}, ${m.promptTokens} prompt tokens, ` +
      `${m.decodeSteps} decode steps, ${ev.dtype}; dense attention ${ms(ev.dense.ms)} per layer-step`,
  );
  for (const p of ev.policies) {
    lines.push('');
    lines.push(`policy ${p.policy}, budget ${p.budget} tokens per kv head`);
    const rows: (string | number)[][] = [['layer', 'recall', 'oracle', 'recall/oracle', 'rel error', 'select', 'needles']];
    for (const l of p.layers)
      rows.push([
        l.layer,
        l.recall.toFixed(4),
        l.oracleRecall.toFixed(4),
        (l.oracleRecall > 0 ? l.recall / l.oracleRecall : 1).toFixed(4),
        l.relError.toExponential(2),
        ms(l.selectMs),
        l.needlesTotal ? `${l.needlesFound}/${l.needlesTotal}` : '-',
      ]);
    rows.push([
      'all',
      p.recall.toFixed(4),
      p.oracleRecall.toFixed(4),
      p.recallVsOracle.toFixed(4),
      p.relError.toExponential(2),
      ms(p.selectMs),
      p.needlesTotal ? `${p.needlesFound}/${p.needlesTotal}` : '-',
    ]);
    lines.push(table(rows));
  }
  lines.push('', `select: mean wall time per step over ${m.decodeSteps > 1 ? "the steps after each layer's first (that one pays one-off costs)" : 'the one step'}; recall, error and needles over every step.`);
  return lines.join('\n');
}

export function register(program: Command): void {
  program
    .command('eval')
    .description('replay a trace through a selection policy and compare with dense attention')
    .requiredOption('--trace <file>', 'trace file (safetensors, DESIGN.md §7)')
    .option('--policy <names>', 'kvdrive, quest, shadowkv, or a comma-separated list', choiceListOption('--policy', POLICIES, 'E_POLICY'), ['kvdrive'])
    .option('--budget <tokens>', 'tokens attended per kv head beside sinks and local window', integerOption('--budget', 1, 2 ** 31 - 1, 'E_BUDGET'), 2048)
    .option('--threads <n>', 'threads for the dense reference, selection and sparse attention', integerOption('--threads', 1, 8), 2)
    .option('--json', 'print one JSON object instead of tables')
    .option('--offloaded', 'select as the offloaded runtime does: from the index alone, without the full keys')
    .option('--sketch-bits <bits>', "kvdrive's key-sketch bits, 4 or 8 (default: the offloaded runtime's; with --offloaded)", integerOption('--sketch-bits', 4, 8))
    .action(async (o: EvalCliOptions) => {
      const reader = await openTrace(o.trace);
      try {
        const total = reader.meta.layers * reader.meta.decodeSteps;
        const bar = o.json ? undefined : new ProgressBar(total, 'eval');
        const ev = await evaluateTrace(reader, {
          policies: o.policy,
          budget: o.budget,
          denseThreads: o.threads,
          offloaded: o.offloaded === true,
          ...(o.sketchBits !== undefined ? { policyOptions: { sketchBits: o.sketchBits as 4 | 8 } } : {}),
          onStep: (l, s) => bar?.tick(`layer ${l} step ${s}`),
        });
        bar?.finish();
        if (o.json) {
          const one = ev.policies.length === 1 ? ev.policies[0]! : undefined;
          const out = one
            ? { ...one, trace: o.trace, meta: ev.meta, dense: ev.dense }
            : { trace: o.trace, meta: ev.meta, dense: ev.dense, budget: o.budget, policies: ev.policies };
          process.stdout.write(JSON.stringify(out) + '\n');
        } else {
          process.stdout.write(report(ev) + '\n');
        }
      } finally {
        await reader.close();
      }
    });
}
