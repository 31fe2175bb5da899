/**
 * The runtime over the memory model (kv-memory.ts): what `openRuntime` runs. It
 * owns the tiers (DRAM tier, optional SSD store, optional hot tier), the sequences' indexes, and
 * runs each attend() entry through the stages of step.ts (append → select → fetch + compute).
 * 'sequential' runs the entries one after another on the calling thread, select inline.
 * 'pipelined' runs up to `concurrency` micro-batches at once: the JS thread appends a micro-batch
 * (tail + index extend: every mutation stays on this thread), writes its queries and index handles
 * into a SharedArrayBuffer slot and pushes the slot on the select pipeline's ring; a piscina stage
 * worker (stage-pool.ts) selects on the indexes by handle and writes the selections into the slot;
 * the JS thread then fetches (I/O engine threads) and attends (native, off-thread) while the worker
 * selects the next micro-batch. Both modes run the same stage functions, so outputs are
 * bit-identical. A worker that dies mid-batch is replaced by the pool and the micro-batch's select
 * (pure: it only reads the index) is submitted again.
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
import { appendEntry, type EntryStepStats } from '../pipeline/append-stage.js';
import { attendEntry, fetchAttendEntry, type EntryResult } from '../pipeline/step.js';
import { SelectArena, selectEntry } from '../pipeline/select-stage.js';
import { Pipeline } from '../pipeline/pipeline.js';
import { compiledPipelineModule } from '../pipeline/stage-pool.js';

/** Tier traffic summed over attend() calls (chunks by where they came from, SSD device bytes, admissions). */
export type MemoryTraffic = Omit<EntryStepStats, 'selectMs' | 'fetchMs' | 'computeMs'>;

/** What openRuntime needs to build a memory runtime. */
/**
 * Entries that run at once in a mode: each holds a fetch buffer and, with an SSD, one read batch of
 * the I/O engine (pipelined: micro-batches in flight; sequential: one).
 */
export function entriesInFlight(mode: 'sequential' | 'pipelined'): number {
  return mode === 'pipelined' ? 4 : 1;
}

/**
 * The I/O engine options a runtime's SSD store opens with where `ssd.io` does not set them: one
 * read batch per entry in flight (the buffers of more batches would be reserved in the budget and
 * never used), queue depth 64 and reads of at most 64 KiB. A step reads ~200-250 small runs (4-16
 * KiB): at depth 64 they reach the device in ~4 rounds instead of ~7, so the I/O thread refills the
 * queue less often while attention keeps both cores busy, and 2 x 64 bounce slots of 72 KiB are 9.0
 * MiB per batch instead of the store defaults' 16.5 MiB (bench/runtime-memory.md, branch ssd4).
 */
export function runtimeIoDefaults(mode: 'sequential' | 'pipelined'): IoEngineOptions {
  return { maxBatches: entriesInFlight(mode), queueDepth: 64, maxIoBytes: 64 << 10 };
}

export interface MemoryRuntimeInit extends Omit<KvMemoryConfig, 'ssd' | 'concurrency' | 'hotTierBytes' | 'selectArenaBytes'> {
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

/** Times one micro-batch is submitted again after its select worker died holding it. */
const MAX_SELECT_RETRIES = 3;

export class MemoryRuntime {
  readonly memory: KvMemory;
  readonly hot: HotTier | undefined;
  readonly mode: 'sequential' | 'pipelined';
  readonly microBatch: number;
  readonly traffic: MemoryTraffic = { chunks: 0, hotChunks: 0, dramChunks: 0, ssdChunks: 0, tailChunks: 0, ssdReadBytes: 0, hotAdmitted: 0, dramAdmitted: 0 };
  readonly time = { selectionMs: 0, fetchMs: 0, computeMs: 0, warmedChunks: 0 };
  /** Most micro-batches of one attend() that ran at once (1 sequentially). */
  maxInFlight = 0;
  /** Pipelined select stage: entries selected on the worker / on this thread (fallback), micro-batches submitted again after their worker died. */
  readonly selectCounts = { onWorker: 0, inline: 0, retries: 0 };
  /**
   * Why the pipelined select stage was given up (its worker could not be replaced, or kept dying
   * past MAX_SELECT_RETRIES); undefined while it runs. From then on every entry selects inline on
   * this thread: the same selectEntry, so outputs do not change, only the overlap is lost.
   */
  selectFallback: string | undefined;
  /**
   * @internal Pipelined: the select stage (one piscina worker) and the slots micro-batches travel
   * in (one per runner). Undefined in sequential mode.
   */
  readonly select: { pipeline: Pipeline; arena: SelectArena } | undefined;
  private readonly ownsSsd: SsdStore | undefined;

  private constructor(
    memory: KvMemory,
    hot: HotTier | undefined,
    init: MemoryRuntimeInit,
    ssd: SsdStore | undefined,
    select: { pipeline: Pipeline; arena: SelectArena } | undefined,
  ) {
    this.memory = memory;
    this.hot = hot;
    this.mode = init.mode;
    this.microBatch = init.microBatch;
    this.ownsSsd = ssd;
    this.select = select;
  }

