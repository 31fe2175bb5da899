/**
 * Random-weight GGUF files of named real model shapes, for speed tests (no weights can be downloaded
 * here) and, at tiny sizes, for correctness tests. The file is complete and loadable by kvdrive and
 * llama.cpp alike: llama/qwen2 metadata, every tensor of the architecture, Llama 3 RoPE frequency
 * factors where the real model has them, and a small byte-level BPE tokenizer (merges learned from
 * a built-in English sample, the rest of the vocabulary reserved control tokens).
 *
 * Weights are random blocks written directly in the chosen type (quants uniform, block scales set so
 * the weights have standard deviation ≈ 0.02), streamed tensor by tensor in pieces of a few MiB, so
 * an 8B-shaped file never sits in memory.
 */
import { fail } from '../../errors.js';
import { f32ToBf16, f32ToF16 } from '../../util/f16.js';
import { GGML_BLOCKS, type GgmlTypeName, type GgufValue } from './ggml-types.js';
import { writeGguf, type GgufTensorSpec } from './writer.js';

/** A model shape: the hyper-parameters a GGUF file declares. */
export interface ModelShape {
  arch: 'llama' | 'qwen2';
  dim: number;
  hiddenDim: number;
  layers: number;
  heads: number;
  kvHeads: number;
  headSize: number;
  vocab: number;
  context: number;
  ropeBase: number;
  rmsEps: number;
  tiedOutput: boolean;
  /** Llama 3.1+ RoPE frequency scaling (written as rope_freqs.weight). */
  llama3Rope?: { factor: number; lowFreqFactor: number; highFreqFactor: number; originalContext: number };
  /** tokenizer.ggml.pre */
  pre: string;
}

/** Real shapes by name (published configurations). */
export const MODEL_SHAPES: Record<string, ModelShape> = {
  'llama-3.2-1b': {
    arch: 'llama', dim: 2048, hiddenDim: 8192, layers: 16, heads: 32, kvHeads: 8, headSize: 64, vocab: 128256, context: 131072,
    ropeBase: 500000, rmsEps: 1e-5, tiedOutput: true, pre: 'llama-bpe',
    llama3Rope: { factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalContext: 8192 },
  },
  'llama-3-8b': {
    arch: 'llama', dim: 4096, hiddenDim: 14336, layers: 32, heads: 32, kvHeads: 8, headSize: 128, vocab: 128256, context: 8192,
    ropeBase: 500000, rmsEps: 1e-5, tiedOutput: false, pre: 'llama-bpe',
  },
  'qwen2.5-0.5b': {
    arch: 'qwen2', dim: 896, hiddenDim: 4864, layers: 24, heads: 14, kvHeads: 2, headSize: 64, vocab: 151936, context: 32768,
    ropeBase: 1000000, rmsEps: 1e-6, tiedOutput: true, pre: 'qwen2',
  },
};

export const RANDOM_WEIGHT_TYPES = ['F32', 'F16', 'BF16', 'Q8_0', 'Q4_0', 'Q4_K', 'Q6_K'] as const satisfies readonly GgmlTypeName[];
export type RandomWeightType = (typeof RANDOM_WEIGHT_TYPES)[number];

/** Options of {@link writeRandomModel}. */
export interface RandomModelOptions {
  /** A key of MODEL_SHAPES or a whole shape. */
  shape: string | ModelShape;
  /** Matrix weight type (norms and biases are F32). */
  type: RandomWeightType;
  out: string;
  seed?: number;
  /** Overrides of the named shape (e.g. fewer layers or a longer context for a quick test). */
  overrides?: Partial<ModelShape>;
}

/** xorshift128+-style 32-bit generator filling buffers fast and reproducibly. */
class Rng {
  private a: number;
  private b: number;
  constructor(seed: number) {
    this.a = (seed ^ 0x9e3779b9) | 1;
    this.b = Math.imul(seed + 1, 0x85ebca6b) | 1;
  }
  u32(): number {
    let s1 = this.a;
    const s0 = this.b;
    this.a = s0;
    s1 ^= s1 << 23;
    s1 ^= s1 >>> 17;
    s1 ^= s0 ^ (s0 >>> 26);
    this.b = s1;
    return (s0 + s1) >>> 0;
  }
  fill(b: Uint8Array): void {
    const n4 = b.length >> 2;
    const w = new Uint32Array(b.buffer, b.byteOffset, n4);
    for (let i = 0; i < n4; i++) w[i] = this.u32();
    for (let i = n4 * 4; i < b.length; i++) b[i] = this.u32() & 0xff;
  }
  /** Approximately normal (sum of 4 uniforms, centred and scaled to unit variance). */
  normal(): number {
    let s = 0;
    for (let i = 0; i < 4; i++) s += this.u32() / 4294967296;
    return (s - 2) * Math.sqrt(3);
  }
}

