/** Synthetic data for the index tests: clustered points and structured keys with planted needles. */
import { randn, rng } from './helpers.js';

/** n points in `clusters` Gaussian blobs (centres ~ N(0, spread²), unit noise), row-major n x dim. */
export function blobs(n: number, dim: number, clusters: number, seed: number, spread = 3): Float32Array {
  const centres = randn(clusters * dim, seed);
  const noise = randn(n * dim, seed + 1);
  const r = rng(seed + 2);
  const out = new Float32Array(n * dim);
  for (let i = 0; i < n; i++) {
    const c = Math.floor(r() * clusters);
    for (let d = 0; d < dim; d++) out[i * dim + d] = spread * centres[c * dim + d]! + noise[i * dim + d]!;
  }
  return out;
}

/** Sum of squared distances of points to the nearest of the given centroids. */
export function inertiaOf(points: Float32Array, dim: number, centroids: ArrayLike<number>[] | Float32Array, k: number): number {
  const c = (j: number, d: number) =>
    centroids instanceof Float32Array ? centroids[j * dim + d]! : (centroids as ArrayLike<number>[])[j]![d]!;
  let total = 0;
  for (let i = 0; i < points.length / dim; i++) {
    let best = Infinity;
    for (let j = 0; j < k; j++) {
      let s = 0;
      for (let d = 0; d < dim; d++) {
        const t = points[i * dim + d]! - c(j, d);
        s += t * t;
      }
      if (s < best) best = s;
    }
    total += best;
  }
  return total;
}

/** Keys with structure like real ones, per kv head: topic runs, planted needles, one query set. */
export interface StructuredCase {
  tokens: number;
  kvHeads: number;
  qHeads: number;
  dim: number;
  /** tokens x kvHeads x dim (thd layout). */
  keys: Float32Array;
  /** Decode queries: each qHeads x dim. */
  queries: Float32Array[];
  /** Per kv head, the needle spans [start, end) (strong matches for every query, far back). */
  needles: [number, number][][];
}

/**
 * Keys follow "topics": runs of minRun..maxRun (16-96) consecutive tokens share one of `topics` random directions
 * (plus noise), as neighbouring tokens of real text share content. Queries point at a couple of
 * topics; `needlesPerHead` spans of `needleTokens` tokens (a planted fact) far back get a key aligned with the queries' needle
 * direction, so they are strong matches hidden inside unrelated runs.
 */
export function structuredCase(opts: {
  tokens: number;
  kvHeads: number;
  qHeads: number;
  dim: number;
  topics?: number;
  needlesPerHead?: number;
  needleTokens?: number;
  minRun?: number;
  maxRun?: number;
  queries?: number;
  seed: number;
}): StructuredCase {
  const { tokens, kvHeads, qHeads, dim, seed } = opts;
  const topics = opts.topics ?? 48;
  const nNeedles = opts.needlesPerHead ?? 4;
  const nQueries = opts.queries ?? 4;
  const needleLen = opts.needleTokens ?? 12;
  const minRun = opts.minRun ?? 16;
  const maxRun = opts.maxRun ?? 96;
  const g = qHeads / kvHeads;
  const r = rng(seed);
  const unit = (v: Float32Array) => {
    let s = 0;
    for (const x of v) s += x * x;
    const inv = 1 / Math.sqrt(s);
    for (let i = 0; i < v.length; i++) v[i]! *= inv;
    return v;
  };
  const keys = new Float32Array(tokens * kvHeads * dim);
  const noise = randn(tokens * kvHeads * dim, seed + 1);
  const needles: [number, number][][] = [];
  const queries = Array.from({ length: nQueries }, () => new Float32Array(qHeads * dim));
  const topicNorm = 1.6 * Math.sqrt(dim);
  for (let h = 0; h < kvHeads; h++) {
    const dirs = Array.from({ length: topics }, (_, t) => unit(randn(dim, seed * 1000 + h * 100 + t + 7)));
    const needleDir = unit(randn(dim, seed * 1000 + h * 100 + 99));
    let t = 0;
    while (t < tokens) {
      const len = minRun + Math.floor(r() * (maxRun - minRun + 1));
      const topic = Math.floor(r() * topics);
      const amp = topicNorm * (0.6 + 0.8 * r());
      for (let u = t; u < Math.min(tokens, t + len); u++)
        for (let d = 0; d < dim; d++)
          keys[(u * kvHeads + h) * dim + d] = amp * dirs[topic]![d]! + 0.5 * noise[(u * kvHeads + h) * dim + d]!;
      t += len;
    }
    const hn: [number, number][] = [];
    for (let i = 0; i < nNeedles; i++) {
      // Far back: inside the first 80% of the context, away from sinks.
      const pos = 16 + Math.floor(r() * (tokens * 0.8 - 16));
      hn.push([pos, pos + needleLen]);
      for (let u = pos; u < pos + needleLen; u++) {
        for (let d = 0; d < dim; d++)
          keys[(u * kvHeads + h) * dim + d] = 2.2 * topicNorm * needleDir[d]! + 0.5 * noise[(u * kvHeads + h) * dim + d]!;
      }
    }
    needles.push(hn.sort((a, b) => a[0] - b[0]));
    for (const q of queries) {
      const ta = Math.floor(r() * topics);
      const tb = Math.floor(r() * topics);
      for (let j = 0; j < g; j++) {
        const qn = randn(dim, Math.floor(r() * 1e9));
        for (let d = 0; d < dim; d++)
          q[(h * g + j) * dim + d] =
            2.2 * (0.9 * dirs[ta]![d]! + 0.6 * dirs[tb]![d]! + 0.8 * needleDir[d]!) + 0.35 * qn[d]!;
      }
    }
  }
  return { tokens, kvHeads, qHeads, dim, keys, queries, needles };
}

