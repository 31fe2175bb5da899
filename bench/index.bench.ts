/**
 * Centroid index benchmarks, each reported against a baseline measured in the same run:
 *  1. scoreCentroids GFLOP/s (GQA group of 4, dim 128) at the best index-kernel level vs the scalar
 *     build of the same kernel;
 *  2. one 4096-token segment k-means (1024 chunk means -> 256 clusters, dim 128) vs one Lloyd
 *     iteration's worth of work at the scalar level;
 *  3. index build of one layer (tokens x 8 kv heads x dim 128, bf16 keys);
 *  4. select() per decode step per layer: kvdrive (index only, and with the keys: exact level-3
 *     re-rank, token-major and head-major keys) vs scoring all chunk means (shadowkv, c = 4) vs
 *     quest, with vectors and bytes scored.
 *  Recall on the demo workload: bench/index-tune.ts.
 *
 *   npm run build:ts && node dist/bench/index.bench.js [tokens=32768]
 */
import { createPolicy } from '../src/index/policy.js';
import { centroidTiles, indexKernelLevel, kmeans, scoreCentroids } from '../src/index/kernels.js';
import { blobPoints, meanMs, uniform } from './bench-util.js';

const TOKENS = Number(process.argv[2] ?? 32768);
const DIM = 128;
const HEADS = 8;
const best = indexKernelLevel('best');

// 1. centroid scoring
{
  const n = 8192;
  const g = 4;
  const q = uniform(g * DIM, 1);
  const c = uniform(n * DIM, 2);
  const tiles = centroidTiles(c, n, DIM);
  const tiles8 = centroidTiles(c, n, DIM, 'i8');
  const tiles4 = centroidTiles(c, n, DIM, 'u4');
  const run = () => scoreCentroids(q, g, tiles, n, DIM, 'tiles');
  const run8 = () => scoreCentroids(q, g, tiles8, n, DIM, 'tiles8');
  const run4 = () => scoreCentroids(q, g, tiles4, n, DIM, 'tiles4');
  const runRows = () => scoreCentroids(q, g, c, n, DIM);
  const tb = await meanMs({ best: run, i8: run8, u4: run4, rows: runRows });
  indexKernelLevel('scalar');
  const tScalar = (await meanMs({ scalar: run })).scalar!;
  indexKernelLevel('best');
  const flop = 2 * g * n * DIM;
  const gf = (ms: number) => (flop / ms / 1e6).toFixed(2);
  console.log(`scoreCentroids ${n} centroids x group ${g} x dim ${DIM} (tiled, as the index): ${best} ${gf(tb.best!)} GFLOP/s ` +
    `(${tb.best!.toFixed(3)} ms), scalar build ${gf(tScalar)} GFLOP/s; ratio ${(tScalar / tb.best!).toFixed(2)}x; ` +
    `row-major input incl. transpose ${gf(tb.rows!)} GFLOP/s; int8 tiles (a quarter of the bytes, query quantized per call) ` +
    `${gf(tb.i8!)} GFLOP/s, ratio vs f32 tiles ${(tb.best! / tb.i8!).toFixed(2)}x; 4-bit tiles (what the index scores, an eighth ` +
    `of the bytes) ${gf(tb.u4!)} GFLOP/s, ratio vs f32 tiles ${(tb.best! / tb.u4!).toFixed(2)}x`);
}

// 2. one segment's k-means
{
  const pts = blobPoints(1024, DIM, 300, 3);
  const seg = (trials: number) => () => kmeans(pts, DIM, { k: 256, iters: 8, seed: 1, trials });
  const t = await meanMs({ greedy: seg(0), two: seg(2) }, 600);
  indexKernelLevel('scalar');
  const ts = await meanMs({ two: seg(2) }, 600);
  indexKernelLevel('best');
  const r = kmeans(pts, DIM, { k: 256, iters: 8, seed: 1, trials: 2 });
  const lloydFlop = 2 * 1024 * 256 * DIM;
  console.log(`segment k-means 1024 x ${DIM} -> 256 (iters <= 8, ran ${r.iterations}): ${best} ${t.two!.toFixed(2)} ms with 2 draws/centre ` +
    `(greedy 2+ln k draws ${t.greedy!.toFixed(2)} ms), scalar build ${ts.two!.toFixed(2)} ms; ratio ${(ts.two! / t.two!).toFixed(2)}x; ` +
    `= ${(((r.iterations + 1) * lloydFlop) / t.two! / 1e6).toFixed(1)} GFLOP/s counting Lloyd passes only`);
}

