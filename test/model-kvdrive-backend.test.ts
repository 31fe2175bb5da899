// The reference host's sparse backend ("kvdrive", the same RuntimeAttention as "runtime"): the one
// decode path, select → fetch → compute in the runtime. A budget covering the context gives dense
// attention at every layer-step and the dense greedy tokens, for every policy; a small budget
// attends a bounded share; positions are checked; options and inputs are typed errors.
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { PolicyName } from '../src/index/selection.js';
import type { AttentionBackend } from '../src/model/attention-backend.js';
import { createBackend } from '../src/model/backends.js';
import { loadCheckpoint, type Checkpoint } from '../src/model/checkpoint.js';
import { DenseTsAttention } from '../src/model/dense-attention.js';
import { attentionShape, Transformer } from '../src/model/forward.js';
import { generate } from '../src/model/generate.js';
import { RuntimeAttention, type RuntimeAttentionOptions } from '../src/model/runtime-attention.js';
import { argmax } from '../src/model/sampler.js';
import { loadTokenizer } from '../src/model/tokenizer.js';
import { expectKvdError, fixturesDir, randn } from './helpers.js';
import { checkpointBytes, tinyHeader, tmpDir, writeTmp, type TinyHeader } from './model-helpers.js';

const POLICIES: PolicyName[] = ['kvdrive', 'quest', 'shadowkv'];

/** ||a − b|| / ||b||, in f64. */
function relError(a: Float32Array, b: Float32Array): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < b.length; i++) {
    num += (a[i]! - b[i]!) ** 2;
    den += b[i]! ** 2;
  }
  return Math.sqrt(num / den);
}

/** Runs the backend under test and the dense reference on every call; the model follows the backend under test. */
class CompareWithDense implements AttentionBackend {
  maxRelError = 0;
  calls = 0;
  constructor(
    readonly tested: AttentionBackend,
    readonly reference: AttentionBackend,
  ) {}
  async attend(layer: number, pos: number, q: Float32Array, k: Float32Array, v: Float32Array): Promise<Float32Array> {
    const out = await this.tested.attend(layer, pos, q, k, v);
    const ref = await this.reference.attend(layer, pos, q, k, v);
    this.maxRelError = Math.max(this.maxRelError, relError(out, ref));
    this.calls++;
    return out;
  }
  reset(): void {
    this.tested.reset?.();
    this.reference.reset?.();
  }
}

/** Feeds `first` (then greedy continuations) for `steps` positions; returns the greedy tokens and whether every logit was finite. */
async function runGreedy(model: Checkpoint, backend: AttentionBackend, steps: number, first: number): Promise<{ tokens: number[]; finite: boolean }> {
  const t = new Transformer(model, backend);
  t.reset();
  let token = first;
  let finite = true;
  const tokens: number[] = [];
  for (let pos = 0; pos < steps; pos++) {
    const logits = await t.forwardAsync(token, pos);
    for (let i = 0; i < logits.length; i++) if (!Number.isFinite(logits[i]!)) finite = false;
    token = argmax(logits);
    tokens.push(token);
  }
  return { tokens, finite };
}

// A random-weight model long enough for chunks to leave a small local window (no fixture needed).
const tinyLong: TinyHeader = { ...tinyHeader, seq_len: 96 };
const tiny = loadCheckpoint(writeTmp(tmpDir(), 'tiny-long.bin', checkpointBytes(tinyLong, 5)));
const tinyShape = attentionShape(tiny.config);
const CHUNK = { kvdrive: 4, quest: 16, shadowkv: 8 } as const;
const SINKS = 4;

function stories(): { model: Checkpoint; tokenizer: ReturnType<typeof loadTokenizer> } | undefined {
  const fx = fixturesDir();
  if (!fx) return undefined;
  const model = loadCheckpoint(join(fx, 'stories260K', 'stories260K.bin'));
  return { model, tokenizer: loadTokenizer(join(fx, 'stories260K', 'tok512.bin'), { vocabSize: model.config.vocabSize }) };
}

