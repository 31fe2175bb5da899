/**
 * The runtime over the memory model (kv-memory.ts): what `openRuntime` runs. It
 * owns the tiers (DRAM tier, optional SSD store, optional hot tier), the sequences' indexes, and
 * runs each attend() entry through step.ts. 'sequential' runs the entries one after another on the
 * calling thread; 'pipelined' runs micro-batches concurrently — selection of one micro-batch on the
 * JS thread while the SSD reads (I/O engine threads) and the attention (off-thread native work) of
 * others proceed. Both run the same step, so outputs are bit-identical.
 */
import { KvdriveError, fail } from '../errors.js';
import { createPolicy } from '../index/policy.js';
import { importanceScoresAsync, rankChunks } from '../cache/warmup.js';
import { HotTier } from '../cache/hot-tier.js';
import { SsdStore } from '../storage/ssd-store.js';
import type { IoEngineOptions } from '../storage/io-engine.js';
import { fromF32 } from '../util/f16.js';
import type { Dtype, KvTensor } from '../types.js';
import type { Selection } from '../index/selection.js';
import { KvMemory, type KvMemoryConfig, type MemoryStats } from './kv-memory.js';
import { attendEntry, type EntryStepStats } from '../pipeline/step.js';

/** Tier traffic summed over attend() calls (chunks by where they came from, SSD device bytes, admissions). */
export type MemoryTraffic = Omit<EntryStepStats, 'selectMs' | 'fetchMs' | 'computeMs'>;

/** What openRuntime needs to build a memory runtime. */
export interface MemoryRuntimeInit extends Omit<KvMemoryConfig, 'ssd' | 'concurrency' | 'hotTierBytes'> {
  mode: 'sequential' | 'pipelined';
  microBatch: number;
  hotTier?: ConstructorParameters<typeof HotTier>[0];
  ssd?: { dir: string; direct?: boolean; io?: IoEngineOptions };
}

/** One attend() entry, converted to the host dtype. */
export interface MemoryEntry {
  seq: number;
  q: Float32Array;
  kNew: Float32Array | Uint16Array;
  vNew: Float32Array | Uint16Array;
}

export class MemoryRuntime {
  readonly memory: KvMemory;
  readonly hot: HotTier | undefined;
  readonly mode: 'sequential' | 'pipelined';
  readonly microBatch: number;
  readonly traffic: MemoryTraffic = { chunks: 0, hotChunks: 0, dramChunks: 0, ssdChunks: 0, tailChunks: 0, ssdReadBytes: 0, hotAdmitted: 0, dramAdmitted: 0 };
  readonly time = { selectionMs: 0, fetchMs: 0, computeMs: 0, warmedChunks: 0 };
  /** Most micro-batches of one attend() that ran at once (1 sequentially). */
  maxInFlight = 0;
  private readonly ownsSsd: SsdStore | undefined;

  private constructor(memory: KvMemory, hot: HotTier | undefined, init: MemoryRuntimeInit, ssd: SsdStore | undefined) {
    this.memory = memory;
    this.hot = hot;
    this.mode = init.mode;
    this.microBatch = init.microBatch;
    this.ownsSsd = ssd;
  }

  static async open(init: MemoryRuntimeInit): Promise<MemoryRuntime> {
    const { shape, dtype, policyOptions: p } = init;
    const { mode: _m, microBatch: _b, hotTier: _h, ssd: _s, ...rest } = init;
    // Micro-batches in flight at once (pipelined): each holds a fetch buffer.
    const concurrency = init.mode === 'pipelined' ? 4 : 1;
    const config: Omit<KvMemoryConfig, 'ssd'> = { ...rest, concurrency, hotTierBytes: init.hotTier?.maxBytes ?? 0 };
    const ssd = init.ssd
      ? await SsdStore.open({
          ...(init.ssd.io ?? {}),
          dir: init.ssd.dir,
          direct: init.ssd.direct ?? false,
          shape: { layers: 1, kvHeads: shape.kvHeads, headDim: shape.headDim, dtype, chunkSize: p.chunkSize },
        })
      : undefined;
    let hot: HotTier | undefined;
    try {
      const memory = KvMemory.open({ ...config, ssd });
      hot = init.hotTier ? new HotTier(init.hotTier) : undefined;
      return new MemoryRuntime(memory, hot, init, ssd);
    } catch (e) {
      hot?.destroy();
      await ssd?.close();
      throw e;
    }
  }

  openSequence(seq: number): void {
    this.memory.openSequence(seq);
  }

  async closeSequence(seq: number): Promise<void> {
    this.hot?.resetSequence(seq);
    await this.memory.closeSequence(seq);
  }

  /** Whether (seq, layer) was prefilled. */
  prefilled(seq: number, layer: number): boolean {
    return this.memory.layer(seq, layer).tokens >= 0;
  }

  tokens(seq: number, layer: number): number {
    return this.memory.layer(seq, layer).tokens;
  }

