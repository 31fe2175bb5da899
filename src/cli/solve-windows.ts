/**
 * `kvdrive solve-windows`: 2D window scaling (kvdrive.txt §5.2). Reads a window profile, solves the
 * multiple-choice knapsack for a byte budget and writes windows.json (the hot tier's `windows`
 * configuration), printing the chosen window per (layer, kv head), the total cost and the predicted
 * transfer against the best uniform window at the same bytes.
 */
import type { Command } from 'commander';
import { KvdriveError, fail } from '../errors.js';
import { parseProfile } from '../cache/profile-types.js';
import { parseBytes, solveWindows, type SolveMethod } from '../cache/window-solver.js';
import { openTrace } from '../trace/trace.js';
import { readJsonFile, writeJsonFile } from './json-file.js';

interface SolveCliOptions {
  profile: string;
  budget: string;
  method: string;
  trace?: string;
  out: string;
}

export function register(program: Command): void {
  program
    .command('solve-windows')
    .description('choose a hot-tier window per (layer, kv head) under a byte budget from a profile (MCKP)')
    .requiredOption('--profile <file>', 'profile JSON written by `kvdrive profile`')
    .requiredOption('--budget <bytes>', 'total hot-tier bytes (K/V slots), e.g. 262144 or 256KiB')
    .option('--method <m>', 'exact, greedy or auto', 'auto')
    .option('--trace <file>', 'check that the profile matches this trace\'s shape')
    .option('--out <file>', 'window allocation JSON to write', 'windows.json')
    .action(async (o: SolveCliOptions) => {
      if (!['exact', 'greedy', 'auto'].includes(o.method)) fail('E_CONFIG', 'option --method', 'exact, greedy or auto', o.method);
      const budgetBytes = parseBytes(o.budget, 'option --budget');
      const profile = parseProfile(readJsonFile(o.profile, 'profile'), `profile ${o.profile}`);
      if (o.trace !== undefined) {
        const t = await openTrace(o.trace);
        const m = t.meta;
        await t.close();
        const s = profile.shape;
        if (s.layers !== m.layers || s.kvHeads !== m.kvHeads || (s.headDim !== undefined && s.headDim !== m.headDim) || (s.qHeads !== undefined && s.qHeads !== m.qHeads))
          throw new KvdriveError(
            'E_SHAPE',
            `profile ${o.profile}: expected the shape of trace ${o.trace} (layers ${m.layers}, kvHeads ${m.kvHeads}, qHeads ${m.qHeads}, headDim ${m.headDim}), got layers ${s.layers}, kvHeads ${s.kvHeads}, qHeads ${s.qHeads ?? '?'}, headDim ${s.headDim ?? '?'}`,
          );
      }
      const a = solveWindows(profile, { budgetBytes, method: o.method as SolveMethod });
      writeJsonFile(o.out, a, 'window allocation');
      const lines = [`method ${a.method}${a.quantised ? ' (quantised)' : ''}, ${a.solveMs.toFixed(1)} ms; windows ×N per (layer, kv head):`];
      a.windows.forEach((row, l) => lines.push(`  layer ${String(l).padStart(3)}: ${row.map((w) => String(w).padStart(2)).join(' ')}`));
      lines.push(`total cost ${a.totalCostBytes} of ${a.budgetBytes} bytes (minimum feasible ${a.minimumBytes})`);
      lines.push(`predicted transfer ${a.predictedFetchedBytesPerStep.toFixed(0)} bytes/step`);
      if (a.uniform)
        lines.push(
          `uniform ×${a.uniform.window} at ${a.uniform.costBytes} bytes: ${a.uniform.fetchedBytesPerStep.toFixed(0)} bytes/step → 2D/uniform = ${(a.predictedFetchedBytesPerStep / a.uniform.fetchedBytesPerStep).toFixed(3)}`,
        );
      else lines.push('no uniform window fits this budget');
      lines.push(`wrote ${o.out}`);
      process.stdout.write(lines.join('\n') + '\n');
    });
}
