/**
 * Synthetic traces with the structure of real long-context KV caches, deterministic from a seed.
 *
 * Keys are built pre-RoPE as a sum of parts, then rotated at their positions:
 *   k_t = noise (σ = keyNoise per element)
 *       + w_t × topic centre of t's segment (low-frequency "semantic" pairs; segments of ~topicSpan
 *                                            tokens, topics recur, so close tokens cluster; w_t a
 *                                            log-normal per-token salience giving heavy tails)
 *       + positional bias b                (high-frequency pairs: makes local heads possible)
 *       + outlier channels                 (a few fixed channels with a large constant, as in real K)
 *   sinks (the first sinkTokens): the topic part is replaced by a large vector on the lowest-
 *   frequency pairs, which barely rotate over the whole context, so every query aligns with them;
 *   needles: the topic part is replaced by a strong needle direction (see below).
 * Queries (positions T+s, also rotated) mix, per head role:
 *   every head: the sink direction (logit ≈ sinkLogit on sinks);
 *   'local': the positional bias (logit ≈ localLogit for the last few dozen tokens, decaying with
 *            distance as RoPE dephases the high-frequency pairs);
 *   'retrieval': one topic's centre (logit ≈ topicLogit·w_t on that topic's tokens, fading with
 *            distance as RoPE turns the mid-frequency pairs), plus at a needle's steps the
 *            needle's direction (logit ≈ needleLogit);
 *   'mixed': half of both, focused on the current (last) topic;
 *   all: an AR(1) query-noise process renewed by the fraction queryDrift per step, so consecutive
 *   steps' top-K sets overlap 70–90% (Finding 1 / Fig. 7 of the KVDrive paper). Measured with the
 *   defaults, dense softmax: T=2048 (D 64) top-64 overlap ≈0.82–0.87, top-1.56% mass ≈0.72–0.79;
 *   T=128K (32/8 heads, D 128) top-2048 overlap ≈0.72–0.75, top-2048 mass ≈0.78.
 * The logit defaults grow with ln T so the structure keeps its share of attention at any length.
 * A needle's key is written in the rotated frame of its steps' queries (its pre-RoPE content is the
 * needle direction turned back by the relative position), so the match survives any distance, as
 * a learned retrieval would; pair norms are unchanged by this.
 *
 * Pair layout: with RoPE 'half' (Llama/HF rotate-half) pair p is dims (p, p+D/2); with
 * 'interleaved' (Meta original) dims (2p, 2p+1); frequency θ_p = ropeBase^(-2p/D). 'none' skips
 * the rotation (for ablations and tests).
 *
 * Values are noise, fixed per token. Layers are generated on demand from (seed, layer), one at a
 * time; nothing but small per-layer plans is kept.
 */
import { z } from 'zod';
import { KvdriveError, describe, fail } from '../errors.js';
import type { Dtype } from '../types.js';
import { f32BitsToBf16Bits, f32BitsToF16Bits, fromF32 } from '../util/f16.js';
import { kvArray } from '../util/kv-array.js';
import { memoryTrace, writeTrace, type TraceExtraTensor, type TraceLayerData, type TraceMeta, type TraceReader } from './trace.js';

const int = (min: number, max: number) => z.number().int().min(min).max(max);
const real = (min: number, max: number) => z.number().min(min).max(max);

