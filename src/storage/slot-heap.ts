/**
 * Indexed binary min-heap over slot ids keyed by a Float32 score: O(log n) insert, remove and
 * re-key, O(1) minimum. The DRAM tier uses it to find the least important resident chunk.
 * Memory: 3 x 4 bytes per slot (scores, heap, positions), allocated once.
 */
export class SlotHeap {
  readonly score: Float32Array;
  private readonly heap: Int32Array;
  private readonly pos: Int32Array; // slot -> index in heap, -1 when absent
  private n = 0;

  constructor(capacity: number) {
    this.score = new Float32Array(capacity);
    this.heap = new Int32Array(capacity);
    this.pos = new Int32Array(capacity).fill(-1);
  }

  static bytesPerSlot = 12;

  get size(): number {
    return this.n;
  }
  has(slot: number): boolean {
    return this.pos[slot]! >= 0;
  }
  /** The slot with the smallest score, or -1 when empty. */
  peek(): number {
    return this.n > 0 ? this.heap[0]! : -1;
  }
  insert(slot: number, score: number): void {
    this.score[slot] = score;
    const i = this.n++;
    this.heap[i] = slot;
    this.pos[slot] = i;
    this.up(i);
  }
  update(slot: number, score: number): void {
    const i = this.pos[slot]!;
    const old = this.score[slot]!;
    this.score[slot] = score;
    if (score < old) this.up(i);
    else this.down(i);
  }
  remove(slot: number): void {
    const i = this.pos[slot]!;
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
    const s = this.score;
    const slot = h[i]!;
    const key = s[slot]!;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (s[h[p]!]! <= key) break;
      h[i] = h[p]!;
      this.pos[h[i]!] = i;
      i = p;
    }
    h[i] = slot;
    this.pos[slot] = i;
  }
  private down(i: number): void {
    const h = this.heap;
    const s = this.score;
    const slot = h[i]!;
    const key = s[slot]!;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= this.n) break;
      if (c + 1 < this.n && s[h[c + 1]!]! < s[h[c]!]!) c++;
      if (s[h[c]!]! >= key) break;
      h[i] = h[c]!;
      this.pos[h[i]!] = i;
      i = c;
    }
    h[i] = slot;
    this.pos[slot] = i;
  }
}
