/**
 * Llama-family hyper-parameters and tensor table from a parsed GGUF file: architectures `llama`
 * (Llama 2/3, TinyLlama, SmolLM; RoPE on adjacent pairs) and `qwen2` (QKV bias; RoPE on pairs
 * (i, i + d/2), "neox" style). Every expected tensor is checked for presence and shape here, so a
 * file that does not match its own metadata is an E_MODEL_FORMAT error naming the tensor.
 *
 * GGUF conventions: metadata keys are `<arch>.<name>` (e.g. llama.embedding_length); a weight matrix
 * of `out` rows × `in` columns has ne = [in, out]; the output head `output.weight` is absent when it
 * is tied to `token_embd.weight`; Llama 3.1+ files carry per-frequency RoPE factors in
 * `rope_freqs.weight` (ropeDim / 2 f32 divisors of the rotation frequencies).
 */
import { closeSync, openSync, readSync } from 'node:fs';
import { failFormat } from '../format-error.js';
import type { GgmlTypeName } from './ggml-types.js';
import { GgufMeta, type GgufFile, type GgufTensorInfo } from './reader.js';

export const ARCHITECTURES = ['llama', 'qwen2'] as const;
export type Architecture = (typeof ARCHITECTURES)[number];

/** Model hyper-parameters read from GGUF metadata. */
export interface LlamaConfig {
  arch: Architecture;
  /** Residual width (embedding_length). */
  dim: number;
  /** FFN inner width (feed_forward_length). */
  hiddenDim: number;
  nLayers: number;
  nHeads: number;
  nKvHeads: number;
  headSize: number;
  vocabSize: number;
  /** Training context length (context_length): the most positions a sequence may use. */
  contextLength: number;
  /** Leading dims of each head that RoPE rotates. */
  ropeDim: number;
  /** True: pairs (i, i + ropeDim/2) (qwen2); false: pairs (2i, 2i+1) (llama). */
  ropeNeox: boolean;
  ropeBase: number;
  rmsEps: number;
  /** True when the output head is the token embedding. */
  tiedOutput: boolean;
  /** Weight type of the first layer's attn_q (for display). */
  weightType: GgmlTypeName;
}

/** Tensor names per layer role, as native/model/model_bindings.cc expects them. */
const LAYER_TENSORS = ['attn_norm', 'attn_q', 'attn_k', 'attn_v', 'attn_output', 'ffn_norm', 'ffn_gate', 'ffn_up', 'ffn_down'] as const;
const BIAS_TENSORS = ['attn_q_bias', 'attn_k_bias', 'attn_v_bias'] as const;

/** A tensor descriptor handed to the native model: absolute offset, GGML type code, ne0, ne1. */
export interface NativeTensor {
  offset: number;
  type: number;
  ne0: number;
  ne1: number;
}

/** Reads the configuration; unknown architectures and inconsistent values are E_MODEL_FORMAT. */
export function llamaConfig(file: GgufFile): LlamaConfig {
  const m = new GgufMeta(file);
  const arch = m.string('general.architecture');
  if (!(ARCHITECTURES as readonly string[]).includes(arch))
    failFormat('E_MODEL_FORMAT', `GGUF ${file.path} general.architecture`, `one of ${ARCHITECTURES.join(', ')}`, JSON.stringify(arch));
  const a = arch as Architecture;
  const dim = m.int(`${a}.embedding_length`);
  const nHeads = m.int(`${a}.attention.head_count`);
  const nKvHeads = m.int(`${a}.attention.head_count_kv`, nHeads);
  const headSize = m.int(`${a}.attention.key_length`, nHeads > 0 ? Math.floor(dim / nHeads) : 0);
  const valueLength = m.int(`${a}.attention.value_length`, headSize);
  const embd = file.tensorByName.get('token_embd.weight');
  if (!embd) failFormat('E_MODEL_FORMAT', `GGUF ${file.path} tensor "token_embd.weight"`, 'present', 'no such tensor');
  const c: LlamaConfig = {
    arch: a,
    dim,
    hiddenDim: m.int(`${a}.feed_forward_length`),
    nLayers: m.int(`${a}.block_count`),
    nHeads,
    nKvHeads,
    headSize,
    vocabSize: embd.dims[1] ?? 0,
    contextLength: m.int(`${a}.context_length`),
    ropeDim: m.int(`${a}.rope.dimension_count`, headSize),
    ropeNeox: a === 'qwen2',
    ropeBase: m.float(`${a}.rope.freq_base`, 10000),
    rmsEps: m.float(`${a}.attention.layer_norm_rms_epsilon`, 1e-5),
    tiedOutput: !file.tensorByName.has('output.weight'),
    weightType: file.tensorByName.get('blk.0.attn_q.weight')?.type ?? embd.type,
  };
  const positive = { dim, hiddenDim: c.hiddenDim, nLayers: c.nLayers, nHeads, nKvHeads, headSize, vocabSize: c.vocabSize, contextLength: c.contextLength };
  for (const [k, v] of Object.entries(positive))
    if (!(v >= 1)) failFormat('E_MODEL_FORMAT', `GGUF ${file.path} ${k}`, 'an integer ≥ 1', String(v));
  if (nHeads % nKvHeads !== 0)
    failFormat('E_MODEL_FORMAT', `GGUF ${file.path} head counts`, 'head_count divisible by head_count_kv', `${nHeads} and ${nKvHeads}`);
  if (valueLength !== headSize)
    failFormat('E_MODEL_FORMAT', `GGUF ${file.path} ${a}.attention.value_length`, `the key length ${headSize}`, String(valueLength));
  if (c.ropeDim < 2 || c.ropeDim > headSize || c.ropeDim % 2 !== 0)
    failFormat('E_MODEL_FORMAT', `GGUF ${file.path} ${a}.rope.dimension_count`, `an even number in [2, ${headSize}]`, String(c.ropeDim));
  if (m.has(`${a}.rope.scaling.type`) && !['none', 'linear', 'llama3'].includes(m.string(`${a}.rope.scaling.type`)))
    failFormat('E_MODEL_FORMAT', `GGUF ${file.path} ${a}.rope.scaling.type`, '"none", "linear" or "llama3"', JSON.stringify(m.string(`${a}.rope.scaling.type`)));
  return c;
}