/** Options of {@link generateSyntheticTrace}; every field is optional (defaults: a small test shape). */
export const SyntheticTraceOptionsSchema = z
  .strictObject({
    /** PRNG seed; equal seeds (and options) give bit-identical traces. Default 1. */
    seed: int(0, 2 ** 32 - 1).default(1),
    /** Layers L. Default 2. */
    layers: int(1, 1024).default(2),
    /** Query heads Hq (a multiple of kvHeads). Default 8. */
    qHeads: int(1, 1024).default(8),
    /** KV heads Hkv. Default 2. */
    kvHeads: int(1, 1024).default(2),
    /** Head dimension D (even, ≥ 8). Default 64. */
    headDim: int(8, 1024).default(64),
    /** Prompt tokens T. Default 2048. */
    promptTokens: int(16, 1 << 24).default(2048),
    /** Decode steps S (queries and new tokens). Default 8. */
    decodeSteps: int(1, 1 << 16).default(8),
    /** Storage dtype of K/V/q. Default 'f16'. */
    dtype: z.enum(['f32', 'f16', 'bf16']).default('f16'),
    /** RoPE base (Llama-3: 500000). Default 500000. */
    ropeBase: real(2, 1e12).default(500000),
    /** RoPE pairing: 'half' (rotate-half, HF Llama), 'interleaved', or 'none'. Default 'half'. */
    ropeStyle: z.enum(['half', 'interleaved', 'none']).default('half'),
    /** Attention-sink tokens at the start of the prompt. Default 4. */
    sinkTokens: int(0, 1024).default(4),
    /**
     * Scaled logit (q·k/√D) every query gives a sink token. Default ln(promptTokens), so sinks keep
     * a share of the attention comparable to the whole rest of the context at any length.
     */
    sinkLogit: real(0, 50).optional(),
    /** Mean length in tokens of a topic segment (lengths drawn in [span/2, 3·span/2]). Default 256. */
    topicSpan: int(4, 1 << 24).default(256),
    /**
     * Distinct topics per (layer, kv head); segments draw topics from these, so topics recur.
     * Default max(8, round(promptTokens / (4·topicSpan))): each topic recurs about four times.
     */
    topics: int(1, 1 << 20).optional(),
    /**
     * Spread of the per-token salience: the topic part of a key is scaled by a log-normal weight
     * with this σ (mean 1), so a few tokens of a topic stand out (keywords) and attention has a
     * heavy tail inside the topic. Default 0.3.
     */
    salience: real(0, 3).default(0.3),
    /**
     * Scaled logit a retrieval head gives tokens of its topic (of salience 1). Default
     * 0.7·ln(promptTokens), so the topic's tokens outweigh the rest of a long context.
     */
    topicLogit: real(0, 50).optional(),
    /** Peak scaled logit a local head gives the most recent tokens. Default ln(promptTokens) + 2. */
    localLogit: real(0, 50).optional(),
    /** Fraction of query heads per layer that are local heads. Default 0.25. */
    localHeads: real(0, 1).default(0.25),
    /** Fraction of query heads per layer that are retrieval heads (at least one when needles > 0). Default 0.25. */
    retrievalHeads: real(0, 1).default(0.25),
    /** Outlier channels per kv head (fixed channels with a large constant in every key). Default 2. */
    outlierChannels: int(0, 64).default(2),
    /** Magnitude of the outlier channels, in units of keyNoise. Default 8. */
    outlierScale: real(0, 1000).default(8),
    /** Per-element standard deviation of the key noise. Default 1. */
    keyNoise: real(0, 100).default(1),
    /**
     * Strength of the query noise process, as the standard deviation (over tokens) of the scaled
     * logits it adds. Default 0.7.
     */
    queryNoise: real(0, 100).default(0.7),
    /** Fraction of the query noise renewed per decode step (0: frozen, 1: independent steps). Default 0.25. */
    queryDrift: real(0, 1).default(0.25),
    /** Needles planted per layer. Default 2. */
    needlesPerLayer: int(0, 1024).default(2),
    /**
     * Scaled logit the needle's retrieval head gives the needle at its steps. Default
     * 2·topicLogit + 5, above the most salient topic tokens.
     */
    needleLogit: real(0, 100).optional(),
    /** Decode steps each needle stays attended (clamped to decodeSteps). Default 2. */
    needleSteps: int(1, 1 << 16).default(2),
    /** Needles are placed in the first needleDepth fraction of the prompt (after the sinks). Default 0.5. */
    needleDepth: real(0.01, 1).default(0.5),
  })
  .refine((o) => o.qHeads % o.kvHeads === 0, { message: 'qHeads must be a multiple of kvHeads', path: ['qHeads'] })
  .refine((o) => o.headDim % 2 === 0, { message: 'headDim must be even (RoPE pairs)', path: ['headDim'] })
  .refine((o) => o.sinkTokens < o.promptTokens, { message: 'sinkTokens must be below promptTokens', path: ['sinkTokens'] })
  .refine((o) => o.localHeads + o.retrievalHeads <= 1, { message: 'localHeads + retrievalHeads must be at most 1', path: ['localHeads'] })
  .refine(
    (o) => o.needlesPerLayer <= Math.floor(((o.promptTokens - o.sinkTokens) * o.needleDepth) / 2),
    { message: 'needlesPerLayer must be at most half the tokens of the needle region', path: ['needlesPerLayer'] },
  );

/** Input options (all optional). */
export type SyntheticTraceOptions = z.input<typeof SyntheticTraceOptionsSchema>;
/** Options with defaults applied (including the length-dependent ones). */
export type ResolvedSyntheticOptions = Omit<z.output<typeof SyntheticTraceOptionsSchema>, 'sinkLogit' | 'localLogit' | 'needleLogit' | 'topicLogit' | 'topics'> & {
  sinkLogit: number;
  topicLogit: number;
  localLogit: number;
  needleLogit: number;
  topics: number;
};

/** Role of a query head. */
export type HeadRole = 'local' | 'retrieval' | 'mixed';

/**
 * A planted needle: prompt `token` of (`layer`, `kvHead`) that query head `qHead` (a retrieval head
 * of that kv head's group) attends strongly at decode steps firstStep..lastStep (inclusive).
 * Stored in trace files as I32 rows [layer, kvHead, token, firstStep, lastStep] of `synthetic.needles`.
 */
export interface SyntheticNeedle {
  layer: number;
  kvHead: number;
  qHead: number;
  token: number;
  firstStep: number;
  lastStep: number;
}

/** Name of the needles tensor in trace files. */
export const NEEDLES_TENSOR = 'synthetic.needles';

/** A generated trace: a {@link TraceReader} whose layers are generated on each `layer(l)` call. */
export interface SyntheticTrace extends TraceReader {
  /** Options with defaults applied. */
  readonly options: ResolvedSyntheticOptions;
  /** All planted needles, layer by layer. */
  readonly needles: readonly SyntheticNeedle[];
  /** Role of each query head, [layer][qHead]. */
  readonly headRoles: readonly (readonly HeadRole[])[];
  /** Topic id of every token position 0..T+S-1 (shared by all layers and heads). */
  readonly topicOf: Int32Array;
  /** Generates layer l's data in storage form (what writeTrace takes). */
  layerData(l: number): TraceLayerData;
  /**
   * Queries of layer l's last `window` prompt positions (T-window .. T-1), f32, window x qHeads x
   * headDim after RoPE: what a host's prefill computes and hands the runtime as its observation
   * window (`Runtime.prefill`'s obsQ). Same heads and focus as the decode queries, their noise on a
   * stream of its own (the trace's other tensors do not change); no needle is active in it.
   * E_RANGE for a layer outside [0, layers) or a window outside [1, promptTokens].
   */
  observationQueries(l: number, window: number): Float32Array;
  /** Writes the trace (and the needles tensor) to a file, one layer in memory at a time. */
  write(path: string): Promise<void>;
}

