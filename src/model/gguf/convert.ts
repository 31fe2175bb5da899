/**
 * llama2.c checkpoint + tokenizer → GGUF (architecture `llama`, tokenizer model `llama` with its
 * tokens, scores and token types inside the file), the way llama.cpp lays such a model out:
 * token_embd, output_norm, output (absent when the classifier is shared), then per layer attn_norm,
 * attn_q/k/v/output, ffn_norm, ffn_gate/up/down. llama2.c weights already rotate adjacent pairs,
 * as GGUF `llama` does, so no permutation is needed. Norm gains stay F32; matrices are written in
 * the chosen type, or F32 where their row length is not a multiple of that type's block.
 *
 * Tokenizer pieces: llama2.c stores spaces as ' '; SentencePiece (and GGUF) as "▁" (U+2581). Token 0
 * is unknown, 1/2 (BOS/EOS) are control tokens named <s> / </s>, "<0xXX>" pieces are byte tokens.
 */
import { basename } from 'node:path';
import { failFormat } from '../format-error.js';
import { loadCheckpoint } from '../checkpoint.js';
import { loadTokenizer } from '../tokenizer.js';
import { GGML_BLOCKS, type GgufValue } from './ggml-types.js';
import { QUANTIZE_TYPES, quantize, type QuantizeType } from './quant.js';
import { writeGguf, type GgufTensorSpec } from './writer.js';
import { z } from 'zod';
import { fail } from '../../errors.js';

/** Options of {@link convertLlama2c}. */
export interface ConvertOptions {
  /** llama2.c checkpoint (.bin). */
  model: string;
  /** llama2.c tokenizer (.bin) of that checkpoint. */
  tokenizer: string;
  /** GGUF file to write. */
  out: string;
  /** Weight type of the matrices (default F32: the exact weights). */
  type?: QuantizeType;
}

/** What {@link convertLlama2c} wrote. */
export interface ConvertResult {
  bytes: number;
  tensors: number;
  /** Matrices kept in F32 because their rows do not fill whole blocks of the chosen type. */
  keptF32: string[];
}

const FILE_TYPE: Record<QuantizeType, number> = { F32: 0, F16: 1, Q4_0: 2, Q8_0: 7, BF16: 32 };

/** Converts a llama2.c checkpoint and tokenizer into one GGUF file. */
const convertSchema = z
  .object({
    model: z.string().min(1),
    tokenizer: z.string().min(1),
    out: z.string().min(1),
    type: z.enum(QUANTIZE_TYPES).optional(),
  })
  .strict();

export function convertLlama2c(options: ConvertOptions): ConvertResult {
  if (!convertSchema.safeParse(options).success)
    fail('E_CONFIG', 'convertLlama2c options', `{ model: path, tokenizer: path, out: path, type?: one of ${QUANTIZE_TYPES.join(', ')} }`, options);
  const type = options.type ?? 'F32';
  const ck = loadCheckpoint(options.model);
  const tok = loadTokenizer(options.tokenizer, { vocabSize: ck.config.vocabSize });
  const c = ck.config;
  const utf8 = new TextDecoder('utf-8', { fatal: true });
  const tokens: string[] = [];
  const scores: number[] = [];
  const types: number[] = [];
  for (let id = 0; id < tok.vocabSize; id++) {
    let piece: string;
    try {
      piece = utf8.decode(tok.piece(id));
    } catch {
      failFormat('E_MODEL_FORMAT', `tokenizer ${options.tokenizer} token ${id}`, 'a UTF-8 piece (GGUF stores pieces as strings)', 'invalid UTF-8');
    }
    const isByte = /^<0x[0-9A-Fa-f]{2}>$/.test(piece);
    tokens.push(id === 1 ? '<s>' : id === 2 ? '</s>' : isByte ? piece : piece.replaceAll(' ', '\u2581'));
    scores.push(tok.score(id));
    types.push(id === 0 ? 2 : id === 1 || id === 2 ? 3 : isByte ? 6 : 1);
  }

  const u32 = (value: number): GgufValue => ({ type: 'u32', value });
  const metadata: [string, GgufValue][] = [
    ['general.architecture', { type: 'string', value: 'llama' }],
    ['general.name', { type: 'string', value: basename(options.model).replace(/\.bin$/, '') }],
    ['general.file_type', u32(FILE_TYPE[type])],
    ['llama.context_length', u32(c.seqLen)],
    ['llama.embedding_length', u32(c.dim)],
    ['llama.block_count', u32(c.nLayers)],
    ['llama.feed_forward_length', u32(c.hiddenDim)],
    ['llama.attention.head_count', u32(c.nHeads)],
    ['llama.attention.head_count_kv', u32(c.nKvHeads)],
    ['llama.rope.dimension_count', u32(c.headSize)],
    ['llama.rope.freq_base', { type: 'f32', value: 10000 }],
    ['llama.attention.layer_norm_rms_epsilon', { type: 'f32', value: 1e-5 }],
    ['tokenizer.ggml.model', { type: 'string', value: 'llama' }],
    ['tokenizer.ggml.tokens', { type: 'array', itemType: 'string', value: tokens }],
    ['tokenizer.ggml.scores', { type: 'array', itemType: 'f32', value: scores }],
    ['tokenizer.ggml.token_type', { type: 'array', itemType: 'i32', value: types }],
    ['tokenizer.ggml.bos_token_id', u32(1)],
    ['tokenizer.ggml.eos_token_id', u32(2)],
    ['tokenizer.ggml.unknown_token_id', u32(0)],
    ['tokenizer.ggml.add_bos_token', { type: 'bool', value: true }],
    ['tokenizer.ggml.add_eos_token', { type: 'bool', value: false }],
  ];

  const keptF32: string[] = [];
  const tensors: GgufTensorSpec[] = [];
  const norm = (name: string, w: Float32Array): void => {
    tensors.push({ name, dims: [w.length], type: 'F32', data: quantize(w, 'F32') });
  };
  const matrix = (name: string, w: Float32Array, cols: number): void => {
    const t: QuantizeType = cols % GGML_BLOCKS[type].elems === 0 ? type : 'F32';
    if (t !== type) keptF32.push(name);
    tensors.push({ name, dims: [cols, w.length / cols], type: t, data: quantize(w, t) });
  };
  matrix('token_embd.weight', ck.tokenEmbedding, c.dim);
  norm('output_norm.weight', ck.rmsFinal);
  if (!c.sharedClassifier) matrix('output.weight', ck.wcls, c.dim);
  ck.layers.forEach((L, l) => {
    norm(`blk.${l}.attn_norm.weight`, L.rmsAtt);
    matrix(`blk.${l}.attn_q.weight`, L.wq, c.dim);
    matrix(`blk.${l}.attn_k.weight`, L.wk, c.dim);
    matrix(`blk.${l}.attn_v.weight`, L.wv, c.dim);
    matrix(`blk.${l}.attn_output.weight`, L.wo, c.dim);
    norm(`blk.${l}.ffn_norm.weight`, L.rmsFfn);
    matrix(`blk.${l}.ffn_gate.weight`, L.w1, c.dim);
    matrix(`blk.${l}.ffn_up.weight`, L.w3, c.dim);
    matrix(`blk.${l}.ffn_down.weight`, L.w2, c.hiddenDim);
  });
  const bytes = writeGguf(options.out, { metadata, tensors });
  return { bytes, tensors: tensors.length, keptF32 };
}