describe('The kvdrive backend (the runtime) with a budget covering the whole context', () => {
  it('equals DenseTsAttention at every layer-step (relative error < 1e-5), random-weight model, every policy', async () => {
    for (const policy of POLICIES) {
      // sinks 4 + local 8, segments of 32 tokens: by position 95 most of the context is sealed and must all be selected.
      const kv = new RuntimeAttention(tinyShape, { budget: 512, policy, policyOptions: { local: 8 }, sealTokens: 32 });
      const cmp = new CompareWithDense(kv, new DenseTsAttention(tinyShape));
      await runGreedy(tiny, cmp, tiny.config.seqLen, 1);
      expect(cmp.calls).toBe(tiny.config.seqLen * tiny.config.nLayers);
      expect(cmp.maxRelError).toBeLessThan(1e-5);
      const s = (await kv.stats())!;
      expect(s.attendCalls).toBe(cmp.calls);
      expect(s.memory!.sealedTokens).toBeGreaterThan(0);
      await kv.close();
    }
  });

  it('equals DenseTsAttention at every layer-step on stories260K (relative error < 1e-5), every policy', async (ctx) => {
    const f = stories();
    if (!f) return ctx.skip();
    const shape = attentionShape(f.model.config);
    for (const policy of POLICIES) {
      const kv = new RuntimeAttention(shape, { budget: 512, policy });
      const cmp = new CompareWithDense(kv, new DenseTsAttention(shape));
      await runGreedy(f.model, cmp, 160, 1);
      expect(cmp.calls).toBe(160 * f.model.config.nLayers);
      expect(cmp.maxRelError).toBeLessThan(1e-5);
      await kv.close();
    }
  });

  it('greedy generation gives exactly the dense tokens on stories260K, every policy', async (ctx) => {
    const f = stories();
    if (!f) return ctx.skip();
    const shape = attentionShape(f.model.config);
    const opts = { ...f, prompt: 'Once upon a time', steps: 256, temperature: 0 };
    const dense = await generate({ ...opts, backend: new DenseTsAttention(shape) });
    expect(dense.positions).toBeGreaterThan(100);
    for (const policy of POLICIES) {
      const backend = createBackend('kvdrive', shape, { budget: 512, policy }) as RuntimeAttention;
      const r = await generate({ ...opts, backend });
      expect(r.tokens).toEqual(dense.tokens);
      expect(r.text).toBe(dense.text);
      expect((await backend.stats())!.attendCalls).toBe(r.positions * f.model.config.nLayers);
      await backend.close();
    }
  });
});

describe('The kvdrive backend with a small budget', () => {
  it('runs to the end with finite logits; the chunks fetched per layer-step and kv head fit the budget; less than the context is attended', async () => {
    for (const policy of POLICIES) {
      const local = 8;
      const budget = 16;
      const kv = new RuntimeAttention(tinyShape, { budget, policy, policyOptions: { local }, sealTokens: 32 });
      const r = await runGreedy(tiny, kv, tiny.config.seqLen, 1);
      expect(r.finite).toBe(true);
      const s = (await kv.stats())!;
      const c = CHUNK[policy];
      const heads = s.attendCalls * tinyShape.nKvHeads;
      // Selected (sealed or tail) chunks hold at most `budget` tokens per kv head and step, beside
      // the sinks and the unselected tail (< local + one partial chunk). kvdrive selects single
      // tokens (the runtime attends exactly those): each fetched chunk holds at least one of them.
      const perChunk = policy === 'kvdrive' ? 1 : c;
      expect(s.memory!.traffic.chunks).toBeGreaterThan(0);
      expect(s.memory!.traffic.chunks * perChunk).toBeLessThanOrEqual(heads * budget);
      const selectedTokens = policy === 'kvdrive' ? heads * budget : s.memory!.traffic.chunks * c;
      const attendedAtMost = selectedTokens + heads * (SINKS + local + c - 1);
      const context = tiny.config.nLayers * tinyShape.nKvHeads * ((tiny.config.seqLen * (tiny.config.seqLen + 1)) / 2);
      expect(attendedAtMost).toBeLessThan(context);
      await kv.close();
    }
  });

  it('generates a story on stories260K with budget 16 (text reported, logits finite), every policy', async (ctx) => {
    const f = stories();
    if (!f) return ctx.skip();
    const shape = attentionShape(f.model.config);
    for (const policy of POLICIES) {
      const backend = new RuntimeAttention(shape, { budget: 16, policy });
      const r = await generate({ ...f, steps: 256, temperature: 0, backend });
      expect(r.text.length).toBeGreaterThan(0);
      console.log(`[budget 16, ${policy}] ${r.positions} positions, stopped by ${r.stoppedBy}: ${JSON.stringify(r.text.slice(0, 160))}`);
      const s = (await backend.stats())!;
      expect(s.attendCalls).toBe(r.positions * f.model.config.nLayers);
      // (kvdrive selects single tokens: a fetched chunk holds at least one selected token.)
      expect(s.memory!.traffic.chunks * (policy === 'kvdrive' ? 1 : CHUNK[policy])).toBeLessThanOrEqual(s.attendCalls * shape.nKvHeads * 16);
      await backend.close();
      // Greedy rerun with the logits checked (generate does not expose them).
      const again = new RuntimeAttention(shape, { budget: 16, policy });
      expect((await runGreedy(f.model, again, 200, 1)).finite).toBe(true);
      await again.close();
    }
  });
});