// ---------------------------------------------------------------------------------------------
// Randomness

/** splitmix32-style hash of a list of 32-bit ints (stream seeds from seed, layer, purpose). */
function hashSeed(...xs: number[]): number {
  let h = 0x9e3779b9;
  for (const x of xs) {
    h = (h + (x >>> 0) + 0x9e3779b9) | 0;
    h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
    h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
    h ^= h >>> 16;
  }
  return h >>> 0 || 1; // xorshift needs a non-zero state
}

/** Small PRNG for plans (mulberry32) with uniform, normal and int draws. */
class PlanRng {
  private a: number;
  constructor(seed: number) {
    this.a = seed >>> 0;
  }
  uniform(): number {
    this.a = (this.a + 0x6d2b79f5) >>> 0;
    let t = this.a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  normal(): number {
    const u = Math.max(this.uniform(), 1e-12);
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * this.uniform());
  }
  /** Integer in [lo, hi). */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.uniform() * (hi - lo));
  }
}

/** Inverse standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9). */
function normalQuantile(p: number): number {
  const a = [-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.357751867269, -30.66479806614716, 2.506628277459239];
  const b = [-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972, -13.28068155288572];
  const c = [-0.007784894002430293, -0.3223964580411365, -2.400758277161838, -2.549732539343734, 4.374664141464968, 2.938163982698783];
  const d = [0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416];
  const lo = 0.02425;
  if (p < lo) {
    const q = Math.sqrt(-2 * Math.log(p));
    return (((((c[0]! * q + c[1]!) * q + c[2]!) * q + c[3]!) * q + c[4]!) * q + c[5]!) / ((((d[0]! * q + d[1]!) * q + d[2]!) * q + d[3]!) * q + 1);
  }
  if (p > 1 - lo) return -normalQuantile(1 - p);
  const q = p - 0.5;
  const r = q * q;
  return ((((((a[0]! * r + a[1]!) * r + a[2]!) * r + a[3]!) * r + a[4]!) * r + a[5]!) * q) / (((((b[0]! * r + b[1]!) * r + b[2]!) * r + b[3]!) * r + b[4]!) * r + 1);
}

/**
 * 65536 standard-normal quantiles at (i + 0.5) / 65536 in a fixed random order: indexing it with
 * 16 uniform random bits draws an (almost exactly) normal sample for the cost of a lookup.
 */
let normalTable: Float32Array | undefined;
function normals(): Float32Array {
  if (normalTable) return normalTable;
  const t = new Float32Array(65536);
  for (let i = 0; i < 65536; i++) t[i] = normalQuantile((i + 0.5) / 65536);
  // Shuffle so that adjacent indices are unrelated (the generator's bits are not perfectly mixed).
  const r = new PlanRng(0x5eed);
  for (let i = 65535; i > 0; i--) {
    const j = r.int(0, i + 1);
    const x = t[i]!;
    t[i] = t[j]!;
    t[j] = x;
  }
  return (normalTable = t);
}

// ---------------------------------------------------------------------------------------------
// Geometry

// Key-side magnitudes of each part (in keyNoise units); the queries' coefficients are derived from
// the target logits so that q·k/√D on the part equals the logit.
// Large against the noise (real K caches are strongly low-rank), so the per-token logit noise each
// query part brings (its logit / its norm, in keyNoise units) stays below one.
const SINK_NORM = 32;
const POS_NORM = 12;
const TOPIC_NORM = 10;
const NEEDLE_NORM = 16;
/** Distance in tokens over which the local heads' positional kernel decays to ~0. */
const LOCAL_REACH = 256;
/** Fastest RoPE frequency (rad/token) used by the positional bias. */
const LOCAL_FASTEST = 0.25;

/** Pair bands of the head dimension (pair p has frequency θ_p = base^(-2p/D), p = 0 fastest). */
interface Bands {
  pairs: number; // P = D/2
  /** dims of pair p: first[p], second[p] */
  first: Int32Array;
  second: Int32Array;
  theta: Float64Array;
  posBand: [number, number]; // high-frequency pairs: positional bias (local heads)
  semBand: [number, number]; // low-frequency pairs: topics, needles, outliers
  sinkBand: [number, number]; // lowest-frequency pairs: sink direction
}

