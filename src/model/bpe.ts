/**
 * Byte-pair merging in O(n log n), with exactly the result of llama2.c's O(n²) loop: repeatedly
 * merge the adjacent pair whose merged piece has the highest score, the leftmost one on ties,
 * until no adjacent pair forms a vocabulary piece.
 *
 * Symbols live in a doubly linked list indexed by their original position; merging keeps the left
 * node. Because merges never reorder symbols, "leftmost" is "smallest left node index". Candidate
 * pairs sit in a max-heap keyed by (score, -left); an entry is stale once either of its nodes has
 * changed token or been removed, and stale entries are dropped when popped.
 */

/** The merge of two adjacent tokens, if their concatenation is in the vocabulary. */
export type PairLookup = (left: number, right: number) => { id: number; score: number } | undefined;

interface Candidate {
  score: number;
  left: number;
  right: number;
  /** Token ids of left/right when the candidate was made (to detect staleness). */
  leftTok: number;
  rightTok: number;
  merged: number;
}

/** a before b in the heap: higher score first, then the leftmost pair. */
function before(a: Candidate, b: Candidate): boolean {
  return a.score > b.score || (a.score === b.score && a.left < b.left);
}

class CandidateHeap {
  private readonly items: Candidate[] = [];
  get size(): number {
    return this.items.length;
  }
  push(c: Candidate): void {
    const h = this.items;
    h.push(c);
    let i = h.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!before(h[i]!, h[p]!)) break;
      [h[i], h[p]] = [h[p]!, h[i]!];
      i = p;
    }
  }
  pop(): Candidate | undefined {
    const h = this.items;
    const top = h[0];
    const last = h.pop();
    if (h.length > 0 && last) {
      h[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < h.length && before(h[l]!, h[m]!)) m = l;
        if (r < h.length && before(h[r]!, h[m]!)) m = r;
        if (m === i) break;
        [h[i], h[m]] = [h[m]!, h[i]!];
        i = m;
      }
    }
    return top;
  }
}

/** Merges `symbols` (token ids) and returns the merged token ids. */
export function bpeMerge(symbols: readonly number[], lookup: PairLookup): number[] {
  const n = symbols.length;
  const tok = Int32Array.from(symbols);
  const next = Int32Array.from({ length: n }, (_, i) => (i + 1 < n ? i + 1 : -1));
  const prev = Int32Array.from({ length: n }, (_, i) => i - 1);
  const alive = new Uint8Array(n).fill(1);
  const heap = new CandidateHeap();
  const consider = (left: number, right: number): void => {
    if (left < 0 || right < 0) return;
    const m = lookup(tok[left]!, tok[right]!);
    if (m) heap.push({ score: m.score, left, right, leftTok: tok[left]!, rightTok: tok[right]!, merged: m.id });
  };
  for (let i = 0; i + 1 < n; i++) consider(i, i + 1);

  while (heap.size > 0) {
    const c = heap.pop()!;
    const { left, right } = c;
    if (!alive[left] || !alive[right] || next[left] !== right || tok[left] !== c.leftTok || tok[right] !== c.rightTok) continue;
    tok[left] = c.merged;
    alive[right] = 0;
    next[left] = next[right]!;
    if (next[right]! >= 0) prev[next[right]!] = left;
    consider(prev[left]!, left);
    consider(left, next[left]!);
  }

  const out: number[] = [];
  for (let i = 0; i < n && n > 0; i = next[i]!) {
    out.push(tok[i]!);
    if (next[i]! < 0) break;
  }
  return out;
}

/**
 * llama2.c's merge loop, kept as the reference the heap-based {@link bpeMerge} is tested and
 * benchmarked against: scan every pair, merge the best (strictly greater score wins, so the
 * leftmost pair wins ties), repeat. Quadratic; not used on the encode path.
 */
export function bpeMergeNaive(symbols: number[], lookup: PairLookup): number[] {
  const t = [...symbols];
  for (;;) {
    let best = -Infinity;
    let at = -1;
    let id = -1;
    for (let i = 0; i + 1 < t.length; i++) {
      const m = lookup(t[i]!, t[i + 1]!);
      if (m && m.score > best) [best, at, id] = [m.score, i, m.id];
    }
    if (at < 0) return t;
    t.splice(at, 2, id);
  }
}
