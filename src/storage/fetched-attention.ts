/**
 * Exact attention over a step's KV where it lies (DESIGN.md §3–§4): sinks and the open tail held in
 * memory, sealed chunks as page-first pages in any of a few buffers (a fetch buffer of SSD reads,
 * the DRAM tier's arena) or in hot-tier slots — nothing is copied to attend it. The selection may
 * be finer than the pages (kvdrive selects single tokens; the tiers hold chunks of `pageChunkSize`
 * tokens): exactly the selected tokens are attended. The runtime's step (src/pipeline/step.ts)
 * computes every decode step through it. Attention reads the same rows in the same order whichever
 * tier served them (see native/attention/tiered_attention.cc), so outputs are bit-identical to attendSparse
 * over a contiguous cache with the same selection.
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
  /**
   * What each kv head attends (ids ascending per head, < ceil(tailStart / chunkSize)); units at or
   * after tailBase are read from `tail` (tailBase must not fall inside a unit). Exactly one of
   * `selection` and `select`.
   */
  selection?: Selection;
  /**
   * Instead of `selection` (with `dramTier`; not with heads, hot, into, landing or fetchedMass, and
   * not in attendFetchedAsync): the selection made by this call on the selection index registered as
   * `handle` (SelectionIndex.handle(), the keyless select of `budget` tokens per kv head, as
   * selectIndex makes it), kv head by kv head in the same pass over the addon's threads as the
   * attention, each head attended as soon as its own selection is made. The result then carries
   * the selection, its bytesScored and selectMs. Same selection and same bits as selectIndex, then
   * attendFetched with that selection. `chunkMass: true` (default false) returns the mass per
   * selected unit too: the runtime does not read it, and copying it out costs a fresh 64 KiB array
   * per 128K step.
   */
  select?: { handle: number; budget: number; chunkMass?: boolean };
  /** Tokens per page (the tiers' chunk), a multiple of selection.chunkSize (default: selection.chunkSize). */
  pageChunkSize?: number;
  /**
   * Page-first pages of pageChunkSize tokens: one buffer (entry i at i x page bytes, unless
   * fetchedAt) or up to 256 buffers (with fetchedAt / fetchedIn; the DRAM tier passes its arena blocks).
   */
  fetched?: Uint8Array | Uint8Array[];
  /**
   * Instead of the page lists (fetched*, fetchedMass, landing: E_CONFIG with them): the sealed
   * pages read straight from a DRAM tier that holds every one ({@link TieredKv.residentPages}),
   * each selected unit's page looked up in the tier's slot maps (E_RANGE for a page the tier does
   * not hold). The result then carries `pageCounts`.
   */
  dramTier?: DramTierPages;
  /**
   * kvHeads + 1 offsets and ascending page ids per kv head of the pages (default: the selection's,
   * when pageChunkSize equals its chunkSize). Every selected unit before tailBase not resident in
   * the hot tier must lie in one of them (E_RANGE).
   */
  fetchedOffsets?: Int32Array;
  fetchedIds?: Int32Array;
  /** Byte offset of page entry i in its buffer (Float64Array, one per entry; checked against the buffer). */
  fetchedAt?: Float64Array;
  /** Buffer index of page entry i in `fetched` (default 0; only with fetchedAt). */
  fetchedIn?: Uint8Array;
  /**
   * Read selected units in pages resident in this hot tier (chunk = pageChunkSize) from their slots;
   * records each resident's mass (summed over its selected units) for eviction.
   */
  hot?: { handle: number; sequence?: number; layer: number };
  /** Softmax scale, default 1/sqrt(dim). */
  scale?: number;
  /**
   * Workers of the addon's thread pool, 1 to 8 (default 1): kv heads (and, past 8192 attended tokens
   * per head, KV-length parts merged by log-sum-exp) are spread over them. Outputs are bit-identical
   * at every thread count.
   */
  threads?: number;
  /**
   * Kv heads to attend: one entry per kv head, 1 attend / 0 skip (default every head). A skipped
   * head's pages are not read and its outputs (out / lse rows of its query heads, chunkMass entries)
   * are not written: a caller attends the heads whose pages are ready while other heads' reads are
   * in flight, then the rest into the same arrays (`into`). Each head's output is bit-identical to
   * a call over every head.
   */
  heads?: Uint8Array;
  /**
   * Write the result into these arrays (out qHeads x dim, lse qHeads, chunkMass one per selection
   * entry; exact lengths) instead of new ones; the result is then these arrays.
   */
  into?: FetchedAttentionResult;
  /**
   * Written when given (one entry per page entry of fetchedIds, or per selection entry without
   * page lists): each page's attention mass, the sum of chunkMass over the selected units it holds
   * (in selection order; units read from the hot tier or the tail count in no page). Only the
   * entries of the kv heads attended are written.
   */
  fetchedMass?: Float32Array;
  /**
   * SSD reads still landing in the pages (TieredKv.fetchInPlace's `reads`, one per fetch): each
   * kv head is attended in this one call as soon as every read item holding its pages has landed
   * (`done[1 + i]` is 1 for each item i with `itemHead[i]` the head; `done[0]` is 0 while the read
   * runs), the workers taking whichever head is ready; a head whose read ended without its items
   * (a failed read) is left out. The result's `attended` says which heads were. Each head's output
   * is bit-identical to an ungated call's.
   */
  landing?: ReadLanding[];
  /**
   * With `landing`: how long the call waits for a head still being read, milliseconds (default
   * 30000; an integer >= 0). Past it the head is left out as for a failed read (`attended` 0), so
   * flags that never come cannot hang the call; the caller attends it once the read settles.
   */
  landingTimeoutMs?: number;
}

/**
 * A DRAM tier's pages as attendFetched reads them in place (native/cache/dram_chain.h): global
 * chunk g of the chain lies in the segment s with segStart[s] <= g < segStart[s + 1]; that segment's
 * slot map `maps[s]` holds the slot of (layer, kv head h, g - segStart[s]) at (layer x kvHeads + h)
 * x chunks(s) + g - segStart[s]; slot n lies in arenas[floor(n / slotsPerBlock)] at byte
 * (n % slotsPerBlock) x page bytes.
 */
export interface DramTierPages {
  segStart: Int32Array;
  maps: Int32Array[];
  layer: number;
  arenas: readonly Uint8Array[];
  slotsPerBlock: number;
}

/** The landing flags of one SSD read in flight (see TieredKv.fetchInPlace). */
export interface ReadLanding {
  /** Element 0: 0 while the read runs, 1 once it ended with every item landed, else it failed; element 1 + i: 1 once item i landed. */
  done: Int32Array;
  /** Kv head of each read item. */
  itemHead: Int32Array;
}

/** Output of {@link attendFetched}: as attendSparse's (out, lse, chunkMass per selection entry). */
export interface FetchedAttentionResult {
  out: Float32Array;
  lse: Float32Array;
  /** Attention mass per selection entry; with `select`, only when `select.chunkMass` asks for it. */
  chunkMass?: Float32Array;
  /** With `landing`: 1 per kv head attended by the call, 0 per head left out (masked, or its read failed). */
  attended?: Uint8Array;
  /**
   * With `dramTier`: the distinct pages the attended kv heads read, [from the DRAM tier, from the
   * tail, from the hot tier] (a page counted once per kv head): the step's traffic per source.
   */
  pageCounts?: Int32Array;
  /** With `select`: the selection made (what chunkMass is per entry of). */
  selection?: Selection;
  /** With `select`: index bytes the selection scored. */
  bytesScored?: number;
  /** With `select`: milliseconds from the call's start until the last kv head's selection was made. */
  selectMs?: number;
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
