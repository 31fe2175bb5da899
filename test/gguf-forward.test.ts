/** The native GGUF forward pass against an independent TS reference, for every weight type, both architectures and SIMD levels. */
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { cpuFeatures, setSimdLevel } from '../src/native.js';
import { DenseTsAttention } from '../src/model/dense-attention.js';
import { loadGgufModel, GgufTransformer } from '../src/model/gguf/model.js';
import { MODEL_SHAPES, RANDOM_WEIGHT_TYPES, writeRandomModel, type ModelShape } from '../src/model/gguf/random-model.js';
import { referenceLogits } from './gguf-reference.js';
import { relErr } from './attention-reference.js';
import { tmpDir } from './model-helpers.js';

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
