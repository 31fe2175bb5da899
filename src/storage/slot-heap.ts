/**
 * Indexed 4-ary min-heap over slot ids keyed by a Float32 score, with lazy increases: the DRAM
 * tier uses it to find the least important resident chunk.
 *
 * Each slot has a true score ({@link scoreOf}) and a heap key with key <= score always. Decreases
 * re-key eagerly (O(log n)); increases only write the true score (O(1)) and are applied when the
 * slot reaches the top. {@link peek} re-keys stale tops until the top's key equals its score, so it
 * returns an exact minimum: every other slot has score >= key >= that top's key = its score.
 * Per-step attention-mass refreshes are mostly increases, so they cost O(1) each.
 *
 * Memory: 20 bytes per slot, allocated once: the heap (a slot and its key per position, 8 bytes)
 * and one 12-byte record per slot, [score f32, key f32, heap position i32 (-1 when absent)] at words
 * 3 x slot .. +2 of one buffer (two views). A refresh touches a slot's score, key and position
 * together; as one record they are one cache line instead of three (the DRAM tier refreshes ~3,000
 * slots at random per layer-step in a heap of ~10^5 slots).
 *
 * Why 4-ary, with the keys beside the slots: each eviction sifts a slot from the root down through
 * a heap that the step's attention has just evicted from cache. Binary with the keys only in the
 * records, every level cost two dependent misses to compare the children (heap entry, then its
 * record) plus the moved slot's position write, over ~17 levels at 10^5 slots; 4-ary with keys by
 * position, a level's four children are one or two lines and there are half as many levels.
 */
import { constants as bufferConstants } from 'node:buffer';
import { fail } from '../errors.js';
import { native } from '../native.js';

/** Words per slot record: score, key, position. */
const REC = 3;

export class SlotHeap {
  /** Bytes of heap state per slot (a heap position with its key, and a record). */
  static readonly bytesPerSlot = 20;
  /** Most slots a heap can hold: its records are one typed array of 12 bytes per slot. */
  static readonly maxSlots = Math.floor(bufferConstants.MAX_LENGTH / (4 * REC));

  /** Records as f32 (score at 3 x slot, key at 3 x slot + 1). */
  private readonly recF: Float32Array;
  /** The same records as i32 (heap position at 3 x slot + 2). */
  private readonly recI: Int32Array;
  /**
   * Slot at each heap position; keys[i] is the key of heap[i]. The record keeps the same key on
   * purpose: a refresh (dramHeapRefresh) decides increase or decrease within the record's one line,
   * where reading keys[position] would add a miss per refreshed slot; the sifts compare keys here.
   */
  private readonly heap: Int32Array;
  private readonly keys: Float32Array;
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
    this.keys = new Float32Array(capacity);
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
      if (this.keys[0] === r[REC * top]) return top;
      r[REC * top + 1] = r[REC * top]!;
      this.keys[0] = r[REC * top]!;
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
    this.keys[i] = score;
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
      this.keys[i] = score;
      this.up(i);
    }
  }
  /**
   * Many updates at once: slots[k] gets f32(offset + scores[entries[k]]), in order (the same end state as
   * {@link update} one by one). A native pass (native/cache/dram_tier.cc, dramHeapRefresh) checks
   * every argument (E_RANGE / E_NONFINITE before anything changes), applies the updates that need
   * no sift with its loads prefetched, and returns the decreases, which sift here. For the DRAM
   * tier's per-step refresh of ~3,000 slots at random: one by one, each is a cache miss.
   */
  refresh(slots: Int32Array, entries: Int32Array, scores: Float32Array, offset = 0): void {
    const n = slots.length;
    if (this.decSlots.length < n) {
      this.decSlots = new Int32Array(n);
      this.decScores = new Float32Array(n);
    }
    const dec = native.dramHeapRefresh({ records: this.recF, heap: this.heap, keys: this.keys, slots, entries, scores, offset, out: { slots: this.decSlots, scores: this.decScores } }) as number;
    for (let j = 0; j < dec; j++) this.update(this.decSlots[j]!, this.decScores[j]!);
  }
  /**
   * Subtracts `delta` from every score and key (in the heap or not): the order of any two is kept
   * (f32 rounding is monotonic), so the heap stays valid and key <= score still holds. O(capacity),
   * for the DRAM tier's rare rebase of its GreedyDual priorities.
   */
  shift(delta: number): void {
    const r = this.recF;
    for (let b = 0; b < r.length; b += REC) {
      r[b] = r[b]! - delta;
      r[b + 1] = r[b + 1]! - delta;
    }
    for (let i = 0; i < this.n; i++) this.keys[i] = this.keys[i]! - delta;
  }
  /** Takes a slot out of the heap (its score is kept); nothing for a slot not in it. */
  remove(slot: number): void {
    const i = this.recI[REC * slot + 2]!;
    if (i < 0) return;
    const n = --this.n;
    const last = this.heap[n]!;
    this.recI[REC * slot + 2] = -1;
    if (i === n) return;
    this.heap[i] = last;
    this.keys[i] = this.keys[n]!;
    this.recI[REC * last + 2] = i;
    this.up(i);
    this.down(this.recI[REC * last + 2]!);
  }
  /** Moves heap[i] towards the root while its parent's key is larger. */
  private up(i: number): void {
    const h = this.heap;
    const hk = this.keys;
    const p32 = this.recI;
    const slot = h[i]!;
    const k = hk[i]!;
    while (i > 0) {
      const p = (i - 1) >> 2;
      if (hk[p]! <= k) break;
      h[i] = h[p]!;
      hk[i] = hk[p]!;
      p32[REC * h[i]! + 2] = i;
      i = p;
    }
    h[i] = slot;
    hk[i] = k;
    p32[REC * slot + 2] = i;
  }
  /** Moves heap[i] towards the leaves while a child's key is smaller (the first smallest child). */
  private down(i: number): void {
    const h = this.heap;
    const hk = this.keys;
    const p32 = this.recI;
    const n = this.n;
    const slot = h[i]!;
    const k = hk[i]!;
    for (;;) {
      const first = 4 * i + 1;
      if (first >= n) break;
      const end = Math.min(first + 4, n);
      let c = first;
      let ck = hk[first]!;
      for (let j = first + 1; j < end; j++)
        if (hk[j]! < ck) {
          c = j;
          ck = hk[j]!;
        }
      if (ck >= k) break;
      h[i] = h[c]!;
      hk[i] = ck;
      p32[REC * h[i]! + 2] = i;
      i = c;
    }
    h[i] = slot;
    hk[i] = k;
    p32[REC * slot + 2] = i;
  }
}