function expectTensor(file: GgufFile, name: string, dims: number[]): GgufTensorInfo {
  const t = file.tensorByName.get(name);
  if (!t) failFormat('E_MODEL_FORMAT', `GGUF ${file.path} tensor "${name}"`, `present with shape [${dims.join(', ')}]`, 'no such tensor');
  const got = t.dims.length === 1 && dims.length === 2 && dims[1] === 1 ? [t.dims[0]!, 1] : t.dims;
  if (got.length !== dims.length || got.some((d, i) => d !== dims[i]))
    failFormat('E_MODEL_FORMAT', `GGUF ${file.path} tensor "${name}" shape`, `[${dims.join(', ')}]`, `[${t.dims.join(', ')}]`);
  return t;
}

function native(t: GgufTensorInfo, typeCode: (n: GgmlTypeName) => number): NativeTensor {
  return { offset: t.offset, type: typeCode(t.type), ne0: t.dims[0]!, ne1: t.dims[1] ?? 1 };
}

/** The tensor table the native model opens, every tensor's presence and shape checked. */
export function nativeTensors(file: GgufFile, c: LlamaConfig, typeCode: (n: GgmlTypeName) => number) {
  const qDim = c.nHeads * c.headSize;
  const kvDim = c.nKvHeads * c.headSize;
  const shapes: Record<(typeof LAYER_TENSORS)[number] | (typeof BIAS_TENSORS)[number], number[]> = {
    attn_norm: [c.dim],
    attn_q: [c.dim, qDim],
    attn_k: [c.dim, kvDim],
    attn_v: [c.dim, kvDim],
    attn_output: [qDim, c.dim],
    ffn_norm: [c.dim],
    ffn_gate: [c.dim, c.hiddenDim],
    ffn_up: [c.dim, c.hiddenDim],
    ffn_down: [c.hiddenDim, c.dim],
    attn_q_bias: [qDim],
    attn_k_bias: [kvDim],
    attn_v_bias: [kvDim],
  };
  const layers: Record<string, NativeTensor>[] = [];
  for (let l = 0; l < c.nLayers; l++) {
    const layer: Record<string, NativeTensor> = {};
    for (const role of LAYER_TENSORS) layer[role] = native(expectTensor(file, `blk.${l}.${role}.weight`, shapes[role]), typeCode);
    if (c.arch === 'qwen2')
      for (const role of BIAS_TENSORS) layer[role] = native(expectTensor(file, `blk.${l}.${role.replace('_bias', '')}.bias`, shapes[role]), typeCode);
    layers.push(layer);
  }
  const embd = expectTensor(file, 'token_embd.weight', [c.dim, c.vocabSize]);
  const output = c.tiedOutput ? embd : expectTensor(file, 'output.weight', [c.dim, c.vocabSize]);
  return {
    token_embd: native(embd, typeCode),
    output: native(output, typeCode),
    output_norm: native(expectTensor(file, 'output_norm.weight', [c.dim]), typeCode),
    layers,
  };
}

/**
 * RoPE rotation frequencies (radians per position) of pairs 0 .. ropeDim/2 - 1:
 * base^(-2i/ropeDim), divided by the file's `rope_freqs.weight` factors (Llama 3 frequency scaling)
 * when present and scaled by 1/factor under linear RoPE scaling.
 */
export function ropeFrequencies(file: GgufFile, c: LlamaConfig): Float32Array {
  const half = c.ropeDim / 2;
  const m = new GgufMeta(file);
  let scale = 1;
  if (m.string(`${c.arch}.rope.scaling.type`, 'none') === 'linear') {
    const factor = m.float(`${c.arch}.rope.scaling.factor`, 1);
    if (!(factor > 0)) failFormat('E_MODEL_FORMAT', `GGUF ${file.path} ${c.arch}.rope.scaling.factor`, 'a number > 0', String(factor));
    scale = 1 / factor;
  }
  let factors: Float32Array | undefined;
  const rf = file.tensorByName.get('rope_freqs.weight');
  if (rf) {
    if (rf.type !== 'F32' || rf.elements !== half)
      failFormat('E_MODEL_FORMAT', `GGUF ${file.path} tensor "rope_freqs.weight"`, `F32 with ${half} elements (rope dimension / 2)`, `${rf.type} with ${rf.elements}`);
    const buf = Buffer.alloc(rf.bytes);
    const fd = openSync(file.path, 'r');
    try {
      readSync(fd, buf, 0, rf.bytes, rf.offset);
    } finally {
      closeSync(fd);
    }
    factors = new Float32Array(buf.buffer, buf.byteOffset, half);
  }
  const out = new Float32Array(half);
  for (let i = 0; i < half; i++) out[i] = (Math.pow(c.ropeBase, (-2 * i) / c.ropeDim) * scale) / (factors ? factors[i]! : 1);
  return out;
}
