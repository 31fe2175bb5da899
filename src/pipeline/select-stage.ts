/**
 * The select stage of the decode step: `selectEntry` (the one select both runtime modes run) and
 * the stage module the pipelined runtime's piscina workers load (`createStage`).
 *
 * Sequential mode calls selectEntry inline on the JS thread. Pipelined mode writes each micro-batch
 * into a slot of a {@link SelectArena} (per entry: the index handle, the budget and the query), pushes
 * [slot, entries] on the select pipeline's ring, and a stage worker runs selectEntry on every entry
 * and writes the selections back into the slot. Select only reads the index (native read lock;
 * mutations stay on the main thread), so it is pure and idempotent: a micro-batch whose worker died
 * is simply submitted again.
 *
 * Slot layout (per entry i < microBatch; heads = kv heads, cap = idsPerEntry):
 *   req  i32 [2i, 2i+2):          index handle, budget (tokens per kv head)
 *   q    f32 [i*qLen, (i+1)*qLen): the query
 *   res  f64 [8i, 8i+8):          status (1 = selected; 0 = not, the main thread selects inline),
 *                                 chunkSize, tokens, sinkEnd, tailStart, chunk ids, bytesScored, ms
 *   offs i32 [i*(heads+1), ...):  per kv head offsets into ids
 *   ids  i32 [i*cap, i*cap+n):    selected ids, ascending per head
 * A select that throws, or whose ids exceed cap, leaves status 0: the main thread then runs the
 * same selectEntry itself, which returns the selection or throws the typed error (no error crosses
 * threads as text).
 */
import { native } from '../native.js';
import type { Selection } from '../index/selection.js';
import { SharedArena, planArena, type ArenaLayout } from './shared-arena.js';
import type { StageFn } from './stage-contract.js';

/** A selection and what it cost. */
export interface EntrySelection {
  selection: Selection;
  bytesScored: number;
  /** Wall time of the native select, milliseconds. */
  ms: number;
}

/**
 * Selects for one decode position on the index registered as `handle` (SelectionPolicy.handle()),
 * on the calling thread: the select stage of step.ts, inline (sequential) or on a stage worker
 * (pipelined). q: qHeads x headDim, validated by the runtime; budget: tokens per kv head.
 * `heads` = [first, end): only those kv heads (offsets then cover end - first heads, from 0); kv
 * heads select independently, so consecutive ranges concatenated equal the whole selection
 * (step.ts streams a sequential step's fetch behind the select this way).
 */
export function selectEntry(handle: number, q: Float32Array, budget: number, heads?: readonly [number, number]): EntrySelection {
  const t0 = performance.now();
  const r = (heads ? native.selectIndex(handle, q, budget, undefined, undefined, heads[0], heads[1]) : native.selectIndex(handle, q, budget)) as Selection & {
    bytesScored: number;
  };
  const ms = performance.now() - t0;
  const selection: Selection = { chunkSize: r.chunkSize, tokens: r.tokens, sinkEnd: r.sinkEnd, tailStart: r.tailStart, offsets: r.offsets, chunkIds: r.chunkIds };
  return { selection, bytesScored: r.bytesScored, ms };
}

const RES_WORDS = 8;

function regions(microBatch: number, qLen: number, heads: number, cap: number) {
  return {
    req: { type: 'i32' as const, length: 2 * microBatch },
    q: { type: 'f32' as const, length: qLen * microBatch },
    res: { type: 'f64' as const, length: RES_WORDS * microBatch },
    offs: { type: 'i32' as const, length: (heads + 1) * microBatch },
    ids: { type: 'i32' as const, length: cap * microBatch },
  };
}
type Regions = ReturnType<typeof regions>;

/** What a select stage worker is started with (structured-cloned; the buffer is shared). */
export interface SelectStageInit {
  buffer: SharedArrayBuffer;
  layout: ArenaLayout<Regions>;
  microBatch: number;
  qLen: number;
  heads: number;
  cap: number;
}

/** The shared slots micro-batches travel in between the runtime and its select stage. */
export class SelectArena {
  readonly arena: SharedArena<Regions>;
  readonly init: SelectStageInit;