// 3. layer build, 4. select
{
  const f32 = uniform(TOKENS * HEADS * DIM, 4);
  // Locally correlated keys: a slow random walk per head plus noise, stored as bf16.
  const bits = new Uint16Array(f32.length);
  const walk = new Float32Array(HEADS * DIM);
  const u32 = new Uint32Array(1);
  const f = new Float32Array(u32.buffer);
  for (let t = 0; t < TOKENS; t++)
    for (let i = 0; i < HEADS * DIM; i++) {
      walk[i] = 0.98 * walk[i]! + 0.2 * f32[t * HEADS * DIM + i]!;
      f[0] = walk[i]! * 4 + 0.3 * f32[((t * 7 + 3) % TOKENS) * HEADS * DIM + i]!;
      bits[t * HEADS * DIM + i] = u32[0]! >>> 16;
    }
  const k = { data: bits, dtype: 'bf16' as const, tokens: TOKENS, heads: HEADS, dim: DIM };
  // The same keys head-major ('htd'): a re-ranked chunk's rows are then contiguous (level 3 gathers
  // 4 x 256 B rows per chunk from one place instead of 2 KiB apart in a token-major cache).
  const htdBits = new Uint16Array(bits.length);
  for (let t = 0; t < TOKENS; t++)
    for (let h = 0; h < HEADS; h++) htdBits.set(bits.subarray((t * HEADS + h) * DIM, (t * HEADS + h + 1) * DIM), (h * TOKENS + t) * DIM);
  const kHtd = { ...k, data: htdBits, layout: 'htd' as const };
  const q = uniform(32 * DIM, 5);
  for (let i = 0; i < q.length; i++) q[i]! *= 3;
  const policies = { kvdrive: createPolicy('kvdrive'), allMeans: createPolicy('shadowkv', { chunkSize: 4 }), quest: createPolicy('quest') };
  for (const [name, p] of Object.entries(policies)) {
    const t0 = performance.now();
    const c0 = process.cpuUsage();
    await p.build(k, TOKENS);
    const cpu = process.cpuUsage(c0);
    // CPU time (all threads) is the cost on one core, and stays meaningful on a loaded machine.
    console.log(`build ${name}: ${TOKENS} tokens x ${HEADS} kv heads x dim ${DIM} bf16 in ${(performance.now() - t0).toFixed(0)} ms wall, ` +
      `${((cpu.user + cpu.system) / 1000).toFixed(0)} ms CPU, index ${(p.indexBytes() / 2 ** 20).toFixed(1)} MiB`);
  }
  const budget = Math.round(TOKENS * 0.0156);
  // kvdriveKeys: the same kvdrive index, selecting with the keys (exact level-3 re-rank);
  // kvdriveKeysHtd: the same with head-major keys.
  const selectFor = (name: string) => (name === 'kvdriveKeys' ? { keys: k } : name === 'kvdriveKeysHtd' ? { keys: kHtd } : undefined);
  const withKeys: Record<string, (typeof policies)[keyof typeof policies]> = {
    ...policies, kvdriveKeys: policies.kvdrive, kvdriveKeysHtd: policies.kvdrive,
  };
  const t = await meanMs(Object.fromEntries(Object.entries(withKeys).map(([n, p]) => [n, () => p.select(q, budget, selectFor(n))])), 500);
  // CPU time per step too: on a shared machine wall time includes waiting for a core.
  const cpuMs: Record<string, number> = {};
  for (const [name, p] of Object.entries(withKeys)) {
    const c0 = process.cpuUsage();
    for (let i = 0; i < 50; i++) p.select(q, budget, selectFor(name));
    const u = process.cpuUsage(c0);
    cpuMs[name] = (u.user + u.system) / 1000 / 50;
  }
  for (const [name, p] of Object.entries(withKeys)) {
    p.select(q, budget, selectFor(name));
    const s = p.lastSelectStats();
    console.log(`select ${name}: ${t[name]!.toFixed(3)} ms/step wall, ${cpuMs[name]!.toFixed(3)} ms CPU (32 q heads, budget ${budget}), ` +
      `${s.vectorsScored} vectors, ${(s.bytesScored / 2 ** 20).toFixed(2)} MiB scored; ratio vs allMeans: wall ${(t.allMeans! / t[name]!).toFixed(2)}x, ` +
      `CPU ${(cpuMs.allMeans! / cpuMs[name]!).toFixed(2)}x`);
  }
}