/**
 * Dense attention probabilities per kv head, averaged over its GQA group (softmax of q·k/sqrt(dim)
 * over all `tokens`): probs[h][t].
 */
export function denseGroupProbs(c: StructuredCase, q: Float32Array): Float64Array[] {
  const { tokens, kvHeads, qHeads, dim, keys } = c;
  const g = qHeads / kvHeads;
  const scale = 1 / Math.sqrt(dim);
  const out: Float64Array[] = [];
  for (let h = 0; h < kvHeads; h++) {
    const acc = new Float64Array(tokens);
    for (let j = 0; j < g; j++) {
      const qo = (h * g + j) * dim;
      const logits = new Float64Array(tokens);
      let max = -Infinity;
      for (let t = 0; t < tokens; t++) {
        let s = 0;
        const ko = (t * kvHeads + h) * dim;
        for (let d = 0; d < dim; d++) s += q[qo + d]! * keys[ko + d]!;
        logits[t] = s * scale;
        if (logits[t]! > max) max = logits[t]!;
      }
      let z = 0;
      for (let t = 0; t < tokens; t++) z += logits[t] = Math.exp(logits[t]! - max);
      for (let t = 0; t < tokens; t++) acc[t]! += logits[t]! / z / g;
    }
    out.push(acc);
  }
  return out;
}

/** Attention mass of the oracle: the `budget` most probable tokens inside [lo, hi). */
export function oracleMass(p: Float64Array, lo: number, hi: number, budget: number): number {
  const v = Array.from(p.subarray(lo, hi)).sort((a, b) => b - a);
  let s = 0;
  for (let i = 0; i < Math.min(budget, v.length); i++) s += v[i]!;
  return s;
}

/** Attention mass of the best chunk set: the chunks of [lo, hi) with the most mass, up to `budget` tokens. */
export function chunkOracleMass(p: Float64Array, lo: number, hi: number, chunk: number, budget: number): number {
  const masses: number[] = [];
  for (let j = Math.floor(lo / chunk); j * chunk < hi; j++) {
    let s = 0;
    for (let t = Math.max(j * chunk, lo); t < Math.min((j + 1) * chunk, hi); t++) s += p[t]!;
    masses.push(s);
  }
  masses.sort((a, b) => b - a);
  let s = 0;
  for (let i = 0; i < Math.min(masses.length, Math.floor(budget / chunk)); i++) s += masses[i]!;
  return s;
}
