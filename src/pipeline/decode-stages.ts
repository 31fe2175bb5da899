/**
 * The decode stages of one layer step over a micro-batch slot of the shared arena:
 *   selection: per entry, seal new chunks into the (sequence, layer) index and select the critical
 *              chunks for its query → selMeta / selOffsets / selIds of the slot
 *   compute:   per entry, exact sparse attention over sinks + selected chunks + tail, reading K/V
 *              from the shared sequence store → out / lse of the slot
 * The SAME code runs on the main thread in sequential mode and in stage workers in pipelined mode
 * (this file is also the stage module: `createStage`), which is what makes both modes produce
 * bit-identical outputs.
 *
 * With a hot tier (src/cache/hot-tier.ts, reached by its native handle from any thread) a third
 * stage runs between them:
 *   fetch:     per entry, hit/miss of the selected chunks against the tier's residents, eviction,
 *              admission of misses copied from the store
 * and compute reads chunks from their hot-tier slots (bit-identical to reading the store).
 * Without a hot tier, compute reads the shared DRAM store directly.
 */
import { KvdriveError } from '../errors.js';
import { createPolicy, type SelectionPolicy } from '../index/policy.js';
import type { PolicyOptions } from '../index/options.js';
import type { PolicyName, Selection } from '../index/selection.js';
import { attendSparse } from '../attention/kernels.js';
import type { ModelShape } from '../types.js';
import { SharedArena, decodeSlotRegions, type ArenaLayout } from './shared-arena.js';
import { SequenceStore, type SequenceStoreLayout } from './sequence-store.js';
import type { StageContext, StageHandlers } from './stage-contract.js';
import { native } from '../native.js';

export type DecodeRegions = ReturnType<typeof decodeSlotRegions>;

/** Everything a decode stage needs; structured-cloneable (buffers are shared). */
export interface DecodeInit {
  shape: ModelShape;
  /** Tokens per kv head per step beside sinks and tail. */
  budget: number;
  policy: PolicyName;
  policyOptions: PolicyOptions;
  /** Capacity of selIds per (entry, kv head). */
  maxChunksPerHead: number;
  store: { buffer: SharedArrayBuffer; layout: SequenceStoreLayout };
  arena: { buffer: SharedArrayBuffer; layout: ArenaLayout<DecodeRegions> };
  /** Native handle of the hot tier (sequences = store's maxSequences), or undefined for none. */
  hotTier?: number;
}

/** Control requests of the selection stage. */
export type DecodeControl =
  | { type: 'build'; seq: number; layer: number; tokens: number }
  | { type: 'drop'; seq: number };

/** Words of the slot's `timing` region, summed over the slot's entries (times in ms). */
export const TIMING_SELECTION = 0;
export const TIMING_COMPUTE = 1;
export const TIMING_FETCH = 2;
/** Selected chunks found resident / not resident in the hot tier. */
export const TIMING_HITS = 3;
export const TIMING_MISSES = 4;

/** Selection indexes and views of one thread. */
export class DecodeState {
  readonly init: DecodeInit;
  private readonly store: SequenceStore;
  private readonly arena: SharedArena<DecodeRegions>;
  /** (seq * layers + layer) → index of that sequence's layer. Owned by the selection thread only. */
  private readonly policies = new Map<number, SelectionPolicy>();

  constructor(init: DecodeInit) {
    this.init = init;
    this.store = SequenceStore.attach(init.store.buffer, init.store.layout);
    this.arena = SharedArena.attach(init.arena.buffer, init.arena.layout);
  }

  /** Builds (or rebuilds) the index of (seq, layer) over its first `tokens` keys; drops a sequence. */
  async control(req: DecodeControl): Promise<void> {
    const L = this.init.shape.layers;
    if (req.type === 'drop') {
      for (let l = 0; l < L; l++) this.policies.delete(req.seq * L + l);
      return;
    }
    const { qHeads, kvHeads, headDim } = this.init.shape;
    const policy = createPolicy(this.init.policy, { ...this.init.policyOptions, qHeads, kvHeads, headDim });
    await policy.build(this.store.tensor(req.seq, req.layer, 0, req.tokens), req.tokens);
    this.policies.set(req.seq * L + req.layer, policy);
  }

