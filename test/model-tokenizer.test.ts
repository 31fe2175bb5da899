import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadTokenizer, parseTokenizer, type Tokenizer } from '../src/model/tokenizer.js';
import { expectKvdError, fixturesDir } from './helpers.js';
import { byteVocab, tmpDir, tokenizerBytes, writeTmp } from './model-helpers.js';

const dir = tmpDir();
// Scores: higher merges first. 'bc' outranks 'ab'; ' ab' exists but ' a' does not.
const extra = [' ', 'a', 'b', 'c', 'ab', 'bc', ' ab', 'x'];
const extraScores = [0, 0, 0, 0, -5, -1, -2, 0];
const pieces = byteVocab(extra);
const scores = pieces.map((_, i) => (i < 259 ? 0 : extraScores[i - 259]!));
const tiny = parseTokenizer(tokenizerBytes(pieces, scores));
const id = (p: string): number => 259 + extra.indexOf(p);

describe('Tokenizer (synthetic vocabulary)', () => {
  it('adds BOS and the dummy-space prefix, then merges by score', () => {
    expect(tiny.encode('ab')).toEqual([1, id(' ab')]);
    // 'bc' (score -1) merges before 'ab' (-5), leaving ' ', 'a', 'bc'; ' a' is not a piece.
    expect(tiny.encode('abc')).toEqual([1, id(' '), id('a'), id('bc')]);
  });

  it('honours bos/eos flags and encodes the empty string to BOS alone', () => {
    expect(tiny.encode('x', { bos: false, eos: true })).toEqual([id(' '), id('x'), 2]);
    expect(tiny.encode('')).toEqual([1]);
    expect(tiny.encode('', { bos: false })).toEqual([]);
  });

  it('falls back to byte tokens (byte + 3) for characters not in the vocabulary', () => {
    expect(tiny.encode('é', { bos: false })).toEqual([id(' '), 0xc3 + 3, 0xa9 + 3]);
    expect(tiny.decode(tiny.encode('é'))).toBe('é');
  });

  it('decodes byte tokens to bytes and drops the leading space after BOS only', () => {
    expect(Array.from(tiny.decodePiece(5, 0x41 + 3))).toEqual([0x41]);
    expect(Buffer.from(tiny.decodePiece(1, id(' ab'))).toString()).toBe('ab');
    expect(Buffer.from(tiny.decodePiece(7, id(' ab'))).toString()).toBe(' ab');
    expect(tiny.decode([1, id(' ab'), id(' ab'), 2])).toBe('ab ab');
  });

  it('rejects token ids outside the vocabulary with E_RANGE', async () => {
    await expectKvdError(() => tiny.decodePiece(1, 267 + 1000), 'E_RANGE', /token id: expected an integer in \[0, 267\), got 1267/);
    await expectKvdError(() => tiny.decode([1, -1]), 'E_RANGE', /got -1/);
  });

  it('without byte-fallback tokens an unknown character is E_RANGE', async () => {
    const t = parseTokenizer(tokenizerBytes(['<unk>', '<s>', '</s>', ' ', 'a']));
    expect(t.encode('a a')).toEqual([1, 3, 4, 3, 4]);
    await expectKvdError(() => t.encode('é'), 'E_RANGE', /byte 0xc3: expected a vocabulary piece or a byte-fallback token/);
  });
});

describe('Tokenizer (stories260K fixture)', () => {
  const load = (): Tokenizer | undefined => {
    const fx = fixturesDir();
    return fx ? loadTokenizer(join(fx, 'stories260K', 'tok512.bin'), { vocabSize: 512 }) : undefined;
  };

  // it.for (not it.each) passes the test context second, so ctx.skip() works without the fixture.
  it.for([
    'Once upon a time, there was a little girl named Lily.',
    'She said, "I can\'t find it!"\nThe end.',
    '  two leading spaces and  double  spaces ',
    'Ünïcödé, 日本語 and an emoji 🐶 fall back to bytes',
    'tabs\tand\r\nCRLF ~[x]|<y>',
  ])('round-trips %j', (text, ctx) => {
    const tok = load();
    if (!tok) return ctx.skip();
    const ids = tok.encode(text);
    expect(ids[0]).toBe(1);
    expect(ids.every((t) => Number.isInteger(t) && t >= 0 && t < 512)).toBe(true);
    expect(tok.decode(ids)).toBe(text);
  });

  it('merges common words into single pieces', (ctx) => {
    const tok = load();
    if (!tok) return ctx.skip();
    const ids = tok.encode('Once upon a time');
    // BPE must do far better than one token per character (16 chars + dummy space).
    expect(ids.length).toBeLessThan(10);
    expect(tok.decode(ids)).toBe('Once upon a time');
  });
});