function makeBands(o: ResolvedSyntheticOptions): Bands {
  const D = o.headDim;
  const P = D / 2;
  const first = new Int32Array(P);
  const second = new Int32Array(P);
  const theta = new Float64Array(P);
  for (let p = 0; p < P; p++) {
    if (o.ropeStyle === 'interleaved') {
      first[p] = 2 * p;
      second[p] = 2 * p + 1;
    } else {
      first[p] = p;
      second[p] = p + P;
    }
    theta[p] = o.ropeStyle === 'none' ? 0 : Math.pow(o.ropeBase, (-2 * p) / D);
  }
  const sinkPairs = Math.max(1, Math.floor(P / 16));
  // Positional band: the pairs turning between 1/LOCAL_REACH and LOCAL_FASTEST rad per token. Their
  // sum of cosines (the local heads' kernel) is ~1 for the last few tokens and decays roughly like
  // the fraction of pairs with θ·distance < 1, to ~0 around LOCAL_REACH tokens. The fastest pairs
  // are left out: they would add a far-field ripple that changes completely every decode step.
  let posStart = 0;
  while (posStart < P / 2 - 1 && Math.pow(o.ropeBase, (-2 * posStart) / D) > LOCAL_FASTEST) posStart++;
  let posEnd = posStart;
  while (posEnd < P / 2 && Math.pow(o.ropeBase, (-2 * posEnd) / D) >= 1 / LOCAL_REACH) posEnd++;
  posEnd = Math.max(posStart + 1, posEnd);
  const semStart = Math.max(posEnd, Math.floor(P / 2));
  return { pairs: P, first, second, theta, posBand: [posStart, posEnd], semBand: [semStart, P - sinkPairs], sinkBand: [P - sinkPairs, P] };
}

/** Random unit vector (length D) supported on the given pair band. */
function unitOnBand(r: PlanRng, D: number, bands: Bands, band: [number, number]): Float64Array {
  const v = new Float64Array(D);
  let n2 = 0;
  for (let p = band[0]; p < band[1]; p++) {
    for (const i of [bands.first[p]!, bands.second[p]!]) {
      const x = r.normal();
      v[i] = x;
      n2 += x * x;
    }
  }
  const s = 1 / Math.sqrt(n2 || 1);
  for (let i = 0; i < D; i++) v[i]! *= s;
  return v;
}

/**
 * Random unit vector on `band` orthogonal to `others` (Gram–Schmidt; when the band has no room left
 * it falls back to the plain random direction).
 */
function orthogonalUnit(r: PlanRng, D: number, bands: Bands, band: [number, number], others: Float64Array[]): Float64Array {
  const v = unitOnBand(r, D, bands, band);
  if (others.length >= 2 * (band[1] - band[0])) return v;
  const w = Float64Array.from(v);
  for (let pass = 0; pass < 2; pass++) {
    for (const o of others) {
      let d = 0;
      let n2 = 0;
      for (let i = 0; i < D; i++) {
        d += w[i]! * o[i]!;
        n2 += o[i]! * o[i]!;
      }
      if (n2 > 0) for (let i = 0; i < D; i++) w[i]! -= (d / n2) * o[i]!;
    }
  }
  let n = 0;
  for (let i = 0; i < D; i++) n += w[i]! * w[i]!;
  if (n < 1e-12) return v;
  const s = 1 / Math.sqrt(n);
  for (let i = 0; i < D; i++) w[i]! *= s;
  return w;
}

/** Rotates vector `v` (pre-RoPE, length D) to position `pos` in place (pos may be negative). */
function rotate(v: Float64Array, pos: number, bands: Bands): void {
  for (let p = 0; p < bands.pairs; p++) {
    const a = pos * bands.theta[p]!;
    if (a === 0) continue;
    const c = Math.cos(a);
    const s = Math.sin(a);
    const i = bands.first[p]!;
    const j = bands.second[p]!;
    const x = v[i]!;
    const y = v[j]!;
    v[i] = x * c - y * s;
    v[j] = x * s + y * c;
  }
}


/** Everything about one layer that is small: directions, roles, needles, queries. */
interface LayerPlan {
  roles: HeadRole[];
  needles: SyntheticNeedle[];
  /** [kvHead] → pre-RoPE key part every ordinary token has (positional bias + outliers), length D. */
  common: Float32Array[];
  /** [kvHead][topic] → pre-RoPE topic part (scaled by each token's salience), length D. */
  topicVec: Float32Array[][];
  /** [kvHead] → constant key part of sink tokens. */
  sinkBase: Float32Array[];
  /** [kvHead] → Map token → pre-RoPE needle key constant part (already turned back). */
  needleKeys: Map<number, Float32Array>[];
  /** S × Hq × D queries after RoPE (f32). */
  q: Float32Array;
  /** The queries of prompt positions T-W..T-1 (W × Hq × D after RoPE, f32): see planLayer. */
  observe: (W: number) => Float32Array;
  valueSeed: number;
  keySeed: number;
  newSeed: number;
}

/** Topic id of each position 0..T+S-1: segments of ~topicSpan tokens; new tokens continue the last. */
function segmentTopics(o: ResolvedSyntheticOptions): Int32Array {
  const T = o.promptTokens;
  const out = new Int32Array(T + o.decodeSteps);
  const r = new PlanRng(hashSeed(o.seed, 0x70b1c));
  let t = 0;
  let prev = -1;
  while (t < T) {
    const len = Math.max(1, Math.round(o.topicSpan * (0.5 + r.uniform())));
    let topic = r.int(0, o.topics);
    if (o.topics > 1 && topic === prev) topic = (topic + 1) % o.topics; // consecutive segments differ
    out.fill(topic, t, Math.min(T, t + len));
    prev = topic;
    t += len;
  }
  out.fill(out[T - 1]!, T);
  return out;
}

