/**
 * Importance-guided warm-up (kvdrive.txt §7.1, DESIGN.md §4): at the end of prefill, score every
 * prefix chunk by the attention the observation window's queries (the last 16–64 prompt queries)
 * pay to it, and fill the hot tier with the most important chunks before the first decode step.
 *
 * Scores are per (layer, kv head), summed over the GQA group's query heads and the observation
 * queries (the hot tier is per kv head, so a per-head profile places better than one aggregated over
 * heads). Chunks outside [sinkEnd, tailStart) are skipped: sinks and tail are always attended from
 * the source and never occupy slots.
 */
import { fail } from '../errors.js';
import { native } from '../native.js';
import type { KvTensor } from '../types.js';
import { HotTier } from './hot-tier.js';
import { expectArray, expectInt, expectObject } from '../util/check.js';

/** Observation window of one layer. */
export interface ObservationWindow {
  /** Queries, Float32Array(W × qHeads × headDim), query-major. */
  q: Float32Array;
  qHeads: number;
  /**
   * Absolute position of each query (W entries): query w attends keys [0, positions[w]]. For a
   * trace without prompt queries, pass the first decode query at position promptTokens.
   */
  positions: Int32Array;
}

/**
 * Attention mass per chunk and kv head: Float32Array(kvHeads × ceil(k.tokens / chunkSize)), entry
 * h * nChunks + j = mean over the observation queries and group heads of the probability mass of
 * chunk j. Runs in C++ (AttentionProbsHeadSpans, same arithmetic as attention).
 */
export function importanceScores(k: KvTensor, obs: ObservationWindow, chunkSize: number): Float32Array {
  expectObject(obs, 'importanceScores observation window');
  return native.hotTierImportance({ k, q: obs.q, qHeads: obs.qHeads, positions: obs.positions, chunkSize }) as Float32Array;
}

/** {@link importanceScores} off the JS thread (prefill-sized inputs take long). */
export async function importanceScoresAsync(k: KvTensor, obs: ObservationWindow, chunkSize: number): Promise<Float32Array> {
  expectObject(obs, 'importanceScoresAsync observation window');
  return native.hotTierImportanceAsync({ k, q: obs.q, qHeads: obs.qHeads, positions: obs.positions, chunkSize }) as Promise<Float32Array>;
}

/**
 * Per kv head, the chunks that may occupy slots (clipped range inside [sinkEnd, tailStart)
 * non-empty), best first (ties: lower chunk id first). Returns CSR offsets and ids.
 */
export function rankChunks(
  scores: Float32Array,
  kvHeads: number,
  chunkSize: number,
  sinkEnd: number,
  tailStart: number,
): { offsets: Int32Array; chunkIds: Int32Array } {
  expectArray(scores, Float32Array, 'rankChunks scores');
  expectInt(kvHeads, 'rankChunks kvHeads', 1, 4096);
  expectInt(chunkSize, 'rankChunks chunkSize', 1, 65536);
  if (scores.length % kvHeads !== 0) fail('E_SHAPE', 'rankChunks scores', `a multiple of kvHeads (${kvHeads}) entries`, scores.length);
  if (!Number.isInteger(sinkEnd) || !Number.isInteger(tailStart) || sinkEnd < 0 || tailStart < sinkEnd)
    fail('E_RANGE', 'rankChunks sinkEnd/tailStart', 'integers with 0 <= sinkEnd <= tailStart', `${sinkEnd}/${tailStart}`);
  const n = scores.length / kvHeads;
  const eligible: number[] = [];
  for (let j = 0; j < n; j++) if (Math.min((j + 1) * chunkSize, tailStart) > Math.max(j * chunkSize, sinkEnd)) eligible.push(j);
  const offsets = new Int32Array(kvHeads + 1);
  const chunkIds = new Int32Array(eligible.length * kvHeads);
  for (let h = 0; h < kvHeads; h++) {
    const order = eligible.slice().sort((a, b) => scores[h * n + b]! - scores[h * n + a]! || a - b);
    chunkIds.set(order, h * eligible.length);
    offsets[h + 1] = (h + 1) * eligible.length;
  }
  return { offsets, chunkIds };
}

/**
 * Warms one layer of `tier` from its prefill KV: scores chunks with the observation window and
 * places the best ones into free slots up to each pair's capacity. Returns chunks placed per kv head.
 */
export function warmUp(
  tier: HotTier,
  args: { sequence?: number; layer: number; k: KvTensor; v: KvTensor; sinkEnd: number; tailStart: number } & ObservationWindow,
): Int32Array {
  if (!(tier instanceof HotTier)) fail('E_TYPE', 'warmUp tier', 'a HotTier', tier);
  expectObject(args, 'warmUp args');
  const { chunkSize, kvHeads } = tier.options;
  const scores = importanceScores(args.k, args, chunkSize);
  const ranked = rankChunks(scores, kvHeads, chunkSize, args.sinkEnd, args.tailStart);
  return tier.warm({ sequence: args.sequence, layer: args.layer, k: args.k, v: args.v, ...ranked });
}

/** {@link warmUp} with scoring and copying off the JS thread. */
export async function warmUpAsync(
  tier: HotTier,
  args: { sequence?: number; layer: number; k: KvTensor; v: KvTensor; sinkEnd: number; tailStart: number } & ObservationWindow,
): Promise<Int32Array> {
  if (!(tier instanceof HotTier)) fail('E_TYPE', 'warmUpAsync tier', 'a HotTier', tier);
  expectObject(args, 'warmUpAsync args');
  const { chunkSize, kvHeads } = tier.options;
  const scores = await importanceScoresAsync(args.k, args, chunkSize);
  const ranked = rankChunks(scores, kvHeads, chunkSize, args.sinkEnd, args.tailStart);
  return tier.warmAsync({ sequence: args.sequence, layer: args.layer, k: args.k, v: args.v, ...ranked });
}
