/**
 * The llama2 forward pass in f32 (llama2.c's `forward`), one token at a time:
 *
 *   x = embedding[token]
 *   per layer: xb = rmsnorm(x) · q,k,v = Wq xb, Wk xb, Wv xb · RoPE(q, k) · cache k,v at pos
 *              · out = attention(q, cache[0..pos]) (delegated to an AttentionBackend)
 *              · x += Wo out · xb = rmsnorm(x) · x += W2 (silu(W1 xb) ⊙ W3 xb)
 *   logits = Wcls rmsnorm(x)
 *
 * The host owns the KV cache: per layer two Float32Arrays of seqLen × nKvHeads × headSize,
 * token-major, holding keys after RoPE and values, exactly the arrays handed to the backend.
 */
import { fail } from '../errors.js';
import type { AttentionBackend, AttentionShape } from './attention-backend.js';
import type { Checkpoint, ModelConfig } from './checkpoint.js';

/** Sees each layer's projections at each position (used to record traces). */
export interface ForwardObserver {
  /**
   * Called after RoPE and after k/v are written to the cache, before attention. The arrays are the
   * host's scratch/cache views: copy what you keep. q: nHeads*headSize; k, v: nKvHeads*headSize.
   */
  onProjections(layer: number, pos: number, q: Float32Array, k: Float32Array, v: Float32Array): void;
}

/** The shape an attention backend needs for this model. */
export function attentionShape(config: ModelConfig): AttentionShape {
  return { nLayers: config.nLayers, nHeads: config.nHeads, nKvHeads: config.nKvHeads, headSize: config.headSize, seqLen: config.seqLen };
}

/** y[i] = Σ_j w[i*n + j] · x[j] for i < d: W is d rows × n columns, row-major. */
export function matmul(y: Float32Array, x: Float32Array, w: Float32Array, n: number, d: number): void {
  for (let i = 0; i < d; i++) {
    const row = i * n;
    let s0 = 0;
    let s1 = 0;
    let s2 = 0;
    let s3 = 0;
    let j = 0;
    // Four independent accumulators let the JIT overlap the multiply-adds.
    for (; j + 3 < n; j += 4) {
      s0 += w[row + j]! * x[j]!;
      s1 += w[row + j + 1]! * x[j + 1]!;
      s2 += w[row + j + 2]! * x[j + 2]!;
      s3 += w[row + j + 3]! * x[j + 3]!;
    }
    for (; j < n; j++) s0 += w[row + j]! * x[j]!;
    y[i] = s0 + s1 + (s2 + s3);
  }
}

/** out = weight ⊙ x / sqrt(mean(x²) + 1e-5). out may alias x. */
export function rmsnorm(out: Float32Array, x: Float32Array, weight: Float32Array): void {
  const n = x.length;
  let ss = 0;
  for (let i = 0; i < n; i++) ss += x[i]! * x[i]!;
  const inv = 1 / Math.sqrt(ss / n + 1e-5);
  for (let i = 0; i < n; i++) out[i] = weight[i]! * (inv * x[i]!);
}

/**
 * Rotary position embedding, llama2.c style: within each head, the pair (v[2i], v[2i+1]) is rotated
 * by pos · 10000^(-2i/headSize). Applied in place to a vector of whole heads.
 */
export function rope(vec: Float32Array, pos: number, headSize: number): void {
  for (let i = 0; i < vec.length; i += 2) {
    const freq = 1 / Math.pow(10000, (i % headSize) / headSize);
    const angle = pos * freq;
    const c = Math.cos(angle);
    const s = Math.sin(angle);
    const v0 = vec[i]!;
    const v1 = vec[i + 1]!;
    vec[i] = v0 * c - v1 * s;
    vec[i + 1] = v0 * s + v1 * c;
  }
}

/** A model instance: weights, KV cache and activations for one sequence. */
export class Transformer {
  readonly config: ModelConfig;
  /** Per layer: keys after RoPE, seqLen × nKvHeads × headSize. */
  readonly kCache: Float32Array[];
  /** Per layer: values, seqLen × nKvHeads × headSize. */
  readonly vCache: Float32Array[];
  // Activations, reused across calls.
  private readonly x: Float32Array;
  private readonly xb: Float32Array;
  private readonly xb2: Float32Array;
  private readonly q: Float32Array;
  private readonly hb: Float32Array;
  private readonly hb2: Float32Array;
  private readonly logits: Float32Array;

  constructor(
    readonly checkpoint: Checkpoint,
    readonly backend: AttentionBackend,
    private readonly observer?: ForwardObserver,
  ) {
    if (typeof checkpoint !== 'object' || checkpoint === null || !('config' in checkpoint) || !Array.isArray(checkpoint.layers))
      fail('E_CONFIG', 'Transformer checkpoint', 'a checkpoint from loadCheckpoint()', checkpoint);
    if (typeof backend !== 'object' || backend === null || typeof backend.attend !== 'function')
      fail('E_CONFIG', 'Transformer backend', 'an AttentionBackend (an object with attend())', backend);
    const c = (this.config = checkpoint.config);
    this.kCache = Array.from({ length: c.nLayers }, () => new Float32Array(c.seqLen * c.kvDim));
    this.vCache = Array.from({ length: c.nLayers }, () => new Float32Array(c.seqLen * c.kvDim));
    this.x = new Float32Array(c.dim);
    this.xb = new Float32Array(c.dim);
    this.xb2 = new Float32Array(c.dim);
    this.q = new Float32Array(c.dim);
    this.hb = new Float32Array(c.hiddenDim);
    this.hb2 = new Float32Array(c.hiddenDim);
    this.logits = new Float32Array(c.vocabSize);
  }

