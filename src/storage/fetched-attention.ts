/**
 * Exact attention over a step's KV gathered from several places (DESIGN.md §3–§4): sinks and the
 * open tail held in memory, selected chunks staged page-first by the tiers (DRAM tier, SSD
 * extents, the tail) or read in place from the hot tier. The runtime's step (src/runtime/step.ts)
 * computes every decode step through it. Attention reads the same rows in the same order whichever
 * tier served a chunk (see native/tiered_attention.cc), so outputs are bit-identical to
 * attendSparse over a contiguous cache with the same selection.
 */
import { native } from '../native.js';
import type { KvTensor } from '../types.js';
import type { Selection } from '../index/selection.js';

/** Options of {@link attendFetched}. */
export interface AttendFetchedOptions {
  /** Queries, Float32Array(qHeads * dim), finite. */
  q: Float32Array;
  qHeads: number;
  /** Token-major K/V of tokens [0, sink.tokens), sink.tokens >= selection.sinkEnd. */
  sink: { k: KvTensor; v: KvTensor };
  /** Token-major K/V of tokens [tailBase, tailBase + tail.tokens), covering [selection.tailStart, selection.tokens). */
  tail: { k: KvTensor; v: KvTensor };
  /** First token of `tail`; <= selection.tailStart. */
  tailBase: number;
  /** What each kv head attends (chunk ids ascending per head, < ceil(tailStart / chunkSize)). */
  selection: Selection;
  /** Page-first chunks (a TieredKv fetch buffer): entry i = selection.chunkIds[i], or fetchedIds[i] when given. */
  fetched: Uint8Array;
  /** kvHeads + 1 offsets and ascending ids per kv head of the chunks `fetched` holds (default: the selection's). */
  fetchedOffsets?: Int32Array;
  fetchedIds?: Int32Array;
  /** Read selected chunks resident in this hot tier (all rows) from their slots; records their mass for eviction. */
  hot?: { handle: number; sequence?: number; layer: number };
  /** Softmax scale, default 1/sqrt(dim). */
  scale?: number;
}

/** Output of {@link attendFetched}: as attendSparse's (out, lse, chunkMass per selected chunk). */
export interface FetchedAttentionResult {
  out: Float32Array;
  lse: Float32Array;
  chunkMass: Float32Array;
}

/**
 * Exact attention over sinks and tail held in memory plus chunks staged page-first by the tiers;
 * bit-identical to attendSparse over a contiguous cache holding the same rows. Off the JS thread.
 */
export function attendFetchedAsync(o: AttendFetchedOptions): Promise<FetchedAttentionResult> {
  return native.attendFetchedAsync(o) as Promise<FetchedAttentionResult>;
}

/** {@link attendFetchedAsync} on the calling thread. */
export function attendFetched(o: AttendFetchedOptions): FetchedAttentionResult {
  return native.attendFetched(o) as FetchedAttentionResult;
}
