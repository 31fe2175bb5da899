import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { AttentionBackend } from '../src/model/attention-backend.js';
import { loadCheckpoint, type Checkpoint } from '../src/model/checkpoint.js';
import { DenseTsAttention } from '../src/model/dense-attention.js';
import { attentionShape } from '../src/model/forward.js';
import { generate, type GenerateOptions } from '../src/model/generate.js';
import { Sampler } from '../src/model/sampler.js';
import { loadTokenizer, parseTokenizer, type Tokenizer } from '../src/model/tokenizer.js';
import { expectKvdError, fixturesDir } from './helpers.js';
import { byteVocab, checkpointBytes, tinyHeader, tmpDir, tokenizerBytes, writeTmp } from './model-helpers.js';

const LILY = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park.';

function stories(): { model: Checkpoint; tokenizer: Tokenizer } | undefined {
  const fx = fixturesDir();
  if (!fx) return undefined;
  const model = loadCheckpoint(join(fx, 'stories260K', 'stories260K.bin'));
  return { model, tokenizer: loadTokenizer(join(fx, 'stories260K', 'tok512.bin'), { vocabSize: model.config.vocabSize }) };
}

// Fixture-free model + tokenizer (vocab 300 = 259 special/byte tokens + 41 pieces).
const tinyModel = loadCheckpoint(writeTmp(tmpDir(), 'tiny.bin', checkpointBytes(tinyHeader, 5)));
const tinyTok = parseTokenizer(tokenizerBytes(byteVocab([' ', ...'abcdefghijklmnopqrstuvwxyz', ...'ABCDEFGHIJKLMN'])));

describe('generate with stories260K', () => {
  it('greedy decoding from BOS tells the story of Lily', async (ctx) => {
    const s = stories();
    if (!s) return ctx.skip();
    const r = await generate({ ...s, steps: 40, temperature: 0 });
    expect(r.text.startsWith(LILY)).toBe(true);
    expect(r.tokens[0]).toBe(1);
    expect(r.positions).toBe(40);
    expect(r.tokens.length).toBe(41); // BOS + one sampled token per position
    expect(r.stoppedBy).toBe('steps');
    expect(r.timings.tokensPerSecond).toBeGreaterThan(0);
  });

  it('continues a prompt, streaming pieces that add up to the text', async (ctx) => {
    const s = stories();
    if (!s) return ctx.skip();
    const pieces: string[] = [];
    const r = await generate({ ...s, prompt: 'Tom had a big dog', steps: 30, temperature: 0, onToken: (t) => pieces.push(t) });
    expect(r.text.startsWith('Tom had a big dog')).toBe(true);
    expect(r.text.length).toBeGreaterThan('Tom had a big dog'.length + 10);
    expect(pieces.join('')).toBe(r.text);
    expect(r.tokens.slice(0, r.promptTokens)).toEqual(s.tokenizer.encode('Tom had a big dog'));
  });

  it('sampling is reproducible for a seed and differs between seeds', async (ctx) => {
    const s = stories();
    if (!s) return ctx.skip();
    const a = await generate({ ...s, steps: 40, temperature: 1, seed: 7 });
    const b = await generate({ ...s, steps: 40, temperature: 1, seed: 7 });
    const c = await generate({ ...s, steps: 40, temperature: 1, seed: 8 });
    expect(b.tokens).toEqual(a.tokens);
    expect(c.tokens).not.toEqual(a.tokens);
  });

  it('a user backend sees every layer and position and gives the same tokens as the default', async (ctx) => {
    const s = stories();
    if (!s) return ctx.skip();
    const dense = new DenseTsAttention(attentionShape(s.model.config));
    let calls = 0;
    const backend: AttentionBackend = { attend: (...args) => (calls++, dense.attend(...args)) };
    const r = await generate({ ...s, steps: 12, temperature: 0, backend });
    expect(calls).toBe(12 * s.model.config.nLayers);
    expect(r.tokens).toEqual((await generate({ ...s, steps: 12, temperature: 0 })).tokens);
  });
});