describe('The kvdrive backend lifecycle', () => {
  it('reset() starts a new sequence (same outputs again), pos 0 at layer 0 does too, positions must follow one another, close() ends it', async () => {
    const kv = new RuntimeAttention(tinyShape, { budget: 8, policyOptions: { local: 8 } });
    const first = (await runGreedy(tiny, kv, 64, 3)).tokens;
    const again = (await runGreedy(tiny, kv, 64, 3)).tokens; // Transformer.reset() resets the backend
    expect(again).toEqual(first);
    const { nHeads, nKvHeads, headSize, seqLen } = tinyShape;
    const q = randn(nHeads * headSize, 1);
    const k = randn(seqLen * nKvHeads * headSize, 2);
    const v = randn(seqLen * nKvHeads * headSize, 3);
    for (let p = 0; p < 40; p++) await kv.attend(0, p, q, k, v);
    // Restarting at pos 0 without reset() is a new sequence: one token, attention = its v.
    const restart = (await kv.attend(0, 0, q, k, v)).slice();
    const dense = new DenseTsAttention(tinyShape).attend(0, 0, q, k, v);
    expect(relError(restart, dense)).toBeLessThan(1e-6);
    await kv.attend(0, 1, q, k, v);
    await expectKvdError(() => kv.attend(0, 1, q, k, v), 'E_RANGE', /attention layer 0 pos: expected 2 \(positions in order, one at a time; 0 at layer 0 starts a new sequence\), got 1/);
    await expectKvdError(() => kv.attend(0, 5, q, k, v), 'E_RANGE', /expected 2 .*got 5/);
    // Layer 1's first attend of this sequence comes at pos 2: rows [0, 2) of its cache are its prompt.
    const adopted = (await kv.attend(1, 2, q, k, v)).slice();
    expect(relError(adopted, new DenseTsAttention(tinyShape).attend(1, 2, q, k, v))).toBeLessThan(1e-5);
    await expectKvdError(() => kv.attend(1, 2, q, k, v), 'E_RANGE', /attention layer 1 pos: expected 3/);
    await kv.close();
    await expectKvdError(() => kv.attend(0, 0, q, k, v), 'E_CLOSED', /attend\(\) after close\(\)/);
  });
});

