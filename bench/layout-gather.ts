/**
 * Would the DRAM tier's chunks read faster in the index's cluster order than in position order?
 * Issue 9 asks for a layout that turns the selected rows into few long reads. This bench replays
 * the runtime's own selections (kvdrive, `offloadedPolicyOptions`: key-sketch re-rank, single
 * tokens, each step's selection the next one's prior) on one layer of the demo's synthetic trace
 * and lays 2 KiB chunks (4 tokens: their K rows, then their V rows, as the DRAM tier stores them)
 * of every kv head out twice in one arena on huge pages: in position order (what the DRAM tier's
 * fill gives a head: ascending chunks) and in the order of the index's clusters
 * (`clusterLayout`, the order the SSD store writes a sealed segment in). For each step it times `memoryGather`
 * of the step's K and V rows (each head's K rows, then its V rows) in both layouts on 2 threads,
 * after a 256 MiB read (caches cold, as after a dense pass), the two layouts alternated, and prints
 * the medians with the distinct 4 KiB pages a step touches in each.
 *
 *   npm run build:ts && node dist/bench/layout-gather.js [--context 131072] [--steps 24] [--seed 3] [--rounds 6]
 *
 * Seed 3 is a tuning seed; figures: bench/RESULTS.md ("a cluster-ordered DRAM tier measured and dropped").
 */
import { parseArgs } from 'node:util';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { layerKvWithNew } from '../src/trace/trace.js';
import { prefixView } from '../src/eval/replay.js';
import { createPolicy, type NativeSelectionPolicy } from '../src/index/policy.js';
import { clusterLayout } from '../src/storage/cluster-layout.js';
import { offloadedPolicyOptions } from '../src/index/options.js';
import { memoryGather, memoryRead } from '../src/attention/kernels.js';
import { native } from '../src/native.js';
import type { Selection } from '../src/index/selection.js';
import { median } from './bench-util.js';

const { values: a } = parseArgs({
  options: { context: { type: 'string', default: '131072' }, steps: { type: 'string', default: '24' }, seed: { type: 'string', default: '3' }, rounds: { type: 'string', default: '6' } },
});
const T = Number(a.context);
const S = Number(a.steps);
const SEED = Number(a.seed);
const ROUNDS = Number(a.rounds);
const [H, D, QH, B, CS] = [8, 128, 32, 2048, 4];
const ROW = D * 2; // f16 row bytes
const ROWS_PER_CHUNK = (2 * CS * ROW) / ROW; // K rows then V rows

const trace = generateSyntheticTrace({ layers: 1, promptTokens: T, decodeSteps: S, qHeads: QH, kvHeads: H, headDim: D, dtype: 'f16', seed: SEED });
const layer = await trace.layer(0);
const { k } = layerKvWithNew(layer);
const policy = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { qHeads: QH, kvHeads: H, headDim: D }));
await policy.build(prefixView(k, T), T);
const chunks = Math.ceil(T / CS);

// rank[h][chunk]: the chunk's place in its head's cluster order, the order the SSD store writes a
// sealed segment in (clusterLayout; chunks no cluster holds follow in token order).
const rank = Array.from({ length: H }, (_, h) => {
  const order = clusterLayout(policy as NativeSelectionPolicy, h, 0, chunks).chunkIds;
  const r = new Int32Array(chunks);
  order.forEach((c, i) => (r[c] = i));
  return r;
});

const sels: Selection[] = [];
let prior: Selection | null = null;
for (let s = 0; s < S; s++) {
  const tokens = T + s + 1;
  policy.extend(prefixView(k, tokens), tokens);
  policy.setPrior(prior);
  prior = policy.select(layer.q.subarray(s * QH * D, (s + 1) * QH * D), B);
  sels.push(prior);
}

/** Row indices (units of ROW bytes) of a selection's K and V rows in one layout. */
function rowsOf(sel: Selection, clustered: boolean): Int32Array {
  const out: number[] = [];
  for (let h = 0; h < H; h++) {
    const ks: number[] = [];
    const vs: number[] = [];
    for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) {
      const t = sel.chunkIds[i]!;
      if (t >= T) continue; // decoded tokens: in the tail, not the tier
      const c = Math.floor(t / CS);
      const slot = h * chunks + (clustered ? rank[h]![c]! : c);
      ks.push(slot * ROWS_PER_CHUNK + (t % CS));
      vs.push(slot * ROWS_PER_CHUNK + CS + (t % CS));
    }
    out.push(...ks, ...vs);
  }
  return Int32Array.from(out);
}
const layouts = { position: sels.map((s) => rowsOf(s, false)), cluster: sels.map((s) => rowsOf(s, true)) };
const pages = (rows: Int32Array) => new Set(Array.from(rows, (r) => Math.floor((r * ROW) / 4096))).size;

const arena = new Uint8Array(H * chunks * ROWS_PER_CHUNK * ROW);
native.adviseHugePages(arena);
arena.fill(1);
const flush = new Uint8Array(256 << 20).fill(1);
const ms = { position: [] as number[], cluster: [] as number[] };
for (let round = 0; round < ROUNDS; round++)
  for (let s = 0; s < S; s++) {
    const order: (keyof typeof layouts)[] = (s + round) % 2 ? ['position', 'cluster'] : ['cluster', 'position'];
    for (const name of order) {
      memoryRead(flush, 2);
      const t0 = performance.now();
      memoryGather(arena, ROW, layouts[name][s]!, 2);
      ms[name].push(performance.now() - t0);
    }
  }
const meanPages = (name: keyof typeof layouts) => layouts[name].reduce((p, r) => p + pages(r), 0) / S;
console.log(`seed ${SEED}, context ${T}, budget ${B}, ${S} steps x ${ROUNDS} rounds; a step's K and V rows (${layouts.position[0]!.length} rows of ${ROW} B), memoryGather on 2 threads after a 256 MiB read:`);
for (const name of ['position', 'cluster'] as const)
  console.log(`  ${name} order: median ${median(ms[name]).toFixed(3)} ms; distinct 4 KiB pages per step ${meanPages(name).toFixed(0)}`);
console.log(`  cluster / position: ${(median(ms.cluster) / median(ms.position)).toFixed(3)}`);
