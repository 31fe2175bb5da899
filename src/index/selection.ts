/**
 * The contract between selection (src/index), attention (native) and the hot tier (src/cache).
 *
 * A Selection says, for one decode position of one layer, which tokens each kv head attends:
 *  - always: sinks [0, sinkEnd) and the tail [tailStart, tokens) (the local window plus every token
 *    not yet indexed — nothing is ever silently dropped);
 *  - chosen: chunks of `chunkSize` tokens, chunk j = tokens [j*chunkSize, (j+1)*chunkSize)
 *    intersected with [sinkEnd, tailStart). Chunk ids are per kv head, sorted ascending, unique.
 * The attention kernel walks sinks, chunks (ascending) and tail in token order, so a selection that
 * covers every chunk reproduces dense attention.
 */
export interface Selection {
  /**
   * Tokens per chunk for `chunkIds` (kvdrive 4, shadowkv 8, quest 16 by default; 1 for a kvdrive
   * select given the keys with tokenGranular, its default: chunkIds are then token ids).
   */
  chunkSize: number;
  /** Context length this selection was made for (prompt + decoded tokens, including the current one). */
  tokens: number;
  /** Tokens [0, sinkEnd) are always attended. */
  sinkEnd: number;
  /** Tokens [tailStart, tokens) are always attended. */
  tailStart: number;
  /** kvHeads + 1 offsets into chunkIds: kv head h owns chunkIds[offsets[h] .. offsets[h+1]). */
  offsets: Int32Array;
  /** Selected chunk ids, ascending within each kv head. */
  chunkIds: Int32Array;
  /**
   * Optional lookahead pool (for eviction ranking): per kv head the top-M ranked chunk ids, M > K,
   * best first, with `poolOffsets` like `offsets` and `poolScores` the selection scores.
   */
  poolOffsets?: Int32Array;
  poolIds?: Int32Array;
  poolScores?: Float32Array;
}

export type PolicyName = 'kvdrive' | 'quest' | 'shadowkv';