const SIGMA = 0.02;

/** Random bytes of `rows` rows of `cols` elements of `type`, with sane block scales. */
function randomRows(rng: Rng, type: RandomWeightType, cols: number, rows: number): Uint8Array {
  const blk = GGML_BLOCKS[type];
  const nBlocks = (cols / blk.elems) * rows;
  const out = new Uint8Array(nBlocks * blk.bytes);
  const dv = new DataView(out.buffer);
  if (type === 'F32' || type === 'F16' || type === 'BF16') {
    for (let i = 0; i < nBlocks; i++) {
      const v = rng.normal() * SIGMA;
      if (type === 'F32') dv.setFloat32(4 * i, v, true);
      else dv.setUint16(2 * i, type === 'F16' ? f32ToF16(v) : f32ToBf16(v), true);
    }
    return out;
  }
  rng.fill(out);
  // Standard deviation of the integer levels: uniform int8 ≈ 73.9, 4-bit − 8 ≈ 4.6, 6-bit − 32 ≈ 18.5.
  for (let b = 0; b < nBlocks; b++) {
    const o = b * blk.bytes;
    switch (type) {
      case 'Q8_0':
        dv.setUint16(o, f32ToF16(SIGMA / 73.9), true);
        break;
      case 'Q4_0':
        dv.setUint16(o, f32ToF16(SIGMA / 4.6), true);
        break;
      case 'Q4_K': {
        // Every sub-block scale and min = 32 (6-bit), dmin = 7.5·d: values d·32·(q − 7.5).
        const d = SIGMA / (32 * 4.6);
        dv.setUint16(o, f32ToF16(d), true);
        dv.setUint16(o + 2, f32ToF16(7.5 * d), true);
        out.fill(0xa0, o + 4, o + 12);
        out.fill(0, o + 12, o + 16);
        break;
      }
      case 'Q6_K':
        out.fill(16, o + 192, o + 208);
        dv.setUint16(o + 208, f32ToF16(SIGMA / (16 * 18.5)), true);
        break;
    }
  }
  return out;
}

/** A tensor streamed in pieces of about 4 MiB of rows. */
function randomTensor(rng: Rng, name: string, type: RandomWeightType, cols: number, rows: number): GgufTensorSpec {
  const rowBytes = (cols / GGML_BLOCKS[type].elems) * GGML_BLOCKS[type].bytes;
  const step = Math.max(1, Math.floor((4 << 20) / rowBytes));
  return {
    name,
    dims: [cols, rows],
    type,
    data: (write) => {
      for (let r = 0; r < rows; r += step) write(randomRows(rng, type, cols, Math.min(step, rows - r)));
    },
  };
}

function f32Vector(name: string, values: Float32Array): GgufTensorSpec {
  return { name, dims: [values.length], type: 'F32', data: new Uint8Array(values.buffer, values.byteOffset, values.byteLength) };
}

/** Llama 3 RoPE factors, as llama.cpp's converter computes them. */
export function llama3RopeFactors(s: ModelShape): Float32Array {
  const r = s.llama3Rope!;
  const half = s.headSize / 2;
  const lowWavelen = r.originalContext / r.lowFreqFactor;
  const highWavelen = r.originalContext / r.highFreqFactor;
  const out = new Float32Array(half);
  for (let i = 0; i < half; i++) {
    const freq = Math.pow(s.ropeBase, (-2 * i) / s.headSize);
    const wavelen = (2 * Math.PI) / freq;
    if (wavelen < highWavelen) out[i] = 1;
    else if (wavelen > lowWavelen) out[i] = r.factor;
    else {
      const smooth = (r.originalContext / wavelen - r.lowFreqFactor) / (r.highFreqFactor - r.lowFreqFactor);
      out[i] = 1 / ((1 - smooth) / r.factor + smooth);
    }
  }
  return out;
}