function planLayer(o: ResolvedSyntheticOptions, bands: Bands, topicOf: Int32Array, l: number): LayerPlan {
  const { qHeads: Hq, kvHeads: H, headDim: D, promptTokens: T, decodeSteps: S } = o;
  const g = Hq / H;
  const r = new PlanRng(hashSeed(o.seed, l, 0x91a4));
  const sqrtD = Math.sqrt(D);

  // Head roles: a random permutation, the first ones local, the next retrieval, the rest mixed.
  const order = Array.from({ length: Hq }, (_, i) => i);
  for (let i = Hq - 1; i > 0; i--) {
    const j = r.int(0, i + 1);
    [order[i], order[j]] = [order[j]!, order[i]!];
  }
  let nLocal = Math.round(o.localHeads * Hq);
  let nRetr = Math.round(o.retrievalHeads * Hq);
  if (o.needlesPerLayer > 0 && nRetr === 0) {
    nRetr = 1;
    if (nLocal + nRetr > Hq) nLocal = Hq - nRetr;
  }
  const roles: HeadRole[] = new Array(Hq).fill('mixed');
  order.forEach((h, i) => {
    if (i < nLocal) roles[h] = 'local';
    else if (i < nLocal + nRetr) roles[h] = 'retrieval';
  });

  // Per kv head directions.
  const sinkDir: Float64Array[] = [];
  const posDir: Float64Array[] = [];
  const centres: Float64Array[][] = [];
  const topicVec: Float32Array[][] = [];
  const sinkBase: Float32Array[] = [];
  const commons: Float64Array[] = []; // per kv head: positional bias + outliers (in every key)
  const semChannels: number[] = [];
  for (let p = bands.semBand[0]; p < bands.semBand[1]; p++) semChannels.push(bands.first[p]!, bands.second[p]!);
  for (let h = 0; h < H; h++) {
    sinkDir.push(unitOnBand(r, D, bands, bands.sinkBand));
    posDir.push(unitOnBand(r, D, bands, bands.posBand));
    const outliers = new Float64Array(D);
    const pool = semChannels.length ? semChannels : Array.from({ length: D }, (_, i) => i);
    for (let k = 0; k < o.outlierChannels; k++) {
      const ch = pool[r.int(0, pool.length)]!;
      outliers[ch] = (r.uniform() < 0.5 ? -1 : 1) * o.outlierScale * o.keyNoise;
    }
    const common = new Float64Array(D);
    for (let i = 0; i < D; i++) common[i] = POS_NORM * o.keyNoise * posDir[h]![i]! + outliers[i]!;
    commons.push(common);
    const cs: Float64Array[] = [];
    const ts: Float32Array[] = [];
    for (let j = 0; j < o.topics; j++) {
      const c = unitOnBand(r, D, bands, bands.semBand);
      cs.push(c);
      ts.push(Float32Array.from(c, (x) => TOPIC_NORM * o.keyNoise * x));
    }
    centres.push(cs);
    topicVec.push(ts);
    // Sink keys are their own massive vector: outlier channels but no positional bias, so the local
    // heads' kernel (which fluctuates at long distance) does not move them.
    sinkBase.push(Float32Array.from(sinkDir[h]!, (x, i) => SINK_NORM * o.keyNoise * x + outliers[i]!));
  }

  // Needles: distinct far-back tokens per kv head, each tied to a retrieval head of that group.
  const retrieval = roles.map((x, i) => (x === 'retrieval' ? i : -1)).filter((i) => i >= 0);
  const needles: SyntheticNeedle[] = [];
  const needleKeys: Map<number, Float32Array>[] = Array.from({ length: H }, () => new Map());
  const needleDirs: { n: SyntheticNeedle; dir: Float64Array }[] = [];
  // Topic each head focuses on: retrieval heads a topic of a random prompt token, others the current one.
  const focus = roles.map((role) => (role === 'retrieval' ? topicOf[r.int(0, T)]! : topicOf[T - 1]!));
  const span = Math.min(S, o.needleSteps);
  const regionEnd = o.sinkTokens + Math.max(1, Math.floor((T - o.sinkTokens) * o.needleDepth));
  for (let k = 0; k < o.needlesPerLayer; k++) {
    const qHead = retrieval[r.int(0, retrieval.length)]!;
    const kvHead = Math.floor(qHead / g);
    let token = r.int(o.sinkTokens, regionEnd);
    while (needleKeys[kvHead]!.has(token)) token = token + 1 < regionEnd ? token + 1 : o.sinkTokens;
    const firstStep = r.int(0, S - span + 1);
    const n: SyntheticNeedle = { layer: l, kvHead, qHead, token, firstStep, lastStep: firstStep + span - 1 };
    // Orthogonal to the head's focus topic and to earlier needles of the kv head, so that several
    // needles of one head (even at the same steps) each get their full logit.
    const others = [centres[kvHead]![focus[qHead]!]!, ...needleDirs.filter((x) => x.n.kvHead === kvHead).map((x) => x.dir)];
    const dir = orthogonalUnit(r, D, bands, bands.semBand, others);
    // Pre-RoPE content = the direction turned back by the distance to the middle of its steps, so
    // that after RoPE at `token` it points where the queries point at those steps.
    const content = Float64Array.from(dir, (x) => x * NEEDLE_NORM * o.keyNoise);
    rotate(content, T + (firstStep + n.lastStep) / 2 - token, bands);
    const common = commons[kvHead]!;
    needleKeys[kvHead]!.set(token, Float32Array.from(content, (x, i) => x + common[i]!));
    needles.push(n);
    needleDirs.push({ n, dir });
  }

  // Queries: role components + AR(1) noise, rotated to T+s.
  const q = new Float32Array(S * Hq * D);
  const rho = 1 - o.queryDrift;
  const innov = Math.sqrt(Math.max(0, 1 - rho * rho));
  // Per-element σ such that z·k/√D varies over tokens with std queryNoise: the token-varying key
  // parts are the noise (D·keyNoise²) and the rotating positional bias and topic centre.
  const zSigma = o.queryNoise / (o.keyNoise * Math.sqrt(1 + (POS_NORM ** 2 + TOPIC_NORM ** 2) / D) || 1);
  const noise = new Float64Array(Hq * D);
  for (let i = 0; i < noise.length; i++) noise[i] = zSigma * r.normal();
  const noise0 = noise.slice(); // step 0's state: the observation window runs back from it
  const v = new Float64Array(D);
  // Each query head's focus topic centre: what the queries (and the observation window, generated
  // later from a closure over this scope) need of `centres`, which then need not outlive the plan.
  // (A loop, not a map callback: a callback naming `centres` would keep it alive with this scope.)
  const focusDir: Float64Array[] = [];
  for (let hq = 0; hq < Hq; hq++) focusDir.push(centres[Math.floor(hq / g)]![focus[hq]!]!);
  /** Query head hq at `position` from the noise state `state`, with needle directions `active`, into out at off. */
  const query = (hq: number, state: Float64Array, active: { dir: Float64Array }[], position: number, out: Float32Array, off: number) => {
    const h = Math.floor(hq / g);
    const role = roles[hq]!;
    const aSink = (o.sinkLogit * sqrtD) / (SINK_NORM * o.keyNoise);
    const aPos = ((role === 'local' ? 1 : role === 'mixed' ? 0.5 : 0) * o.localLogit * sqrtD) / (POS_NORM * o.keyNoise);
    const aTopic = ((role === 'retrieval' ? 1 : role === 'mixed' ? 0.5 : 0) * o.topicLogit * sqrtD) / (TOPIC_NORM * o.keyNoise);
    const c = focusDir[hq]!;
    // The noise stays off the sink pairs and off the needle directions active now: its job is the
    // step-to-step drift of ordinary tokens' scores, not to move the few strong keys at random.
    const z = state.slice(hq * D, (hq + 1) * D);
    for (let p = bands.sinkBand[0]; p < bands.sinkBand[1]; p++) z[bands.first[p]!] = z[bands.second[p]!] = 0;
    for (const { dir } of active) {
      let d = 0;
      for (let i = 0; i < D; i++) d += z[i]! * dir[i]!;
      for (let i = 0; i < D; i++) z[i]! -= d * dir[i]!;
    }
    for (let i = 0; i < D; i++) v[i] = aSink * sinkDir[h]![i]! + aPos * posDir[h]![i]! + aTopic * c[i]! + z[i]!;
    for (const { dir } of active) {
      const a = (o.needleLogit * sqrtD) / (NEEDLE_NORM * o.keyNoise);
      for (let i = 0; i < D; i++) v[i]! += a * dir[i]!;
    }
    rotate(v, position, bands);
    out.set(v, off);
  };
  for (let s = 0; s < S; s++) {
    if (s > 0) for (let i = 0; i < noise.length; i++) noise[i] = rho * noise[i]! + innov * zSigma * r.normal();
    for (let hq = 0; hq < Hq; hq++) {
      const active = needleDirs.filter(({ n }) => n.qHead === hq && s >= n.firstStep && s <= n.lastStep);
      query(hq, noise, active, T + s, q, (s * Hq + hq) * D);
    }
  }
  // The last W prompt positions' queries, as a host's prefill computes them: the same heads, the
  // AR(1) noise run backwards from step 0's state (a stationary Gaussian AR(1) reads the same either
  // way) on its own stream, so the decode queries above do not change. No needle is active there:
  // which far token a later step retrieves is not announced by the prompt's end.
  const observe = (W: number): Float32Array => {
    const out = new Float32Array(W * Hq * D);
    const rb = new PlanRng(hashSeed(o.seed, l, 0x0b5e));
    const state = noise0.slice();
    for (let w = W - 1; w >= 0; w--) {
      for (let i = 0; i < state.length; i++) state[i] = rho * state[i]! + innov * zSigma * rb.normal();
      for (let hq = 0; hq < Hq; hq++) query(hq, state, [], T - W + w, out, (w * Hq + hq) * D);
    }
    return out;
  };
  return {
    roles,
    needles,
    observe,
    common: commons.map((c) => Float32Array.from(c)),
    topicVec,
    sinkBase,
    needleKeys,
    q,
    keySeed: hashSeed(o.seed, l, 0x6b),
    valueSeed: hashSeed(o.seed, l, 0x76),
    newSeed: hashSeed(o.seed, l, 0x6e),
  };
}

