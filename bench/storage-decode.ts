/**
 * Whole-run decode benchmark over the storage tiers (bench/storage.md, section "decode").
 *
 * One synthetic trace (Llama-3-8B-like layer: 32 query / 8 kv heads, head dim 128, f16 KV) whose
 * prompt KV is `--ratio` (default 3) times the DRAM budget. Every configuration runs the real decode
 * of every layer and step — kvdrive selection + fetch + exact attention, real outputs:
 * The tiered configurations put a hot tier (`--hot-windows`, default 2; 0 = none) in front of DRAM.
 *  - dram-only: TieredAttention with a DRAM tier holding the whole KV (warmed at prefill), the bound;
 *  - dram+ssd:  TieredAttention with the DRAM budget = KV / ratio: importance-warmed DRAM, misses
 *               read from SSD (O_DIRECT, whole cluster extents) and admitted into DRAM by mass;
 *  - dram+ssd + pool prefetch: the same, prefetching the lookahead pool (--pool) for the next step;
 *  - flexgen:   per layer-step the layer's whole KV read from SSD (O_DIRECT) then dense attention
 *               over it (attendFetched with every chunk selected).
 * After one discarded warm-up decode, configurations run one after the other in rotated order
 * for `--rounds` rounds (fresh prefill
 * each round); figures are medians over rounds of the mean time per layer-step, the first
 * `--warm-steps` (2) steps of each run (flexgen: 1) excluded from timing but not from the bytes. Throughput ratios:
 * dram+ssd / dram-only and dram+ssd / flexgen. The outputs of dram+ssd and dram-only are checked to
 * be bit-identical (same index, same selection, different tiers).
 *
 * Run: npm run build:ts && node dist/bench/storage-decode.js [--context 32768] [--layers 2]
 *      [--steps 16] [--budget 512] [--pool 1024] [--ratio 3] [--cluster-tokens 16]
 *      [--rounds 3] [--hot-windows 2] [--engine uring|pread] [--dir /tmp] [--no-direct]
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateSyntheticTrace, type KvTensor, type Selection } from '../src/index.js';
import { attendFetchedAsync, TieredAttention } from '../src/storage/tiered-attention.js';
import { DramStore } from '../src/storage/dram-store.js';
import { HotTier } from '../src/cache/hot-tier.js';
import { SsdStore, type StoreShape } from '../src/storage/ssd-store.js';
import { type TraceLayer } from '../src/trace/trace.js';

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] ? process.argv[i + 1]! : dflt;
}

const context = Number(arg('context', '32768'));
const L = Number(arg('layers', '2'));
const S = Number(arg('steps', '16'));
const budget = Number(arg('budget', '512'));
const pool = Number(arg('pool', String(2 * budget)));
const ratio = Number(arg('ratio', '3'));
const clusterTokens = Number(arg('cluster-tokens', '16'));
const rounds = Number(arg('rounds', '3'));
const hotWindows = Number(arg('hot-windows', '2'));
const engine = arg('engine', 'uring') as 'uring' | 'pread';
const direct = !process.argv.includes('--no-direct');
const flexSteps = Math.min(S, Number(arg('flex-steps', '4')));
/** Steps per configuration excluded from timing (first-touch of buffers, JIT, scratch growth). */
const warmSteps = Math.min(S - 1, Number(arg('warm-steps', '2')));
const qHeads = 32;
const kvHeads = 8;
const D = 128;
const shape: StoreShape = { layers: L, kvHeads, headDim: D, dtype: 'f16', chunkSize: 4 };
const kvBytes = L * context * kvHeads * D * 2 * 2;
const policy = { segmentTokens: 4096, tokensPerCluster: clusterTokens };

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}
const mib = (b: number) => `${(b / 2 ** 20).toFixed(2)} MiB`;
function token(t: KvTensor, i: number): KvTensor {
  const row = t.heads * t.dim;
  return { ...t, tokens: 1, data: t.data.subarray(i * row, (i + 1) * row) };
}

interface RunResult {
  msPerLayerStep: number;
  perStep: { hot: number; dram: number; prefetched: number; ssd: number; ssdRead: number }; // bytes per layer-step
  prefetch?: { issued: number; chunks: number; readBytes: number; cancelled: number };
  outputs: Float32Array[];
  prefillMs: number;
}

