/**
 * Loader for llama2.c checkpoints (the `.bin` files written by llama2.c's export scripts, "legacy"
 * version 0 format).
 *
 * File layout (little-endian):
 *   header: 7 × int32 — dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len.
 *           A negative vocab_size means the classifier (wcls) is stored separately at the end;
 *           positive means it is shared with the token embedding.
 *   weights, f32, in this order (each row-major, the layer index outermost):
 *     token_embedding [vocab, dim]
 *     rms_att [L, dim]
 *     wq [L, dim, nHeads*headSize]      wk, wv [L, dim, nKvHeads*headSize] (stored out × in, see below)
 *     wo [L, nHeads*headSize, dim]
 *     rms_ffn [L, dim]
 *     w1 [L, hidden, dim]  w2 [L, dim, hidden]  w3 [L, hidden, dim]
 *     rms_final [dim]
 *     two legacy RoPE tables (freq_cis_real, freq_cis_imag) of seq_len*headSize/2 each — skipped
 *     wcls [vocab, dim] only when not shared.
 * Every matrix W is stored as out-rows × in-columns, so `y = W x` is `y[i] = Σ_j W[i*in + j] x[j]`.
 *
 * The weights are exposed as Float32Array views of one buffer (no per-tensor copies).
 */
import { readFileSync, statSync } from 'node:fs';
import { endianness } from 'node:os';
import { KvdriveError, fail } from '../errors.js';
import { failFormat } from './format-error.js';

/** Model hyper-parameters from the checkpoint header, plus the values derived from them. */
export interface ModelConfig {
  /** Residual stream width. */
  dim: number;
  /** FFN inner width. */
  hiddenDim: number;
  nLayers: number;
  /** Query heads. */
  nHeads: number;
  /** Key/value heads (GQA: each kv head serves nHeads / nKvHeads query heads). */
  nKvHeads: number;
  vocabSize: number;
  /** Maximum context length (positions 0 .. seqLen-1). */
  seqLen: number;
  /** dim / nHeads. */
  headSize: number;
  /** nKvHeads * headSize: width of one position's K (or V) across all kv heads. */
  kvDim: number;
  /** True when the classifier is the token embedding (header vocab_size > 0). */
  sharedClassifier: boolean;
}

/** One transformer block's weights (views into the checkpoint buffer). */
export interface LayerWeights {
  /** RMSNorm gain before attention, [dim]. */
  rmsAtt: Float32Array;
  /** [dim (out), dim (in)]. */
  wq: Float32Array;
  /** [kvDim (out), dim (in)]. */
  wk: Float32Array;
  /** [kvDim (out), dim (in)]. */
  wv: Float32Array;
  /** [dim (out), dim (in)]. */
  wo: Float32Array;
  /** RMSNorm gain before the FFN, [dim]. */
  rmsFfn: Float32Array;
  /** [hiddenDim (out), dim (in)] — gate projection. */
  w1: Float32Array;
  /** [dim (out), hiddenDim (in)] — down projection. */
  w2: Float32Array;
  /** [hiddenDim (out), dim (in)] — up projection. */
  w3: Float32Array;
}

/** A loaded checkpoint: configuration and weights. */
export interface Checkpoint {
  /** Path the checkpoint was read from. */
  path: string;
  config: ModelConfig;
  /** [vocab, dim]. */
  tokenEmbedding: Float32Array;
  layers: LayerWeights[];
  /** [dim]. */
  rmsFinal: Float32Array;
  /** Classifier [vocab, dim]; the same array as tokenEmbedding when shared. */
  wcls: Float32Array;
}

const HEADER_BYTES = 7 * 4;
/** "ak42" read as a little-endian uint32: the magic of llama2.c's versioned export formats. */
const LLAMA2C_MAGIC = 0x616b3432;

/**
 * Upper bounds for header fields. They are far above any llama2.c-format model (Llama-2 70B has
 * dim 8192, 80 layers) and only exist to reject garbage headers before doing arithmetic on them.
 */
const LIMITS = {
  dim: 1 << 16,
  hidden_dim: 1 << 18,
  n_layers: 1 << 10,
  n_heads: 1 << 10,
  n_kv_heads: 1 << 10,
  vocab_size: 1 << 22,
  seq_len: 1 << 22,
} as const;

