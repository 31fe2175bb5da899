/**
 * Indexed binary min-heap over slot ids keyed by a Float32 score, with lazy increases: the DRAM
 * tier uses it to find the least important resident chunk.
 *
 * Each slot has a true score ({@link scoreOf}) and a heap key with key <= score always. Decreases
 * re-key eagerly (O(log n)); increases only write the true score (O(1)) and are applied when the
 * slot reaches the top. {@link peek} re-keys stale tops until the top's key equals its score, so it
 * returns an exact minimum: every other slot has score >= key >= that top's key = its score.
 * Per-step attention-mass refreshes are mostly increases, so they cost O(1) each.
 *
 * Memory: 16 bytes per slot, allocated once: the heap (4 bytes per position) and one 12-byte
 * record per slot, [score f32, key f32, heap position i32 (-1 when absent)] at words 3 x slot .. +2
 * of one buffer (two views). A refresh touches a slot's score, key and position together; as one
 * record they are one cache line instead of three (the DRAM tier refreshes ~3,000 slots at random
 * per layer-step in a heap of ~10^5 slots).
 */
import { constants as bufferConstants } from 'node:buffer';
import { fail } from '../errors.js';
import { native } from '../native.js';

/** Words per slot record: score, key, position. */
const REC = 3;

export class SlotHeap {
  /** Bytes of heap state per slot (a heap position and a record). */
  static readonly bytesPerSlot = 16;
  /** Most slots a heap can hold: its records are one typed array of 12 bytes per slot. */
  static readonly maxSlots = Math.floor(bufferConstants.MAX_LENGTH / (4 * REC));

  /** Records as f32 (score at 3 x slot, key at 3 x slot + 1). */
  private readonly recF: Float32Array;
  /** The same records as i32 (heap position at 3 x slot + 2). */
  private readonly recI: Int32Array;
  private readonly heap: Int32Array;
  private n = 0;
  /** The decreases {@link refresh} leaves for the sift (grown to the largest refresh seen). */
  private decSlots = new Int32Array(0);
  private decScores = new Float32Array(0);

  constructor(capacity: number) {
    if (!Number.isInteger(capacity) || capacity < 0 || capacity > SlotHeap.maxSlots) fail('E_BUDGET', 'SlotHeap capacity', `an integer in [0, ${SlotHeap.maxSlots}]`, capacity);
    const buf = new ArrayBuffer(4 * REC * capacity);
    this.recF = new Float32Array(buf);
    this.recI = new Int32Array(buf);
    for (let s = 0; s < capacity; s++) this.recI[REC * s + 2] = -1;
    this.heap = new Int32Array(capacity);
  }

  get size(): number {
    return this.n;
  }
  has(slot: number): boolean {
    return this.recI[REC * slot + 2]! >= 0;
  }
  /** True score of a slot (the last one given by insert / update). */
  scoreOf(slot: number): number {
    return this.recF[REC * slot]!;
  }
  /** The slot with the smallest score, or -1 when empty. */
  peek(): number {
    const r = this.recF;
    while (this.n > 0) {
      const top = this.heap[0]!;
      if (r[REC * top + 1] === r[REC * top]) return top;
      r[REC * top + 1] = r[REC * top]!;
      this.down(0);
    }
    return -1;
  }
  insert(slot: number, score: number): void {
    const b = REC * slot;
    this.recF[b] = score;
    this.recF[b + 1] = score;
    const i = this.n++;
    this.heap[i] = slot;
    this.recI[b + 2] = i;
    this.up(i);
  }
  /** Sets a slot's score; for a slot not in the heap (taken out by {@link remove}) only the score is kept, for a later {@link insert}. */
  update(slot: number, score: number): void {
    const b = REC * slot;
    const r = this.recF;
    r[b] = score;
    const i = this.recI[b + 2]!;
    if (i < 0) {
      r[b + 1] = score;
      return;
    }
    if (score < r[b + 1]!) {
      r[b + 1] = score;
      this.up(i);
    }
  }
  /**
   * Many updates at once: slots[k] gets scores[entries[k]], in order (the same end state as
   * {@link update} one by one). A native pass (native/cache/dram_tier.cc, dramHeapRefresh) checks
   * every argument (E_RANGE / E_NONFINITE before anything changes), applies the updates that need
   * no sift with its loads prefetched, and returns the decreases, which sift here. For the DRAM
   * tier's per-step refresh of ~3,000 slots at random: one by one, each is a cache miss.
   */
  refresh(slots: Int32Array, entries: Int32Array, scores: Float32Array): void {
    const n = slots.length;
    if (this.decSlots.length < n) {
      this.decSlots = new Int32Array(n);
      this.decScores = new Float32Array(n);
    }
    const dec = native.dramHeapRefresh({ records: this.recF, heap: this.heap, slots, entries, scores, out: { slots: this.decSlots, scores: this.decScores } }) as number;
    for (let j = 0; j < dec; j++) this.update(this.decSlots[j]!, this.decScores[j]!);
  }
  /** Takes a slot out of the heap (its score is kept); nothing for a slot not in it. */
  remove(slot: number): void {
    const i = this.recI[REC * slot + 2]!;
    if (i < 0) return;
    const last = this.heap[--this.n]!;
    this.recI[REC * slot + 2] = -1;
    if (i === this.n) return;
    this.heap[i] = last;
    this.recI[REC * last + 2] = i;
    this.up(i);
    this.down(this.recI[REC * last + 2]!);
  }
  private up(i: number): void {
    const h = this.heap;
    const r = this.recF;
    const p32 = this.recI;
    const slot = h[i]!;
    const k = r[REC * slot + 1]!;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (r[REC * h[p]! + 1]! <= k) break;
      h[i] = h[p]!;
      p32[REC * h[i]! + 2] = i;
      i = p;
    }
    h[i] = slot;
    p32[REC * slot + 2] = i;
  }
  private down(i: number): void {
    const h = this.heap;
    const r = this.recF;
    const p32 = this.recI;
    const slot = h[i]!;
    const k = r[REC * slot + 1]!;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= this.n) break;
      if (c + 1 < this.n && r[REC * h[c + 1]! + 1]! < r[REC * h[c]! + 1]!) c++;
      if (r[REC * h[c]! + 1]! >= k) break;
      h[i] = h[c]!;
      p32[REC * h[i]! + 2] = i;
      i = c;
    }
    h[i] = slot;
    p32[REC * slot + 2] = i;
  }
}