  /** Selection stage over entries [0, count) of `slot`. */
  select(slot: number, count: number, layer: number): void {
    const t0 = performance.now();
    const { qHeads: hq, kvHeads: hkv, headDim: d, layers: L } = this.init.shape;
    const a = this.arena;
    const seqs = a.view(slot, 'seq');
    const q = a.view(slot, 'q');
    const meta = a.view(slot, 'selMeta');
    const offsets = a.view(slot, 'selOffsets');
    const ids = a.view(slot, 'selIds');
    const maxC = this.init.maxChunksPerHead;
    for (let b = 0; b < count; b++) {
      const seq = seqs[b]!;
      const tokens = meta[b * 4 + 1]!;
      const policy = this.policies.get(seq * L + layer);
      if (!policy) throw new KvdriveError('E_RANGE', `selection: expected sequence ${seq} layer ${layer} to be prefilled, got no index for it`);
      policy.extend(this.store.tensor(seq, layer, 0, tokens), tokens);
      const sel = policy.select(q.subarray(b * hq * d, (b + 1) * hq * d), this.init.budget);
      for (let h = 0; h < hkv; h++) {
        const n = sel.offsets[h + 1]! - sel.offsets[h]!;
        if (n > maxC)
          throw new KvdriveError('E_INTERNAL', `selection: expected at most ${maxC} chunks per kv head for budget ${this.init.budget}, got ${n} (kv head ${h})`);
      }
      meta.set([sel.chunkSize, sel.tokens, sel.sinkEnd, sel.tailStart], b * 4);
      offsets.set(sel.offsets, b * (hkv + 1));
      ids.set(sel.chunkIds, b * hkv * maxC);
    }
    a.view(slot, 'timing')[TIMING_SELECTION] = performance.now() - t0;
  }

  /** The Selection of entry b of `slot`, as views into the arena (no copies). */
  private selectionOf(slot: number, b: number): Selection {
    const hkv = this.init.shape.kvHeads;
    const maxC = this.init.maxChunksPerHead;
    const meta = this.arena.view(slot, 'selMeta');
    const off = this.arena.view(slot, 'selOffsets').subarray(b * (hkv + 1), (b + 1) * (hkv + 1));
    return {
      chunkSize: meta[b * 4]!,
      tokens: meta[b * 4 + 1]!,
      sinkEnd: meta[b * 4 + 2]!,
      tailStart: meta[b * 4 + 3]!,
      offsets: off,
      chunkIds: this.arena.view(slot, 'selIds').subarray(b * hkv * maxC, b * hkv * maxC + off[hkv]!),
    };
  }

  /** Fetch stage (hot tier only) over entries [0, count) of `slot`. */
  fetch(slot: number, count: number, layer: number): void {
    const t0 = performance.now();
    const handle = this.init.hotTier;
    if (handle === undefined) throw new KvdriveError('E_INTERNAL', 'fetch stage: expected a hot tier, got none');
    const seqs = this.arena.view(slot, 'seq');
    const timing = this.arena.view(slot, 'timing');
    for (let b = 0; b < count; b++) {
      const seq = seqs[b]!;
      const selection = this.selectionOf(slot, b);
      const { tokens } = selection;
      const r = native.hotTierFetch(handle, {
        sequence: seq,
        layer,
        k: this.store.tensor(seq, layer, 0, tokens),
        v: this.store.tensor(seq, layer, 1, tokens),
        selection,
      }) as { hits: Float64Array; misses: Float64Array };
      for (let h = 0; h < r.hits.length; h++) {
        timing[TIMING_HITS]! += r.hits[h]!;
        timing[TIMING_MISSES]! += r.misses[h]!;
      }
    }
    timing[TIMING_FETCH] = performance.now() - t0;
  }

  /** Compute stage over entries [0, count) of `slot` (from hot-tier slots when there is a tier). */
  compute(slot: number, count: number, layer: number): void {
    const t0 = performance.now();
    const { qHeads: hq, headDim: d } = this.init.shape;
    const a = this.arena;
    const seqs = a.view(slot, 'seq');
    const q = a.view(slot, 'q');
    const out = a.view(slot, 'out');
    const lse = a.view(slot, 'lse');
    const handle = this.init.hotTier;
    for (let b = 0; b < count; b++) {
      const seq = seqs[b]!;
      const selection = this.selectionOf(slot, b);
      const args = {
        q: q.subarray(b * hq * d, (b + 1) * hq * d),
        qHeads: hq,
        k: this.store.tensor(seq, layer, 0, selection.tokens),
        v: this.store.tensor(seq, layer, 1, selection.tokens),
        selection,
      };
      const r =
        handle === undefined
          ? attendSparse(args)
          : (native.hotTierAttend(handle, { ...args, sequence: seq, layer }) as { out: Float32Array; lse: Float32Array });
      out.set(r.out, b * hq * d);
      lse.set(r.lse, b * hq);
    }
    a.view(slot, 'timing')[TIMING_COMPUTE] = performance.now() - t0;
  }
}

/** Stage module entry (see stage-contract.ts): descriptor user words are [slot, count, layer]. */
export function createStage(init: DecodeInit & { role: 'selection' | 'fetch' | 'compute' }, _ctx: StageContext): StageHandlers {
  const state = new DecodeState(init);
  if (init.role === 'selection')
    return { run: (desc) => state.select(desc[0]!, desc[1]!, desc[2]!), control: (req) => state.control(req as DecodeControl) };
  if (init.role === 'fetch') return { run: (desc) => state.fetch(desc[0]!, desc[1]!, desc[2]!) };
  return { run: (desc) => state.compute(desc[0]!, desc[1]!, desc[2]!) };
}
