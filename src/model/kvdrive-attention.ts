/**
 * The kvdrive sparse attention backend for the reference host: per layer a {@link SelectionPolicy}
 * indexes the host's own KV cache (zero-copy views, no second copy of K/V), grows as positions
 * advance, selects the critical chunks for each query and {@link attendSparse} computes exact
 * softmax attention over sinks + selected chunks + local tail.
 *
 * Per layer and position `pos` (context = tokens [0, pos] = pos + 1 tokens):
 *   pos 0 (a new sequence), or the layer's first call: the index is built synchronously over the
 *   context (`buildSync`: with the host's one-token-at-a-time prefill this is a 1-token, empty
 *   index); later positions: `extend` seals the chunks that left the local window (cheap, online).
 *   Then `select(q, budget)` and `attendSparse` over the selection.
 * Positions must arrive in increasing order per layer (the host runs them in order); a position at
 * or before the last one seen, other than 0, is an E_RANGE error rather than a silent re-index.
 * A host that prefilled a long prompt in one go calls {@link KvdriveAttention.prefill} per layer
 * first: the index build (k-means over the whole prompt) then runs off the JS thread.
 */
import { z } from 'zod';
import { describe, fail, KvdriveError } from '../errors.js';
import { attendSparse } from '../attention/kernels.js';
import { createPolicy, type SelectionPolicy } from '../index/policy.js';
import type { PolicyOptions } from '../index/options.js';
import type { PolicyName, Selection } from '../index/selection.js';
import type { KvTensor } from '../types.js';
import { checkAttentionShape, type AttentionBackend, type AttentionShape } from './attention-backend.js';

/** Options of {@link KvdriveAttention}. */
export interface KvdriveAttentionOptions {
  /**
   * Tokens attended per (layer, kv head) per step beside the always-kept sinks and local window
   * (DESIGN.md §2): an integer ≥ 1. Required. A budget at least the context length attends every
   * token, i.e. reproduces dense attention.
   */
  budget: number;
  /** Selection policy: 'kvdrive' (hierarchical centroids, default), 'quest' (page bounds) or 'shadowkv' (chunk means). */
  policy?: PolicyName;
  /**
   * Options of the policy (chunkSize, sinks, local, tokensPerCluster, ...; see {@link PolicyOptions}),
   * validated by the policy (E_CONFIG). qHeads, kvHeads and headDim come from the model shape; if
   * given they must match it.
   */
  policyOptions?: PolicyOptions;
  /** Threads attendSparse splits the kv heads over, integer in [1, 8] (default 1). Outputs do not depend on it. */
  threads?: number;
}

/** Cumulative cost of the backend since construction or the last reset(). */
export interface KvdriveAttentionStats {
  policy: PolicyName;
  budget: number;
  /** attend() calls (one per layer and position). */
  layerSteps: number;
  /** Wall time of index upkeep (buildSync at pos 0, extend afterwards), ms, summed. */
  indexMs: number;
  /** Wall time of select(), ms, summed. */
  selectMs: number;
  /** Wall time of attendSparse, ms, summed. */
  attendMs: number;
  /** Tokens attended, summed over layer-steps and kv heads. */
  attendedTokens: number;
  /** Context tokens (pos + 1), summed over layer-steps and kv heads. */
  contextTokens: number;
}

const optionsSchema = z.strictObject({
  budget: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER),
  policy: z.enum(['kvdrive', 'quest', 'shadowkv']).optional(),
  policyOptions: z.record(z.string(), z.unknown()).optional(),
  threads: z.number().int().min(1).max(8).optional(),
});

const EXPECTED: Record<string, string> = {
  budget: 'an integer ≥ 1 (tokens per kv head)',
  policy: "one of 'kvdrive', 'quest', 'shadowkv'",
  policyOptions: 'an options object (see PolicyOptions)',
  threads: 'an integer in [1, 8]',
};

/** Validates {@link KvdriveAttentionOptions}: E_BUDGET for the budget, E_POLICY for the policy, else E_CONFIG. */
function parseOptions(options: unknown): z.infer<typeof optionsSchema> {
  const what = 'kvdrive attention options';
  if (options === null || typeof options !== 'object' || Array.isArray(options))
    fail('E_CONFIG', what, 'an options object { budget, policy?, policyOptions?, threads? }', options);
  const r = optionsSchema.safeParse(options);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  if (issue.code === 'unrecognized_keys')
    throw new KvdriveError('E_CONFIG', `${what}: expected only ${Object.keys(EXPECTED).join(', ')}, got unknown ${issue.keys.map((k) => `'${k}'`).join(', ')}`);
  const key = String(issue.path[0]);
  const given = (options as Record<string, unknown>)[key];
  const code = key === 'budget' ? 'E_BUDGET' : key === 'policy' ? 'E_POLICY' : 'E_CONFIG';
  throw new KvdriveError(code, `${what}.${key}: expected ${EXPECTED[key] ?? 'a valid value'}, got ${describe(given)}`);
}

