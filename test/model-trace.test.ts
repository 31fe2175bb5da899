import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadCheckpoint } from '../src/model/checkpoint.js';
import { DenseTsAttention } from '../src/model/dense-attention.js';
import { attentionShape, matmul, rmsnorm, rope, Transformer } from '../src/model/forward.js';
import { generate } from '../src/model/generate.js';
import { TraceRecorder } from '../src/model/trace-recorder.js';
import { loadTokenizer, parseTokenizer } from '../src/model/tokenizer.js';
import { openTrace } from '../src/trace/trace.js';
import { expectKvdError, fixturesDir } from './helpers.js';
import { byteVocab, checkpointBytes, tinyHeader, tmpDir, tokenizerBytes, writeTmp } from './model-helpers.js';

const dir = tmpDir();
const tinyModel = loadCheckpoint(writeTmp(dir, 'tiny.bin', checkpointBytes(tinyHeader, 9)));
const tinyTok = parseTokenizer(tokenizerBytes(byteVocab([' ', ...'abcdefghijklmnopqrstuvwxyz', ...'ABCDEFGHIJKLMN'])));
const c = tinyModel.config;

/** The safetensors header of a file (parsed independently of the trace module). */
function header(path: string): Record<string, { dtype: string; shape: number[] }> & { __metadata__: Record<string, string> } {
  const b = readFileSync(path);
  const n = Number(b.readBigUInt64LE(0));
  return JSON.parse(b.subarray(8, 8 + n).toString('utf8'));
}

describe('trace recording', () => {
  it('writes T prompt positions and S decode steps per layer with the §7 shapes and metadata', async () => {
    const out = join(dir, 'tiny.safetensors');
    const r = await generate({ model: tinyModel, tokenizer: tinyTok, steps: 10, temperature: 0, traceOut: out, tracePromptTokens: 6 });
    expect(r.positions).toBe(10); // the random model must not stop early for this test to mean anything
    const h = header(out);
    expect(JSON.parse(h.__metadata__.kvdrive!)).toEqual({ version: 1, layers: 2, qHeads: 4, kvHeads: 2, headDim: 4, promptTokens: 6, decodeSteps: 4 });
    for (let l = 0; l < 2; l++) {
      expect(h[`layers.${l}.k`]).toMatchObject({ dtype: 'F32', shape: [6, 2, 4] });
      expect(h[`layers.${l}.v`]).toMatchObject({ dtype: 'F32', shape: [6, 2, 4] });
      expect(h[`layers.${l}.q`]).toMatchObject({ dtype: 'F32', shape: [4, 4, 4] });
      expect(h[`layers.${l}.k_new`]).toMatchObject({ dtype: 'F32', shape: [4, 2, 4] });
      expect(h[`layers.${l}.v_new`]).toMatchObject({ dtype: 'F32', shape: [4, 2, 4] });
    }
    expect(r.trace?.promptTokens).toBe(6);
  });

  it('records exactly what the forward pass computed (keys after RoPE, values, queries)', async () => {
    const out = join(dir, 'tiny2.safetensors');
    const r = await generate({ model: tinyModel, tokenizer: tinyTok, steps: 8, temperature: 0, traceOut: out });
    expect(r.trace).toMatchObject({ promptTokens: 4, decodeSteps: 4 }); // default: half
    // Replay the same tokens and compare with the host's KV cache.
    const t = new Transformer(tinyModel, new DenseTsAttention(attentionShape(c)));
    r.tokens.slice(0, 8).forEach((tok, pos) => t.forward(tok, pos));
    const trace = await openTrace(out);
    try {
      for (let l = 0; l < c.nLayers; l++) {
        const layer = await trace.layer(l);
        expect(Array.from(layer.k.data)).toEqual(Array.from(t.kCache[l]!.subarray(0, 4 * c.kvDim)));
        expect(Array.from(layer.v.data)).toEqual(Array.from(t.vCache[l]!.subarray(0, 4 * c.kvDim)));
        expect(Array.from(layer.kNew.data)).toEqual(Array.from(t.kCache[l]!.subarray(4 * c.kvDim, 8 * c.kvDim)));
        expect(Array.from(layer.vNew.data)).toEqual(Array.from(t.vCache[l]!.subarray(4 * c.kvDim, 8 * c.kvDim)));
      }
      // Layer 0's query at decode step s is RoPE(Wq · rmsnorm(embedding[token at T+s]), T+s).
      const layer0 = await trace.layer(0);
      for (let s = 0; s < 4; s++) {
        const tok = r.tokens[4 + s]!;
        const xb = new Float32Array(c.dim);
        rmsnorm(xb, tinyModel.tokenEmbedding.subarray(tok * c.dim, (tok + 1) * c.dim), tinyModel.layers[0]!.rmsAtt);
        const q = new Float32Array(c.dim);
        matmul(q, xb, tinyModel.layers[0]!.wq, c.dim, c.dim);
        rope(q, 4 + s, c.headSize);
        expect(Array.from(layer0.q.subarray(s * c.dim, (s + 1) * c.dim))).toEqual(Array.from(q));
      }
    } finally {
      await trace.close();
    }
  });

  it('records a stories260K trace with the model shape', async (ctx) => {
    const fx = fixturesDir();
    if (!fx) return ctx.skip();
    const model = loadCheckpoint(join(fx, 'stories260K', 'stories260K.bin'));
    const tokenizer = loadTokenizer(join(fx, 'stories260K', 'tok512.bin'), { vocabSize: 512 });
    const out = join(dir, 'stories.safetensors');
    await generate({ model, tokenizer, steps: 24, temperature: 0, traceOut: out });
    const trace = await openTrace(out);
    try {
      expect(trace.meta).toEqual({ version: 1, layers: 5, qHeads: 8, kvHeads: 4, headDim: 8, promptTokens: 12, decodeSteps: 12 });
      const l4 = await trace.layer(4);
      expect([l4.k.tokens, l4.k.heads, l4.k.dim]).toEqual([12, 4, 8]);
      expect(l4.q.length).toBe(12 * 8 * 8);
      expect(l4.q.every(Number.isFinite)).toBe(true);
    } finally {
      await trace.close();
    }
  });

  it('rejects prompt splits that leave no prompt or no decode step', async () => {
    const rec = new TraceRecorder(c, 4);
    const t = new Transformer(tinyModel, new DenseTsAttention(attentionShape(c)), rec);
    t.forward(1, 0);
    await expectKvdError(() => rec.write(join(dir, 'one.safetensors')), 'E_RANGE', /trace prompt tokens: expected an integer in \[1, 0\] \(1 positions were generated\), got 0/);
    t.forward(5, 1);
    t.forward(6, 2);
    await expectKvdError(() => rec.write(join(dir, 'x.safetensors'), 3), 'E_RANGE', /expected an integer in \[1, 2\]/);
    await expect(rec.write(join(dir, 'ok.safetensors'), 2)).resolves.toMatchObject({ promptTokens: 2, decodeSteps: 1 });
    await expectKvdError(() => new TraceRecorder(c, 33), 'E_RANGE', /trace recorder positions: expected an integer in \[1, 32\]/);
  });
});
