/**
 * The reference host's attention through the runtime (src/runtime/runtime.ts, memory model): the
 * one decode path of the host — backends "kvdrive" and "runtime" both build this class. The
 * backend owns the KV. Per layer and position it hands the runtime the query and the new token's
 * k / v (row `pos` of the host's cache; earlier rows are never read again), and the runtime keeps
 * sinks and the open tail in DRAM, seals older tokens into the DRAM tier (and the SSD store with
 * `storage`), selects, fetches and attends. Answers asynchronously: hosts use
 * `Transformer.forwardAsync` (generate() does). With a budget covering the context the greedy tokens
 * equal dense attention's in every mode and tier configuration.
 */
import { z } from 'zod';
import { describe, fail, KvdriveError } from '../errors.js';
import { openRuntime, type Runtime, type RuntimeStats } from '../runtime/runtime.js';
import type { PolicyOptions } from '../index/options.js';
import { checkAttentionShape, type AttentionBackend, type AttentionShape, type BackendOptions } from './attention-backend.js';

/**
 * Options of {@link RuntimeAttention}: the backend options (documented on {@link BackendOptions}),
 * with the budget required. A budget at least the context length reproduces dense attention.
 */
export type RuntimeAttentionOptions = Omit<BackendOptions, 'budget'> & { budget: number };

const DEFAULT_DRAM_BUDGET = 256 * 2 ** 20;

const optionsSchema = z.strictObject({
  budget: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER),
  policy: z.enum(['kvdrive', 'quest', 'shadowkv']).optional(),
  policyOptions: z.record(z.string(), z.unknown()).optional(),
  mode: z.enum(['sequential', 'pipelined']).optional(),
  storage: z.string().min(1).optional(),
  dramBudget: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER).optional(),
  sealTokens: z.number().int().min(1).optional(),
});

const EXPECTED: Record<string, string> = {
  budget: 'an integer >= 1 (tokens per kv head)',
  policy: "one of 'kvdrive', 'quest', 'shadowkv'",
  policyOptions: 'an options object (see PolicyOptions)',
  mode: "'sequential' or 'pipelined'",
  storage: 'a directory path',
  dramBudget: 'a positive integer number of bytes, at most 2^53 - 1',
  sealTokens: 'an integer >= 1 (a multiple of the chunk size)',
};

/** Validates {@link RuntimeAttentionOptions}: E_BUDGET for the budget, E_POLICY for the policy, else E_CONFIG. */
function parseOptions(options: unknown): RuntimeAttentionOptions {
  const what = 'attention backend options';
  if (options === null || typeof options !== 'object' || Array.isArray(options))
    fail('E_CONFIG', what, `an options object { ${Object.keys(EXPECTED).join(', ')} }`, options);
  const r = optionsSchema.safeParse(options);
  if (r.success) return r.data as RuntimeAttentionOptions;
  const issue = r.error.issues[0]!;
  if (issue.code === 'unrecognized_keys')
    throw new KvdriveError('E_CONFIG', `${what}: expected only ${Object.keys(EXPECTED).join(', ')}, got unknown ${issue.keys.map((k) => `'${k}'`).join(', ')}`);
  const key = String(issue.path[0]);
  const given = (options as Record<string, unknown>)[key];
  const code = key === 'budget' ? 'E_BUDGET' : key === 'policy' ? 'E_POLICY' : 'E_CONFIG';
  throw new KvdriveError(code, `${what}.${key}: expected ${EXPECTED[key] ?? 'a valid value'}, got ${describe(given)}`);
}

export class RuntimeAttention implements AttentionBackend {
  readonly shape: AttentionShape;
  private readonly options: RuntimeAttentionOptions;
  private runtime: Promise<Runtime> | undefined;
  private seq = -1;
  /** Set by reset(): the next attend starts a new sequence. */
  private fresh = true;
  private closed = false;
  /** Per layer: the position the next attend must carry (the runtime appends one token per step). */
  private readonly next: Int32Array;
  /** Per layer: 1 once the current sequence's prompt (possibly empty) was handed to the runtime. */
  private readonly prefilled: Uint8Array;

  constructor(shape: AttentionShape, options: RuntimeAttentionOptions) {
    checkAttentionShape(shape);
    const { nHeads, nKvHeads, headSize, nLayers } = shape;
    const o = parseOptions(options);
    const given = (o.policyOptions ?? {}) as Record<string, unknown>;
    const model = { qHeads: nHeads, kvHeads: nKvHeads, headDim: headSize };
    for (const [k, v] of Object.entries(model))
      if (given[k] !== undefined && given[k] !== v) fail('E_CONFIG', `attention backend policyOptions.${k}`, `${v} (the model's) or nothing`, given[k]);
    const policyOptions = Object.fromEntries(Object.entries(given).filter(([k]) => !(k in model)));
    this.shape = shape;
    this.options = { ...o, policyOptions: policyOptions as PolicyOptions };
    this.next = new Int32Array(nLayers);
    this.prefilled = new Uint8Array(nLayers);
  }