/** Per-layer state: the policy over the host's cache and how many tokens it has seen. */
interface LayerState {
  policy: SelectionPolicy;
  /** Context length at the last attend() of this layer (0: nothing indexed yet). */
  tokens: number;
}

/** Tokens one kv head attends under a selection: sinks + chosen chunks clipped to [sinkEnd, tailStart) + tail. */
export function attendedTokensPerHead(sel: Selection, kvHeads: number): number[] {
  const out: number[] = [];
  const c = sel.chunkSize;
  for (let h = 0; h < kvHeads; h++) {
    let n = sel.sinkEnd + (sel.tokens - sel.tailStart);
    for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) {
      const j = sel.chunkIds[i]!;
      n += Math.max(0, Math.min((j + 1) * c, sel.tailStart) - Math.max(j * c, sel.sinkEnd));
    }
    out.push(n);
  }
  return out;
}

export class KvdriveAttention implements AttentionBackend {
  readonly policy: PolicyName;
  readonly budget: number;
  private readonly threads: number;
  private readonly layers: LayerState[];
  private readonly kvDim: number;
  private totals: KvdriveAttentionStats;
  private closed = false;

  constructor(
    readonly shape: AttentionShape,
    options: KvdriveAttentionOptions,
  ) {
    checkAttentionShape(shape);
    const { nHeads, nKvHeads, headSize, seqLen, nLayers } = shape;
    const o = parseOptions(options);
    this.policy = o.policy ?? 'kvdrive';
    this.budget = o.budget;
    this.threads = o.threads ?? 1;
    this.kvDim = nKvHeads * headSize;
    const given = (o.policyOptions ?? {}) as Record<string, unknown>;
    const model = { qHeads: nHeads, kvHeads: nKvHeads, headDim: headSize };
    for (const [k, v] of Object.entries(model))
      if (given[k] !== undefined && given[k] !== v)
        fail('E_CONFIG', `kvdrive attention policyOptions.${k}`, `${v} (the model's) or nothing`, given[k]);
    // createPolicy validates the options (E_CONFIG naming the option) before any layer exists.
    const policyOptions = { ...given, ...model } as PolicyOptions;
    this.layers = Array.from({ length: nLayers }, () => ({ policy: createPolicy(this.policy, policyOptions), tokens: 0 }));
    this.totals = this.emptyStats();
  }

  private emptyStats(): KvdriveAttentionStats {
    return { policy: this.policy, budget: this.budget, layerSteps: 0, indexMs: 0, selectMs: 0, attendMs: 0, attendedTokens: 0, contextTokens: 0 };
  }

  /** The first `tokens` positions of a host cache array as a KV tensor, without copying. */
  private view(cache: Float32Array, tokens: number): KvTensor {
    return { data: cache.subarray(0, tokens * this.kvDim), dtype: 'f32', tokens, heads: this.shape.nKvHeads, dim: this.shape.headSize };
  }

  attend(layer: number, pos: number, q: Float32Array, kCache: Float32Array, vCache: Float32Array): Float32Array {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'kvdrive attention: expected an open backend, got attend() after close()');
    const { nHeads, nKvHeads, headSize, seqLen, nLayers } = this.shape;
    if (!Number.isInteger(layer) || layer < 0 || layer >= nLayers) fail('E_RANGE', 'attention layer', `an integer in [0, ${nLayers})`, layer);
    if (!Number.isInteger(pos) || pos < 0 || pos >= seqLen) fail('E_RANGE', 'attention pos', `an integer in [0, ${seqLen})`, pos);
    if (!(q instanceof Float32Array)) fail('E_TYPE', 'attention q', 'a Float32Array', q);
    if (!(kCache instanceof Float32Array)) fail('E_TYPE', 'attention kCache', 'a Float32Array', kCache);
    if (!(vCache instanceof Float32Array)) fail('E_TYPE', 'attention vCache', 'a Float32Array', vCache);
    if (q.length !== nHeads * headSize) fail('E_SHAPE', 'attention q', `length ${nHeads * headSize} (nHeads*headSize)`, q.length);
    if (kCache.length !== seqLen * this.kvDim) fail('E_SHAPE', 'attention kCache', `length ${seqLen * this.kvDim}`, kCache.length);
    if (vCache.length !== seqLen * this.kvDim) fail('E_SHAPE', 'attention vCache', `length ${seqLen * this.kvDim}`, vCache.length);