async function runTiered(name: string, ssd: SsdStore, layers: TraceLayer[], budgetBytes: number, usePool: boolean): Promise<RunResult> {
  const dram = new DramStore({ budgetBytes, shape });
  const hotTier = hotWindows > 0 ? new HotTier({ ...shape, budget, windows: hotWindows, maxBytes: 2 ** 40 }) : undefined;
  const ta = TieredAttention.open({ ssd, dram, sequence: name, qHeads, budget, pool: usePool ? pool : 0, maxDecodeTokens: S, policy, stagingBuffers: 4, hotTier });
  const t0 = performance.now();
  // Observation window: the first decode query (the synthetic trace has no prompt queries).
  await ta.prefill(layers.map((x) => ({ k: x.k, v: x.v, obs: { q: x.q.subarray(0, qHeads * D), qHeads, positions: Int32Array.of(context) } })));
  const prefillMs = performance.now() - t0;
  const outputs: Float32Array[] = [];
  const acc = { hot: 0, dram: 0, prefetched: 0, ssd: 0, ssdRead: 0 };
  let t1 = performance.now();
  for (let s = 0; s < S; s++)
    for (let l = 0; l < L; l++) {
      if (s === warmSteps && l === 0) t1 = performance.now();
      const x = layers[l]!;
      const r = await ta.step(l, x.q.subarray(s * qHeads * D, (s + 1) * qHeads * D), token(x.kNew, s), token(x.vNew, s));
      outputs.push(r.out);
      acc.hot += r.stats.hotBytes;
      acc.dram += r.stats.dramBytes;
      acc.prefetched += r.stats.prefetchedBytes;
      acc.ssd += r.stats.ssdBytes;
      acc.ssdRead += r.stats.ssdReadBytes;
      const st = dram.stats();
      if (st.reservedBytes > budgetBytes) throw new Error(`DRAM budget exceeded: ${st.reservedBytes} > ${budgetBytes}`);
    }
  const ms = performance.now() - t1;
  const n = S * L;
  const timed = (S - warmSteps) * L;
  const prefetch = ta.tiers.prefetchTotals();
  await ta.close();
  hotTier?.destroy();
  return {
    msPerLayerStep: ms / timed,
    perStep: { hot: acc.hot / n, dram: acc.dram / n, prefetched: acc.prefetched / n, ssd: acc.ssd / n, ssdRead: acc.ssdRead / n },
    prefetch,
    outputs,
    prefillMs,
  };
}

/** FlexGen-style: each layer-step reads the layer's whole prompt KV from SSD, then attends densely. */
async function runFlexgen(ssd: SsdStore, segments: readonly string[], layers: TraceLayer[]): Promise<RunResult> {
  const chunks = context / 4;
  const cb = ssd.chunkBytes;
  const buf = new Uint8Array(kvHeads * chunks * cb);
  const info = new Map(ssd.segments().map((s) => [s.id, s]));
  const offsets = Int32Array.from({ length: kvHeads + 1 }, (_, h) => h * chunks);
  const chunkIds = new Int32Array(kvHeads * chunks);
  for (let h = 0; h < kvHeads; h++) for (let c = 0; c < chunks; c++) chunkIds[h * chunks + c] = c;
  const sinkK = { ...token(layers[0]!.k, 0), tokens: 0, data: layers[0]!.k.data.subarray(0, 0) };
  let read = 0;
  let t1 = performance.now();
  const flexWarm = Math.min(1, flexSteps - 1);
  for (let s = 0; s < flexSteps; s++)
    for (let l = 0; l < L; l++) {
      const x = layers[l]!;
      if (s === flexWarm && l === 0) t1 = performance.now();
      // Head-major: head h's chunks (every segment, ascending) at entries h * chunks ...
      const items = [];
      const dofs: number[] = [];
      for (let h = 0; h < kvHeads; h++) {
        let first = 0;
        for (const id of segments) {
          const n = info.get(id)!.chunks;
          items.push({ segment: id, layer: l, kvHead: h, chunkIds: Int32Array.from({ length: n }, (_, j) => j) });
          for (let j = 0; j < n; j++) dofs.push((h * chunks + first + j) * cb);
          first += n;
        }
      }
      const st = await ssd.readBatch(items, buf, Float64Array.from(dofs));
      read += st.bytesRead;
      // Decoded tokens 0..s live in memory (as in the tiered runs).
      const tail = { k: { ...x.kNew, tokens: s + 1, data: x.kNew.data.subarray(0, (s + 1) * kvHeads * D) }, v: { ...x.vNew, tokens: s + 1, data: x.vNew.data.subarray(0, (s + 1) * kvHeads * D) } };
      const sel: Selection = { chunkSize: 4, tokens: context + s + 1, sinkEnd: 0, tailStart: context, offsets, chunkIds };
      await attendFetchedAsync({ q: x.q.subarray(s * qHeads * D, (s + 1) * qHeads * D), qHeads, sink: { k: sinkK, v: sinkK }, tail, tailBase: context, selection: sel, fetched: buf });
    }
  const n = flexSteps * L;
  return { msPerLayerStep: (performance.now() - t1) / ((flexSteps - flexWarm) * L), perStep: { hot: 0, dram: 0, prefetched: 0, ssd: read / n, ssdRead: read / n }, outputs: [], prefillMs: 0 };
}

