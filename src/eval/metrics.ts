/**
 * Selection-quality metrics against dense attention (DESIGN.md §3): recall of dense attention mass,
 * the oracle's recall at the same budget, and output error. Pure functions over typed arrays; the
 * dense probabilities come from the native `attentionWeights` kernel.
 */
import type { Selection } from '../index/selection.js';

/**
 * Buffers the metrics reuse from call to call (an eval scores every row of every decode step: at
 * 128K a mask is 1 MiB per kv-head set and the oracle's per-head copies 0.5 MiB each, garbage that
 * the next timed row's GC would otherwise collect). A mask a metric returns through a scratch is a
 * view of it, valid until the next call that uses the same scratch for that mask.
 */
export class MetricsScratch {
  private readonly u8 = new Map<string, Uint8Array>();
  private readonly f32 = new Map<string, Float32Array>();

  /** `n` zeroed bytes of buffer `name` (grown as needed). */
  bytes(name: string, n: number): Uint8Array {
    let b = this.u8.get(name);
    if (!b || b.length < n) this.u8.set(name, (b = new Uint8Array(Math.max(n, 2 * (b?.length ?? 0)))));
    return b.subarray(0, n).fill(0);
  }

  /** `n` floats of buffer `name` (grown as needed; contents not cleared). */
  floats(name: string, n: number): Float32Array {
    let b = this.f32.get(name);
    if (!b || b.length < n) this.f32.set(name, (b = new Float32Array(Math.max(n, 2 * (b?.length ?? 0)))));
    return b.subarray(0, n);
  }
}

/**
 * Marks, per kv head, which tokens a selection attends: 1 for sinks, chosen chunks (clipped to
 * [sinkEnd, tailStart)) and the tail. Returns kvHeads × tokens bytes (in `scratch` when given).
 */
export function attendedMask(sel: Selection, kvHeads: number, scratch?: MetricsScratch): Uint8Array {
  const T = sel.tokens;
  const mask = scratch ? scratch.bytes('attended', kvHeads * T) : new Uint8Array(kvHeads * T);
  for (let h = 0; h < kvHeads; h++) {
    const row = mask.subarray(h * T, (h + 1) * T);
    row.fill(1, 0, Math.min(sel.sinkEnd, T));
    row.fill(1, Math.min(sel.tailStart, T), T);
    for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) {
      const c = sel.chunkIds[i]!;
      const a = Math.max(c * sel.chunkSize, sel.sinkEnd);
      const b = Math.min((c + 1) * sel.chunkSize, sel.tailStart);
      if (b > a) row.fill(1, a, b);
    }
  }
  return mask;
}

/** Number of tokens attended per kv head (sinks + chosen + tail), for bytes-touched accounting. */
export function attendedTokens(mask: Uint8Array, kvHeads: number, tokens: number): number[] {
  const out: number[] = [];
  for (let h = 0; h < kvHeads; h++) {
    let n = 0;
    for (let t = h * tokens; t < (h + 1) * tokens; t++) n += mask[t]!;
    out.push(n);
  }
  return out;
}

/**
 * Mean over query heads of the dense attention mass that falls on attended tokens.
 * weights: qHeads × tokens softmax probabilities; mask: kvHeads × tokens.
 */
export function massRecall(weights: Float32Array, mask: Uint8Array, qHeads: number, kvHeads: number, tokens: number): number {
  const g = qHeads / kvHeads;
  let total = 0;
  for (let h = 0; h < qHeads; h++) {
    const w = weights.subarray(h * tokens, (h + 1) * tokens);
    const m = mask.subarray(Math.floor(h / g) * tokens, (Math.floor(h / g) + 1) * tokens);
    let s = 0;
    for (let t = 0; t < tokens; t++) if (m[t]) s += w[t]!;
    total += s;
  }
  return total / qHeads;
}

/**
 * The oracle at budget K: per kv head, sinks + tail + the K tokens of [sinkEnd, tailStart) with the
 * largest dense mass summed over the GQA group — the best any selection of K tokens can do.
 * Returns the oracle's attended mask (kvHeads × tokens; in `scratch` when given, which also holds
 * the per-head scores and their copy).
 */