describe('generate option validation', () => {
  const base: GenerateOptions = { model: tinyModel, tokenizer: tinyTok, steps: 4 };

  it('runs on a fixture-free model', async () => {
    const r = await generate({ ...base, temperature: 0 });
    expect(r.positions).toBeLessThanOrEqual(4);
    expect(r.tokens.every((t) => t >= 0 && t < 300)).toBe(true);
  });

  it.each([
    [{ steps: 0 }, 'E_CONFIG', /generate option steps: expected .*>=1, got 0/],
    [{ steps: 2.5 }, 'E_CONFIG', /generate option steps/],
    [{ temperature: -1 }, 'E_CONFIG', /generate option temperature: .*got -1/],
    [{ topP: 1.5 }, 'E_CONFIG', /generate option topP/],
    [{ seed: 'x' }, 'E_CONFIG', /generate option seed: expected number, got "x"/],
    [{ backend: {} }, 'E_CONFIG', /generate option backend: expected an object with an attend\(\) method/],
    [{ tokenizer: {} }, 'E_CONFIG', /generate option tokenizer: expected a Tokenizer/],
    [{ bogus: 1 }, 'E_CONFIG', /generate options: expected only model, tokenizer, .*, got unknown bogus/],
    [{ steps: 33 }, 'E_RANGE', /generate steps: expected an integer in \[1, 32\] \(seq_len\), got 33/],
    [{ prompt: 'abcdefghij' }, 'E_RANGE', /generate prompt: expected at most 4 tokens including BOS \(steps\), got \d+ tokens/],
    [{ tracePromptTokens: 2 }, 'E_CONFIG', /tracePromptTokens: expected to be given together with traceOut/],
    [{ traceOut: '/tmp/x', tracePromptTokens: 4 }, 'E_RANGE', /tracePromptTokens: expected an integer in \[1, 3\]/],
  ] as [Record<string, unknown>, 'E_CONFIG' | 'E_RANGE', RegExp][])('%j → %s', async (patch, code, msg) => {
    await expectKvdError(() => generate({ ...base, ...patch } as GenerateOptions), code, msg);
  });

  it('a tokenizer of another vocab size → E_MODEL_FORMAT', async () => {
    const other = parseTokenizer(tokenizerBytes(byteVocab(['a'])));
    await expectKvdError(() => generate({ ...base, tokenizer: other }), 'E_MODEL_FORMAT', /tokenizer vocab size: expected 300 \(the model's\), got 260/);
  });
});

describe('Sampler', () => {
  const logits = Float32Array.from([0.1, 2, -1, 1.9, 0]);
  it('greedy picks the argmax', () => {
    expect(new Sampler({ temperature: 0 }).sample(logits)).toBe(1);
  });
  it('top-p keeps only the nucleus', () => {
    // softmax at T=1: p(1) ≈ 0.44, p(3) ≈ 0.40, the rest ≈ 0.16 together; top-p 0.8 keeps {1, 3}.
    const s = new Sampler({ temperature: 1, topP: 0.8, seed: 1 });
    const seen = new Set(Array.from({ length: 400 }, () => s.sample(logits)));
    expect([...seen].sort()).toEqual([1, 3]);
    const full = new Sampler({ temperature: 1, topP: 1, seed: 1 });
    expect(new Set(Array.from({ length: 400 }, () => full.sample(logits))).size).toBe(5);
  });
  it('rejects bad options', async () => {
    await expectKvdError(() => new Sampler({ temperature: Number.NaN }), 'E_CONFIG', /temperature/);
    await expectKvdError(() => new Sampler({ topP: -0.1 }), 'E_CONFIG', /topP/);
    await expectKvdError(() => new Sampler({ seed: 1.5 }), 'E_CONFIG', /seed/);
  });
});