  /** Starts a new sequence: clears the cache and the backend's state. */
  reset(): void {
    for (const a of this.kCache) a.fill(0);
    for (const a of this.vCache) a.fill(0);
    this.backend.reset?.();
  }

  /**
   * Runs token `token` at position `pos` (positions must be fed in order 0, 1, 2, ... for one
   * sequence) and returns the logits over the vocabulary. The returned array is reused: it is
   * valid until the next call. E_CONFIG for a backend that answers asynchronously (use
   * {@link forwardAsync}).
   */
  forward(token: number, pos: number): Float32Array {
    this.embed(token, pos);
    for (let l = 0; l < this.config.nLayers; l++) {
      const att = this.attention(l, pos);
      if (att instanceof Promise) {
        att.catch(() => undefined);
        fail('E_CONFIG', 'Transformer.forward backend', 'a synchronous AttentionBackend (use forwardAsync for this one)', 'a promise from attend()');
      }
      this.finishLayer(l, pos, att);
    }
    return this.head();
  }

  /** {@link forward} for backends that may answer asynchronously (awaits each layer's attention). */
  async forwardAsync(token: number, pos: number): Promise<Float32Array> {
    this.embed(token, pos);
    for (let l = 0; l < this.config.nLayers; l++) this.finishLayer(l, pos, await this.attention(l, pos));
    return this.head();
  }

  private embed(token: number, pos: number): void {
    const { dim, vocabSize, seqLen } = this.config;
    if (!Number.isInteger(token) || token < 0 || token >= vocabSize) fail('E_RANGE', 'forward token', `an integer in [0, ${vocabSize})`, token);
    if (!Number.isInteger(pos) || pos < 0 || pos >= seqLen) fail('E_RANGE', 'forward pos', `an integer in [0, ${seqLen}) (seq_len)`, pos);
    this.x.set(this.checkpoint.tokenEmbedding.subarray(token * dim, (token + 1) * dim));
  }

  /** Layer l up to attention: q into scratch, k and v straight into this position's cache row. */
  private attention(l: number, pos: number): Float32Array | Promise<Float32Array> {
    const { dim, headSize, kvDim } = this.config;
    const { x, xb, q } = this;
    const lw = this.checkpoint.layers[l]!;
    rmsnorm(xb, x, lw.rmsAtt);
    const k = this.kCache[l]!.subarray(pos * kvDim, (pos + 1) * kvDim);
    const v = this.vCache[l]!.subarray(pos * kvDim, (pos + 1) * kvDim);
    matmul(q, xb, lw.wq, dim, dim);
    matmul(k, xb, lw.wk, dim, kvDim);
    matmul(v, xb, lw.wv, dim, kvDim);
    rope(q, pos, headSize);
    rope(k, pos, headSize);
    this.observer?.onProjections(l, pos, q, k, v);
    return this.backend.attend(l, pos, q, this.kCache[l]!, this.vCache[l]!);
  }

  /** Layer l after attention: output projection, residual, SwiGLU FFN. */
  private finishLayer(l: number, pos: number, att: Float32Array): void {
    const { dim, hiddenDim, headSize, nHeads } = this.config;
    const { x, xb, xb2, hb, hb2 } = this;
    const lw = this.checkpoint.layers[l]!;
    if (!(att instanceof Float32Array) || att.length !== nHeads * headSize)
      fail('E_SHAPE', `attention backend output (layer ${l}, pos ${pos})`, `Float32Array(${nHeads * headSize})`, att);
    matmul(xb2, att, lw.wo, dim, dim);
    for (let i = 0; i < dim; i++) x[i] += xb2[i]!;
    // SwiGLU FFN: x += W2 (silu(W1 xb) ⊙ W3 xb).
    rmsnorm(xb, x, lw.rmsFfn);
    matmul(hb, xb, lw.w1, dim, hiddenDim);
    matmul(hb2, xb, lw.w3, dim, hiddenDim);
    for (let i = 0; i < hiddenDim; i++) {
      const g = hb[i]!;
      hb[i] = (g / (1 + Math.exp(-g))) * hb2[i]!;
    }
    matmul(xb, hb, lw.w2, hiddenDim, dim);
    for (let i = 0; i < dim; i++) x[i] += xb[i]!;
  }

  private head(): Float32Array {
    const { dim, vocabSize } = this.config;
    rmsnorm(this.x, this.x, this.checkpoint.rmsFinal);
    matmul(this.logits, this.x, this.checkpoint.wcls, dim, vocabSize);
    return this.logits;
  }
}