/** Reads a whole file, turning fs errors into typed errors (E_NOT_FOUND / E_IO). */
export function readModelFile(path: string, what: string): Buffer {
  if (typeof path !== 'string' || path.length === 0) fail('E_CONFIG', `${what} path`, 'a non-empty string', path);
  try {
    const st = statSync(path);
    if (!st.isFile()) failFormat('E_MODEL_FORMAT', `${what} ${path}`, 'a regular file', st.isDirectory() ? 'a directory' : 'a special file');
    return readFileSync(path);
  } catch (e) {
    if (e instanceof KvdriveError) throw e;
    const code = (e as { code?: string }).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') throw new KvdriveError('E_NOT_FOUND', `${what} not found: ${path}`, { cause: e });
    throw new KvdriveError('E_IO', `cannot read ${what} ${path}: ${(e as Error).message}`, { cause: e });
  }
}

/** Parses and validates the 7-int32 header. */
export function parseCheckpointHeader(buf: Uint8Array, path = '<buffer>'): ModelConfig {
  if (buf.byteLength < HEADER_BYTES)
    failFormat('E_MODEL_FORMAT', `checkpoint ${path} header`, `at least ${HEADER_BYTES} bytes`, `${buf.byteLength} bytes`);
  const dv = new DataView(buf.buffer, buf.byteOffset, HEADER_BYTES);
  // llama2.c's newer exports (export.py --version 1/2) start with the magic "ak42" and a version.
  if (dv.getUint32(0, true) === LLAMA2C_MAGIC)
    failFormat('E_VERSION', `checkpoint ${path}`, 'the legacy llama2.c format (export.py --version 0: a 7-int32 header)', `the "ak42" format version ${dv.getInt32(4, true)}`);
  const names = ['dim', 'hidden_dim', 'n_layers', 'n_heads', 'n_kv_heads', 'vocab_size', 'seq_len'] as const;
  const h = {} as Record<(typeof names)[number], number>;
  names.forEach((n, i) => (h[n] = dv.getInt32(i * 4, true)));
  const sharedClassifier = h.vocab_size > 0;
  const vocabSize = Math.abs(h.vocab_size);
  for (const n of names) {
    const v = n === 'vocab_size' ? vocabSize : h[n];
    if (v <= 0 || v > LIMITS[n])
      fail('E_MODEL_FORMAT', `checkpoint ${path} header field ${n}`, `an integer in [1, ${LIMITS[n]}]`, h[n]);
  }
  if (h.n_heads % h.n_kv_heads !== 0)
    failFormat('E_MODEL_FORMAT', `checkpoint ${path} header`, `n_heads divisible by n_kv_heads`, `n_heads ${h.n_heads}, n_kv_heads ${h.n_kv_heads}`);
  if (h.dim % h.n_heads !== 0)
    failFormat('E_MODEL_FORMAT', `checkpoint ${path} header`, `dim divisible by n_heads`, `dim ${h.dim}, n_heads ${h.n_heads}`);
  const headSize = h.dim / h.n_heads;
  // RoPE rotates (even, odd) pairs inside each head.
  if (headSize % 2 !== 0)
    fail('E_MODEL_FORMAT', `checkpoint ${path} header`, `an even head size (dim / n_heads)`, headSize);
  return {
    dim: h.dim,
    hiddenDim: h.hidden_dim,
    nLayers: h.n_layers,
    nHeads: h.n_heads,
    nKvHeads: h.n_kv_heads,
    vocabSize,
    seqLen: h.seq_len,
    headSize,
    kvDim: h.n_kv_heads * headSize,
    sharedClassifier,
  };
}

/** Number of f32 values after the header, without the separate classifier. */
function bodyFloats(c: ModelConfig): number {
  const { dim, hiddenDim: hd, nLayers: L, vocabSize: V, seqLen, headSize, kvDim } = c;
  return (
    V * dim + // token embedding
    L * dim + // rms_att
    L * dim * dim + // wq
    2 * L * dim * kvDim + // wk, wv
    L * dim * dim + // wo
    L * dim + // rms_ffn
    3 * L * dim * hd + // w1, w2, w3
    dim + // rms_final
    seqLen * headSize // two legacy RoPE tables of seqLen*headSize/2
  );
}

