/**
 * Pareto bench: for each policy (and kvdrive selecting without keys on its key sketch), budgets
 * 512, 1024, 2048 and 4096 on the `kvdrive demo` workload: time per layer-step (extend + select +
 * sparse attention) beside recall / oracle, with dense attention measured in the same run as the
 * baseline. Same code as `kvdrive demo --pareto` (src/cli/demo-pareto.ts); prints markdown.
 *
 *   npm run build:ts && node dist/bench/pareto.js [context=131072] [layers=1] [steps=4] [seeds=1,11] [threads=2]
 *
 * Seed 1 is the demo's; 11 is held out (no default was tuned on it).
 */
import { loadavg, cpus } from 'node:os';
import { runPareto, dominates, KEYLESS, type ParetoResult } from '../src/cli/demo-pareto.js';

const CONTEXT = Number(process.argv[2] ?? 131072);
const LAYERS = Number(process.argv[3] ?? 1);
const STEPS = Number(process.argv[4] ?? 4);
const SEEDS = (process.argv[5] ?? '1,11').split(',').map(Number);
const THREADS = Number(process.argv[6] ?? 2);

function markdown(r: ParetoResult): string {
  const f = (x: number) => x.toFixed(2);
  const lines = [
    `### seed ${r.seed}: ${r.context} tokens, ${r.layers} layer(s) x ${r.steps} steps, ${r.threads} thread(s); dense ${f(r.denseMs)} ms per layer-step`,
    '',
    '| policy | budget | ms/layer-step | select ms | attend ms | vs dense | CPU ms | recall | oracle | recall / oracle | needles |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|',
  ];
  for (const x of r.rows)
    lines.push(`| ${x.policy} | ${x.budget} | ${f(x.totalMs)} | ${f(x.selectMs)} | ${f(x.attendMs)} | ${(x.totalMs / r.denseMs).toFixed(3)} | ${f(x.cpuMs)} | ${x.recall.toFixed(4)} | ` +
      `${x.oracleRecall.toFixed(4)} | ${x.recallVsOracle.toFixed(4)} | ${x.needlesTotal ? `${x.needlesFound}/${x.needlesTotal}` : '-'} |`);
  for (const mine of ['kvdrive', KEYLESS])
    lines.push('', `${mine} vs quest and shadowkv: ` +
      dominates(r, mine, ['quest', 'shadowkv']).map((d) => `${d.budget}: ${d.faster ? 'faster' : 'slower'}, ${d.moreAccurate ? 'more accurate' : 'less accurate'}`).join('; '));
  return lines.join('\n');
}

for (const seed of SEEDS) {
  const r = await runPareto({ context: CONTEXT, layers: LAYERS, steps: STEPS, dtype: 'f16', seed, threads: THREADS, policy: ['kvdrive', 'quest', 'shadowkv'] });
  console.log(markdown(r) + `\n\nload average after the run: ${loadavg().map((x) => x.toFixed(1)).join(' ')} (${cpus().length} CPUs)\n`);
}
