/**
 * Checked against llama.cpp: node-llama-cpp (a development/benchmark dependency installed only in
 * bench/llama-cpp/, `npm install --omit=optional` there) loads the same GGUF files with its prebuilt
 * CPU build. Skipped with a notice when it is not installed.
 */
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DenseTsAttention } from '../src/model/dense-attention.js';
import { convertLlama2c } from '../src/model/gguf/convert.js';
import { generateGguf } from '../src/model/gguf/generate.js';
import { GgufTransformer, loadGgufModel } from '../src/model/gguf/model.js';
import { MODEL_SHAPES, writeRandomModel, type RandomWeightType } from '../src/model/gguf/random-model.js';
import { fixturesDir } from './helpers.js';
import { tmpDir } from './model-helpers.js';
import { variedStrings } from './gguf-strings.js';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const entry = join(root, 'bench', 'llama-cpp', 'node_modules', 'node-llama-cpp', 'dist', 'index.js');
const present = existsSync(entry);
if (!present) console.warn(`NOTICE: node-llama-cpp not installed (${entry}); llama.cpp comparison tests are skipped (npm install --omit=optional in bench/llama-cpp)`);

/* eslint-disable @typescript-eslint/no-explicit-any */
let llama: any;
const dir = tmpDir();

async function open(path: string): Promise<{ model: any; seq: any; dispose: () => Promise<void> }> {
  const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
  // One thread: the checks are of tokens and logits, and on a shared machine a 2-thread llama.cpp pool
  // spins for a core others hold (the stories test took 45-60 s of its 60 s timeout under load).
  const ctx = await model.createContext({ contextSize: 256, threads: 1, flashAttention: false });
  return { model, seq: ctx.getSequence(), dispose: async () => (await ctx.dispose(), await model.dispose()) };
}

/** llama.cpp's raw logits after the last of `tokens` (a fresh sequence). */
async function llamaLogits(seq: any, tokens: number[], vocab: number): Promise<Float32Array> {
  const r = await seq.controlledEvaluate(tokens.map((t, i) => (i === tokens.length - 1 ? [t, { generateNext: { logits: true } }] : t)));
  const out = new Float32Array(vocab);
  for (const [k, v] of r[tokens.length - 1].next.logits as Map<number, number>) out[k] = v;
  return out;
}

/** ‖(a − mean a) − (b − mean b)‖ / ‖b − mean b‖: logits are defined up to a constant. */
function centredRelErr(a: Float32Array, b: Float32Array): number {
  const ma = a.reduce((s, v) => s + v, 0) / a.length;
  const mb = b.reduce((s, v) => s + v, 0) / b.length;
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.length; i++) {
    num += (a[i]! - ma - (b[i]! - mb)) ** 2;
    den += (b[i]! - mb) ** 2;
  }
  return Math.sqrt(num / den);
}

describe.skipIf(!present)('kvdrive against llama.cpp (node-llama-cpp)', () => {
  beforeAll(async () => {
    const mod = await import(entry);
    llama = await mod.getLlama({ gpu: false, build: 'never', logLevel: 'error' });
  });
  afterAll(async () => llama?.dispose?.());

  it('stories260K GGUF: same greedy tokens (dense) and same tokenizer ids on 120 varied strings', async (ctx) => {
    const fx = fixturesDir();
    if (!fx) return ctx.skip();
    const path = join(dir, 'stories.gguf');
    convertLlama2c({ model: join(fx, 'stories260K', 'stories260K.bin'), tokenizer: join(fx, 'stories260K', 'tok512.bin'), out: path });
    const ours = loadGgufModel(path);
    const ll = await open(path);
    try {
      for (const s of variedStrings()) expect(ll.model.tokenize(s), JSON.stringify(s)).toEqual(ours.tokenizer.encode(s, { bos: false }));
      const g = await generateGguf({ model: ours, prompt: 'One day, a cat', steps: 120, temperature: 0 });
      const prompt = g.tokens.slice(0, g.promptTokens);
      let input: unknown[] = prompt.map((t, i) => (i === prompt.length - 1 ? [t, { generateNext: { token: true, options: { temperature: 0 } } }] : t));
      const theirs = [...prompt];
      while (theirs.length < g.tokens.length) {
        const r = await ll.seq.controlledEvaluate(input);
        const next = r[input.length - 1].next.token as number;
        theirs.push(next);
        input = [[next, { generateNext: { token: true, options: { temperature: 0 } } }]];
      }
      expect(g.tokens.length).toBeGreaterThan(100);
      expect(theirs).toEqual(g.tokens);
    } finally {
      ours.close();
      await ll.dispose();
    }
  });

  const cases: [string, RandomWeightType, number][] = [
    ['qwen2.5-0.5b', 'F32', 2e-3],
    ['qwen2.5-0.5b', 'Q8_0', 2e-2],
    ['llama-3.2-1b', 'F16', 2e-3],
    ['llama-3.2-1b', 'Q4_K', 2e-2],
  ];
  for (const [shapeName, type, tol] of cases) {
    it(`random ${shapeName}-shaped ${type}: logits within ${tol} (centred relative L2), same argmax, same BPE ids`, async () => {
      const vocab = 400;
      const shape = { ...MODEL_SHAPES[shapeName]!, dim: 256, hiddenDim: 512, layers: 2, heads: 4, kvHeads: 2, headSize: 64, vocab, context: 256 };
      const path = join(dir, `${shapeName}-${type}.gguf`);
      writeRandomModel({ shape, type, out: path, seed: 3 });
      const ours = loadGgufModel(path);
      const ll = await open(path);
      try {
        for (const s of variedStrings()) expect(ll.model.tokenize(s), JSON.stringify(s)).toEqual(ours.tokenizer.encode(s, { bos: false }));
        const tokens = [5, 17, 200, 3, 99, 42, 7];
        const ref = await llamaLogits(ll.seq, tokens, vocab);
        const tf = new GgufTransformer(ours, new DenseTsAttention(ours.attentionShape(16)), 16);
        let logits!: Float32Array;
        tokens.forEach((t, p) => (logits = tf.forward([t], p)));
        expect(centredRelErr(logits, ref)).toBeLessThan(tol);
        expect(logits.indexOf(Math.max(...logits))).toBe(ref.indexOf(Math.max(...ref)));
      } finally {
        ours.close();
        await ll.dispose();
      }
    });
  }
});
