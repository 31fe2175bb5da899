/**
 * Attention kernel benchmarks at real shapes (head dim 128, GQA 32/8, f16 KV, one layer):
 *   - dense attention at 32K and 128K tokens, threads 1 and 2, token-major cache ('thd', the trace
 *     layout), and at 32K also head-major ('htd');
 *   - sparse attention at budget 2048 (1.56% of 128K) plus 4 sinks and a 64-token tail: over a
 *     compact per-head arena (the hot tier's layout; 8.7 MB, cache-resident), scattered over the
 *     128K cache with the same selection every call (cache-resident, but every chunk on another
 *     page), and scattered with 16 selections in turn (139 MB: reads come from DRAM); and the
 *     runtime's attendFetched over the same tokens as page-first pages in a DRAM-tier arena, and over
 *     2048 single tokens per head at random places (how the runtime's token-granular selections lie);
 *   - centroid scoring as kvdrive's select runs it (int8 tiles, 8192 clusters x 8 kv heads, one thread),
 *     the same tiles every call (L3-resident) and eight copies in turn (from DRAM, as a decode step).
 * Every kernel is reported beside the memory-read baseline (`memoryRead`: one SIMD pass over the
 * same number of bytes, same threads, same cache situation), measured in the same run: time per
 * call, GB/s of K/V bytes read, GFLOP/s, and the ratio of the kernel's GB/s to the baseline's. The
 * f32 attention kernels are also set against the arithmetic baseline (`computePeak`: independent
 * multiply-add chains, same threads): a kernel near 1 there is bound by its arithmetic, not memory.
 * The runtime's attendFetched rows are also set against `memoryGather` of exactly the rows they
 * read (each token's K and V rows, where they lie, in the same order and threads): the roofline of
 * scattered rows, which a sequential read overstates.
 *
 * Run: `npm run build && npm run bench:kernels` (node dist/bench/kernels.bench.js). Options via env:
 * KVD_BENCH_TIME_MS (per task, default 1500), KVD_BENCH_LEVEL (SIMD level, default best), KVD_BENCH_ONLY
 * (a regular expression: only the tasks it matches).
 */
import { cpus, loadavg } from 'node:os';
import { Bench } from 'tinybench';
import { attendDense, attendSparse, computePeak, memoryGather, memoryRead } from '../src/attention/kernels.js';
import { attendFetched } from '../src/storage/fetched-attention.js';
import { cpuFeatures, setSimdLevel, type SimdLevel } from '../src/native.js';
import { native } from '../src/native.js';
import type { KvTensor } from '../src/types.js';
import type { Selection } from '../src/index/selection.js';
import { fillF16, randomUnits as randomUnitsOf, xorshift } from './bench-util.js';
import { placedArray } from '../src/util/kv-array.js';

const Q_HEADS = 32;
const KV_HEADS = 8;
const DIM = 128;
const MAX_TOKENS = 128 * 1024;
const BUDGET = 2048;
const CHUNK = 4;
const SINKS = 4;
const LOCAL = 64;
const ROW_BYTES = DIM * 2; // f16
const TIME_MS = Number(process.env.KVD_BENCH_TIME_MS ?? 1500);

/** A random selection of `perHead` distinct units (of `unit` tokens) per kv head (bench-util's randomUnits at this shape). */
const randomUnits = (tokens: number, seed: number, unit: number, perHead: number): Selection =>
  randomUnitsOf({ kvHeads: KV_HEADS, sinks: SINKS, local: LOCAL }, tokens, seed, unit, perHead);

/** A random budget-K selection per kv head over the whole context: BUDGET/CHUNK chunks, ascending. */
const randomSelection = (tokens: number, seed: number): Selection => randomUnits(tokens, seed, CHUNK, BUDGET / CHUNK);

/**
 * BUDGET single tokens per kv head at random places (chunkSize 1), ascending: the runtime's
 * token-granular selections lie like this — about one or two selected tokens per 4-token page.
 */
const randomTokenSelection = (tokens: number, seed: number): Selection => randomUnits(tokens, seed, 1, BUDGET);