export function oracleMask(
  weights: Float32Array,
  qHeads: number,
  kvHeads: number,
  tokens: number,
  sinkEnd: number,
  tailStart: number,
  budget: number,
  scratch?: MetricsScratch,
): Uint8Array {
  const g = qHeads / kvHeads;
  const mask = scratch ? scratch.bytes('oracle', kvHeads * tokens) : new Uint8Array(kvHeads * tokens);
  const span = Math.max(0, tailStart - sinkEnd);
  const score = scratch ? scratch.floats('score', span) : new Float32Array(span);
  for (let kh = 0; kh < kvHeads; kh++) {
    score.fill(0);
    for (let j = 0; j < g; j++) {
      const w = weights.subarray((kh * g + j) * tokens, (kh * g + j + 1) * tokens);
      for (let t = 0; t < span; t++) score[t]! += w[sinkEnd + t]!;
    }
    const row = mask.subarray(kh * tokens, (kh + 1) * tokens);
    row.fill(1, 0, Math.min(sinkEnd, tokens));
    row.fill(1, Math.min(tailStart, tokens), tokens);
    if (budget >= span) {
      row.fill(1, sinkEnd, tailStart);
      continue;
    }
    const threshold = kthLargest(score, budget, scratch?.floats('copy', span));
    // Take everything above the threshold, then ties up to exactly `budget` tokens.
    let taken = 0;
    for (let t = 0; t < span; t++) if (score[t]! > threshold) { row[sinkEnd + t] = 1; taken++; }
    for (let t = 0; t < span && taken < budget; t++) if (score[t] === threshold) { row[sinkEnd + t] = 1; taken++; }
  }
  return mask;
}

/**
 * The oracle's mass recall ({@link oracleMask}, then {@link massRecall}) for one decode step's dense
 * probabilities, computed once per (budget, sinkEnd, tailStart): every row of a step scored against
 * the same oracle (all of them share sinks and tail) costs one oracle, not one per row.
 */
export class StepOracle {
  private readonly memo = new Map<string, number>();

  constructor(
    private readonly weights: Float32Array,
    private readonly qHeads: number,
    private readonly kvHeads: number,
    private readonly tokens: number,
    private readonly scratch?: MetricsScratch,
  ) {}

  recall(budget: number, sinkEnd: number, tailStart: number): number {
    const key = `${budget}/${sinkEnd}/${tailStart}`;
    let r = this.memo.get(key);
    if (r === undefined) {
      const { weights, qHeads, kvHeads, tokens } = this;
      r = massRecall(weights, oracleMask(weights, qHeads, kvHeads, tokens, sinkEnd, tailStart, budget, this.scratch), qHeads, kvHeads, tokens);
      this.memo.set(key, r);
    }
    return r;
  }
}

/** The k-th largest value (1-based) of xs, by quickselect on a copy (into `copy` when given: xs.length floats). */
export function kthLargest(xs: Float32Array, k: number, copy?: Float32Array): number {
  const a = copy ? copy.subarray(0, xs.length) : new Float32Array(xs.length);
  a.set(xs);
  let lo = 0;
  let hi = a.length - 1;
  const target = k - 1; // index in descending order
  while (lo < hi) {
    const pivot = a[(lo + hi) >>> 1]!;
    let i = lo;
    let j = hi;
    while (i <= j) {
      while (a[i]! > pivot) i++;
      while (a[j]! < pivot) j--;
      if (i <= j) {
        const tmp = a[i]!;
        a[i] = a[j]!;
        a[j] = tmp;
        i++;
        j--;
      }
    }
    if (target <= j) hi = j;
    else if (target >= i) lo = i;
    else return a[target]!;
  }
  return a[target]!;
}

/** ||a − b|| / ||b|| over the whole vectors (b is the dense reference). */
export function relativeError(a: Float32Array, b: Float32Array): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < b.length; i++) {
    const d = a[i]! - b[i]!;
    num += d * d;
    den += b[i]! * b[i]!;
  }
  return den === 0 ? Math.sqrt(num) : Math.sqrt(num / den);
}