    const st = this.layers[layer]!;
    const tokens = pos + 1;
    const k = this.view(kCache, tokens);
    const v = this.view(vCache, tokens);

    const t0 = performance.now();
    if (pos === 0 || st.tokens === 0) st.policy.buildSync(k, tokens);
    else if (tokens > st.tokens) st.policy.extend(k, tokens);
    else fail('E_RANGE', `kvdrive attention layer ${layer} pos`, `> ${st.tokens - 1} (positions in order; 0 starts a new sequence)`, pos);
    st.tokens = tokens;
    const t1 = performance.now();
    // The keys at hand let kvdrive re-rank its best candidates exactly (quest / shadowkv ignore them).
    const selection = st.policy.select(q, this.budget, { keys: k });
    const t2 = performance.now();
    const r = attendSparse({ q, qHeads: nHeads, k, v, selection, threads: this.threads });
    const t3 = performance.now();

    const s = this.totals;
    s.layerSteps++;
    s.indexMs += t1 - t0;
    s.selectMs += t2 - t1;
    s.attendMs += t3 - t2;
    for (const n of attendedTokensPerHead(selection, nKvHeads)) s.attendedTokens += n;
    s.contextTokens += tokens * nKvHeads;
    return r.out;
  }

  /**
   * Indexes the first `tokens` positions of one layer's host cache off the JS thread (for a host
   * that prefilled a prompt in one go), replacing that layer's sequence state; decoding continues
   * with attend() at positions ≥ tokens. Rejects with the policy's typed errors (E_NONFINITE for a
   * NaN/Inf key, ...). Do not write cache positions < tokens until it settles.
   */
  async prefill(layer: number, kCache: Float32Array, tokens: number): Promise<void> {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'kvdrive attention: expected an open backend, got prefill() after close()');
    const { nLayers, seqLen } = this.shape;
    if (!Number.isInteger(layer) || layer < 0 || layer >= nLayers) fail('E_RANGE', 'prefill layer', `an integer in [0, ${nLayers})`, layer);
    if (!(kCache instanceof Float32Array)) fail('E_TYPE', 'prefill kCache', 'a Float32Array', kCache);
    if (kCache.length !== seqLen * this.kvDim) fail('E_SHAPE', 'prefill kCache', `length ${seqLen * this.kvDim}`, kCache.length);
    if (!Number.isInteger(tokens) || tokens < 1 || tokens > seqLen) fail('E_RANGE', 'prefill tokens', `an integer in [1, ${seqLen}]`, tokens);
    const st = this.layers[layer]!;
    const t0 = performance.now();
    st.tokens = 0; // a failed build leaves the layer to start over at its next attend()
    await st.policy.build(this.view(kCache, tokens), tokens);
    st.tokens = tokens;
    this.totals.indexMs += performance.now() - t0;
  }

  /** Cost since construction or the last reset(); a copy. */
  stats(): KvdriveAttentionStats {
    return { ...this.totals };
  }

  /** Starts a new sequence: every layer's index is rebuilt at its next pos-0 call; stats restart. */
  reset(): void {
    for (const st of this.layers) st.tokens = 0;
    this.totals = this.emptyStats();
  }

  /** Drops the per-layer indexes (their native memory is freed when collected); attend() is then E_CLOSED. */
  close(): void {
    this.closed = true;
    this.layers.length = 0;
  }
}

/** One line for the CLI: mean selection and attention time per layer-step and the share attended. */
export function formatKvdriveStats(s: KvdriveAttentionStats): string {
  const n = Math.max(1, s.layerSteps);
  const share = s.contextTokens > 0 ? (100 * s.attendedTokens) / s.contextTokens : 0;
  return (
    `kvdrive attention (policy ${s.policy}, budget ${s.budget}): per layer-step selection ${((s.indexMs + s.selectMs) / n).toFixed(4)} ms ` +
    `(index upkeep ${(s.indexMs / n).toFixed(4)} ms + select ${(s.selectMs / n).toFixed(4)} ms), attention ${(s.attendMs / n).toFixed(4)} ms ` +
    `over ${s.layerSteps} layer-steps; attended ${share.toFixed(1)}% of the context`
  );
}
