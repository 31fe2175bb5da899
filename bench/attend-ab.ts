/**
 * Same-process A/B of the runtime's attention (attendFetched) between two builds of the addon, for
 * a loaded machine where separate runs are not comparable. The demo's layer shape (32 query / 8 kv
 * heads, dim 128, f16): 4 sinks + 2048 selected tokens + a 64-token tail per kv head over a 128K
 * context, the selected tokens read as the step reads them — from page-first `page`-token pages at
 * shuffled slots of a 512 MiB DRAM-tier arena (every chunk resident), sinks and tail from their own
 * token-major tensors. 16 selections are used in turn, so rows come from DRAM, not cache. A
 * selection is runs of `run` consecutive tokens at random places (kvdrive's token selections
 * cluster: runs of neighbours are common; run 1 is the fully scattered worst case).
 *
 * Whether both builds return bit-identical outputs is printed (checked on every selection; builds
 * with different softmax arithmetic differ by float rounding); then calls alternate A, B and a
 * `memoryGather` of exactly the arena rows a call reads (the roofline; in reverse order on odd
 * rounds) for `reps` rounds, and each one's min / median wall per call, process CPU per call and
 * the median wall per attended row (K+V, 512 B) are printed, each build's median beside the
 * gather's (gather / build: 1 = attention as fast as reading its rows).
 *
 *   [KVD_HUGE=1] node dist/bench/attend-ab.js <a.node> <b.node> [threads=2] [reps=60] [run=4] [page=16]
 *
 * `page`: tokens per DRAM-tier page (a power of two, 1..64). The runtime's kvdrive pages hold 4 tokens
 * (its chunk size; 2 KiB of f16 K + V at dim 128), so a token's K and V rows share a 4 KiB page there;
 * 16 is the default only because earlier figures in bench/RESULTS.md were taken with it.
 */
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import { bitsEqual, fillF16, median, xorshift } from './bench-util.js';

const require = createRequire(import.meta.url);
const [A, B] = [process.argv[2]!, process.argv[3]!];
const THREADS = Number(process.argv[4] ?? 2);
const REPS = Number(process.argv[5] ?? 60);
const RUN = Number(process.argv[6] ?? 4);
const PAGE = Number(process.argv[7] ?? 16);
if (!(Number.isInteger(PAGE) && PAGE >= 1 && PAGE <= 64 && (PAGE & (PAGE - 1)) === 0)) throw new Error(`page: expected a power of two in [1, 64], got ${process.argv[7]}`);

const Q_HEADS = 32, KV_HEADS = 8, DIM = 128, TOKENS = 128 * 1024, BUDGET = 2048, SINKS = 4, LOCAL = 64;
const ROW = DIM * 2;
const PAGE_BYTES = 2 * PAGE * ROW;
const CHUNKS = TOKENS / PAGE;
const TAIL_BASE = TOKENS - LOCAL;

// The arena is a fresh f32 array (untouched until filled), so with KVD_HUGE=1 it can be advised for
// transparent huge pages before its first write (fewer TLB misses per scattered row), as the DRAM
// tier advises its arenas (src/util/kv-array.ts).
const arenaF32 = new Float32Array((KV_HEADS * CHUNKS * PAGE_BYTES) / 4);
const HUGE = process.env.KVD_HUGE === '1';
if (HUGE) require(A).adviseHugePages(arenaF32);
const arena = new Uint8Array(arenaF32.buffer);
fillF16(new Uint16Array(arena.buffer), 9);
const hugeKb = HUGE ? /AnonHugePages:\s+(\d+)/.exec(readFileSync('/proc/self/smaps_rollup', 'utf8'))?.[1] : undefined;
const slots = Int32Array.from({ length: KV_HEADS * CHUNKS }, (_, i) => i);
const rnd = xorshift(17);
for (let i = slots.length - 1; i > 0; i--) {
  const j = rnd() % (i + 1);
  [slots[i], slots[j]] = [slots[j]!, slots[i]!];
}
const q = new Float32Array(Q_HEADS * DIM).map((_, i) => Math.sin(i * 0.37) * 0.5);
const tensor = (tokens: number, seed: number) => {
  const data = new Uint16Array(tokens * KV_HEADS * DIM);
  fillF16(data, seed);
  return { data, dtype: 'f16', tokens, heads: KV_HEADS, dim: DIM };
};
const sink = { k: tensor(SINKS, 1), v: tensor(SINKS, 2) };
const tail = { k: tensor(LOCAL, 3), v: tensor(LOCAL, 4) };

