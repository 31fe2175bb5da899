/**
 * The attention row kernels (native/attention/attn_simd.h) on cache-resident rows, in one run
 * (tinybench): `logits_rows` (q·k of a tile of key rows for a GQA group) and `weighted_rows` (the
 * probability-weighted sum of value rows), f16 rows of dim 128 (the Llama-3-8B head), 256 rows per
 * call (64 KiB: they stay in L2, so the row is the kernel's arithmetic, not memory), for GQA groups
 * of 1, 2, 4 and 8 query heads, at the scalar level and the best level this CPU runs. Each call
 * goes through the test bindings (`simdLogitsRows` / `simdWeightedRows`), whose fixed cost (an
 * output array, a row-pointer list) is included and is the same for every build.
 *
 *   npm run build:ts && node dist/bench/attention-rows.bench.js [--time-ms 200] [--rounds 5] [--dist DIR]
 *
 * Every row runs `--time-ms` per round, all rows one after the other, `--rounds` times; a row's
 * figure is the median over the rounds of its mean (and the least of its minima): a machine that
 * slows down for a few seconds then moves one round of every row, not every round of a few rows.
 * On a shared VM the minima are the steadier figure (the scalar rows, the same code in both builds,
 * agree to ~2% in their minima while their means can differ by half).
 *
 * `--dist DIR`: also load another build's addon (DIR/dist, e.g. a checkout of the commit before a
 * change) into this process and time its kernels on the same inputs, rows interleaved with this
 * build's, so a before / after does not depend on how busy the machine was in two separate runs.
 * The outputs of the two builds are compared bit for bit and any difference is printed.
 */
import { cpus, loadavg } from 'node:os';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { importFromBuild, RoundTimes, timeTasks, uniform } from './bench-util.js';
import { native as here, cpuFeatures } from '../src/native.js';
import { f32ArrayToF16 } from '../src/util/f16.js';

const { values: a } = parseArgs({ options: { 'time-ms': { type: 'string' }, rounds: { type: 'string' }, dist: { type: 'string' } } });
const TIME_MS = Number(a['time-ms'] ?? 200);
const ROUNDS = Number(a.rounds ?? 5);
if (!(TIME_MS > 0)) throw new Error(`--time-ms: expected a positive number, got ${a['time-ms']}`);
if (!Number.isInteger(ROUNDS) || ROUNDS < 1) throw new Error(`--rounds: expected an integer >= 1, got ${a.rounds}`);
const distRoot = a.dist ? resolve(a.dist) : undefined;

type Native = typeof here;
const builds: { name: string; native: Native }[] = [{ name: 'this build', native: here }];
if (distRoot) {
  const other = await importFromBuild<{ native: Native }>('src/native.js', distRoot);
  builds.unshift({ name: 'before', native: other.native });
}

const DIM = 128;
const ROWS = 256;
const GROUPS = [1, 2, 4, 8];
const levels = cpuFeatures().levels as string[];
const best = levels[levels.length - 1]!;

const rows = f32ArrayToF16(uniform(ROWS * DIM, 7));
const inputs = GROUPS.map((g) => ({
  g,
  q: uniform(g * DIM, 11 + g),
  // Softmax-like weights in [0, 1).
  w: Float32Array.from(uniform(g * ROWS, 13 + g), (x) => Math.abs(x) % 1),
  acc: new Float32Array(g * DIM),
}));

// The builds must agree bit for bit before their times mean anything.
if (builds.length > 1) {
  for (const { g, q, w } of inputs)
    for (const level of levels) {
      const [l0, l1] = builds.map((b) => b.native.simdLogitsRows(level, q, g, rows, 'f16') as Float32Array);
      const [a0, a1] = builds.map((b) => {
        const acc = new Float32Array(g * DIM);
        b.native.simdWeightedRows(level, acc, g, w, rows, 'f16');
        return acc;
      });
      const differ = (x: Float32Array, y: Float32Array) => x.some((v, i) => !Object.is(v, y[i]));
      if (differ(l0!, l1!) || differ(a0!, a1!)) console.log(`note: the builds' outputs differ at level ${level}, group ${g}`);
    }
}

const tasks: [string, () => unknown][] = [];
for (const { g, q, w, acc } of inputs)
  for (const level of levels)
    for (const kernel of ['logits', 'weighted'] as const)
      for (const b of builds)
        tasks.push([`${kernel} g${g} ${level} | ${b.name}`, kernel === 'logits'
          ? () => b.native.simdLogitsRows(level, q, g, rows, 'f16')
          : () => b.native.simdWeightedRows(level, acc, g, w, rows, 'f16')]);

const rounds = new RoundTimes();
for (let round = 0; round < ROUNDS; round++) rounds.add(await timeTasks(tasks, { timeMs: TIME_MS, warmupMs: 50, iterations: 10 }));
const stat = new Map(tasks.map(([name]) => [name, rounds.get(name)]));

console.log(`# attention row kernels (${ROWS} f16 rows of dim ${DIM} per call; CPU ${cpus()[0]?.model ?? '?'}, best level ${best}; ` +
  `${ROUNDS} rounds x ${TIME_MS} ms per row; load ${loadavg().map((x) => x.toFixed(1)).join(' ')})`);
console.log('');
const cols = builds.map((b) => `${b.name}: ns per row (median mean / min)`);
console.log(`| kernel | group | level | ${cols.join(' | ')} |${builds.length > 1 ? ' before / this (median means) | before / this (minima) |' : ''}`);
console.log(`|---|---:|---|${builds.map(() => '---:').join('|')}|${builds.length > 1 ? '---:|---:|' : ''}`);
for (const { g } of inputs)
  for (const level of levels)
    for (const kernel of ['logits', 'weighted']) {
      const s = builds.map((b) => stat.get(`${kernel} g${g} ${level} | ${b.name}`)!);
      const cells = s.map((x) => `${((x.mean * 1e6) / ROWS).toFixed(1)} / ${((x.min * 1e6) / ROWS).toFixed(1)}`);
      const ratio = builds.length > 1 ? ` ${(s[0]!.mean / s[1]!.mean).toFixed(2)} | ${(s[0]!.min / s[1]!.min).toFixed(2)} |` : '';
      console.log(`| ${kernel} | ${g} | ${level} | ${cells.join(' | ')} |${ratio}`);
    }