// ---------------------------------------------------------------------------------------------
// Bulk generation (hot loops: typed arrays, xorshift32, table normals, no allocation per token)

/** Writes f32 values `src[0..n)` into `out` at `off` in the storage form of `dtype`. */
function store(src: Float32Array, srcBits: Uint32Array, n: number, out: Float32Array | Uint16Array, off: number, dtype: Dtype): void {
  if (dtype === 'f32') {
    (out as Float32Array).set(src.subarray(0, n), off);
  } else if (dtype === 'f16') {
    for (let i = 0; i < n; i++) out[off + i] = f32BitsToF16Bits(srcBits[i]!);
  } else {
    for (let i = 0; i < n; i++) out[off + i] = f32BitsToBf16Bits(srcBits[i]!);
  }
}

const BLOCK = 256; // tokens generated in f32 before conversion to storage

/**
 * Keys of positions [t0, t1) into `out` (tokens × H × D, token t at row t - t0), RoPE'd at their
 * positions. cos/sin per pair are advanced by the angle-addition recurrence and re-anchored with
 * exact values at every block start, so the drift stays at f64 rounding level.
 */
function generateKeys(
  o: ResolvedSyntheticOptions,
  bands: Bands,
  plan: LayerPlan,
  topicOf: Int32Array,
  t0: number,
  t1: number,
  seed: number,
  out: Float32Array | Uint16Array,
): void {
  const { kvHeads: H, headDim: D } = o;
  const P = bands.pairs;
  const row = H * D;
  const tab = normals();
  const sigma = o.keyNoise;
  const buf = new Float32Array(BLOCK * row);
  const bufBits = new Uint32Array(buf.buffer);
  const cos = new Float64Array(P);
  const sin = new Float64Array(P);
  const cosStep = Float64Array.from(bands.theta, (t) => Math.cos(t));
  const sinStep = Float64Array.from(bands.theta, (t) => Math.sin(t));
  const first = bands.first;
  const second = bands.second;
  const zeros = new Float32Array(D);
  const salienceHalfVar = (o.salience * o.salience) / 2; // log-normal weight with mean 1
  let x = seed | 0 || 1;
  for (let b0 = t0; b0 < t1; b0 += BLOCK) {
    const b1 = Math.min(t1, b0 + BLOCK);
    for (let p = 0; p < P; p++) {
      cos[p] = Math.cos(b0 * bands.theta[p]!);
      sin[p] = Math.sin(b0 * bands.theta[p]!);
    }
    for (let t = b0; t < b1; t++) {
      const rowOff = (t - b0) * row;
      for (let h = 0; h < H; h++) {
        const special = t < o.sinkTokens ? plan.sinkBase[h]! : plan.needleKeys[h]!.get(t);
        // Ordinary token: common part + salience × its topic's part. Sinks/needles: their own vector.
        const c = special ?? plan.common[h]!;
        const tv = special ? zeros : plan.topicVec[h]![topicOf[t]!]!;
        x ^= x << 13;
        x ^= x >>> 17;
        x ^= x << 5;
        const w = special ? 0 : Math.exp(o.salience * tab[x & 0xffff]! - salienceHalfVar);
        const off = rowOff + h * D;
        for (let p = 0; p < P; p++) {
          x ^= x << 13;
          x ^= x >>> 17;
          x ^= x << 5;
          const i = first[p]!;
          const j = second[p]!;
          const kx = c[i]! + w * tv[i]! + sigma * tab[x & 0xffff]!;
          const ky = c[j]! + w * tv[j]! + sigma * tab[x >>> 16]!;
          const cp = cos[p]!;
          const sp = sin[p]!;
          buf[off + i] = kx * cp - ky * sp;
          buf[off + j] = kx * sp + ky * cp;
        }
      }
      for (let p = 0; p < P; p++) {
        const cp = cos[p]!;
        const sp = sin[p]!;
        cos[p] = cp * cosStep[p]! - sp * sinStep[p]!;
        sin[p] = sp * cosStep[p]! + cp * sinStep[p]!;
      }
    }
    store(buf, bufBits, (b1 - b0) * row, out, (b0 - t0) * row, o.dtype);
  }
}