/** Expected file size in bytes for a header. */
export function expectedCheckpointBytes(c: ModelConfig): number {
  return HEADER_BYTES + 4 * (bodyFloats(c) + (c.sharedClassifier ? 0 : c.vocabSize * c.dim));
}

/**
 * Loads a llama2.c checkpoint. Throws E_NOT_FOUND when the file is missing and E_MODEL_FORMAT when
 * it is shorter than the header, has an invalid header, or its size differs from what the header
 * implies. The file is read whole into memory (Node reads at most 2 GiB at once; larger files are
 * E_IO). The weights are little-endian f32 viewed in place, so the host must be little-endian.
 */
export function loadCheckpoint(path: string): Checkpoint {
  if (endianness() !== 'LE') fail('E_INTERNAL', 'host byte order', 'little-endian (llama2.c checkpoints are little-endian)', endianness());
  const buf = readModelFile(path, 'checkpoint');
  const config = parseCheckpointHeader(buf, path);
  const expected = expectedCheckpointBytes(config);
  if (buf.byteLength !== expected) {
    // Say so when the size fits the other classifier variant: the sign of vocab_size is wrong.
    const otherVariant = expectedCheckpointBytes({ ...config, sharedClassifier: !config.sharedClassifier });
    const hint =
      buf.byteLength === otherVariant
        ? ` (that is the size with ${config.sharedClassifier ? 'a separate' : 'a shared'} classifier; the sign of vocab_size says otherwise)`
        : '';
    failFormat(
      'E_MODEL_FORMAT',
      `checkpoint ${path} size`,
      `${expected} bytes for dim ${config.dim}, hidden_dim ${config.hiddenDim}, n_layers ${config.nLayers}, n_heads ${config.nHeads}, n_kv_heads ${config.nKvHeads}, vocab_size ${config.vocabSize} (${config.sharedClassifier ? 'shared' : 'separate'} classifier), seq_len ${config.seqLen}`,
      `${buf.byteLength} bytes${hint}`,
    );
  }
  // A Float32Array view needs a 4-byte aligned offset; copy only if the Buffer is not aligned.
  const nFloats = (buf.byteLength - HEADER_BYTES) / 4;
  const start = buf.byteOffset + HEADER_BYTES;
  const floats =
    start % 4 === 0
      ? new Float32Array(buf.buffer, start, nFloats)
      : new Float32Array(new Uint8Array(buf.buffer, start, nFloats * 4).slice().buffer);

  let off = 0;
  const take = (n: number): Float32Array => {
    const v = floats.subarray(off, off + n);
    off += n;
    return v;
  };
  const { dim, hiddenDim, nLayers, vocabSize, seqLen, headSize, kvDim } = config;
  const tokenEmbedding = take(vocabSize * dim);
  // Each tensor is stacked over layers; slice it into per-layer views.
  const perLayer = (n: number): Float32Array[] => {
    const all = take(nLayers * n);
    return Array.from({ length: nLayers }, (_, l) => all.subarray(l * n, (l + 1) * n));
  };
  const rmsAtt = perLayer(dim);
  const wq = perLayer(dim * dim);
  const wk = perLayer(dim * kvDim);
  const wv = perLayer(dim * kvDim);
  const wo = perLayer(dim * dim);
  const rmsFfn = perLayer(dim);
  const w1 = perLayer(dim * hiddenDim);
  const w2 = perLayer(hiddenDim * dim);
  const w3 = perLayer(dim * hiddenDim);
  const rmsFinal = take(dim);
  take(seqLen * headSize); // legacy freq_cis_real + freq_cis_imag; RoPE is computed on the fly
  const wcls = config.sharedClassifier ? tokenEmbedding : take(vocabSize * dim);
  if (off !== nFloats) throw new KvdriveError('E_INTERNAL', `checkpoint layout: consumed ${off} floats of ${nFloats}`);

  const layers: LayerWeights[] = [];
  for (let l = 0; l < nLayers; l++) {
    layers.push({ rmsAtt: rmsAtt[l]!, wq: wq[l]!, wk: wk[l]!, wv: wv[l]!, wo: wo[l]!, rmsFfn: rmsFfn[l]!, w1: w1[l]!, w2: w2[l]!, w3: w3[l]! });
  }
  return { path, config, tokenEmbedding, layers, rmsFinal, wcls };
}