describe('loadTokenizer errors', () => {
  const good = tokenizerBytes(pieces, scores);

  it('missing file → E_NOT_FOUND', async () => {
    await expectKvdError(() => loadTokenizer(join(dir, 'none.bin')), 'E_NOT_FOUND', /tokenizer not found/);
  });

  it('shorter than max_token_length → E_MODEL_FORMAT', async () => {
    const p = writeTmp(dir, 't2.bin', good.subarray(0, 2));
    await expectKvdError(() => loadTokenizer(p), 'E_MODEL_FORMAT', /expected at least 4 bytes \(max_token_length\), got 2 bytes/);
  });

  it('truncated inside a piece → E_MODEL_FORMAT', async () => {
    const p = writeTmp(dir, 't3.bin', good.subarray(0, good.length - 1));
    await expectKvdError(() => loadTokenizer(p), 'E_MODEL_FORMAT', /token 266 bytes: expected 1 bytes at offset \d+, got 0 bytes \(file truncated\)/);
  });

  it('truncated inside a score/length pair → E_MODEL_FORMAT', async () => {
    const p = writeTmp(dir, 't4.bin', good.subarray(0, 4 + 8 + 5 + 3));
    await expectKvdError(() => loadTokenizer(p), 'E_MODEL_FORMAT', /token 1: expected 8 bytes \(score, length\) at offset 17, got 3 bytes/);
  });

  it('fewer tokens than the model vocab → E_MODEL_FORMAT', async () => {
    const p = writeTmp(dir, 't5.bin', good);
    await expectKvdError(() => loadTokenizer(p, { vocabSize: 512 }), 'E_MODEL_FORMAT', /token 267: .*file truncated; vocab size 512/);
  });

  it('more tokens than the model vocab → E_MODEL_FORMAT', async () => {
    const p = writeTmp(dir, 't6.bin', good);
    await expectKvdError(() => loadTokenizer(p, { vocabSize: 260 }), 'E_MODEL_FORMAT', /expected exactly 260 tokens \(the model's vocab size\).* trailing\)/);
    expect(loadTokenizer(p, { vocabSize: 267 }).vocabSize).toBe(267);
  });

  it('corrupt header or entries → E_MODEL_FORMAT', async () => {
    const badMax = Buffer.from(good);
    badMax.writeInt32LE(0, 0);
    await expectKvdError(() => parseTokenizer(badMax), 'E_MODEL_FORMAT', /max_token_length: expected an integer in \[1, 65536\], got 0/);
    const badLen = Buffer.from(good);
    badLen.writeInt32LE(-4, 4 + 4); // token 0's length
    await expectKvdError(() => parseTokenizer(badLen), 'E_MODEL_FORMAT', /token 0 length: expected an integer in \[0, 6\] \(max_token_length\), got -4/);
    const longLen = Buffer.from(good);
    longLen.writeInt32LE(7, 4 + 4);
    await expectKvdError(() => parseTokenizer(longLen), 'E_MODEL_FORMAT', /token 0 length: .* got 7/);
    const nanScore = Buffer.from(good);
    nanScore.writeFloatLE(Number.NaN, 4);
    await expectKvdError(() => parseTokenizer(nanScore), 'E_MODEL_FORMAT', /token 0 score: expected a finite float, got NaN/);
  });

  it('a truncated copy of the fixture tokenizer → E_MODEL_FORMAT', async (ctx) => {
    const fx = fixturesDir();
    if (!fx) return ctx.skip();
    const bytes = readFileSync(join(fx, 'stories260K', 'tok512.bin'));
    const p = writeTmp(dir, 'tok-trunc.bin', bytes.subarray(0, Math.floor(bytes.length * 0.7)));
    await expectKvdError(() => loadTokenizer(p, { vocabSize: 512 }), 'E_MODEL_FORMAT', /file truncated/);
  });
});
