import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { evaluateTrace } from '../src/eval/replay.js';
import { loadCheckpoint } from '../src/model/checkpoint.js';
import { generate } from '../src/model/generate.js';
import { loadTokenizer } from '../src/model/tokenizer.js';
import { openTrace } from '../src/trace/trace.js';
import { fixturesDir } from './helpers.js';
import { tmpDir } from './model-helpers.js';

describe('a trace recorded from the reference host', () => {
  it('opens and validates, and replays through kvdrive/quest/shadowkv at budget 64 within the oracle', async (ctx) => {
    const fx = fixturesDir();
    if (!fx) return ctx.skip();
    const model = loadCheckpoint(join(fx, 'stories260K', 'stories260K.bin'));
    const tokenizer = loadTokenizer(join(fx, 'stories260K', 'tok512.bin'), { vocabSize: model.config.vocabSize });
    const path = join(tmpDir(), 'host.safetensors');
    // 200 positions: a 136-token prompt (so 64 sealed chunks' worth lie outside sinks + local) and 64 decode steps.
    const g = await generate({ model, tokenizer, steps: 200, temperature: 0, traceOut: path, tracePromptTokens: 136 });
    expect(g.positions).toBe(200);

    const reader = await openTrace(path);
    try {
      const { nLayers, nHeads, nKvHeads, headSize } = model.config;
      expect(reader.meta).toEqual({ version: 1, layers: nLayers, qHeads: nHeads, kvHeads: nKvHeads, headDim: headSize, promptTokens: 136, decodeSteps: 64 });
      expect(reader.dtype).toBe('f32');
      for (let l = 0; l < nLayers; l++) {
        const layer = await reader.layer(l);
        expect([layer.k.tokens, layer.k.heads, layer.k.dim]).toEqual([136, nKvHeads, headSize]);
        expect([layer.kNew.tokens, layer.vNew.tokens]).toEqual([64, 64]);
        expect(layer.q.length).toBe(64 * nHeads * headSize);
        for (const a of [layer.k.data, layer.v.data, layer.q, layer.kNew.data, layer.vNew.data])
          expect(a.every((x) => Number.isFinite(x))).toBe(true);
      }

      const ev = await evaluateTrace(reader, { policies: ['kvdrive', 'quest', 'shadowkv'], budget: 64 });
      expect(ev.policies.map((p) => p.policy)).toEqual(['kvdrive', 'quest', 'shadowkv']);
      for (const p of ev.policies) {
        expect(p.steps).toBe(nLayers * 64);
        expect(p.recall).toBeLessThanOrEqual(p.oracleRecall + 1e-6);
        expect(p.recall).toBeGreaterThanOrEqual(0.5);
        expect(p.relError).toBeLessThan(1);
        for (const l of p.layers) {
          expect(l.recall).toBeLessThanOrEqual(l.oracleRecall + 1e-6);
          expect(l.recall).toBeGreaterThanOrEqual(0.5);
          expect(l.relError).toBeLessThan(1);
        }
      }
    } finally {
      await reader.close();
    }
  });
});