function args(seed: number) {
  const next = xorshift(seed);
  const ids = new Int32Array(BUDGET * KV_HEADS);
  const offsets = new Int32Array(KV_HEADS + 1);
  const pageIds: number[] = [];
  const fetchedOffsets = new Int32Array(KV_HEADS + 1);
  for (let h = 0; h < KV_HEADS; h++) {
    const chosen = new Set<number>();
    while (chosen.size < BUDGET) {
      const start = SINKS + (next() % (TAIL_BASE - SINKS - RUN));
      for (let t = start; t < start + RUN && chosen.size < BUDGET; t++) chosen.add(t);
    }
    ids.set(Int32Array.from([...chosen].sort((a, b) => a - b)), h * BUDGET);
    offsets[h + 1] = (h + 1) * BUDGET;
    let last = -1;
    for (let i = h * BUDGET; i < (h + 1) * BUDGET; i++) {
      const c = Math.floor(ids[i]! / PAGE);
      if (c !== last) pageIds.push((last = c));
    }
    fetchedOffsets[h + 1] = pageIds.length;
  }
  const fetchedAt = new Float64Array(pageIds.length);
  for (let h = 0; h < KV_HEADS; h++)
    for (let i = fetchedOffsets[h]!; i < fetchedOffsets[h + 1]!; i++) fetchedAt[i] = slots[h * CHUNKS + pageIds[i]!]! * PAGE_BYTES;
  const selection = { chunkSize: 1, tokens: TOKENS, sinkEnd: SINKS, tailStart: TAIL_BASE, offsets, chunkIds: ids };
  // The arena rows the call reads, in the order its passes read them (every head's selected K rows,
  // then their V rows; a page holds its tokens' K rows, then their V rows), in ROW-byte units: the
  // gather baseline. (The sinks' and tail's rows, 3% of the rows, lie in small tensors: left out.)
  const gatherRows = new Int32Array(2 * BUDGET * KV_HEADS);
  for (let h = 0, n = 0; h < KV_HEADS; h++)
    for (let i = h * BUDGET; i < (h + 1) * BUDGET; i++, n++) {
      const t = ids[i]!;
      const row = (slots[h * CHUNKS + Math.floor(t / PAGE)]! * PAGE_BYTES) / ROW + (t % PAGE);
      gatherRows[n] = row;
      gatherRows[BUDGET * KV_HEADS + n] = row + PAGE;
    }
  return { q, qHeads: Q_HEADS, sink, tail, tailBase: TAIL_BASE, selection, pageChunkSize: PAGE, fetched: arena, fetchedOffsets, fetchedIds: Int32Array.from(pageIds), fetchedAt, threads: THREADS, gatherRows };
}
const sels = Array.from({ length: 16 }, (_, i) => args(100 + i));
const rows = KV_HEADS * (SINKS + BUDGET + LOCAL);

type Out = { out: Float32Array; lse: Float32Array; chunkMass: Float32Array };
type Args = ReturnType<typeof args>;
const runs = [A, B].map((path) => ({ path, fn: require(path).attendFetched as (o: Args) => unknown, wall: [] as number[], cpu: 0 }));
let same = true;
for (const s of sels) {
  const [x, y] = runs.map((r) => r.fn(s) as Out);
  same &&= bitsEqual(x!.out, y!.out) && bitsEqual(x!.lse, y!.lse) && bitsEqual(x!.chunkMass, y!.chunkMass);
}
// The roofline, timed in turn with the builds: a gather of exactly the arena rows each call reads
// (memoryGather, A's build: each row's lines requested 4 KiB of rows ahead, summed, the list split
// over the threads), what no kernel reading those rows can beat.
const gatherFn = require(A).memoryGather as (buf: Uint8Array, rowBytes: number, rows: Int32Array, threads: number) => number;
runs.push({ path: 'memoryGather of the same arena rows', fn: (s: Args) => gatherFn(arena, ROW, s.gatherRows, THREADS), wall: [], cpu: 0 });
console.log(`attendFetched A/B: ${THREADS} thread(s), runs of ${RUN} tokens, ${PAGE}-token pages, ${rows} rows per call, arena on ${HUGE ? `huge pages (${hugeKb} KiB)` : '4 KiB pages'}; bit-identical outputs: ${same}; load ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
let at = 0;
for (let r = 0; r < REPS; r++)
  for (const run of r % 2 ? [...runs].reverse() : runs) {
    const s = sels[at++ % 16]!;
    const c = process.cpuUsage();
    const t = performance.now();
    run.fn(s);
    run.wall.push(performance.now() - t);
    const d = process.cpuUsage(c);
    run.cpu += (d.user + d.system) / 1000;
  }
const gatherP50 = median(runs[2]!.wall);
for (const run of runs) {
  const p50 = median(run.wall);
  const vs = run === runs[2] ? '' : `; gather p50 / this p50 ${(gatherP50 / p50).toFixed(2)}`;
  console.log(`${run.path}: min ${Math.min(...run.wall).toFixed(3)} p50 ${p50.toFixed(3)} ms (${((p50 * 1e6) / rows).toFixed(1)} ns/row), CPU ${(run.cpu / REPS).toFixed(3)} ms/call${vs}`);
}
console.log(`load after ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
