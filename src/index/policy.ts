/**
 * Selection policies: one interface over the native index of one layer for the three policies
 * (kvdrive hierarchical centroids, the Quest page bound, ShadowKV chunk means). The hot loops
 * (chunk representatives, k-means, scoring, ranking) run in C++ (native/index/,
 * native/index/layer_index.cc); this file validates, orchestrates and shapes the {@link Selection}.
 */
import { KvdriveError, describe, fail, fromNative } from '../errors.js';
import { native } from '../native.js';
import type { KvTensor } from '../types.js';
import { resolvePolicyOptions, type PolicyOptions, type ResolvedPolicyOptions } from './options.js';
import type { PolicyName, Selection } from './selection.js';

/** Per-step cost of the last {@link SelectionPolicy.select}. */
export interface SelectStats {
  /**
   * Vectors scored: index representatives (centroids + re-ranked chunk means; Quest counts min and
   * max) plus key rows read by kvdrive's exact re-rank.
   */
  vectorsScored: number;
  /** Bytes those vectors occupy (index vectors as stored, key rows in the KV dtype): bytes touched by the step. */
  bytesScored: number;
  /** Wall time of the select call, milliseconds. */
  ms: number;
}

/** Per-call options of {@link SelectionPolicy.select}. */
export interface SelectOptions {
  /** Lookahead pool in tokens per kv head (an integer >= budget): best-ranked chunks first. */
  pool?: number;
  /**
   * The layer's keys (same heads and dim as at build, at least the indexed tokens), read in place
   * on the calling thread. kvdrive re-ranks its best rerankFactor x budget tokens' chunks by exact
   * q·k; without keys selection uses the index alone.
   */
  keys?: KvTensor;
}

/** The selection side of one layer's KV cache. */
export interface SelectionPolicy {
  readonly name: PolicyName;
  /**
   * Tokens per indexed chunk. Consumers must read Selection.chunkSize: a kvdrive select given the
   * keys with tokenGranular (the default) selects single tokens and returns chunkSize 1.
   */
  readonly chunkSize: number;
  /** Index tokens [0, tokens) of one layer's keys (prefill). Off the JS thread. */
  build(k: KvTensor, tokens: number): Promise<void>;
  /**
   * {@link build} on the calling thread, for synchronous hosts (an attention backend called per
   * layer and position) that start from a short or empty context and grow it with {@link extend}.
   * Same checks and typed errors; a failed build leaves the previous index in place.
   */
  buildSync(k: KvTensor, tokens: number): void;
  /**
   * Called each decode step as the context grows (k now holds `tokens` tokens): seals chunks that
   * left the local window into the index, incrementally (kvdrive: a new chunk joins the nearest
   * centroid of its open segment, and a segment that fills up is re-clustered) — cheap, synchronous.
   * `first` (default 0): k holds tokens [first, first + k.tokens) only — a caller that offloaded
   * older tokens passes its in-memory tail; first must not exceed the first token not sealed yet.
   */
  extend(k: KvTensor, tokens: number, first?: number): void;
  /**
   * Select for one decode position. q: Float32Array(qHeads*dim) (query head h belongs to kv head
   * floor(h / (qHeads/kvHeads))). budget: tokens per kv head beside sinks and tail (integer >= 1).
   * opts.pool: lookahead pool size in tokens per kv head (>= budget), best-ranked chunks first.
   * opts.keys: the layer's keys (the KV tensor given to extend, read in place, at least as many
   * tokens as indexed). kvdrive then re-ranks its best chunks by their exact attention mass
   * (see {@link PolicyOptions.rerankFactor}); the other policies ignore it.
   */
  select(q: Float32Array, budget: number, opts?: SelectOptions): Selection;
  /**
   * Sets the prior selection later selects start from (kvdrive with
   * {@link PolicyOptions.reuseCandidateFactor} > 0; the other policies keep it unused): typically
   * this sequence's selection at the previous decode step. Its tokens join the candidates, which lets
   * fewer clusters be taken. Any chunk size; at most the indexed tokens; null clears it. A mutation,
   * like extend: on the owning thread. build() clears it.
   */
  setPrior(selection: Selection | null): void;
  /** Bytes of index memory. */
  indexBytes(): number;
  /**
   * Bytes the built index may hold beyond indexBytes() for a while: kvdrive's pending background
   * re-clustering (its result and the chunk means sealed meanwhile, see
   * {@link PolicyOptions.reclusterDelay}); 0 for the other policies. Memory plans add it per layer.
   */
  reserveBytes(): number;
  /** Vectors and bytes scored by, and wall time of, the last select. */
  lastSelectStats(): SelectStats;
  /**
   * The index's process-global handle: `native.selectIndex(handle, q, budget)` runs this policy's
   * select on any thread (a pipeline stage worker) while this object stays alive. Mutations
   * (build, extend) stay on the owning thread; the native index is read/write locked, so a select
   * elsewhere sees it before or after a mutation, never in between.
   */
  handle(): number;
}