  private open(): Promise<Runtime> {
    const { nLayers, nHeads, nKvHeads, headSize, seqLen } = this.shape;
    const o = this.options;
    this.runtime ??= openRuntime({
      shape: { layers: nLayers, qHeads: nHeads, kvHeads: nKvHeads, headDim: headSize },
      budget: o.budget,
      policy: o.policy,
      policyOptions: o.policyOptions as Omit<PolicyOptions, 'qHeads' | 'kvHeads' | 'headDim'>,
      mode: o.mode,
      maxSequences: 1,
      maxTokens: seqLen,
      dramBudget: o.dramBudget ?? DEFAULT_DRAM_BUDGET,
      ...(o.sealTokens !== undefined ? { sealTokens: o.sealTokens } : {}),
      ...(o.storage !== undefined ? { ssd: { dir: o.storage } } : {}),
    });
    return this.runtime;
  }

  /**
   * Positions arrive one at a time and in order per layer (pos = tokens seen by that layer); pos 0
   * at layer 0 starts a new sequence, as reset() does. A layer's first attend of a sequence may come
   * at any pos: rows [0, pos) of the host's cache are then that layer's prompt, handed to the
   * runtime's prefill in one call (indexed and sealed into the tiers) — so a host that filled its
   * cache itself (a batched prefill, a restored context) starts decoding at once. Any other
   * position is E_RANGE.
   */
  async attend(layer: number, pos: number, q: Float32Array, kCache: Float32Array, vCache: Float32Array): Promise<Float32Array> {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'runtime backend: expected an open backend, got attend() after close()');
    const { nHeads, nKvHeads, headSize, seqLen, nLayers } = this.shape;
    const kvDim = nKvHeads * headSize;
    if (!Number.isInteger(layer) || layer < 0 || layer >= nLayers) fail('E_RANGE', 'attention layer', `an integer in [0, ${nLayers})`, layer);
    if (!Number.isInteger(pos) || pos < 0 || pos >= seqLen) fail('E_RANGE', 'attention pos', `an integer in [0, ${seqLen})`, pos);
    if (!(q instanceof Float32Array)) fail('E_TYPE', 'attention q', 'a Float32Array', q);
    if (!(kCache instanceof Float32Array)) fail('E_TYPE', 'attention kCache', 'a Float32Array', kCache);
    if (!(vCache instanceof Float32Array)) fail('E_TYPE', 'attention vCache', 'a Float32Array', vCache);
    if (q.length !== nHeads * headSize) fail('E_SHAPE', 'attention q', `length ${nHeads * headSize} (nHeads*headSize)`, q.length);
    if (kCache.length !== seqLen * kvDim) fail('E_SHAPE', 'attention kCache', `length ${seqLen * kvDim}`, kCache.length);
    if (vCache.length !== seqLen * kvDim) fail('E_SHAPE', 'attention vCache', `length ${seqLen * kvDim}`, vCache.length);
    if (pos === 0 && layer === 0 && this.next[0]! > 0) this.reset();
    const expected = this.prefilled[layer] ? this.next[layer]! : pos;
    if (pos !== expected) fail('E_RANGE', `attention layer ${layer} pos`, `${expected} (positions in order, one at a time; 0 at layer 0 starts a new sequence)`, pos);
    const rt = await this.open();
    if (this.fresh) {
      if (this.seq >= 0) await rt.closeSequence(this.seq);
      this.seq = rt.createSequence();
      this.fresh = false;
    }
    if (!this.prefilled[layer]) {
      // The layer's prompt: the host's cache rows before its first attended position (often none).
      const rows = (c: Float32Array) => ({ data: c.subarray(0, pos * kvDim), dtype: 'f32' as const, tokens: pos, heads: nKvHeads, dim: headSize });
      await rt.prefill(this.seq, layer, rows(kCache), rows(vCache));
      this.prefilled[layer] = 1;
    }
    const [out] = await rt.attend(layer, [{ seq: this.seq, q, kNew: kCache.subarray(pos * kvDim, (pos + 1) * kvDim), vNew: vCache.subarray(pos * kvDim, (pos + 1) * kvDim) }]);
    this.next[layer] = pos + 1;
    return out!;
  }

  /** Starts a new sequence at the next attend (the runtime's stats keep counting). */
  reset(): void {
    this.fresh = true;
    this.next.fill(0);
    this.prefilled.fill(0);
  }

  /** The runtime's stats (tiers, memory, time), or undefined before the first attend. */
  async stats(): Promise<RuntimeStats | undefined> {
    return this.runtime ? (await this.runtime).stats() : undefined;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    // A runtime that failed to open (its error went to attend()) has nothing to release.
    const rt = this.runtime ? await this.runtime.catch(() => undefined) : undefined;
    await rt?.close();
  }
}
