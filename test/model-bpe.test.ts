import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { bpeMerge, bpeMergeNaive, type PairLookup } from '../src/model/bpe.js';
import { loadTokenizer } from '../src/model/tokenizer.js';
import { fixturesDir, rng } from './helpers.js';

describe('bpeMerge', () => {
  it('equals the quadratic llama2.c loop on random vocabularies with many score ties', () => {
    const r = rng(42);
    for (let trial = 0; trial < 200; trial++) {
      // Symbols are strings over 'abc'; a random set of concatenations are pieces with scores in {0,1,2}.
      const pieces = ['a', 'b', 'c'];
      const ids = new Map(pieces.map((p, i) => [p, i]));
      const scores = [0, 0, 0];
      for (let k = 0; k < 40; k++) {
        const p = pieces[Math.floor(r() * pieces.length)]! + pieces[Math.floor(r() * pieces.length)]!;
        if (p.length <= 6 && !ids.has(p)) {
          ids.set(p, pieces.length);
          pieces.push(p);
          scores.push(Math.floor(r() * 3));
        }
      }
      const lookup: PairLookup = (a, b) => {
        const id = ids.get(pieces[a]! + pieces[b]!);
        return id === undefined ? undefined : { id, score: scores[id]! };
      };
      const syms = Array.from({ length: Math.floor(r() * 30) }, () => Math.floor(r() * 3));
      expect(bpeMerge(syms, lookup)).toEqual(bpeMergeNaive(syms, lookup));
    }
  });

  it('handles empty and single-symbol input', () => {
    const none: PairLookup = () => undefined;
    expect(bpeMerge([], none)).toEqual([]);
    expect(bpeMerge([7], none)).toEqual([7]);
  });

  it('equals the quadratic loop with the stories260K vocabulary on text', (ctx) => {
    const fx = fixturesDir();
    if (!fx) return ctx.skip();
    const tok = loadTokenizer(join(fx, 'stories260K', 'tok512.bin'), { vocabSize: 512 });
    // Reach the piece table through the public API: piece bytes per id.
    const latin = Array.from({ length: 512 }, (_, i) => Buffer.from(tok.piece(i)).toString('latin1'));
    const byPiece = new Map<string, number>();
    latin.forEach((p, i) => byPiece.has(p) || byPiece.set(p, i));
    const text = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "Let\'s go!" said Tom.';
    const ids = tok.encode(text, { bos: false });
    // Re-split into single characters and merge them with the naive loop.
    const chars = [...(' ' + text)].map((ch) => byPiece.get(ch)!);
    expect(chars.every((c) => c !== undefined)).toBe(true);
    const lookup: PairLookup = (a, b) => {
      const id = byPiece.get(latin[a]! + latin[b]!);
      return id === undefined ? undefined : { id, score: tok.score(id) };
    };
    expect(bpeMergeNaive(chars, lookup)).toEqual(ids);
  });
});
