/**
 * The reference host's attention through the runtime (src/pipeline/runtime.ts, memory model): the
 * backend owns the KV. Per layer and position it hands the runtime the query and the new token's
 * k / v (row `pos` of the host's cache; earlier rows are never read again), and the runtime keeps
 * sinks and the open tail in DRAM, seals older tokens into the DRAM tier (and the SSD store with
 * `storage`), selects, fetches and attends. Answers asynchronously: hosts use
 * `Transformer.forwardAsync` (generate() does). With a budget covering the context the greedy tokens
 * equal dense attention's in every mode and tier configuration.
 */
import { fail, KvdriveError } from '../errors.js';
import { openRuntime, type Runtime, type RuntimeStats } from '../pipeline/runtime.js';
import type { PolicyOptions } from '../index/options.js';
import type { PolicyName } from '../index/selection.js';
import type { AttentionBackend, AttentionShape } from './attention-backend.js';

/** Options of {@link RuntimeAttention}. */
export interface RuntimeAttentionOptions {
  /** Tokens attended per (layer, kv head) per step beside sinks and the local window (integer >= 1). */
  budget: number;
  policy?: PolicyName;
  policyOptions?: Omit<PolicyOptions, 'qHeads' | 'kvHeads' | 'headDim'>;
  mode?: 'sequential' | 'pipelined';
  /** SSD store directory (sealed segments go there; the DRAM tier caches them). */
  storage?: string;
  /** DRAM budget of the memory model, bytes (default 256 MiB). */
  dramBudget?: number;
  /** Tokens per segment sealed while decoding (see RuntimeOptions.sealTokens). */
  sealTokens?: number;
}

const DEFAULT_DRAM_BUDGET = 256 * 2 ** 20;

export class RuntimeAttention implements AttentionBackend {
  readonly shape: AttentionShape;
  private readonly options: RuntimeAttentionOptions;
  private runtime: Promise<Runtime> | undefined;
  private seq = -1;
  /** Set by reset(): the next attend starts a new sequence. */
  private fresh = true;
  private closed = false;

  constructor(shape: AttentionShape, options: RuntimeAttentionOptions) {
    if (!Number.isInteger(options?.budget) || options.budget < 1) fail('E_BUDGET', 'runtime backend budget', 'an integer >= 1', options?.budget);
    this.shape = shape;
    this.options = options;
  }

  private open(): Promise<Runtime> {
    const { nLayers, nHeads, nKvHeads, headSize, seqLen } = this.shape;
    const o = this.options;
    this.runtime ??= openRuntime({
      shape: { layers: nLayers, qHeads: nHeads, kvHeads: nKvHeads, headDim: headSize },
      budget: o.budget,
      policy: o.policy,
      policyOptions: o.policyOptions,
      mode: o.mode,
      maxSequences: 1,
      maxTokens: seqLen,
      dramBudget: o.dramBudget ?? DEFAULT_DRAM_BUDGET,
      ...(o.sealTokens !== undefined ? { sealTokens: o.sealTokens } : {}),
      ...(o.storage !== undefined ? { ssd: { dir: o.storage } } : {}),
    });
    return this.runtime;
  }

  async attend(layer: number, pos: number, q: Float32Array, kCache: Float32Array, vCache: Float32Array): Promise<Float32Array> {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'runtime backend: expected an open backend, got a closed one');
    const rt = await this.open();
    if (this.fresh) {
      if (this.seq >= 0) await rt.closeSequence(this.seq);
      this.seq = rt.createSequence();
      const { nLayers, nKvHeads, headSize } = this.shape;
      const empty = { data: new Float32Array(0), dtype: 'f32' as const, tokens: 0, heads: nKvHeads, dim: headSize };
      for (let l = 0; l < nLayers; l++) await rt.prefill(this.seq, l, empty, empty);
      this.fresh = false;
    }
    const row = this.shape.nKvHeads * this.shape.headSize;
    const [out] = await rt.attend(layer, [{ seq: this.seq, q, kNew: kCache.subarray(pos * row, (pos + 1) * row), vNew: vCache.subarray(pos * row, (pos + 1) * row) }]);
    return out!;
  }

  reset(): void {
    this.fresh = true;
  }

  /** The runtime's stats (tiers, memory, time), or undefined before the first attend. */
  async stats(): Promise<RuntimeStats | undefined> {
    return this.runtime ? (await this.runtime).stats() : undefined;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.runtime) await (await this.runtime).close();
  }
}