  /**
   * Prefill of one layer: builds the index over the prompt's keys, seals everything the index
   * sealed into one segment (SSD + DRAM tier, ranked by the observation window when given), keeps
   * sinks and the open tail, and warms the hot tier. k / v: thd, host dtype, already validated.
   */
  async prefill(seq: number, layer: number, k: KvTensor, v: KvTensor, obsQ?: Float32Array): Promise<void> {
    const mem = this.memory;
    const lk = mem.layer(seq, layer);
    if (lk.tokens >= 0) fail('E_CONFIG', `prefill seq ${seq} layer ${layer}`, 'one prefill per layer (the tiers hold the sealed prompt)', 'a second prefill');
    const { shape, policyOptions: p } = mem.config;
    const T = k.tokens;
    const row = shape.kvHeads * shape.headDim;
    const policy = createPolicy(mem.config.policy, mem.config.policyInput);
    await policy.build(k, T);
    const cs = p.chunkSize;
    const nChunks = Math.ceil(T / cs);
    let scores: Float32Array | undefined;
    if (obsQ) {
      const window = obsQ.length / (shape.qHeads * shape.headDim);
      const positions = Int32Array.from({ length: window }, (_, w) => T - window + w);
      scores = await importanceScoresAsync(k, { q: obsQ, qHeads: shape.qHeads, positions }, cs);
    }
    lk.policy = policy;
    const end = mem.sealTarget(lk, T);
    try {
      if (end > 0) {
        let segScores: Float32Array | undefined;
        if (scores) {
          segScores = new Float32Array(shape.kvHeads * (end / cs));
          for (let h = 0; h < shape.kvHeads; h++) segScores.set(scores.subarray(h * nChunks, h * nChunks + end / cs), h * (end / cs));
        }
        await mem.seal(seq, layer, lk, k.data.subarray(0, end * row), v.data.subarray(0, end * row), end, segScores);
      }
    } catch (e) {
      lk.policy = undefined;
      throw e;
    }
    lk.sinkK.set(k.data.subarray(0, Math.min(p.sinks, T) * row));
    lk.sinkV.set(v.data.subarray(0, Math.min(p.sinks, T) * row));
    lk.tailK.set(k.data.subarray(end * row, T * row));
    lk.tailV.set(v.data.subarray(end * row, T * row));
    if (this.hot && scores) {
      const sinkEnd = Math.min(p.sinks, T);
      const tailStart = Math.max(sinkEnd, Math.floor((T - p.local) / cs) * cs);
      const ranked = rankChunks(scores, shape.kvHeads, cs, sinkEnd, tailStart);
      const placed = this.hot.warm({ sequence: seq, layer, k, v, ...ranked });
      for (const n of placed) this.time.warmedChunks += n;
    }
    lk.tokens = T;
  }

  /**
   * Attention for the entries of one layer step; outputs in entry order. Commits (token counts,
   * seals) only when every entry succeeded: a failed step can be retried as a whole.
   */
  async attend(layer: number, entries: MemoryEntry[]): Promise<{ out: Float32Array; selection: Selection; bytesScored: number }[]> {
    type Done = Awaited<ReturnType<typeof attendEntry>>;
    const run = (e: MemoryEntry, offThread: boolean) => attendEntry(this.memory, this.hot, e.seq, layer, e.q, e.kNew, e.vNew, offThread);
    let done: Done[];
    if (this.mode === 'sequential') {
      this.maxInFlight = Math.max(this.maxInFlight, 1);
      done = [];
      for (const e of entries) done.push(await run(e, false));
    } else {
      // Pipelined: micro-batches overlap (each entry is a different sequence: disjoint state), at
      // most `concurrency` at once — the fetch buffers the budget counts; later ones wait for a
      // runner (back-pressure, nothing dropped). Outputs keep entry order.
      const parts: MemoryEntry[][] = [];
      for (let i = 0; i < entries.length; i += this.microBatch) parts.push(entries.slice(i, i + this.microBatch));
      const results: Done[][] = new Array<Done[]>(parts.length);
      let next = 0;
      let running = 0;
      const runner = async () => {
        while (next < parts.length) {
          const p = next++;
          this.maxInFlight = Math.max(this.maxInFlight, ++running);
          try {
            const outs: Done[] = [];
            for (const e of parts[p]!) outs.push(await run(e, true));
            results[p] = outs;
          } finally {
            running--;
          }
        }
      };
      const settled = await Promise.allSettled(Array.from({ length: Math.min(this.memory.config.concurrency, parts.length) }, runner));
      const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected');
      if (failed) throw failed.reason;
      done = results.flat();
    }
    for (const d of done) {
      d.commit();
      this.count(d.stats);
    }
    return done.map((d) => ({ out: d.out, selection: d.selection, bytesScored: d.bytesScored }));
  }

  private count(s: EntryStepStats): void {
    for (const k of Object.keys(this.traffic) as (keyof MemoryTraffic)[]) this.traffic[k] += s[k];
    this.time.selectionMs += s.selectMs;
    this.time.fetchMs += s.fetchMs;
    this.time.computeMs += s.computeMs;
  }

  stats(): MemoryStats & { traffic: MemoryTraffic } {
    return { ...this.memory.stats(), traffic: { ...this.traffic } };
  }

  /** Closes every open sequence (given), the hot tier and the SSD store this runtime opened. */
  async close(openSeqs: number[]): Promise<void> {
    let error: unknown;
    for (const s of openSeqs) await this.memory.closeSequence(s).catch((e: unknown) => (error ??= e));
    this.hot?.destroy();
    await this.ownsSsd?.close();
    if (error !== undefined) throw error;
  }
}

/** Rows in the host dtype: f32 input is narrowed to f16 / bf16 (round to nearest even); 16-bit input is taken as bits. */
export function toDtype(what: string, data: Float32Array | Uint16Array, dtype: Dtype): Float32Array | Uint16Array {
  if (dtype === 'f32') {
    if (!(data instanceof Float32Array)) fail('E_DTYPE', what, 'a Float32Array (the runtime stores f32)', data);
    return data;
  }
  if (data instanceof Uint16Array) return data;
  if (data instanceof Float32Array) return fromF32(data, dtype);
  throw new KvdriveError('E_TYPE', `${what}: expected a Float32Array or the ${dtype} bits as a Uint16Array, got ${typeof data}`);
}