/** Values: noise fixed per (layer, token), unit variance. */
function generateValues(o: ResolvedSyntheticOptions, count: number, seed: number, out: Float32Array | Uint16Array): void {
  const tab = normals();
  // Storage-form table so the loop is a lookup and a store.
  let x = seed | 0 || 1;
  if (o.dtype === 'f32') {
    for (let i = 0; i < count; i += 2) {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      out[i] = tab[x & 0xffff]!;
      if (i + 1 < count) out[i + 1] = tab[x >>> 16]!;
    }
    return;
  }
  const bits = storageNormals(o.dtype);
  for (let i = 0; i < count; i += 2) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = bits[x & 0xffff]!;
    if (i + 1 < count) out[i + 1] = bits[x >>> 16]!;
  }
}

const storageTables: Partial<Record<Dtype, Uint16Array>> = {};
function storageNormals(dtype: 'f16' | 'bf16'): Uint16Array {
  const cached = storageTables[dtype];
  if (cached) return cached;
  const tab = normals();
  const bits = new Uint32Array(tab.buffer);
  const t = new Uint16Array(65536);
  for (let i = 0; i < 65536; i++) t[i] = dtype === 'f16' ? f32BitsToF16Bits(bits[i]!) : f32BitsToBf16Bits(bits[i]!);
  return (storageTables[dtype] = t);
}