  static async open(init: MemoryRuntimeInit): Promise<MemoryRuntime> {
    const { shape, dtype, policyOptions: p } = init;
    const { mode: _m, microBatch: _b, hotTier: _h, ssd: _s, ...rest } = init;
    const concurrency = entriesInFlight(init.mode);
    const qLen = shape.qHeads * shape.headDim;
    const selectArenaBytes = init.mode === 'pipelined' ? SelectArena.bytes(concurrency, init.microBatch, qLen, shape.kvHeads, init.budget) : 0;
    const config: Omit<KvMemoryConfig, 'ssd' | 'hotTierBytes'> = { ...rest, concurrency, selectArenaBytes };
    const ssd = init.ssd
      ? await SsdStore.open({
          ...runtimeIoDefaults(init.mode),
          ...(init.ssd.io ?? {}),
          dir: init.ssd.dir,
          direct: init.ssd.direct ?? false,
          // Segments already there were left by a runtime that never closed (its process died):
          // their sequences died with it and nothing can read them again. Deleted, so that this
          // runtime's segment ids are free and the disk space comes back; the shape is this one's.
          reset: true,
          shape: { layers: 1, kvHeads: shape.kvHeads, headDim: shape.headDim, dtype, chunkSize: p.chunkSize },
        })
      : undefined;
    let hot: HotTier | undefined;
    let pipeline: Pipeline | undefined;
    try {
      // The hot tier before the plan, so that the plan reserves the bytes the tier holds (its
      // windows' slots and metadata, at most maxBytes) and not the cap: a generous cap would
      // otherwise be budget that no tier ever uses. Its slots are not touched until admitted.
      hot = init.hotTier ? new HotTier(init.hotTier) : undefined;
      const memory = KvMemory.open({ ...config, hotTierBytes: hot?.info().bytes ?? 0, ssd });
      let select: { pipeline: Pipeline; arena: SelectArena } | undefined;
      if (init.mode === 'pipelined') {
        const arena = new SelectArena(concurrency, init.microBatch, qLen, shape.kvHeads, init.budget); // plan.selectArenaBytes
        pipeline = await Pipeline.start({
          stages: [{ name: 'select', module: compiledPipelineModule('select-stage.js'), init: arena.init, threads: 1 }],
          words: 2, // [slot, entries]
          capacity: 8, // >= concurrency: a runner never waits for ring space
        });
        select = { pipeline, arena };
      }
      return new MemoryRuntime(memory, hot, init, ssd, select);
    } catch (e) {
      await pipeline?.close();
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
    let done: EntryResult[];
    // One micro-batch has nothing to overlap with: the hop to the select worker and back would be
    // pure latency, so it runs as the sequential mode does (same stage functions, same output).
    if (this.mode === 'sequential' || entries.length <= this.microBatch) {
      this.maxInFlight = Math.max(this.maxInFlight, 1);
      done = [];
      for (const e of entries) done.push(await attendEntry(this.memory, this.hot, e.seq, layer, e.q, e.kNew, e.vNew, false));
    } else {
      // Pipelined: micro-batches overlap (each entry is a different sequence: disjoint state), at
      // most `concurrency` at once — the fetch buffers the budget counts, and runner r owns arena
      // slot r; later ones wait for a runner (back-pressure, nothing dropped). Outputs keep entry order.
      const parts: MemoryEntry[][] = [];
      for (let i = 0; i < entries.length; i += this.microBatch) parts.push(entries.slice(i, i + this.microBatch));
      const results: EntryResult[][] = new Array<EntryResult[]>(parts.length);
      let next = 0;
      let running = 0;
      const runner = async (slot: number) => {
        while (next < parts.length) {
          const p = next++;
          this.maxInFlight = Math.max(this.maxInFlight, ++running);
          try {
            results[p] = await this.runMicroBatch(layer, parts[p]!, slot);
          } finally {
            running--;
          }
        }
      };
      const n = Math.min(this.memory.config.concurrency, parts.length);
      const settled = await Promise.allSettled(Array.from({ length: n }, (_, slot) => runner(slot)));
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

  /**
   * One micro-batch, pipelined: append on this thread, select on the stage worker (through arena
   * slot `slot`), then fetch + attend off-thread, entry by entry.
   */
  private async runMicroBatch(layer: number, part: MemoryEntry[], slot: number): Promise<EntryResult[]> {
    const { pipeline, arena } = this.select!;
    const budget = this.memory.config.budget;
    const appended = [];
    for (let i = 0; i < part.length; i++) {
      const e = part[i]!;
      const a = await appendEntry(this.memory, e.seq, layer, e.kNew, e.vNew);
      arena.put(slot, i, a.handle, budget, e.q);
      appended.push(a);
    }
    // A worker that dies holding the batch rejects it with E_WORKER (the stage function itself
    // never throws: see select-stage.ts) and is replaced; select only reads, so submit again. When
    // the stage cannot go on (no replacement started, or deaths past MAX_SELECT_RETRIES) decoding
    // does not fail: the entries left unselected (status 0 in the slot) select inline below.
    for (let attempt = 0; this.selectFallback === undefined; attempt++) {
      try {
        await pipeline.submit([slot, part.length]);
        break;
      } catch (e) {
        if (!(e instanceof KvdriveError && e.code === 'E_WORKER')) throw e;
        if (attempt >= MAX_SELECT_RETRIES || pipeline.failure() !== undefined) this.selectFallback = e.message;
        else this.selectCounts.retries++;
      }
    }
    const outs: EntryResult[] = [];
    for (let i = 0; i < part.length; i++) {
      const e = part[i]!;
      const a = appended[i]!;
      // Not selected on the worker (it threw, or the selection outgrew the slot): the same select
      // here, which returns the selection or throws its typed error.
      let s = arena.take(slot, i);
      if (s) this.selectCounts.onWorker++;
      else {
        s = selectEntry(a.handle, e.q, budget);
        this.selectCounts.inline++;
      }
      outs.push(await fetchAttendEntry(this.memory, this.hot, e.seq, layer, a, e.q, s, true));
    }
    return outs;
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

  /** Closes every open sequence (given), the select stage (its worker threads joined), the hot tier and the SSD store this runtime opened. */
  async close(openSeqs: number[]): Promise<void> {
    let error: unknown;
    await this.select?.pipeline.close().catch((e: unknown) => (error ??= e));
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
