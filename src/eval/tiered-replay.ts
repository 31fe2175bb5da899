/**
 * Replays a trace's decode through the storage tiers (src/storage/tiered-attention.ts) twice in the
 * same run — DRAM+SSD under a DRAM budget, and DRAM-only (a DRAM tier holding the whole KV) — and
 * reports per decode step the time per layer-step and the bytes each tier served, the throughput
 * ratio, and whether the two runs' outputs are bit-identical (same index, same selection).
 * Used by `kvdrive demo --storage`.
 */
import { fail } from '../errors.js';
import type { TraceReader, TraceLayer } from '../trace/trace.js';
import type { KvTensor } from '../types.js';
import { DramStore } from '../storage/dram-store.js';
import { SsdStore } from '../storage/ssd-store.js';
import { TieredAttention } from '../storage/tiered-attention.js';
import { HotTier } from '../cache/hot-tier.js';

/** Options of {@link replayTiered}. */
export interface TieredReplayOptions {
  /** SSD store directory (created if missing); the segments written here are deleted afterwards. */
  dir: string;
  /** DRAM budget of the DRAM+SSD run in bytes (default: a third of the prompt KV). */
  dramBudget?: number;
  /** Tokens selected per kv head and step. */
  budget: number;
  /** Lookahead pool (tokens per kv head) driving prefetch; default 0 (none). */
  pool?: number;
  /** Read with O_DIRECT (default true) so the page cache does not stand in for the SSD. */
  direct?: boolean;
  /** Hot tier window (slots per kv head = window x budget / chunkSize) in front of DRAM, both runs; 0 = none. Default 2. */
  hotWindows?: number;
  onStep?: (run: string, layer: number, step: number) => void;
}

/** Per decode step (summed over layers) of one run. */
export interface TieredReplayStep {
  /** Mean milliseconds per layer-step (select + fetch + attention + prefetch issue). */
  ms: number;
  /** Chunk bytes attended from hot-tier slots. */
  hotBytes: number;
  dramBytes: number;
  prefetchedBytes: number;
  ssdBytes: number;
  ssdReadBytes: number;
}

export interface TieredReplayRun {
  steps: TieredReplayStep[];
  /** Mean ms per layer-step over steps after the first (the first touches every buffer). */
  msPerLayerStep: number;
  dramBudget: number;
  prefillMs: number;
  prefetch: { issued: number; chunks: number; readBytes: number; cancelled: number };
}

export interface TieredReplayResult {
  kvBytes: number;
  tiered: TieredReplayRun;
  dramOnly: TieredReplayRun;
  /** DRAM+SSD throughput / DRAM-only throughput. */
  ratio: number;
  identical: boolean;
  engine: string;
}

function token(t: KvTensor, i: number): KvTensor {
  const row = t.heads * t.dim;
  return { ...t, tokens: 1, data: t.data.subarray(i * row, (i + 1) * row) };
}

async function run(
  name: string,
  ssd: SsdStore,
  layers: TraceLayer[],
  meta: TraceReader['meta'],
  dramBudget: number,
  o: TieredReplayOptions,
  outputs: Float32Array[],
): Promise<TieredReplayRun> {
  const shape = ssd.shape;
  const dram = new DramStore({ budgetBytes: dramBudget, shape });
  const { qHeads, headDim: D, decodeSteps: S, promptTokens: T } = meta;
  const sequence = `${name}-${process.pid}-${Date.now()}`;
  const win = o.hotWindows ?? 2;
  const hotTier = win > 0 ? new HotTier({ ...shape, budget: o.budget, windows: win, maxBytes: 2 ** 40 }) : undefined; // sized by window x budget, no extra cap
  const ta = TieredAttention.open({ ssd, dram, sequence, qHeads, budget: o.budget, pool: o.pool, maxDecodeTokens: S, hotTier });
  try {
    const t0 = performance.now();
    // Observation window: the first decode query (traces carry no prompt queries).
    await ta.prefill(layers.map((x) => ({ k: x.k, v: x.v, obs: { q: x.q.subarray(0, qHeads * D), qHeads, positions: Int32Array.of(T) } })));
    const prefillMs = performance.now() - t0;
    const steps: TieredReplayStep[] = [];
    for (let s = 0; s < S; s++) {
      const st: TieredReplayStep = { ms: 0, hotBytes: 0, dramBytes: 0, prefetchedBytes: 0, ssdBytes: 0, ssdReadBytes: 0 };
      for (let l = 0; l < layers.length; l++) {
        const x = layers[l]!;
        const r = await ta.step(l, x.q.subarray(s * qHeads * D, (s + 1) * qHeads * D), token(x.kNew, s), token(x.vNew, s));
        outputs.push(r.out);
        st.ms += r.stats.ms / layers.length;
        st.hotBytes += r.stats.hotBytes;
        st.dramBytes += r.stats.dramBytes;
        st.prefetchedBytes += r.stats.prefetchedBytes;
        st.ssdBytes += r.stats.ssdBytes;
        st.ssdReadBytes += r.stats.ssdReadBytes;
        const d = dram.stats();
        if (d.reservedBytes > dramBudget) fail('E_INTERNAL', 'DRAM tier', `at most its budget ${dramBudget} bytes`, d.reservedBytes);
        o.onStep?.(name, l, s);
      }
      steps.push(st);
    }
    const timed = steps.length > 1 ? steps.slice(1) : steps;
    return {
      steps,
      msPerLayerStep: timed.reduce((a, x) => a + x.ms, 0) / timed.length,
      dramBudget,
      prefillMs,
      prefetch: ta.tiers.prefetchTotals(),
    };
  } finally {
    await ta.close();
    hotTier?.destroy();
    for (const id of ta.segments) await ssd.deleteSegment(id);
  }
}

/** Runs DRAM+SSD then DRAM-only over the trace; see the module comment. */
export async function replayTiered(trace: TraceReader, o: TieredReplayOptions): Promise<TieredReplayResult> {
  const m = trace.meta;
  const layers: TraceLayer[] = [];
  for (let l = 0; l < m.layers; l++) layers.push(await trace.layer(l));
  const shape = { layers: m.layers, kvHeads: m.kvHeads, headDim: m.headDim, dtype: trace.dtype, chunkSize: 4 };
  const es = trace.dtype === 'f32' ? 4 : 2;
  const kvBytes = m.layers * m.promptTokens * m.kvHeads * m.headDim * 2 * es;
  const ssd = await SsdStore.open({ dir: o.dir, shape, direct: o.direct ?? true });
  try {
    const a: Float32Array[] = [];
    const b: Float32Array[] = [];
    const tiered = await run('tiered', ssd, layers, m, o.dramBudget ?? Math.floor(kvBytes / 3), o, a);
    // DRAM-only: room for every chunk plus slot metadata.
    const dramOnly = await run('dramonly', ssd, layers, m, Math.ceil(kvBytes * 1.05), o, b);
    const identical = a.length === b.length && a.every((x, i) => Buffer.from(x.buffer).equals(Buffer.from(b[i]!.buffer)));
    return { kvBytes, tiered, dramOnly, ratio: dramOnly.msPerLayerStep / tiered.msPerLayerStep, identical, engine: ssd.engineInfo.kind };
  } finally {
    await ssd.close();
  }
}