// ---------------------------------------------------------------------------------------------

/** Validates options (E_CONFIG naming each bad field) and applies defaults. */
export function resolveSyntheticOptions(options: SyntheticTraceOptions = {}): ResolvedSyntheticOptions {
  const r = SyntheticTraceOptionsSchema.safeParse(options);
  if (!r.success) {
    const what = r.error.issues.map((i) => `${i.path.join('.') || '(options)'}: ${i.message}`).join('; ');
    const given = r.error.issues
      .map((i) => {
        const key = String(i.path[0] ?? '');
        const value = key && options && typeof options === 'object' ? (options as Record<string, unknown>)[key] : options;
        return i.code === 'unrecognized_keys' ? `unknown option(s) ${i.keys.join(', ')}` : `${key || 'options'}=${describe(value)}`;
      })
      .join('; ');
    throw new KvdriveError('E_CONFIG', `synthetic trace options: expected ${what}; got ${given}`);
  }
  const o = r.data;
  const logT = Math.log(o.promptTokens);
  return {
    ...o,
    sinkLogit: o.sinkLogit ?? logT,
    localLogit: o.localLogit ?? logT + 2,
    topicLogit: o.topicLogit ?? 0.7 * logT,
    needleLogit: o.needleLogit ?? 2 * (o.topicLogit ?? 0.7 * logT) + 5,
    topics: o.topics ?? Math.max(8, Math.round(o.promptTokens / (4 * o.topicSpan))),
  };
}

/**
 * Generates a synthetic trace (see the file comment for the structure). Cheap to call: layers are
 * generated when `layer(l)` / `layerData(l)` is called (a Llama-3-8B-like layer — 32/8 heads, D 128,
 * 128K tokens, f16 — takes a few seconds and ~0.5 GiB) and not cached.
 * Errors: E_CONFIG for invalid options (message names the field and the constraint).
 */
export function generateSyntheticTrace(options: SyntheticTraceOptions = {}): SyntheticTrace {
  const o = resolveSyntheticOptions(options);
  const bands = makeBands(o);
  const topicOf = segmentTopics(o);
  const meta: TraceMeta = {
    version: 1,
    layers: o.layers,
    qHeads: o.qHeads,
    kvHeads: o.kvHeads,
    headDim: o.headDim,
    promptTokens: o.promptTokens,
    decodeSteps: o.decodeSteps,
  };
  // Plans are small (queries and directions); keep them so needles and roles are known up front.
  const plans: LayerPlan[] = Array.from({ length: o.layers }, (_, l) => planLayer(o, bands, topicOf, l));
  const needles = plans.flatMap((p) => p.needles);
  const needleRows = new Int32Array(needles.length * 5);
  needles.forEach((n, i) => needleRows.set([n.layer, n.kvHead, n.token, n.firstStep, n.lastStep], i * 5));
  const extras: TraceExtraTensor[] = [{ name: NEEDLES_TENSOR, dtype: 'I32', shape: [needles.length, 5], data: needleRows }];

  const layerData = (l: number): TraceLayerData => {
    if (!Number.isInteger(l) || l < 0 || l >= o.layers) fail('E_RANGE', 'synthetic trace layer', `an integer in [0, ${o.layers})`, l);
    const plan = plans[l]!;
    const { promptTokens: T, decodeSteps: S, kvHeads: H, headDim: D } = o;
    const k = kvArray(o.dtype, T * H * D);
    const v = kvArray(o.dtype, T * H * D);
    const kNew = kvArray(o.dtype, S * H * D);
    const vNew = kvArray(o.dtype, S * H * D);
    generateKeys(o, bands, plan, topicOf, 0, T, plan.keySeed, k);
    generateKeys(o, bands, plan, topicOf, T, T + S, plan.newSeed, kNew);
    generateValues(o, T * H * D, plan.valueSeed, v);
    generateValues(o, S * H * D, hashSeed(plan.valueSeed, 1), vNew);
    // q goes out in storage form, so the in-memory trace and a file written from it read back the
    // same f32 queries.
    return { k, v, q: o.dtype === 'f32' ? plan.q.slice() : fromF32(plan.q, o.dtype), kNew, vNew };
  };

  const reader = memoryTrace(meta, o.dtype, layerData, extras);
  return {
    ...reader,
    meta: reader.meta,
    dtype: reader.dtype,
    options: o,
    needles,
    headRoles: plans.map((p) => p.roles),
    topicOf,
    layerData,
    observationQueries: (l: number, window: number) => {
      if (!Number.isInteger(l) || l < 0 || l >= o.layers) fail('E_RANGE', 'synthetic trace layer', `an integer in [0, ${o.layers})`, l);
      if (!Number.isInteger(window) || window < 1 || window > o.promptTokens)
        fail('E_RANGE', 'synthetic observation window', `an integer in [1, ${o.promptTokens}] (prompt tokens)`, window);
      return plans[l]!.observe(window);
    },
    write: (path: string) =>
      writeTrace(
        path,
        meta,
        o.dtype,
        (function* () {
          for (let l = 0; l < o.layers; l++) yield layerData(l);
        })(),
        extras,
      ),
  };
}