async function main(): Promise<void> {
  const t0 = performance.now();
  const trace = generateSyntheticTrace({ layers: L, promptTokens: context, decodeSteps: S, qHeads, kvHeads, headDim: D, dtype: 'f16', seed: 1 });
  const layers: TraceLayer[] = [];
  for (let l = 0; l < L; l++) layers.push(await trace.layer(l));
  const budgetBytes = Math.floor(kvBytes / ratio);
  console.log(
    `decode over tiers: ${L} layers x ${S} steps, context ${context}, ${qHeads}/${kvHeads} heads, dim ${D}, f16; KV ${mib(kvBytes)}, ` +
      `DRAM budget ${mib(budgetBytes)} (KV/${ratio}); budget ${budget} tokens/kv head, pool ${pool} (prefetch row only), ~${clusterTokens} tokens per cluster extent, hot tier window ${hotWindows}; ` +
      `engine ${engine}, O_DIRECT ${direct}; ${cpus().length} CPUs, load ${loadavg()[0]!.toFixed(1)}; trace ${((performance.now() - t0) / 1000).toFixed(1)} s`,
  );
  const dirs: string[] = [];
  const res: Record<string, RunResult[]> = { 'dram-only': [], 'dram+ssd': [], 'dram+ssd + pool prefetch': [], flexgen: [] };
  const order = Object.keys(res);
  try {
    {
      // Discarded warm-up decode (JIT, allocator, first-touch of the attention scratch), so the
      // first configuration of round 0 does not pay for it.
      const dir = mkdtempSync(join(arg('dir', tmpdir()), 'kvd-decode-'));
      dirs.push(dir);
      const ssd = await SsdStore.open({ dir, shape, kind: engine, direct, queueDepth: 32 });
      const w = await runTiered('warmup', ssd, layers, budgetBytes, false);
      console.log(`  warm-up (discarded): ${w.msPerLayerStep.toFixed(2)} ms/layer-step`);
      await ssd.close();
      rmSync(dir, { recursive: true, force: true });
    }
    for (let r = 0; r < rounds; r++) {
      const dir = mkdtempSync(join(arg('dir', tmpdir()), 'kvd-decode-'));
      dirs.push(dir);
      const ssd = await SsdStore.open({ dir, shape, kind: engine, direct, queueDepth: 32 });
      let segs: readonly string[] = [];
      const rot = order.slice(r % order.length).concat(order.slice(0, r % order.length));
      // flexgen needs segments on disk: write them with the first tiered prefill of the round.
      if (rot[0] === 'flexgen') rot.push(rot.shift()!);
      for (const name of rot) {
        let out: RunResult;
        if (name === 'flexgen') out = await runFlexgen(ssd, segs, layers);
        else {
          const seq = `${name.replace(/[^a-z]/g, '')}${r}`;
          out = await runTiered(seq, ssd, layers, name === 'dram-only' ? Math.ceil(kvBytes * 1.05) : budgetBytes, name === 'dram+ssd + pool prefetch');
          if (!segs.length) segs = ssd.segments().filter((s) => s.id.startsWith(`${seq}.`)).map((s) => s.id);
        }
        res[name]!.push(out);
        console.log(`  round ${r} ${name}: ${out.msPerLayerStep.toFixed(2)} ms/layer-step`);
      }
      await ssd.close();
      rmSync(dir, { recursive: true, force: true });
    }
  } finally {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  }
  // Same selection, different tiers: outputs must be bit-identical.
  for (let r = 0; r < rounds; r++) {
    const a = res['dram-only']![r]!.outputs;
    for (const other of ['dram+ssd', 'dram+ssd + pool prefetch']) {
      const b = res[other]![r]!.outputs;
      for (let i = 0; i < a.length; i++)
        if (!Buffer.from(a[i]!.buffer).equals(Buffer.from(b[i]!.buffer))) throw new Error(`round ${r}: ${other} output ${i} differs from dram-only`);
    }
  }
  const ms = (k: string) => median(res[k]!.map((x) => x.msPerLayerStep));
  const base = ms('dram-only');
  console.log('\n| config | ms / layer-step (median) | throughput vs dram-only | hot bytes/step | DRAM bytes/step | prefetched bytes/step | SSD bytes/step (requested) | SSD device bytes/step |');
  console.log('|---|---|---|---|---|---|---|---|');
  for (const k of order) {
    const p = res[k]![0]!.perStep;
    console.log(`| ${k} | ${ms(k).toFixed(2)} | ${(base / ms(k)).toFixed(3)} | ${mib(p.hot)} | ${mib(p.dram)} | ${mib(p.prefetched)} | ${mib(p.ssd)} | ${mib(p.ssdRead)} |`);
  }
  const pf = res['dram+ssd + pool prefetch']![0]!.prefetch!;
  console.log(`\nprefetch (dram+ssd + pool prefetch, round 0): ${pf.issued} issued, ${pf.chunks} chunks staged, ${mib(pf.readBytes)} read, ${pf.cancelled} cancelled`);
  console.log(`prefill (dram+ssd, round 0): ${(res['dram+ssd']![0]!.prefillMs / 1000).toFixed(1)} s (index build + SSD write + warm-up)`);
  for (const k of ['dram+ssd', 'dram+ssd + pool prefetch'])
    console.log(`${k} / dram-only throughput: ${(base / ms(k)).toFixed(3)} (per round: ${res[k]!.map((x, i) => (res['dram-only']![i]!.msPerLayerStep / x.msPerLayerStep).toFixed(3)).join(', ')})`);
  console.log(`dram+ssd / flexgen throughput: ${(ms('flexgen') / ms('dram+ssd')).toFixed(1)}x`);
  console.log('outputs of dram+ssd and dram-only: bit-identical');
}

await main();
