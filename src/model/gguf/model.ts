/**
 * A GGUF Llama-family model run by the native forward pass (native/model/), with attention through
 * an {@link AttentionBackend} — the same interface, and so the same dense or sparse kernels, as the
 * llama2.c reference host (src/model/forward.ts).
 *
 * Per chunk of T consecutive positions (T = 1 when decoding, up to the prefill chunk size for a
 * prompt): native Embed; per layer native AttnPre (RMSNorm, Q/K/V products, bias, RoPE; K and V are
 * written straight into this sequence's cache rows), then the backend attends each position over
 * [0, pos], then native AttnPost (output product, residual, RMSNorm, SwiGLU FFN, residual); finally
 * native Logits of the last position. The KV cache is the host's: per layer two Float32Arrays of
 * seqLen × nKvHeads × headSize, token-major, keys after RoPE — the arrays handed to the backend.
 */
import { z } from 'zod';
import { fail, KvdriveError } from '../../errors.js';
import { native } from '../../native.js';
import { placedArray } from '../../util/kv-array.js';
import type { AttentionBackend, AttentionShape } from '../attention-backend.js';
import { GGML_TYPES } from './ggml-types.js';
import { llamaConfig, nativeTensors, ropeFrequencies, type LlamaConfig } from './llama-config.js';
import { readGguf, type GgufFile } from './reader.js';
import { ggufTokenizer, type GgufTokenizer } from './tokenizer.js';

/** Options of {@link loadGgufModel}. */
export interface LoadGgufOptions {
  /** Threads of the native matrix products (default: all cores). */
  threads?: number;
  /**
   * Where the weights live (default 'huge-pages'). 'huge-pages': read once into memory advised for
   * transparent huge pages — decode reads every weight per token, and over 4 KiB pages of a file
   * mapping the TLB misses (page walks) cost a large share of that when the KV cache streams
   * gigabytes too; needs the model's size in memory besides the page cache. 'mmap': the file
   * mapped and read in place (no copy, pages evictable; slower decode).
   */
  weights?: 'huge-pages' | 'mmap';
}

const loadSchema = z.strictObject({
  threads: z.number().int().min(1).max(1024).optional(),
  weights: z.enum(['huge-pages', 'mmap']).optional(),
});

/** An opened GGUF model: metadata, tokenizer and the native weights (see LoadGgufOptions.weights). */
export class GgufModel {
  private handle: number;

  constructor(
    readonly file: GgufFile,
    readonly config: LlamaConfig,
    readonly tokenizer: GgufTokenizer,
    threads?: number,
    weights?: 'huge-pages' | 'mmap',
  ) {
    this.handle = native.ggufModelOpen({
      path: file.path,
      dim: config.dim,
      hidden: config.hiddenDim,
      layers: config.nLayers,
      heads: config.nHeads,
      kvHeads: config.nKvHeads,
      headSize: config.headSize,
      vocab: config.vocabSize,
      ropeDim: config.ropeDim,
      ropeNeox: config.ropeNeox,
      eps: config.rmsEps,
      threads,
      weights,
      invFreq: ropeFrequencies(file, config),
      tensors: nativeTensors(file, config, (t) => GGML_TYPES[t]),
    }) as number;
  }

  /** The native handle; E_CLOSED after close(). */
  get native(): number {
    if (this.handle < 0) throw new KvdriveError('E_CLOSED', `GGUF model ${this.file.path}: expected an open model, got use after close()`);
    return this.handle;
  }

  /** The shape an attention backend needs for sequences of up to `seqLen` positions. */
  attentionShape(seqLen: number): AttentionShape {
    const c = this.config;
    return { nLayers: c.nLayers, nHeads: c.nHeads, nKvHeads: c.nKvHeads, headSize: c.headSize, seqLen };
  }

  /** Unmaps the weights. Idempotent. */
  close(): void {
    if (this.handle >= 0) native.ggufModelClose(this.handle);
    this.handle = -1;
  }
}

/**
 * Opens a GGUF model (architectures llama and qwen2; weight types F32, F16, BF16, Q8_0, Q4_0, Q4_K,
 * Q6_K). Malformed or unsupported files are E_MODEL_FORMAT / E_VERSION; missing ones E_NOT_FOUND.
 */
export function loadGgufModel(path: string, options: LoadGgufOptions = {}): GgufModel {
  const r = loadSchema.safeParse(options);
  if (!r.success) fail('E_CONFIG', 'loadGgufModel options', "only { threads?: integer in [1, 1024], weights?: 'huge-pages' | 'mmap' }", options);
  const file = readGguf(path);
  const config = llamaConfig(file);
  const tokenizer = ggufTokenizer(file);
  if (tokenizer.vocabSize !== config.vocabSize)
    fail('E_MODEL_FORMAT', `GGUF ${path} tokenizer.ggml.tokens`, `${config.vocabSize} tokens (token_embd rows)`, tokenizer.vocabSize);
  return new GgufModel(file, config, tokenizer, r.data.threads, r.data.weights);
}

/** One sequence on a GGUF model: its KV cache and the attention backend. */
export class GgufTransformer {
  readonly kCache: Float32Array[];
  readonly vCache: Float32Array[];
  private readonly logits: Float32Array;