/** One k-means segment of one kv head (kvdrive introspection). */
export interface SegmentClusters {
  /** Chunks [firstChunk, endChunk) belong to this segment. */
  firstChunk: number;
  endChunk: number;
  /** True once k-means ran over the whole, full segment (else it grows online). */
  full: boolean;
  /** Clusters. */
  k: number;
  /** k x dim centroids. */
  centroids: Float32Array;
  /** k + 1 CSR offsets into members. */
  offsets: Int32Array;
  /** Absolute chunk ids grouped by cluster, ascending within a cluster. */
  members: Int32Array;
  /** Sum of squared distances of the last k-means run. */
  inertia: number;
}

interface NativeIndex {
  build(k: KvTensor, tokens: number): Promise<void>;
  buildSync(k: KvTensor, tokens: number): void;
  extend(k: KvTensor, tokens: number, first?: number): void;
  select(q: Float32Array, budget: number, pool?: number, keys?: KvTensor): Selection & { vectorsScored: number; bytesScored: number };
  bytes(): number;
  reserveBytes(): number;
  handle(): number;
  clusters(head: number): SegmentClusters[];
  scoreSketch(q: Float32Array, head: number, tokens: Int32Array): Float32Array;
  setPrior(selection: Selection | null): void;
}

function call<T>(fn: () => T): T {
  try {
    return fn();
  } catch (e) {
    throw fromNative(e);
  }
}

function checkTokens(what: string, tokens: unknown): asserts tokens is number {
  if (typeof tokens !== 'number' || !Number.isSafeInteger(tokens) || tokens < 0)
    fail('E_RANGE', `${what} tokens`, 'a non-negative integer', tokens);
}

/** A policy backed by one native SelectionIndex. */
export class NativeSelectionPolicy implements SelectionPolicy {
  readonly name: PolicyName;
  readonly chunkSize: number;
  readonly options: Readonly<ResolvedPolicyOptions>;
  private readonly index: NativeIndex;
  private stats: SelectStats = { vectorsScored: 0, bytesScored: 0, ms: 0 };

  constructor(name: PolicyName, options: ResolvedPolicyOptions) {
    this.name = name;
    this.options = Object.freeze({ ...options });
    this.chunkSize = options.chunkSize;
    const { qHeads: _q, kvHeads: _k, headDim: _d, ...cfg } = options;
    this.index = call(() => new native.SelectionIndex({ policy: name, ...cfg }) as NativeIndex);
  }

  private checkKv(what: string, k: KvTensor): void {
    if (k === null || typeof k !== 'object') fail('E_TYPE', `${what} k`, 'a KV tensor { data, dtype, tokens, heads, dim }', k);
    const { kvHeads, headDim } = this.options;
    if (kvHeads !== undefined && k.heads !== kvHeads) fail('E_SHAPE', `${what} k.heads`, `kvHeads = ${kvHeads}`, k.heads);
    if (headDim !== undefined && k.dim !== headDim) fail('E_SHAPE', `${what} k.dim`, `headDim = ${headDim}`, k.dim);
  }

  async build(k: KvTensor, tokens: number): Promise<void> {
    this.checkKv('build', k);
    checkTokens('build', tokens);
    try {
      await this.index.build(k, tokens);
    } catch (e) {
      throw fromNative(e);
    }
  }

  buildSync(k: KvTensor, tokens: number): void {
    this.checkKv('buildSync', k);
    checkTokens('buildSync', tokens);
    call(() => this.index.buildSync(k, tokens));
  }