describe('The kvdrive backend options and inputs', () => {
  const ok: RuntimeAttentionOptions = { budget: 16 };
  const make = (o: unknown) => () => new RuntimeAttention(tinyShape, o as RuntimeAttentionOptions);

  it('rejects bad options with typed errors', async () => {
    await expectKvdError(make(undefined), 'E_CONFIG', /attention backend options: expected an options object \{ budget, policy, policyOptions, mode, storage, dramBudget, sealTokens \}, got undefined/);
    await expectKvdError(make({}), 'E_BUDGET', /options\.budget: expected an integer >= 1 \(tokens per kv head\), got undefined/);
    await expectKvdError(make({ budget: 0 }), 'E_BUDGET', /options\.budget: expected an integer >= 1 \(tokens per kv head\), got 0/);
    await expectKvdError(make({ budget: 2.5 }), 'E_BUDGET', /got 2\.5/);
    await expectKvdError(make({ budget: '16' }), 'E_BUDGET', /got "16"/);
    await expectKvdError(make({ ...ok, policy: 'lru' }), 'E_POLICY', /options\.policy: expected one of 'kvdrive', 'quest', 'shadowkv', got "lru"/);
    await expectKvdError(make({ ...ok, mode: 'eager' }), 'E_CONFIG', /options\.mode: expected 'sequential' or 'pipelined', got "eager"/);
    await expectKvdError(make({ ...ok, dramBudget: -1 }), 'E_CONFIG', /options\.dramBudget: expected a positive integer number of bytes, at most 2\^53 - 1, got -1/);
    await expectKvdError(make({ ...ok, bugdet: 3 }), 'E_CONFIG', /expected only budget, policy, policyOptions, mode, storage, dramBudget, sealTokens, got unknown 'bugdet'/);
    await expectKvdError(make({ ...ok, policyOptions: 5 }), 'E_CONFIG', /options\.policyOptions: expected an options object/);
    await expectKvdError(make({ ...ok, policyOptions: { kvHeads: 3 } }), 'E_CONFIG', /policyOptions\.kvHeads: expected 2 \(the model's\) or nothing, got 3/);
    await expectKvdError(() => new RuntimeAttention({ ...tinyShape, nKvHeads: 3 }, ok), 'E_CONFIG', /attention shape: expected nHeads divisible by nKvHeads, got "4\/3"/);
    await expectKvdError(() => createBackend('kvdrive', tinyShape), 'E_BUDGET', /budget: expected an integer >= 1 \(tokens per kv head\), got undefined/);
    await expectKvdError(() => createBackend('kvdrive', tinyShape, { budget: 4, policy: 'nope' as PolicyName }), 'E_POLICY', /got "nope"/);
    // The policy's own options are checked when the runtime opens (the first attend).
    const { nHeads, nKvHeads, headSize, seqLen } = tinyShape;
    const q = randn(nHeads * headSize, 1);
    const k = randn(seqLen * nKvHeads * headSize, 2);
    for (const [o, re] of [
      [{ ...ok, policyOptions: { chunkSize: 0 } }, /chunkSize: expected an integer in \[1, 65536\], got 0/],
      [{ ...ok, policy: 'quest', policyOptions: { seed: 1 } }, /kvdrive-only options/],
    ] as Array<[RuntimeAttentionOptions, RegExp]>) {
      const kv = new RuntimeAttention(tinyShape, o);
      await expectKvdError(() => kv.attend(0, 0, q, k, k), 'E_CONFIG', re);
      await kv.close();
    }
  });

  it('rejects bad attend() inputs with typed errors', async () => {
    const kv = new RuntimeAttention(tinyShape, ok);
    const { nHeads, nKvHeads, headSize, seqLen } = tinyShape;
    const q = randn(nHeads * headSize, 1);
    const k = randn(seqLen * nKvHeads * headSize, 2);
    const v = randn(seqLen * nKvHeads * headSize, 3);
    await expectKvdError(() => kv.attend(2, 0, q, k, v), 'E_RANGE', /attention layer: expected an integer in \[0, 2\), got 2/);
    await expectKvdError(() => kv.attend(0, 96, q, k, v), 'E_RANGE', /attention pos: expected an integer in \[0, 96\), got 96/);
    await expectKvdError(() => kv.attend(0, 0, q.subarray(1), k, v), 'E_SHAPE', /attention q: expected length 16 \(nHeads\*headSize\), got 15/);
    await expectKvdError(() => kv.attend(0, 0, q, k.subarray(8), v), 'E_SHAPE', /attention kCache: expected length 768/);
    await expectKvdError(() => kv.attend(0, 0, q, k, [] as unknown as Float32Array), 'E_TYPE', /attention vCache: expected a Float32Array/);
    const bad = q.slice();
    bad[3] = NaN;
    await expectKvdError(() => kv.attend(0, 0, bad, k, v), 'E_NONFINITE');
    const badK = k.slice();
    badK[(20 * nKvHeads + 1) * headSize] = Infinity; // token 20, kv head 1
    for (let p = 0; p < 20; p++) await kv.attend(0, p, q, badK, v);
    // The new token's key is refused before it enters the runtime's KV; the position is not consumed.
    await expectKvdError(() => kv.attend(0, 20, q, badK, v), 'E_NONFINITE');
    await kv.attend(0, 20, q, k, v);
    await kv.close();
  });
});
