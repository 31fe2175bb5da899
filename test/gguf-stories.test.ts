/** stories260K converted to GGUF runs through the native forward pass with the llama2.c path's greedy text. */
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadCheckpoint } from '../src/model/checkpoint.js';
import { generate } from '../src/model/generate.js';
import { loadTokenizer } from '../src/model/tokenizer.js';
import { convertLlama2c } from '../src/model/gguf/convert.js';
import { generateGguf } from '../src/model/gguf/generate.js';
import { loadGgufModel } from '../src/model/gguf/model.js';
import { fixturesDir } from './helpers.js';
import { tmpDir } from './model-helpers.js';

const fx = fixturesDir();

describe.skipIf(!fx)('stories260K as GGUF', () => {
  const dir = join(fx ?? '', 'stories260K');
  const ckPath = join(dir, 'stories260K.bin');
  const tokPath = join(dir, 'tok512.bin');

  it('greedy text and tokens equal the llama2.c path (dense attention), prefill chunked or not', async () => {
    const out = join(tmpDir(), 's.gguf');
    const r = convertLlama2c({ model: ckPath, tokenizer: tokPath, out });
    expect(r.keptF32).toEqual([]);
    const model = loadGgufModel(out);
    try {
      expect(model.config).toMatchObject({ arch: 'llama', dim: 64, nLayers: 5, nHeads: 8, nKvHeads: 4, vocabSize: 512, contextLength: 512, tiedOutput: true });
      const ck = loadCheckpoint(ckPath);
      const tok = loadTokenizer(tokPath, { vocabSize: ck.config.vocabSize });
      for (const prompt of ['Once upon a time', 'Lily saw a big red ball and', '']) {
        const ref = await generate({ model: ck, tokenizer: tok, prompt, steps: 160, temperature: 0 });
        expect(ref.tokens.length).toBeGreaterThan(40);
        expect(model.tokenizer.encode(prompt)).toEqual(tok.encode(prompt));
        for (const prefillChunk of [1, 64]) {
          const g = await generateGguf({ model, prompt, steps: 160, temperature: 0, prefillChunk });
          expect(g.tokens).toEqual(ref.tokens);
          expect(g.text).toBe(ref.text);
          expect(g.stoppedBy).toBe(ref.stoppedBy);
        }
      }
    } finally {
      model.close();
    }
  });
});
