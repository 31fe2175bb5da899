/** GGUF tokenizers: SentencePiece-style against the llama2.c tokenizer, byte-level BPE by construction. */
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadTokenizer } from '../src/model/tokenizer.js';
import { convertLlama2c } from '../src/model/gguf/convert.js';
import { readGguf } from '../src/model/gguf/reader.js';
import { ggufTokenizer, GgufTokenizer } from '../src/model/gguf/tokenizer.js';
import { MODEL_SHAPES, writeRandomModel } from '../src/model/gguf/random-model.js';
import { fixturesDir } from './helpers.js';
import { tmpDir } from './model-helpers.js';
import { variedStrings } from './gguf-strings.js';

const dir = tmpDir();

describe('GGUF SentencePiece tokenizer (llama)', () => {
  it('gives the llama2.c tokenizer ids and text on 120 varied strings (stories260K converted)', (ctx) => {
    const fx = fixturesDir();
    if (!fx) return ctx.skip();
    const tokPath = join(fx, 'stories260K', 'tok512.bin');
    const out = join(dir, 's.gguf');
    convertLlama2c({ model: join(fx, 'stories260K', 'stories260K.bin'), tokenizer: tokPath, out });
    const g = ggufTokenizer(readGguf(out));
    const ref = loadTokenizer(tokPath, { vocabSize: 512 });
    const strings = variedStrings();
    expect(strings.length).toBeGreaterThanOrEqual(100);
    for (const s of strings) {
      const ids = g.encode(s);
      expect(ids, JSON.stringify(s)).toEqual(ref.encode(s));
      expect(g.decode(ids)).toBe(ref.decode(ids));
    }
  });
});

describe('GGUF byte-level BPE tokenizer (gpt2)', () => {
  it('merges by rank, leftmost first, and round-trips 120 varied strings', () => {
    const path = join(dir, 'bpe.gguf');
    writeRandomModel({ shape: { ...MODEL_SHAPES['llama-3.2-1b']!, dim: 32, hiddenDim: 32, layers: 1, heads: 1, kvHeads: 1, headSize: 32, vocab: 1000 }, type: 'F32', out: path });
    const t = ggufTokenizer(readGguf(path));
    expect(t.addBos).toBe(true);
    for (const s of variedStrings()) {
      const ids = t.encode(s, { bos: false });
      expect(t.decode(ids), JSON.stringify(s)).toBe(s);
    }
    // Frequent words of the sample text become single tokens; rare ones stay split.
    expect(t.encode(' the', { bos: false })).toHaveLength(1);
    expect(t.encode(' zyx', { bos: false }).length).toBeGreaterThan(1);
  });

  it('known answers on a hand-made vocabulary: pre-tokenizer split and rank order', () => {
    // Byte chars for "a", "b", " " (Ġ = U+0120), then merges.
    const tokens = ['a', 'b', 'c', '\u0120', 'ab', 'bc', 'abc', '\u0120a', '<s>'];
    const merges = ['b c', 'a b', 'a bc', '\u0120 a'];
    const t = new GgufTokenizer('gpt2', tokens, { merges, types: tokens.map((_, i) => (i === 8 ? 3 : 1)), bos: 8, eos: 8, addBos: false, pre: 'qwen2' });
    // "abc": ranks b c (0) before a b (1) → a + bc → abc.
    expect(t.encode('abc')).toEqual([6]);
    // " ab": pre-tokens " ab" → Ġ a b: a b (rank 1) before Ġ a (rank 3) → Ġ + ab (no merge Ġ ab).
    expect(t.encode(' ab')).toEqual([3, 4]);
    expect(t.decode([3, 4, 6])).toBe(' ababc');
  });
});