  /**
   * `slots` micro-batches of up to `microBatch` entries; qLen = qHeads x headDim; ids room for
   * heads x (budget + 1) per entry (a select returns at most ceil(budget / chunk) + 1 chunks or
   * budget tokens per head; a larger one falls back to the main thread, see the file header).
   */
  constructor(slots: number, microBatch: number, qLen: number, heads: number, budget: number) {
    const cap = heads * (budget + 1);
    this.arena = SharedArena.create(slots, regions(microBatch, qLen, heads, cap));
    this.init = { buffer: this.arena.buffer, layout: this.arena.layout, microBatch, qLen, heads, cap };
  }

  /** Bytes the arena of these arguments takes (the same layout the constructor allocates), for the memory plan. */
  static bytes(slots: number, microBatch: number, qLen: number, heads: number, budget: number): number {
    const layout = planArena(slots, regions(microBatch, qLen, heads, heads * (budget + 1)));
    return layout.slots * layout.slotBytes;
  }

  /** Writes entry i of slot `slot` (status reset: not selected yet). */
  put(slot: number, i: number, handle: number, budget: number, q: Float32Array): void {
    const req = this.arena.view(slot, 'req');
    req[2 * i] = handle;
    req[2 * i + 1] = budget;
    this.arena.view(slot, 'q').set(q, i * this.init.qLen);
    this.arena.view(slot, 'res')[RES_WORDS * i] = 0;
  }

  /** The selection of entry i of slot `slot` (copied out: the slot is reused), or undefined when the worker did not select it. */
  take(slot: number, i: number): EntrySelection | undefined {
    return readEntry(this.arena, this.init, slot, i);
  }
}

function readEntry(arena: SharedArena<Regions>, init: SelectStageInit, slot: number, i: number): EntrySelection | undefined {
  const res = arena.view(slot, 'res').subarray(RES_WORDS * i, RES_WORDS * (i + 1));
  if (res[0] !== 1) return undefined;
  const h1 = init.heads + 1;
  const offsets = arena.view(slot, 'offs').slice(i * h1, (i + 1) * h1);
  const chunkIds = arena.view(slot, 'ids').slice(i * init.cap, i * init.cap + res[5]!);
  return {
    selection: { chunkSize: res[1]!, tokens: res[2]!, sinkEnd: res[3]!, tailStart: res[4]!, offsets, chunkIds },
    bytesScored: res[6]!,
    ms: res[7]!,
  };
}

function writeEntry(arena: SharedArena<Regions>, init: SelectStageInit, slot: number, i: number, s: EntrySelection): void {
  const { selection: sel } = s;
  const res = arena.view(slot, 'res').subarray(RES_WORDS * i, RES_WORDS * (i + 1));
  if (sel.chunkIds.length > init.cap || sel.offsets.length !== init.heads + 1) return; // status stays 0: inline
  arena.view(slot, 'offs').set(sel.offsets, i * (init.heads + 1));
  arena.view(slot, 'ids').set(sel.chunkIds, i * init.cap);
  res.set([1, sel.chunkSize, sel.tokens, sel.sinkEnd, sel.tailStart, sel.chunkIds.length, s.bytesScored, s.ms]);
}

/**
 * Stage module entry (a piscina stage worker, see stage-pool.ts): selects every entry of the
 * micro-batch in slot desc[0] (desc[1] entries). Never throws: an entry that failed keeps status 0.
 */
export function createStage(init: SelectStageInit): StageFn {
  const arena = SharedArena.attach(init.buffer, init.layout);
  return (desc) => {
    const slot = desc[0]!;
    const n = desc[1]!;
    if (!(slot >= 0 && slot < init.layout.slots && n >= 0 && n <= init.microBatch)) return; // nothing selected: inline
    const req = arena.view(slot, 'req');
    const q = arena.view(slot, 'q');
    for (let i = 0; i < n; i++) {
      try {
        writeEntry(arena, init, slot, i, selectEntry(req[2 * i]!, q.subarray(i * init.qLen, (i + 1) * init.qLen), req[2 * i + 1]!));
      } catch {
        // status stays 0: the main thread selects this entry itself and gets the typed error
      }
    }
  };
}