  constructor(
    readonly model: GgufModel,
    readonly backend: AttentionBackend,
    /** Positions this sequence may use (the cache holds seqLen × kvDim per layer). */
    readonly seqLen: number,
  ) {
    const c = model.config;
    if (!Number.isInteger(seqLen) || seqLen < 1 || seqLen > c.contextLength)
      fail('E_RANGE', 'GGUF sequence length', `an integer in [1, ${c.contextLength}] (the model's context_length)`, seqLen);
    if (typeof backend !== 'object' || backend === null || typeof backend.attend !== 'function')
      fail('E_CONFIG', 'GgufTransformer backend', 'an AttentionBackend (an object with attend())', backend);
    const kvDim = c.nKvHeads * c.headSize;
    // Huge pages for the cache (advised before its first write): dense decode streams all of it
    // every token, and over 4 KiB pages the page walks cost a large share of that (see weights).
    const cache = (): Float32Array => placedArray(Float32Array, seqLen * kvDim);
    this.kCache = Array.from({ length: c.nLayers }, cache);
    this.vCache = Array.from({ length: c.nLayers }, cache);
    this.logits = new Float32Array(c.vocabSize);
  }

  /** Starts a new sequence: clears the cache and the backend's state. */
  reset(): void {
    for (const a of this.kCache) a.fill(0);
    for (const a of this.vCache) a.fill(0);
    this.backend.reset?.();
  }

  /**
   * Runs `tokens` at positions pos0 .. pos0 + T - 1 (positions must follow each other from 0 for one
   * sequence) and returns the logits after the last one. The returned array is reused until the
   * next call. For a synchronous backend only; a backend that answers with a Promise (the runtime
   * backend) needs {@link forwardAsync}.
   */
  forward(tokens: ArrayLike<number>, pos0: number): Float32Array {
    const run = this.steps(tokens, pos0);
    for (let r = run.next(); ; ) {
      if (r.done) return r.value;
      const out = this.backend.attend(r.value.layer, r.value.pos, r.value.q, this.kCache[r.value.layer]!, this.vCache[r.value.layer]!);
      if (out instanceof Promise) {
        out.catch(() => undefined); // not awaited here: keep it from surfacing as an unhandled rejection
        fail('E_CONFIG', 'GgufTransformer.forward backend', 'a synchronous AttentionBackend (use forwardAsync for this one)', 'a promise from attend()');
      }
      r = run.next(out);
    }
  }

  /** {@link forward} for any backend, synchronous or not (generateGguf uses it). */
  async forwardAsync(tokens: ArrayLike<number>, pos0: number): Promise<Float32Array> {
    const run = this.steps(tokens, pos0);
    for (let r = run.next(); ; ) {
      if (r.done) return r.value;
      r = run.next(await this.backend.attend(r.value.layer, r.value.pos, r.value.q, this.kCache[r.value.layer]!, this.vCache[r.value.layer]!));
    }
  }

  /**
   * The forward pass as a generator: it yields each attention request (layer, position, query) and
   * is resumed with the backend's output, so the sync and async drivers above share one pass.
   */
  private *steps(tokens: ArrayLike<number>, pos0: number): Generator<{ layer: number; pos: number; q: Float32Array }, Float32Array, Float32Array> {
    const c = this.model.config;
    const T = tokens.length;
    if (T < 1) fail('E_SHAPE', 'GGUF forward tokens', 'at least one token', T);
    if (!Number.isInteger(pos0) || pos0 < 0 || pos0 + T > this.seqLen)
      fail('E_RANGE', 'GGUF forward positions', `pos0 + tokens within [0, ${this.seqLen}] (the sequence length)`, `${pos0} + ${T}`);
    const h = this.model.native;
    const qDim = c.nHeads * c.headSize;
    const kvDim = c.nKvHeads * c.headSize;
    const x = new Float32Array(T * c.dim);
    const q = new Float32Array(T * qDim);
    const att = new Float32Array(T * qDim);
    native.ggufModelEmbed(h, Int32Array.from(tokens), x);
    for (let l = 0; l < c.nLayers; l++) {
      const k = this.kCache[l]!.subarray(pos0 * kvDim, (pos0 + T) * kvDim);
      const v = this.vCache[l]!.subarray(pos0 * kvDim, (pos0 + T) * kvDim);
      native.ggufModelAttnPre(h, l, pos0, x, q, k, v);
      for (let t = 0; t < T; t++) {
        const out: Float32Array = yield { layer: l, pos: pos0 + t, q: q.subarray(t * qDim, (t + 1) * qDim) };
        att.set(this.checkOutput(out, l, pos0 + t), t * qDim);
      }
      native.ggufModelAttnPost(h, l, x, att);
    }
    native.ggufModelLogits(h, x.subarray((T - 1) * c.dim), this.logits);
    return this.logits;
  }

  /** Checks what the backend returned for (layer, pos). */
  private checkOutput(out: unknown, layer: number, pos: number): Float32Array {
    const n = this.model.config.nHeads * this.model.config.headSize;
    if (!(out instanceof Float32Array) || out.length !== n)
      fail('E_SHAPE', `attention backend output (layer ${layer}, pos ${pos})`, `Float32Array(${n})`, out);
    return out;
  }
}