const SAMPLE_TEXT =
  'Once upon a time there was a little girl who lived in a village near the forest. Whenever she went out, ' +
  'the little girl wore a red riding cloak, so everyone in the village called her Little Red Riding Hood. ' +
  'The quick brown fox jumps over the lazy dog. It is 2026 and the model reads 131072 tokens of context; ' +
  "we don't know what they'll say, but it's worth trying. Attention is all you need, they said, and then " +
  'they needed more memory. Numbers like 3.14159 and 42 and 1000000 appear in text, as do emails and code: ' +
  'function add(a, b) { return a + b; } // comments\n\nNew paragraphs, tabs\tand "quotes" too.';

/** GPT-2's byte → printable character map (see tokenizer.ts). */
function byteChars(): string[] {
  const keep = (b: number): boolean => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  let n = 0;
  return Array.from({ length: 256 }, (_, b) => String.fromCodePoint(keep(b) ? b : 256 + n++));
}

/**
 * A byte-level BPE vocabulary of exactly `vocab` tokens: the 256 byte characters, up to `vocab`
 * − 260 merges learned from the sample text (most frequent pair first), then reserved control
 * tokens; BOS and EOS are the first two control tokens.
 */
export function sampleBpeVocab(vocab: number): { tokens: string[]; types: number[]; merges: string[]; bos: number; eos: number } {
  if (vocab < 260) fail('E_CONFIG', 'random model vocab', 'at least 260 tokens (256 bytes, merges, BOS/EOS)', vocab);
  const chars = byteChars();
  const words = (SAMPLE_TEXT.match(/ ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+/gu) ?? []).map((w) =>
    Array.from(Buffer.from(w, 'utf8'), (b) => chars[b]!),
  );
  const tokens = [...chars];
  const merges: string[] = [];
  const maxMerges = Math.min(vocab - 260, 2000);
  while (merges.length < maxMerges) {
    const counts = new Map<string, number>();
    for (const w of words) for (let i = 0; i + 1 < w.length; i++) counts.set(`${w[i]} ${w[i + 1]}`, (counts.get(`${w[i]} ${w[i + 1]}`) ?? 0) + 1);
    let best = '';
    let bestN = 0;
    for (const [p, n] of counts) if (n > bestN) [best, bestN] = [p, n];
    if (bestN < 2) break;
    const [l, r] = best.split(' ') as [string, string];
    merges.push(best);
    tokens.push(l + r);
    for (const w of words)
      for (let i = 0; i + 1 < w.length; i++)
        if (w[i] === l && w[i + 1] === r) w.splice(i, 2, l + r);
  }
  const types = tokens.map(() => 1);
  const bos = tokens.length;
  tokens.push('<|begin_of_text|>', '<|end_of_text|>');
  while (tokens.length < vocab) tokens.push(`<|reserved_special_token_${tokens.length - bos - 2}|>`);
  while (types.length < vocab) types.push(3);
  return { tokens, types, merges, bos, eos: bos + 1 };
}

