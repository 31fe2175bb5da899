/**
 * The full fuzz run: every target (bench/fuzz/targets.ts), N seeded inputs each, in child
 * processes (a crash or hang is caught and reported with its input). Writes bench/fuzz.md.
 *
 *   npm run build:ts && node dist/bench/fuzz.js [--inputs 10000] [--seed 1] [--timeout-ms 20000]
 *     [--targets a,b] [--out bench/fuzz.md]
 *   node dist/bench/fuzz/child.js <target> <seed> <index> 0 --only   # re-runs one input in-process
 */
import { writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { reportTable, runFuzz, type TargetReport } from './fuzz/harness.js';
import { fuzzTargets } from './fuzz/targets.js';

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : dflt;
}

const here = dirname(fileURLToPath(import.meta.url));
const inputs = Number(arg('inputs', '10000'));
const seed = Number(arg('seed', '1'));
const timeoutMs = Number(arg('timeout-ms', '20000'));
const targets = arg('targets', fuzzTargets().map((t) => t.name).join(',')).split(',');
const out = arg('out', resolve(here, '..', '..', 'bench', 'fuzz.md'));
const command = `node dist/bench/fuzz.js --inputs ${inputs} --seed ${seed} --timeout-ms ${timeoutMs}`;

const t0 = performance.now();
const reports = await runFuzz({
  targets,
  inputs,
  seed,
  timeoutMs,
  childScript: join(here, 'fuzz', 'child.js'),
  onTarget: (r: TargetReport) => {
    const codes = Object.entries(r.codes).sort((a, b) => b[1] - a[1]).map(([c, n]) => `${c} ${n}`).join(', ');
    console.log(`${r.target}: ${r.inputs} inputs, ${r.ok} ok, ${r.typed} typed (${codes}), ${r.crashes} crashes, ${r.hangs} hangs, ${r.untyped} untyped, ${r.badMessages} bad messages, ${(r.ms / 1000).toFixed(1)} s`);
    for (const f of r.findings) console.log(`  ${f.kind} at input ${f.index}: ${f.detail}\n    input: ${f.input}`);
  },
});
const total = (performance.now() - t0) / 1000;
const findings = reports.flatMap((r) => r.findings.map((f) => ({ target: r.target, ...f })));
const md = [
  '# Fuzzing: no input crashes the process',
  '',
  `Command: \`npm run build:ts && ${command}\` (${total.toFixed(0)} s in all; each input must finish within`,
  `${timeoutMs} ms). Every input either succeeds or throws / rejects with a \`KvdriveError\` carrying a code;`,
  'a crash (the child process dies), a hang, an untyped error or a badly worded message ("expected',
  'expected", "got nan") is a finding. Inputs are seeded: input i of a target is the same on every run,',
  'and `node dist/bench/fuzz/child.js <target> <seed> <i> 0 --only` re-runs it alone. The s column is',
  'wall time on a shared, loaded 2-core machine (noisy; for scale only).',
  '',
  reportTable(reports),
  '',
  '## Error codes per target',
  '',
  ...reports.map((r) => `- ${r.target}: ${Object.entries(r.codes).sort((a, b) => b[1] - a[1]).map(([c, n]) => `${c} ${n}`).join(', ') || 'none'}`),
  '',
  '## Findings',
  '',
  ...(findings.length ? findings.map((f) => `- ${f.target} #${f.index} ${f.kind}: ${f.detail.slice(0, 300)}\n  input: \`${f.input.slice(0, 300)}\``) : ['None.']),
  '',
];
if (arg('out', '') !== '-') writeFileSync(out, md.join('\n'));
console.log(`\n${reportTable(reports)}\n(${total.toFixed(0)} s)`);
process.exit(findings.length ? 1 : 0);
