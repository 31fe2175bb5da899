/**
 * Indexed binary min-heap over slot ids keyed by a Float32 score, with lazy increases: the DRAM
 * tier uses it to find the least important resident chunk.
 *
 * Each slot has a true score (`score`) and a heap key (`key`) with key <= score always. Decreases
 * re-key eagerly (O(log n)); increases only write the true score (O(1)) and are applied when the
 * slot reaches the top. {@link peek} re-keys stale tops until the top's key equals its score, so it
 * returns an exact minimum: every other slot has score >= key >= that top's key = its score.
 * Per-step attention-mass refreshes are mostly increases, so they cost O(1) each.
 * Memory: 4 x 4 bytes per slot (scores, keys, heap, positions), allocated once.
 */
export class SlotHeap {
  /** True score per slot (read it; write through {@link update}). */
  readonly score: Float32Array;
  private readonly key: Float32Array;
  private readonly heap: Int32Array;
  private readonly pos: Int32Array; // slot -> index in heap, -1 when absent
  private n = 0;

  constructor(capacity: number) {
    this.score = new Float32Array(capacity);
    this.key = new Float32Array(capacity);
    this.heap = new Int32Array(capacity);
    this.pos = new Int32Array(capacity).fill(-1);
  }

  static bytesPerSlot = 16;

  get size(): number {
    return this.n;
  }
  has(slot: number): boolean {
    return this.pos[slot]! >= 0;
  }
  /** The slot with the smallest score, or -1 when empty. */
  peek(): number {
    while (this.n > 0) {
      const top = this.heap[0]!;
      if (this.key[top] === this.score[top]) return top;
      this.key[top] = this.score[top]!;
      this.down(0);
    }
    return -1;
  }
  insert(slot: number, score: number): void {
    this.score[slot] = score;
    this.key[slot] = score;
    const i = this.n++;
    this.heap[i] = slot;
    this.pos[slot] = i;
    this.up(i);
  }
  /** Sets a slot's score; for a slot not in the heap (taken out by {@link remove}) only the score is kept, for a later {@link insert}. */
  update(slot: number, score: number): void {
    this.score[slot] = score;
    if (this.pos[slot]! < 0) {
      this.key[slot] = score;
      return;
    }
    if (score < this.key[slot]!) {
      this.key[slot] = score;
      this.up(this.pos[slot]!);
    }
  }
  /** Takes a slot out of the heap (its score is kept); nothing for a slot not in it. */
  remove(slot: number): void {
    const i = this.pos[slot]!;
    if (i < 0) return;
    const last = this.heap[--this.n]!;
    this.pos[slot] = -1;
    if (i === this.n) return;
    this.heap[i] = last;
    this.pos[last] = i;
    this.up(i);
    this.down(this.pos[last]!);
  }
  private up(i: number): void {
    const h = this.heap;
    const s = this.key;
    const slot = h[i]!;
    const k = s[slot]!;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (s[h[p]!]! <= k) break;
      h[i] = h[p]!;
      this.pos[h[i]!] = i;
      i = p;
    }
    h[i] = slot;
    this.pos[slot] = i;
  }
  private down(i: number): void {
    const h = this.heap;
    const s = this.key;
    const slot = h[i]!;
    const k = s[slot]!;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= this.n) break;
      if (c + 1 < this.n && s[h[c + 1]!]! < s[h[c]!]!) c++;
      if (s[h[c]!]! >= k) break;
      h[i] = h[c]!;
      this.pos[h[i]!] = i;
      i = c;
    }
    h[i] = slot;
    this.pos[slot] = i;
  }
}