interface Row {
  name: string;
  bytes: number;
  flops: number;
  baseline?: string;
  /** The computePeak row of the same thread count, for f32 kernels (GFLOP/s ÷ its GFLOP/s). */
  peak?: string;
  /** The memoryGather row reading exactly this kernel's rows (scattered kernels): its roofline. */
  gather?: string;
  minMs?: number;
  p50Ms?: number;
  /** Process CPU time per call (user + system, all threads), from process.cpuUsage(). */
  cpuMs?: number;
}

function fmt(x: number, digits = 2): string {
  return x.toFixed(digits);
}

async function main(): Promise<void> {
  const level = process.env.KVD_BENCH_LEVEL as SimdLevel | undefined;
  if (level) setSimdLevel(level);
  const features = cpuFeatures();
  console.log(`# kvdrive kernel benchmarks  (SIMD ${features.active}; node ${process.version}; ${TIME_MS} ms per task)`);
  console.log(`shape: qHeads ${Q_HEADS}, kvHeads ${KV_HEADS}, dim ${DIM}, f16 KV, layout thd; allocating 2 x ${(MAX_TOKENS * KV_HEADS * ROW_BYTES) / 2 ** 20} MiB`);

  // Placed as traces and the runtime's arenas are (page-aligned, huge pages advised: kv-array.ts).
  const kData = placedArray(Uint16Array, MAX_TOKENS * KV_HEADS * DIM);
  const vData = placedArray(Uint16Array, MAX_TOKENS * KV_HEADS * DIM);
  fillF16(kData, 1);
  fillF16(vData, 2);
  const k: KvTensor = { data: kData, dtype: 'f16', tokens: MAX_TOKENS, heads: KV_HEADS, dim: DIM };
  const v: KvTensor = { data: vData, dtype: 'f16', tokens: MAX_TOKENS, heads: KV_HEADS, dim: DIM };
  const q = new Float32Array(Q_HEADS * DIM);
  const nq = xorshift(3);
  for (let i = 0; i < q.length; i++) q[i] = ((nq() % 2000) - 1000) / 1000;

  const bench = new Bench({ time: TIME_MS, iterations: 5, warmupTime: 200, warmupIterations: 2 });
  const rows = new Map<string, Row>();
  // Each call also accumulates process CPU time: on a shared, oversubscribed machine wall time
  // includes time the process was not running, CPU time does not.
  const cpu = new Map<string, { us: number; calls: number }>();
  // KVD_BENCH_ONLY (a regular expression): only the tasks whose name matches (name their baselines too).
  const only = process.env.KVD_BENCH_ONLY ? new RegExp(process.env.KVD_BENCH_ONLY) : undefined;
  const add = (row: Row, fn: () => unknown): void => {
    if (only && !only.test(row.name)) return;
    rows.set(row.name, row);
    const acc = { us: 0, calls: 0 };
    cpu.set(row.name, acc);
    bench.add(row.name, () => {
      const c0 = process.cpuUsage();
      fn();
      const c = process.cpuUsage(c0);
      acc.us += c.user + c.system;
      acc.calls++;
    });
  };
  const flopsFor = (tokensPerHead: number): number => 4 * Q_HEADS * tokensPerHead * DIM; // QK + PV, 2 flops per MAC

  // The arithmetic baseline: ~5 ms of multiply-adds per call (flops per call from one probe call).
  const PEAK_ITERS = 2_000_000;
  for (const threads of [1, 2]) add({ name: `computePeak (${threads}T)`, bytes: 0, flops: computePeak(PEAK_ITERS, threads).flops }, () => computePeak(PEAK_ITERS, threads));

  for (const tokens of [32 * 1024, MAX_TOKENS]) {
    const tk = `${tokens / 1024}K`;
    const elems = tokens * KV_HEADS * DIM;
    const bytes = 2 * elems * 2; // K and V, f16
    const kPart = kData.subarray(0, elems);
    const vPart = vData.subarray(0, elems);
    for (const threads of [1, 2]) {
      const base = `memoryRead ${tk} K+V (${threads}T)`;
      add({ name: base, bytes, flops: 0 }, () => memoryRead(kPart, threads) + memoryRead(vPart, threads));
      add({ name: `dense ${tk} (${threads}T)`, bytes, flops: flopsFor(tokens), peak: `computePeak (${threads}T)`, baseline: base }, () =>
        attendDense({ q, qHeads: Q_HEADS, k, v, tokens, threads }),
      );
    }
  }

  // The same 32K tokens head-major ('htd': each kv head's rows contiguous, as in a per-head arena).
  // Threads split kv heads; in a token-major cache every thread still streams a part of every token
  // row, here each thread streams its own contiguous region.
  {
    const tokens = 32 * 1024;
    const elems = tokens * KV_HEADS * DIM;
    const toHtd = (src: Uint16Array): Uint16Array => {
      const dst = new Uint16Array(elems);
      for (let t = 0; t < tokens; t++)
        for (let h = 0; h < KV_HEADS; h++) dst.set(src.subarray((t * KV_HEADS + h) * DIM, (t * KV_HEADS + h + 1) * DIM), (h * tokens + t) * DIM);
      return dst;
    };
    const kh: KvTensor = { data: toHtd(kData), dtype: 'f16', tokens, heads: KV_HEADS, dim: DIM, layout: 'htd' };
    const vh: KvTensor = { data: toHtd(vData), dtype: 'f16', tokens, heads: KV_HEADS, dim: DIM, layout: 'htd' };
    for (const threads of [1, 2])
      add(
        { name: `dense 32K head-major (${threads}T)`, bytes: 2 * elems * 2, flops: flopsFor(tokens), peak: `computePeak (${threads}T)`, baseline: `memoryRead 32K K+V (${threads}T)` },
        () => attendDense({ q, qHeads: Q_HEADS, k: kh, v: vh, threads }),
      );
  }

  // Sparse: tokens read per kv head = sinks + budget + tail.
  const perHead = SINKS + BUDGET + LOCAL;
  const sparseBytes = 2 * perHead * KV_HEADS * ROW_BYTES;
  const hotSel = randomSelection(MAX_TOKENS, 7);
  const coldSels = Array.from({ length: 16 }, (_, i) => randomSelection(MAX_TOKENS, 100 + i));
  let coldI = 0;
  // Baselines over the same byte count: one fixed slice (hot) or 16 rotating slices 16 MiB apart (cold).
  const sliceElems = sparseBytes / 2;
  const hotSlice = kData.subarray(0, sliceElems);
  const coldSlices = Array.from({ length: 16 }, (_, i) => kData.subarray(i * (8 << 20), i * (8 << 20) + sliceElems));
  let coldB = 0;
  // The same rows gathered into a compact per-head arena ('htd', tokens = sinks + budget + tail), as
  // a hot tier holds them; a selection of every chunk there attends exactly those rows.
  const arenaK = new Uint16Array(perHead * KV_HEADS * DIM);
  const arenaV = new Uint16Array(perHead * KV_HEADS * DIM);
  for (let h = 0; h < KV_HEADS; h++) {
    const toks: number[] = [];
    for (let t = 0; t < SINKS; t++) toks.push(t);
    for (let i = hotSel.offsets[h]!; i < hotSel.offsets[h + 1]!; i++)
      for (let t = hotSel.chunkIds[i]! * CHUNK; t < (hotSel.chunkIds[i]! + 1) * CHUNK; t++) toks.push(t);
    for (let t = MAX_TOKENS - LOCAL; t < MAX_TOKENS; t++) toks.push(t);
    toks.forEach((t, slot) => {
      const src = (t * KV_HEADS + h) * DIM;
      const dst = (h * perHead + slot) * DIM;
      arenaK.set(kData.subarray(src, src + DIM), dst);
      arenaV.set(vData.subarray(src, src + DIM), dst);
    });
  }
  const arena = (data: Uint16Array): KvTensor => ({ data, dtype: 'f16', tokens: perHead, heads: KV_HEADS, dim: DIM, layout: 'htd' });
  const arenaSel = randomSelection(perHead, 0);
  for (let h = 0; h < KV_HEADS; h++)
    for (let i = 0; i < BUDGET / CHUNK; i++) arenaSel.chunkIds[h * (BUDGET / CHUNK) + i] = SINKS / CHUNK + i;

  // The same 2048 tokens per head as single-token spans (a token-granular kvdrive selection).
  const tokenSel: Selection = { ...hotSel, chunkSize: 1, chunkIds: new Int32Array(BUDGET * KV_HEADS), offsets: new Int32Array(KV_HEADS + 1) };
  for (let h = 0; h < KV_HEADS; h++) {
    let at = h * BUDGET;
    for (let i = hotSel.offsets[h]!; i < hotSel.offsets[h + 1]!; i++)
      for (let t = hotSel.chunkIds[i]! * CHUNK; t < (hotSel.chunkIds[i]! + 1) * CHUNK; t++) tokenSel.chunkIds[at++] = t;
    tokenSel.offsets[h + 1] = at;
  }
  for (const threads of [1, 2]) {
    const hot = `memoryRead sparse bytes, hot (${threads}T)`;
    const cold = `memoryRead sparse bytes, cold (${threads}T)`;
    add({ name: hot, bytes: sparseBytes, flops: 0 }, () => memoryRead(hotSlice, threads));
    add(
      { name: `sparse 2048 of 128K, compact arena (hot tier) (${threads}T)`, bytes: sparseBytes, flops: flopsFor(perHead), peak: `computePeak (${threads}T)`, baseline: hot },
      () => attendSparse({ q, qHeads: Q_HEADS, k: arena(arenaK), v: arena(arenaV), selection: arenaSel, threads }),
    );
    add(
      { name: `sparse 2048 of 128K, scattered, same selection (${threads}T)`, bytes: sparseBytes, flops: flopsFor(perHead), peak: `computePeak (${threads}T)`, baseline: hot },
      () => attendSparse({ q, qHeads: Q_HEADS, k, v, selection: hotSel, threads }),
    );
    add(
      { name: `sparse 2048 single tokens of 128K, same selection (${threads}T)`, bytes: sparseBytes, flops: flopsFor(perHead), peak: `computePeak (${threads}T)`, baseline: hot },
      () => attendSparse({ q, qHeads: Q_HEADS, k, v, selection: tokenSel, threads }),
    );
    add({ name: cold, bytes: sparseBytes, flops: 0 }, () => memoryRead(coldSlices[coldB++ % 16]!, threads));
    add(
      { name: `sparse 2048 of 128K, scattered, 16 selections in turn (${threads}T)`, bytes: sparseBytes, flops: flopsFor(perHead), peak: `computePeak (${threads}T)`, baseline: cold },
      () => attendSparse({ q, qHeads: Q_HEADS, k, v, selection: coldSels[coldI++ % 16]!, threads }),
    );
  }

  // The runtime's attention (attendFetched, src/pipeline/step.ts): the same 2048 single tokens per
  // head read where the DRAM tier keeps them: page-first pages of 16-token chunks (K rows, then V
  // rows, of one kv head) at shuffled slots of one 512 MiB arena (every chunk of the 128K context
  // resident), sinks and the 64-token tail from their own token-major tensors. Only the pages
  // holding a selected token are named, as the step names them. Baselines as above: the same
  // selection every call (hot) and 16 selections in turn (cold).
  {
    const PAGE = 16;
    const pageBytes = 2 * PAGE * ROW_BYTES;
    const chunks = MAX_TOKENS / PAGE;
    // Placed as the runtime places its DRAM tier (page-aligned, huge pages advised: kv-array.ts),
    // and a copy of it 16 bytes past a cache line, where a buffer's start lies in V8 (what the
    // runtime's arenas were until 2026-11-29): the same calls over both show what the placement is worth.
    const arenaBytes = placedArray(Uint8Array, KV_HEADS * chunks * pageBytes);
    fillF16(new Uint16Array(arenaBytes.buffer, arenaBytes.byteOffset, arenaBytes.length / 2), 9);
    const offLine = (() => {
      const raw = placedArray(Uint8Array, arenaBytes.length + 64);
      const v = raw.subarray(16, 16 + arenaBytes.length);
      v.set(arenaBytes);
      return v;
    })();
    // slot of (head, chunk): a fixed random permutation, as admissions over time leave them.
    const slots = Int32Array.from({ length: KV_HEADS * chunks }, (_, i) => i);
    const ns = xorshift(17);
    for (let i = slots.length - 1; i > 0; i--) {
      const j = ns() % (i + 1);
      [slots[i], slots[j]] = [slots[j]!, slots[i]!];
    }
    const tok = (sel: Selection): Selection => {
      const ids = new Int32Array(BUDGET * KV_HEADS);
      const offsets = new Int32Array(KV_HEADS + 1);
      let at = 0;
      for (let h = 0; h < KV_HEADS; h++) {
        for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) for (let t = sel.chunkIds[i]! * CHUNK; t < (sel.chunkIds[i]! + 1) * CHUNK; t++) ids[at++] = t;
        offsets[h + 1] = at;
      }
      return { ...sel, chunkSize: 1, offsets, chunkIds: ids };
    };
    const tailBase = MAX_TOKENS - LOCAL; // a multiple of PAGE: pages cover [0, tailBase)
    const rowsOf = (data: Uint16Array, from: number, n: number): KvTensor => ({ data: data.subarray(from * KV_HEADS * DIM, (from + n) * KV_HEADS * DIM), dtype: 'f16', tokens: n, heads: KV_HEADS, dim: DIM });
    const sink = { k: rowsOf(kData, 0, SINKS), v: rowsOf(vData, 0, SINKS) };
    const tail = { k: rowsOf(kData, tailBase, LOCAL), v: rowsOf(vData, tailBase, LOCAL) };
    const fetchedArgs = (chunkSel: Selection) => fetchedArgsOf(tok(chunkSel));
    const fetchedArgsOf = (selection: Selection) => {
      const fetchedOffsets = new Int32Array(KV_HEADS + 1);
      const ids: number[] = [];
      for (let h = 0; h < KV_HEADS; h++) {
        let last = -1;
        for (let i = selection.offsets[h]!; i < selection.offsets[h + 1]!; i++) {
          const c = Math.floor(selection.chunkIds[i]! / PAGE);
          if (c !== last) ids.push((last = c));
        }
        fetchedOffsets[h + 1] = ids.length;
      }
      const fetchedAt = new Float64Array(ids.length);
      for (let h = 0; h < KV_HEADS; h++) for (let i = fetchedOffsets[h]!; i < fetchedOffsets[h + 1]!; i++) fetchedAt[i] = slots[h * chunks + ids[i]!]! * pageBytes;
      return { q, qHeads: Q_HEADS, sink, tail, tailBase, selection, pageChunkSize: PAGE, fetched: arenaBytes, fetchedOffsets, fetchedIds: Int32Array.from(ids), fetchedAt };
    };
    const hotArgs = fetchedArgs(hotSel);
    const coldArgs = coldSels.map(fetchedArgs);
    // Single tokens at random places (runs of one: copied together before the row kernels).
    const scatteredArgs = Array.from({ length: 16 }, (_, i) => fetchedArgsOf(randomTokenSelection(MAX_TOKENS, 200 + i)));
    // The rows one attendFetched call reads, as row indices of ROW_BYTES: every kv head's selected
    // tokens' K rows in the arena, then their V rows (the attention's two passes), and the sinks'
    // and tail's rows in the token-major tensors. memoryGather of these lists is its roofline.
    const rowListsOf = (a: ReturnType<typeof fetchedArgsOf>) => {
      const kRows: number[] = [];
      const edge: number[] = [];
      for (let h = 0; h < KV_HEADS; h++) {
        for (let t = 0; t < SINKS; t++) edge.push(t * KV_HEADS + h);
        let p = a.fetchedOffsets[h]!;
        for (let i = a.selection.offsets[h]!; i < a.selection.offsets[h + 1]!; i++) {
          const t = a.selection.chunkIds[i]!;
          if (t < SINKS || t >= tailBase) continue; // attended from the sinks / tail (clipped), not the arena
          while (a.fetchedIds[p]! !== Math.floor(t / PAGE)) p++;
          kRows.push((a.fetchedAt[p]! + (t % PAGE) * ROW_BYTES) / ROW_BYTES);
        }
        for (let t = tailBase; t < MAX_TOKENS; t++) edge.push(t * KV_HEADS + h);
      }
      return { k: Int32Array.from(kRows), v: Int32Array.from(kRows, (r) => r + PAGE), edge: Int32Array.from(edge) };
    };
    const gatherRows = (l: ReturnType<typeof rowListsOf>, threads: number, arena = arenaBytes) =>
      memoryGather(arena, ROW_BYTES, l.k, threads) + memoryGather(kData, ROW_BYTES, l.edge, threads) +
      memoryGather(arena, ROW_BYTES, l.v, threads) + memoryGather(vData, ROW_BYTES, l.edge, threads);
    const hotRows = rowListsOf(hotArgs);
    const coldRows = coldArgs.map(rowListsOf);
    const scatteredRows = scatteredArgs.map(rowListsOf);
    let coldF = 0;
    let scatteredF = 0;
    let coldG = 0;
    let scatteredG = 0;
    for (const threads of [1, 2]) {
      const g = (what: string) => `memoryGather ${what} (${threads}T)`;
      add({ name: g('of those rows, same selection'), bytes: sparseBytes, flops: 0 }, () => gatherRows(hotRows, threads));
      add(
        { name: `attendFetched 2048 single tokens of 128K, DRAM-tier pages, same selection (${threads}T)`, bytes: sparseBytes, flops: flopsFor(perHead), peak: `computePeak (${threads}T)`, baseline: `memoryRead sparse bytes, hot (${threads}T)`, gather: g('of those rows, same selection') },
        () => attendFetched({ ...hotArgs, threads }),
      );
      add({ name: g('of those rows, 16 selections in turn'), bytes: sparseBytes, flops: 0 }, () => gatherRows(coldRows[coldG++ % 16]!, threads));
      add(
        { name: `attendFetched 2048 single tokens of 128K, DRAM-tier pages, 16 selections in turn (${threads}T)`, bytes: sparseBytes, flops: flopsFor(perHead), peak: `computePeak (${threads}T)`, baseline: `memoryRead sparse bytes, cold (${threads}T)`, gather: g('of those rows, 16 selections in turn') },
        () => attendFetched({ ...coldArgs[coldF++ % 16]!, threads }),
      );
      add({ name: g('of those rows, 16 selections in turn, arena 16 B past a line'), bytes: sparseBytes, flops: 0 }, () => gatherRows(coldRows[coldG++ % 16]!, threads, offLine));
      add(
        { name: `attendFetched 2048 single tokens of 128K, DRAM-tier pages, 16 selections in turn, arena 16 B past a line (${threads}T)`, bytes: sparseBytes, flops: flopsFor(perHead), peak: `computePeak (${threads}T)`, baseline: `memoryRead sparse bytes, cold (${threads}T)`, gather: g('of those rows, 16 selections in turn, arena 16 B past a line') },
        () => attendFetched({ ...coldArgs[coldF++ % 16]!, fetched: offLine, threads }),
      );
      add({ name: g('of those rows, scattered, 16 selections in turn'), bytes: sparseBytes, flops: 0 }, () => gatherRows(scatteredRows[scatteredG++ % 16]!, threads));
      add(
        { name: `attendFetched 2048 scattered single tokens of 128K, DRAM-tier pages, 16 selections in turn (${threads}T)`, bytes: sparseBytes, flops: flopsFor(perHead), peak: `computePeak (${threads}T)`, baseline: `memoryRead sparse bytes, cold (${threads}T)`, gather: g('of those rows, scattered, 16 selections in turn') },
        () => attendFetched({ ...scatteredArgs[scatteredF++ % 16]!, threads }),
      );
    }
  }

  // Centroid scoring as kvdrive's select runs it: 4-bit tiles (the layout the index keeps since
  // 2026-11-29; before, int8 tiles of twice the bytes: both are timed), one distinct tile array per
  // kv head (512 KiB / 1 MiB at 128K, ~16 tokens per cluster), one call per kv head scoring its GQA
  // group in one pass over each tile, on one thread. Each baseline reads the same 8 arrays (one
  // thread). Two pairs per format: "hot", the same arrays every iteration (they stay in this
  // machine's 32 MiB L3), and "cold", COLD_SETS copies of them taken in turn (>= 64 MiB: each set has
  // left the L3 by its next turn), as a decode step finds them after the previous layer's select
  // and attention have streamed through the caches.
  if (typeof native.scoreCentroids === 'function' && typeof native.centroidTiles === 'function') {
    const n = MAX_TOKENS / 16;
    const group = Q_HEADS / KV_HEADS;
    type TileSet = { tiles: Uint8Array | Int8Array; scales: Float32Array }[];
    for (const [fmt, layout, label] of [['u4', 'tiles4', '4-bit'], ['i8', 'tiles8', 'int8']] as const) {
      const tiles: TileSet = [];
      for (let h = 0; h < KV_HEADS; h++) {
        const centroids = new Float32Array(n * DIM);
        const nc = xorshift(5 + h);
        for (let i = 0; i < centroids.length; i++) centroids[i] = ((nc() % 2000) - 1000) / 1000;
        tiles.push(native.centroidTiles(centroids, n, DIM, fmt) as TileSet[number]);
      }
      const cBytes = tiles.reduce((a, t) => a + t.tiles.byteLength + t.scales.byteLength, 0);
      const readTiles = (set: TileSet): number => {
        let s = 0;
        for (const t of set) s += memoryRead(new Uint8Array(t.tiles.buffer, t.tiles.byteOffset, t.tiles.byteLength)) + memoryRead(t.scales);
        return s;
      };
      const scoreTiles = (set: TileSet): void => {
        for (let h = 0; h < KV_HEADS; h++) native.scoreCentroids(q.subarray(h * group * DIM, (h + 1) * group * DIM), group, set[h]!, n, DIM, layout);
      };
      const COLD_SETS = Math.ceil((64 << 20) / cBytes);
      const coldTiles: TileSet[] = Array.from({ length: COLD_SETS }, () => tiles.map((t) => ({ tiles: t.tiles.slice(), scales: t.scales.slice() })));
      let coldRead = 0;
      let coldScore = 0;
      for (const [what, read, score] of [
        ['', () => readTiles(tiles), () => scoreTiles(tiles)],
        [', cold', () => readTiles(coldTiles[coldRead++ % COLD_SETS]!), () => scoreTiles(coldTiles[coldScore++ % COLD_SETS]!)],
      ] as const) {
        const base = `memoryRead centroid ${label} tiles${what} (1T)`;
        add({ name: base, bytes: cBytes, flops: 0 }, read);
        add({ name: `scoreCentroids ${label} tiles ${n}/head x ${KV_HEADS} heads${what} (1T)`, bytes: cBytes, flops: 2 * Q_HEADS * n * DIM, baseline: base }, score);
      }
    }
  } else {
    console.log('note: native.scoreCentroids / centroidTiles not in this build: centroid scoring skipped');
  }

  await bench.run();
  for (const task of bench.tasks) {
    const r = task.result;
    if (r.state !== 'completed') throw new Error(`${task.name}: ${r.state === 'errored' ? r.error.message : r.state}`);
    const row = rows.get(task.name)!;
    row.minMs = r.latency.min;
    row.p50Ms = r.latency.p50;
    const c = cpu.get(task.name)!;
    row.cpuMs = c.us / 1000 / c.calls;
  }

  // Throughput and ratios use the fastest call (min): the least disturbed by other processes, and
  // measured the same way for kernel and baseline.
  console.log(`\nload average at the end: ${loadavg().map((x) => x.toFixed(1)).join(' ')} (${cpus().length} CPUs)`);
  console.log('\n| task | ms/call min | p50 | CPU ms/call | GB/s (min) | GFLOP/s (min) | kernel GB/s ÷ baseline GB/s | GFLOP/s ÷ computePeak | ÷ gather of the same rows |');
  console.log('|---|---:|---:|---:|---:|---:|---|---:|---:|');
  for (const row of rows.values()) {
    const gbs = row.bytes / (row.minMs! * 1e6);
    const gflops = row.flops ? fmt(row.flops / (row.minMs! * 1e6)) : '';
    let vs = '';
    const b = row.baseline ? rows.get(row.baseline) : undefined;
    if (b) {
      const bgbs = b.bytes / (b.minMs! * 1e6);
      vs = `${fmt(gbs / bgbs, 2)} (baseline ${fmt(bgbs)} GB/s, ${fmt(b.minMs!, 3)} ms)`;
    }
    const p = row.peak ? rows.get(row.peak) : undefined;
    const vsPeak = p && row.flops ? fmt(row.flops / row.minMs! / (p.flops / p.minMs!), 2) : '';
    // Same bytes as the gather row, so the ratio of GB/s is the ratio of its time to the kernel's.
    const gr = row.gather ? rows.get(row.gather) : undefined;
    const vsGather = gr ? `${fmt(gr.minMs! / row.minMs!, 2)} (${fmt(gr.minMs!, 3)} ms)` : '';
    console.log(`| ${row.name} | ${fmt(row.minMs!, 3)} | ${fmt(row.p50Ms!, 3)} | ${fmt(row.cpuMs!, 3)} | ${row.bytes ? fmt(gbs) : ''} | ${gflops} | ${vs} | ${vsPeak} | ${vsGather} |`);
  }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