/** Writes a random-weight GGUF file; returns its size in bytes. */
export function writeRandomModel(options: RandomModelOptions): number {
  const base = typeof options.shape === 'string' ? MODEL_SHAPES[options.shape] : options.shape;
  if (!base) fail('E_CONFIG', 'random model shape', `one of ${Object.keys(MODEL_SHAPES).join(', ')} or a ModelShape`, options.shape);
  if (!(RANDOM_WEIGHT_TYPES as readonly string[]).includes(options.type)) fail('E_DTYPE', 'random model type', RANDOM_WEIGHT_TYPES.join(', '), options.type);
  const s: ModelShape = { ...base, ...options.overrides };
  const blk = GGML_BLOCKS[options.type].elems;
  const qDim = s.heads * s.headSize;
  const kvDim = s.kvHeads * s.headSize;
  for (const [k, v] of Object.entries({ dim: s.dim, hiddenDim: s.hiddenDim, qDim }))
    if (v % blk !== 0) fail('E_SHAPE', `random model ${k} for ${options.type}`, `a multiple of ${blk} (the block size)`, v);
  const rng = new Rng(options.seed ?? 1);
  const a = s.arch;
  const u32 = (value: number): GgufValue => ({ type: 'u32', value });
  const f32 = (value: number): GgufValue => ({ type: 'f32', value });
  const tok = sampleBpeVocab(s.vocab);
  const metadata: [string, GgufValue][] = [
    ['general.architecture', { type: 'string', value: a }],
    ['general.name', { type: 'string', value: `random ${typeof options.shape === 'string' ? options.shape : a} ${options.type}` }],
    [`${a}.context_length`, u32(s.context)],
    [`${a}.embedding_length`, u32(s.dim)],
    [`${a}.block_count`, u32(s.layers)],
    [`${a}.feed_forward_length`, u32(s.hiddenDim)],
    [`${a}.attention.head_count`, u32(s.heads)],
    [`${a}.attention.head_count_kv`, u32(s.kvHeads)],
    [`${a}.attention.key_length`, u32(s.headSize)],
    [`${a}.attention.value_length`, u32(s.headSize)],
    [`${a}.rope.dimension_count`, u32(s.headSize)],
    [`${a}.rope.freq_base`, f32(s.ropeBase)],
    [`${a}.attention.layer_norm_rms_epsilon`, f32(s.rmsEps)],
    [`${a}.vocab_size`, u32(s.vocab)],
    ['tokenizer.ggml.model', { type: 'string', value: 'gpt2' }],
    ['tokenizer.ggml.pre', { type: 'string', value: s.pre }],
    ['tokenizer.ggml.tokens', { type: 'array', itemType: 'string', value: tok.tokens }],
    ['tokenizer.ggml.token_type', { type: 'array', itemType: 'i32', value: tok.types }],
    ['tokenizer.ggml.merges', { type: 'array', itemType: 'string', value: tok.merges }],
    ['tokenizer.ggml.bos_token_id', u32(tok.bos)],
    ['tokenizer.ggml.eos_token_id', u32(tok.eos)],
    ['tokenizer.ggml.add_bos_token', { type: 'bool', value: a === 'llama' }],
  ];
  const norm = (n: number): Float32Array => Float32Array.from({ length: n }, () => 1 + 0.1 * rng.normal());
  const bias = (n: number): Float32Array => Float32Array.from({ length: n }, () => 0.1 * rng.normal());
  const t = options.type;
  const tensors: GgufTensorSpec[] = [randomTensor(rng, 'token_embd.weight', t, s.dim, s.vocab)];
  if (s.llama3Rope) tensors.push(f32Vector('rope_freqs.weight', llama3RopeFactors(s)));
  tensors.push(f32Vector('output_norm.weight', norm(s.dim)));
  if (!s.tiedOutput) tensors.push(randomTensor(rng, 'output.weight', t, s.dim, s.vocab));
  for (let l = 0; l < s.layers; l++) {
    const p = `blk.${l}.`;
    tensors.push(f32Vector(`${p}attn_norm.weight`, norm(s.dim)));
    tensors.push(randomTensor(rng, `${p}attn_q.weight`, t, s.dim, qDim));
    tensors.push(randomTensor(rng, `${p}attn_k.weight`, t, s.dim, kvDim));
    tensors.push(randomTensor(rng, `${p}attn_v.weight`, t, s.dim, kvDim));
    if (a === 'qwen2') {
      tensors.push(f32Vector(`${p}attn_q.bias`, bias(qDim)));
      tensors.push(f32Vector(`${p}attn_k.bias`, bias(kvDim)));
      tensors.push(f32Vector(`${p}attn_v.bias`, bias(kvDim)));
    }
    tensors.push(randomTensor(rng, `${p}attn_output.weight`, t, qDim, s.dim));
    tensors.push(f32Vector(`${p}ffn_norm.weight`, norm(s.dim)));
    tensors.push(randomTensor(rng, `${p}ffn_gate.weight`, t, s.dim, s.hiddenDim));
    tensors.push(randomTensor(rng, `${p}ffn_up.weight`, t, s.dim, s.hiddenDim));
    tensors.push(randomTensor(rng, `${p}ffn_down.weight`, t, s.hiddenDim, s.dim));
  }
  return writeGguf(options.out, { metadata, tensors });
}
