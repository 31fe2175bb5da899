/** The native GGUF forward pass against an independent TS reference, for every weight type, both architectures and SIMD levels. */
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { cpuFeatures, native, setSimdLevel } from '../src/native.js';
import { DenseTsAttention } from '../src/model/dense-attention.js';
import { loadGgufModel, GgufTransformer } from '../src/model/gguf/model.js';
import { MODEL_SHAPES, RANDOM_WEIGHT_TYPES, writeRandomModel, type ModelShape } from '../src/model/gguf/random-model.js';
import { referenceLogits } from './gguf-reference.js';
import { relErr } from './attention-reference.js';
import { tmpDir } from './model-helpers.js';
import { expectKvdError } from './helpers.js';

const dir = tmpDir();
/** Tiny shapes; 256-wide rows so the K-quants (256-element blocks) fit. */
const tinyLlama: ModelShape = { ...MODEL_SHAPES['llama-3.2-1b']!, dim: 256, hiddenDim: 512, layers: 2, heads: 4, kvHeads: 2, headSize: 64, vocab: 300, context: 64 };
const tinyQwen: ModelShape = { ...MODEL_SHAPES['qwen2.5-0.5b']!, dim: 256, hiddenDim: 256, layers: 2, heads: 4, kvHeads: 1, headSize: 64, vocab: 320, context: 64 };

function nativeLogits(path: string, tokens: number[], chunk: number): Float32Array[] {
  const m = loadGgufModel(path, { threads: 2 });
  try {
    const tf = new GgufTransformer(m, new DenseTsAttention(m.attentionShape(tokens.length)), tokens.length);
    const out: Float32Array[] = [];
    for (let p = 0; p < tokens.length; p += chunk) {
      const n = Math.min(chunk, tokens.length - p);
      // Logits of a chunk are its last position's; compare those positions.
      out[p + n - 1] = tf.forward(tokens.slice(p, p + n), p).slice();
    }
    return out;
  } finally {
    m.close();
  }
}

afterAll(() => setSimdLevel('best'));

describe('GGUF forward pass', () => {
  const tokens = [5, 17, 200, 3, 99, 42, 7, 250];
  for (const [name, shape] of [['llama (Llama 3 RoPE factors)', tinyLlama], ['qwen2 (QKV bias, neox RoPE)', tinyQwen]] as const) {
    for (const type of RANDOM_WEIGHT_TYPES) {
      it(`${name} ${type}: logits equal the TS reference at every SIMD level, decode (Q8_0 activations for Q8_0/Q4_0) and chunked prefill`, () => {
        const path = join(dir, `${shape.arch}-${type}.gguf`);
        writeRandomModel({ shape, type, out: path, seed: 7 });
        const refDecode = referenceLogits(path, tokens, 'all');
        const refPrefill = referenceLogits(path, tokens, 'output');
        for (const level of cpuFeatures().levels) {
          setSimdLevel(level);
          const dec = nativeLogits(path, tokens, 1);
          for (let p = 0; p < tokens.length; p++) expect(relErr(dec[p]!, refDecode[p]!), `${level} pos ${p}`).toBeLessThan(1e-4);
          const pre = nativeLogits(path, tokens, 3);
          for (const p of [2, 5, 7]) expect(relErr(pre[p]!, refPrefill[p]!), `${level} chunked pos ${p}`).toBeLessThan(1e-4);
        }
      });
    }
  }
});

describe('GGUF model arguments are checked', () => {
  it('token ids, positions, activation lengths, layers and use after close are typed errors', async () => {
    const path = join(dir, 'args.gguf');
    writeRandomModel({ shape: tinyLlama, type: 'Q8_0', out: path });
    const m = loadGgufModel(path);
    const tf = new GgufTransformer(m, new DenseTsAttention(m.attentionShape(8)), 8);
    await expectKvdError(() => tf.forward([tinyLlama.vocab], 0), 'E_RANGE', /token id in \[0, 300\), got 300/);
    await expectKvdError(() => tf.forward([1, 2], 7), 'E_RANGE', /within \[0, 8\]/);
    await expectKvdError(() => new GgufTransformer(m, new DenseTsAttention(m.attentionShape(8)), 65), 'E_RANGE', /context_length/);
    const x = new Float32Array(256);
    const q = new Float32Array(256);
    const kv = new Float32Array(128);
    await expectKvdError(() => native.ggufModelAttnPre(m.native, 0, 0, new Float32Array(100), q, kv, kv), 'E_SHAPE', /multiple of 256/);
    await expectKvdError(() => native.ggufModelAttnPre(m.native, 0, 0, x, q, new Float32Array(64), kv), 'E_SHAPE', /kvHeads/);
    await expectKvdError(() => native.ggufModelAttnPre(m.native, 2, 0, x, q, kv, kv), 'E_RANGE', /layer: expected an integer in \[0, 1\]/);
    await expectKvdError(() => native.ggufModelLogits(m.native, x, new Float32Array(10)), 'E_SHAPE', /vocab/);
    m.close();
    await expectKvdError(() => tf.forward([1], 0), 'E_CLOSED');
  });
});

describe('GGUF weight placement', () => {
  it("weights 'huge-pages' (the default) and 'mmap' give bit-identical logits; other values are E_CONFIG", async () => {
    const path = join(dir, 'placement.gguf');
    writeRandomModel({ shape: tinyLlama, type: 'Q4_K', out: path, seed: 3 });
    const run = (weights?: 'huge-pages' | 'mmap'): Float32Array[] => {
      const m = loadGgufModel(path, weights ? { weights } : {});
      try {
        const tf = new GgufTransformer(m, new DenseTsAttention(m.attentionShape(4)), 4);
        return [tf.forward([5, 17, 200], 0).slice(), tf.forward([3], 3).slice()];
      } finally {
        m.close();
      }
    };
    const mapped = run('mmap');
    for (const w of [undefined, 'huge-pages'] as const) {
      const other = run(w);
      for (let i = 0; i < mapped.length; i++) expect(Buffer.from(other[i]!.buffer).equals(Buffer.from(mapped[i]!.buffer))).toBe(true);
    }
    await expectKvdError(() => loadGgufModel(path, { weights: 'disk' as 'mmap' }), 'E_CONFIG', /weights\?: 'huge-pages' \| 'mmap'/);
    expect(native.adviseHugePages(new Float32Array(8))).toBe(0); // no whole 2 MiB page inside: nothing advised
    await expectKvdError(() => native.adviseHugePages([1, 2, 3]), 'E_TYPE', /expected a TypedArray/);
  });
});
