/**
 * `kvdrive profile`: replays a trace through the selection policy and a hot tier per candidate
 * window, and writes the window profile (bytes fetched per step and bytes resident per
 * (layer, kv head) and window) that `kvdrive solve-windows` consumes.
 */
import type { Command } from 'commander';
import { checkOutputFile, integerOption } from './options.js';
import { fail } from '../errors.js';
import { EvictionPolicies, type EvictionPolicy } from '../cache/hot-tier.js';
import { profileTotals, profileTrace } from '../cache/profiler.js';
import type { PolicyName } from '../index/selection.js';
import { openTrace } from '../trace/trace.js';
import { writeJsonFile } from './json-file.js';

function windowList(value: string): number[] {
  const parts = value.split(',').map((s) => s.trim());
  const ws = parts.map(Number);
  if (parts.some((p) => p === '') || ws.some((w) => !Number.isInteger(w) || w < 0))
    fail('E_CONFIG', 'option --windows', 'a comma-separated list of integers >= 0 like 0,1,2,3,4', value);
  return ws;
}

function mib(n: number): string {
  return n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(2)} MiB` : `${(n / 1024).toFixed(1)} KiB`;
}

interface ProfileCliOptions {
  trace: string;
  windows: number[];
  budget: number;
  policy: string;
  eviction: string;
  poolFactor: string;
  steps?: number;
  warmup: boolean;
  out: string;
}

export function register(program: Command): void {
  program
    .command('profile')
    .description('measure hot-tier transfer (benefit) and resident bytes (cost) per (layer, kv head) and window ×N on a trace')
    .requiredOption('--trace <file>', 'trace file (safetensors, DESIGN.md §7)')
    .option('--windows <list>', 'candidate windows ×N, comma-separated', windowList, [0, 1, 2, 3, 4])
    .option('--budget <k>', 'sparsity budget: tokens selected per (layer, kv head) per step', integerOption('--budget', 1, Number.MAX_SAFE_INTEGER, 'E_BUDGET'), 256)
    .option('--policy <name>', 'selection policy: kvdrive, quest or shadowkv', 'kvdrive')
    .option('--eviction <name>', `hot-tier eviction: ${EvictionPolicies.join(', ')}`, 'lookahead')
    .option('--pool-factor <x>', 'lookahead pool M as a multiple of the budget', '1.25')
    .option('--steps <n>', 'replay only the first n decode steps', integerOption('--steps', 1))
    .option('--no-warmup', 'skip the importance-guided warm-up')
    .option('--out <file>', 'profile JSON to write', 'profile.json')
    .action(async (o: ProfileCliOptions) => {
      if (!['kvdrive', 'quest', 'shadowkv'].includes(o.policy)) fail('E_POLICY', 'option --policy', 'kvdrive, quest or shadowkv', o.policy);
      if (!(EvictionPolicies as readonly string[]).includes(o.eviction)) fail('E_POLICY', 'option --eviction', EvictionPolicies.join(', '), o.eviction);
      const poolFactor = Number(o.poolFactor);
      if (!Number.isFinite(poolFactor) || poolFactor < 1) fail('E_CONFIG', 'option --pool-factor', 'a number >= 1', o.poolFactor);
      checkOutputFile(o.out, 'option --out');
      const trace = await openTrace(o.trace);
      try {
        const profile = await profileTrace(trace, {
          windows: o.windows,
          budget: o.budget,
          policy: o.policy as PolicyName,
          eviction: o.eviction as EvictionPolicy,
          poolFactor,
          steps: o.steps,
          warmup: o.warmup,
        });
        writeJsonFile(o.out, profile, 'profile');
        const lines = [`profile of ${o.trace}: ${profile.shape.layers} layers × ${profile.shape.kvHeads} kv heads, budget ${o.budget}, ${o.policy} + ${o.eviction}, ${profile.source!.steps} steps`];
        lines.push('window  fetched/step  resident      hit rate');
        for (const t of profileTotals(profile))
          lines.push(`×${String(t.window).padEnd(6)}${mib(t.fetchedBytesPerStep).padStart(12)}  ${mib(t.residentBytes).padStart(12)}  ${(t.hitRate * 100).toFixed(1).padStart(6)}%`);
        lines.push(`wrote ${o.out}`);
        process.stdout.write(lines.join('\n') + '\n');
      } finally {
        await trace.close();
      }
    });
}
