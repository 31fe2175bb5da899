/**
 * Indexed binary min-heap over slot ids keyed by a Float32 score, with lazy increases: the DRAM
 * tier uses it to find the least important resident chunk. This class owns the heap's memory; every
 * operation that changes it runs natively (native/cache/dram_tier.cc: `slotHeap`, and `dramPut`, the
 * DRAM tier's admission loop, which runs the same heap in the same pass as its evictions).
 *
 * Each slot has a true score ({@link scoreOf}) and a heap key with key <= score always. Decreases
 * re-key eagerly (O(log n)); increases only write the true score (O(1)) and are applied when the
 * slot reaches the top. {@link peek} re-keys stale tops until the top's key equals its score, so it
 * returns an exact minimum: every other slot has score >= key >= that top's key = its score.
 * Per-step attention-mass refreshes are mostly increases, so they cost O(1) each.
 *
 * Memory: 16 bytes per slot, allocated once: the heap (4 bytes per position) and one 12-byte
 * record per slot, [score f32, key f32, heap position i32 (-1 when absent)] at words 3 x slot .. +2
 * of one buffer (two views), plus the heap's size in a one-element Int32Array (the native passes
 * update it). A refresh touches a slot's score, key and position together: one cache line.
 */
import { constants as bufferConstants } from 'node:buffer';
import { fail } from '../errors.js';
import { native } from '../native.js';

/** Words per slot record: score, key, position. */
const REC = 3;

/** The native heap's operations (native/cache/dram_tier.cc slotHeap `op`). */
const OP_PEEK = 0;
const OP_INSERT = 1;
const OP_UPDATE = 2;
const OP_REMOVE = 3;

/** The heap's arrays as the native passes take them. */
export interface SlotHeapState {
  /** Slot records as i32 words (score and key are f32 bits at 3 x slot and 3 x slot + 1). */
  rec: Int32Array;
  heap: Int32Array;
  /** [number of slots in the heap]. */
  size: Int32Array;
}

export class SlotHeap {
  /** Bytes of heap state per slot (a heap position and a record). */
  static readonly bytesPerSlot = 16;
  /** Most slots a heap can hold: its records are one typed array of 12 bytes per slot. */
  static readonly maxSlots = Math.floor(bufferConstants.MAX_LENGTH / (4 * REC));

  /** The arrays the native operations run on. */
  readonly state: SlotHeapState;
  /** Records as f32 (score at 3 x slot), for reads. */
  private readonly recF: Float32Array;
  private readonly one = { slots: new Int32Array(1), scores: new Float64Array(1) };

  constructor(capacity: number) {
    if (!Number.isInteger(capacity) || capacity < 0 || capacity > SlotHeap.maxSlots) fail('E_BUDGET', 'SlotHeap capacity', `an integer in [0, ${SlotHeap.maxSlots}]`, capacity);
    const buf = new ArrayBuffer(4 * REC * capacity);
    this.recF = new Float32Array(buf);
    const rec = new Int32Array(buf);
    for (let s = 0; s < capacity; s++) rec[REC * s + 2] = -1;
    this.state = { rec, heap: new Int32Array(capacity), size: new Int32Array(1) };
  }

  get size(): number {
    return this.state.size[0]!;
  }
  has(slot: number): boolean {
    return this.state.rec[REC * slot + 2]! >= 0;
  }
  /** True score of a slot (the last one given by insert / update). */
  scoreOf(slot: number): number {
    return this.recF[REC * slot]!;
  }
  /** The slot with the smallest score, or -1 when empty. */
  peek(): number {
    return native.slotHeap({ ...this.state, op: OP_PEEK }) as number;
  }
  insert(slot: number, score: number): void {
    this.one.slots[0] = slot;
    this.one.scores[0] = score;
    native.slotHeap({ ...this.state, op: OP_INSERT, slots: this.one.slots, scores: this.one.scores });
  }
  /** Sets a slot's score; for a slot not in the heap (taken out by {@link remove}) only the score is kept, for a later {@link insert}. */
  update(slot: number, score: number): void {
    this.one.slots[0] = slot;
    this.one.scores[0] = score;
    native.slotHeap({ ...this.state, op: OP_UPDATE, slots: this.one.slots, scores: this.one.scores });
  }
  /**
   * Sets the scores of many slots in order: slots[k] gets scores[entries[k]] (scores[k] without
   * entries). Every slot and score is checked (range, finite) before any changes.
   */
  updateMany(slots: Int32Array, scores: Float32Array | Float64Array, entries?: Int32Array): void {
    native.slotHeap({ ...this.state, op: OP_UPDATE, slots, scores, ...(entries ? { entries } : {}) });
  }
  /** Takes slots out of the heap (their scores are kept); nothing for a slot not in it. */
  remove(slot: number): void {
    this.one.slots[0] = slot;
    native.slotHeap({ ...this.state, op: OP_REMOVE, slots: this.one.slots });
  }
}
