/**
 * Same-process A/B of the attention kernels between two builds of the addon (bench/attend-ab.ts
 * does the runtime's attendFetched): dense attention over a 128K context and sparse attention over
 * 2048 tokens of it, the shapes of `npm run bench:kernels` (32 query / 8 kv heads, dim 128, f16,
 * token-major KV on huge pages). Sparse cases: a compact per-head arena (the hot tier's layout, the
 * same rows every call: cache-resident), 4-token chunks scattered over the context (the same
 * selection every call), 2048 single tokens scattered over it (a token-granular selection, the same
 * every call), and 16 selections of 4-token chunks in turn (rows from DRAM). On a shared VM separate
 * runs differ by more than most kernel changes, so the two builds run on the same inputs, call by
 * call (A, B; B, A on odd rounds), and each one's min / median wall per call is printed, with
 * whether their outputs are bit-identical.
 *
 *   node dist/bench/kernels-ab.js <a.node> <b.node> [threads=1,2] [reps=30] [cases=dense,compact,scattered,tokens,cold]
 */
import { createRequire } from 'node:module';
import os from 'node:os';
import { bitsEqual, fillF16, median, randomUnits } from './bench-util.js';

const require = createRequire(import.meta.url);
const [A, B] = [process.argv[2], process.argv[3]];
if (!A || !B) throw new Error('usage: node dist/bench/kernels-ab.js <a.node> <b.node> [threads=1,2] [reps=30] [cases]');
const THREADS = (process.argv[4] ?? '1,2').split(',').map(Number);
const REPS = Number(process.argv[5] ?? 30);
const CASES = (process.argv[6] ?? 'dense,compact,scattered,tokens,cold').split(',');
if (THREADS.some((t) => !Number.isInteger(t) || t < 1)) throw new Error(`threads: expected a list of integers >= 1, got ${process.argv[4]}`);
if (!Number.isInteger(REPS) || REPS < 1) throw new Error(`reps: expected an integer >= 1, got ${process.argv[5]}`);

const Q_HEADS = 32, KV_HEADS = 8, DIM = 128, TOKENS = 128 * 1024, BUDGET = 2048, CHUNK = 4, SINKS = 4, LOCAL = 64;
type Addon = { attendDense(o: unknown): { out: Float32Array }; attendSparse(o: unknown): { out: Float32Array }; adviseHugePages(a: Uint16Array): void };
const builds = [A, B].map((path) => ({ path, addon: require(path) as Addon }));

const kv = (seed: number) => {
  const data = new Uint16Array(TOKENS * KV_HEADS * DIM);
  builds[0]!.addon.adviseHugePages(data); // as the DRAM tier and the traces do
  fillF16(data, seed);
  return { data, dtype: 'f16', tokens: TOKENS, heads: KV_HEADS, dim: DIM };
};
const k = kv(1);
const v = kv(2);
const q = new Float32Array(Q_HEADS * DIM).map((_, i) => Math.sin(i * 0.37) * 0.5);

/** `per` distinct 4-token chunks per kv head at random places between the sinks and the tail, ascending. */
const chunks = (tokens: number, seed: number, per: number) => randomUnits({ kvHeads: KV_HEADS, sinks: SINKS, local: LOCAL }, tokens, seed, CHUNK, per);
// The compact arena: every chunk of a head-major arena of sinks + budget + tail tokens per head.
const perHead = SINKS + BUDGET + LOCAL;
const arena = (seed: number) => {
  const data = new Uint16Array(perHead * KV_HEADS * DIM);
  fillF16(data, seed);
  return { data, dtype: 'f16', tokens: perHead, heads: KV_HEADS, dim: DIM, layout: 'htd' };
};
const arenaK = arena(3);
const arenaV = arena(4);
const arenaSel = chunks(perHead, 0, BUDGET / CHUNK);
for (let h = 0; h < KV_HEADS; h++) for (let i = 0; i < BUDGET / CHUNK; i++) arenaSel.chunkIds[h * (BUDGET / CHUNK) + i] = SINKS / CHUNK + i;
const hotSel = chunks(TOKENS, 7, BUDGET / CHUNK);
// The same tokens as single-token units (how kvdrive's token-granular selections lie).
const tokenSel = randomUnits({ kvHeads: KV_HEADS, sinks: SINKS, local: LOCAL }, TOKENS, 9, 1, BUDGET);
const coldSels = Array.from({ length: 16 }, (_, i) => chunks(TOKENS, 100 + i, BUDGET / CHUNK));

let coldAt = 0;
const cases: Record<string, { run: (a: Addon, threads: number) => { out: Float32Array }; next?: () => void }> = {
  dense: { run: (a, threads) => a.attendDense({ q, qHeads: Q_HEADS, k, v, tokens: TOKENS, threads }) },
  compact: { run: (a, threads) => a.attendSparse({ q, qHeads: Q_HEADS, k: arenaK, v: arenaV, selection: arenaSel, threads }) },
  scattered: { run: (a, threads) => a.attendSparse({ q, qHeads: Q_HEADS, k, v, selection: hotSel, threads }) },
  tokens: { run: (a, threads) => a.attendSparse({ q, qHeads: Q_HEADS, k, v, selection: tokenSel, threads }) },
  // Both builds attend the same selection in a round; the next round takes the next one.
  cold: { run: (a, threads) => a.attendSparse({ q, qHeads: Q_HEADS, k, v, selection: coldSels[coldAt % 16], threads }), next: () => coldAt++ },
};
for (const c of CASES) if (!cases[c]) throw new Error(`cases: expected names among ${Object.keys(cases).join(', ')}, got ${c}`);

console.log(`kernels A/B (${A} vs ${B}), ${REPS} rounds per case; load ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
console.log('| case | threads | A min / p50 ms | B min / p50 ms | B / A (p50) | bit-identical |');
console.log('|---|---:|---:|---:|---:|---|');
for (const threads of THREADS)
  for (const name of CASES) {
    const c = cases[name]!;
    const wall = builds.map(() => [] as number[]);
    let same = true;
    for (let r = 0; r < REPS; r++) {
      const outs: Float32Array[] = [];
      for (const i of r % 2 ? [1, 0] : [0, 1]) {
        const t = performance.now();
        outs[i] = c.run(builds[i]!.addon, threads).out;
        wall[i]!.push(performance.now() - t);
      }
      same &&= bitsEqual(outs[0]!, outs[1]!);
      c.next?.();
    }
    const [a, b] = wall.map((w) => ({ min: Math.min(...w), p50: median(w) }));
    console.log(`| ${name} | ${threads} | ${a!.min.toFixed(3)} / ${a!.p50.toFixed(3)} | ${b!.min.toFixed(3)} / ${b!.p50.toFixed(3)} | ${(b!.p50 / a!.p50).toFixed(3)} | ${same} |`);
  }
console.log(`load after ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