  extend(k: KvTensor, tokens: number, first = 0): void {
    this.checkKv('extend', k);
    checkTokens('extend', tokens);
    if (!Number.isSafeInteger(first) || first < 0) fail('E_RANGE', 'extend first', 'a non-negative integer', first);
    call(() => this.index.extend(k, tokens, first));
  }

  select(q: Float32Array, budget: number, opts?: SelectOptions): Selection {
    if (!(q instanceof Float32Array)) fail('E_TYPE', 'select q', 'a Float32Array(qHeads*dim)', q);
    const { qHeads, headDim } = this.options;
    if (qHeads !== undefined && headDim !== undefined && q.length !== qHeads * headDim)
      fail('E_SHAPE', 'select q', `qHeads*headDim = ${qHeads * headDim} elements`, q);
    if (typeof budget !== 'number' || !Number.isSafeInteger(budget) || budget < 1)
      fail('E_BUDGET', 'select budget (tokens per kv head)', 'an integer >= 1', budget);
    if (opts !== undefined && (opts === null || typeof opts !== 'object'))
      fail('E_TYPE', 'select opts', 'an object { pool?, keys? }', opts);
    const keys = opts?.keys;
    if (keys !== undefined) this.checkKv('select opts.keys', keys);
    const pool = opts?.pool;
    if (pool !== undefined && (typeof pool !== 'number' || !Number.isSafeInteger(pool) || pool < budget))
      throw new KvdriveError('E_BUDGET', `select pool (tokens per kv head): expected an integer >= the budget ${budget}, got ${describe(pool)}`);
    const t0 = performance.now();
    const r = call(() => this.index.select(q, budget, pool, keys));
    const ms = performance.now() - t0;
    this.stats = { vectorsScored: r.vectorsScored, bytesScored: r.bytesScored, ms };
    const sel: Selection = {
      chunkSize: r.chunkSize,
      tokens: r.tokens,
      sinkEnd: r.sinkEnd,
      tailStart: r.tailStart,
      offsets: r.offsets,
      chunkIds: r.chunkIds,
    };
    if (pool !== undefined) {
      sel.poolOffsets = r.poolOffsets;
      sel.poolIds = r.poolIds;
      sel.poolScores = r.poolScores;
    }
    return sel;
  }

  setPrior(selection: Selection | null): void {
    if (selection !== null && typeof selection !== 'object')
      fail('E_TYPE', 'setPrior selection', 'a Selection or null', selection);
    call(() => this.index.setPrior(selection));
  }

  indexBytes(): number {
    return call(() => this.index.bytes());
  }

  reserveBytes(): number {
    return call(() => this.index.reserveBytes());
  }

  handle(): number {
    return call(() => this.index.handle());
  }

  lastSelectStats(): SelectStats {
    return { ...this.stats };
  }

  /** kvdrive: the k-means segments of one kv head (empty for quest / shadowkv). E_RANGE for a bad head. */
  clusters(head: number): SegmentClusters[] {
    return call(() => this.index.clusters(head));
  }

  /**
   * kvdrive with keySketch: the key sketch's approximate q_j·k_t for a group of query heads q
   * (group x headDim, row-major) and the given tokens of kv head `head`, as the keyless re-rank
   * scores them; Float32Array(group x tokens.length), row j for q_j. For checking the sketch's error.
   */
  sketchScores(q: Float32Array, head: number, tokens: Int32Array): Float32Array {
    if (!(q instanceof Float32Array)) fail('E_TYPE', 'sketchScores q', 'a Float32Array(group*headDim)', q);
    if (!(tokens instanceof Int32Array)) fail('E_TYPE', 'sketchScores tokens', 'an Int32Array', tokens);
    return call(() => this.index.scoreSketch(q, head, tokens));
  }
}

const POLICY_NAMES: readonly PolicyName[] = ['kvdrive', 'quest', 'shadowkv'];

/**
 * Creates a selection policy for one layer. Options are validated (E_CONFIG); an unknown name is
 * E_POLICY. See {@link PolicyOptions} for defaults.
 */
export function createPolicy(name: PolicyName, options?: PolicyOptions): SelectionPolicy {
  if (!POLICY_NAMES.includes(name))
    fail('E_POLICY', 'createPolicy name', `one of ${POLICY_NAMES.map((n) => `'${n}'`).join(', ')}`, name);
  return new NativeSelectionPolicy(name, resolvePolicyOptions(name, options));
}
