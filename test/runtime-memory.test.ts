// The runtime's memory model (openRuntime): sinks + open tail in DRAM, sealed segments (prompt and
// decoded tokens) on SSD and in the DRAM tier, hot tier in front. Outputs are bit-identical to the
// default runtime (no dramBudget: DRAM holds everything), whichever tier serves a chunk, in both modes; a
// budget covering the context equals dense attention; KV stays in the host dtype; budgets that
// cannot hold what they must fail with E_BUDGET; a failed step retried equals a clean run.
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { openRuntime, type Runtime, type RuntimeOptions } from '../src/runtime/runtime.js';
import { attendDense } from '../src/attention/kernels.js';
import { fromF32 } from '../src/util/f16.js';
import { checkMemory, formatMemoryCheck, processMemory } from '../src/runtime/process-memory.js';
import type { Dtype, KvTensor } from '../src/types.js';
import { expectKvdError, hotTierBytesOf, ioBufferBytes, randn } from './helpers.js';
import { corruptSegments } from './storage-kv.js';

const shape = { layers: 2, qHeads: 4, kvHeads: 2, headDim: 16 };
const row = shape.kvHeads * shape.headDim;
const PROMPT = 300;
const SEQS = 3;
// Enough steps that decoded tokens leave the local window (64) and are sealed (sealTokens 32).
const STEPS = 48;
const SEAL = 32;
const MiB = 2 ** 20;
/**
 * A DRAM budget whose DRAM tier holds about a quarter of the sealed chunks of 3 sequences (fixed
 * parts ~0.4 MB: tails, index reserve, fetch buffers), so most selected chunks come from SSD.
 */
const SMALL = 640_000 + ioBufferBytes(); // + the I/O engine's reserve (the plan's ioBufferBytes); the index's part holds a pending re-clustering (reserveBytes)
const SMALL_PIPELINED = 720_000 + ioBufferBytes({}, 'pipelined'); // its engine reserves 4 batches
const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), 'kvd-rt-mem-'));
  dirs.push(d);
  return d;
};
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const fds = () => readdirSync('/proc/self/fd').length;
const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');
const kvt = (data: Float32Array | Uint16Array, tokens: number, dtype: Dtype = 'f32'): KvTensor => ({ data, dtype, tokens, heads: shape.kvHeads, dim: shape.headDim });

/** Deterministic inputs of sequence i. */
const input = {
  prompt: (seed: number, i: number, l: number, kind: number) => randn(PROMPT * row, seed + 1000 * i + 100 * l + kind),
  q: (seed: number, i: number, l: number, t: number) => randn(shape.qHeads * shape.headDim, seed + 7919 * (1 + i) + 131 * l + 17 * t),
  kv: (seed: number, i: number, l: number, t: number, kind: number) => randn(row, seed + 7919 * (1 + i) + 131 * l + 17 * t + 3 + kind),
};

async function prefillAll(rt: Runtime, seed: number, n: number): Promise<number[]> {
  const seqs = Array.from({ length: n }, () => rt.createSequence());
  for (const [i, s] of seqs.entries())
    for (let l = 0; l < shape.layers; l++) await rt.prefill(s, l, kvt(input.prompt(seed, i, l, 0), PROMPT), kvt(input.prompt(seed, i, l, 1), PROMPT));
  return seqs;
}

const batchOf = (seqs: number[], seed: number, l: number, t: number) =>
  seqs.map((s, i) => ({ seq: s, q: input.q(seed, i, l, t), kNew: input.kv(seed, i, l, t, 0), vNew: input.kv(seed, i, l, t, 1) }));

async function decode(rt: Runtime, seed: number, n = SEQS, steps = STEPS): Promise<Float32Array[]> {
  const seqs = await prefillAll(rt, seed, n);
  const outs: Float32Array[] = [];
  for (let t = 0; t < steps; t++) for (let l = 0; l < shape.layers; l++) outs.push(...(await rt.attend(l, batchOf(seqs, seed, l, t))));
  return outs;
}

// keySketch off: a smaller index reserve, so SMALL leaves a DRAM tier of about a quarter of the
// sealed chunks (the sketch path is covered by the dense-equality test below and the demo test).
const base: RuntimeOptions = { shape, budget: 32, policy: 'kvdrive', policyOptions: { keySketch: false, segmentTokens: 256, reclusterDelay: 16 }, microBatch: 2, maxSequences: SEQS, maxTokens: 512 };
/** A hot tier of 2 windows under a generous cap (1 MiB): the plan counts what it allocates, not the cap. */
const HOT = { windows: 2, maxBytes: MiB };

describe('Runtime memory model', () => {
  it('DRAM-only, DRAM+SSD and hot tier: outputs bit-identical to the default runtime, sequential and pipelined; decoded tokens are sealed', async () => {
    const reference = await openRuntime({ ...base, mode: 'sequential' });
    const want = await decode(reference, 5);
    await reference.close();
    expect(new Set(want.map(bits)).size).toBe(want.length);
    const configs: Array<[string, RuntimeOptions]> = [
      ['dram-only sequential', { ...base, dramBudget: 64 * MiB, sealTokens: SEAL }],
      ['dram-only pipelined', { ...base, mode: 'pipelined', dramBudget: 64 * MiB, sealTokens: SEAL }],
      // DRAM tier far smaller than the KV: most sealed chunks are read from SSD.
      ['dram+ssd sequential', { ...base, dramBudget: SMALL, sealTokens: SEAL, ssd: { dir: tmp() } }],
      ['dram+ssd pipelined', { ...base, mode: 'pipelined', dramBudget: SMALL_PIPELINED, sealTokens: SEAL, ssd: { dir: tmp() } }],
      ['hot+dram+ssd sequential', { ...base, dramBudget: SMALL + hotTierBytesOf({ ...base, hotTier: HOT }), sealTokens: SEAL, ssd: { dir: tmp() }, hotTier: HOT }],
    ];
    for (const [name, opts] of configs) {
      const fdsBefore = fds();
      const rt = await openRuntime(opts);
      const got = await decode(rt, 5);
      for (let i = 0; i < want.length; i++) expect(bits(got[i]!), `${name} output ${i}`).toBe(bits(want[i]!));
      const m = (await rt.stats()).memory!;
      // Prompt sealed at prefill (236 tokens), then decoded tokens in blocks of 32 as they left the window.
      expect(m.sealedTokens, name).toBe(SEQS * shape.layers * (236 + SEAL));
      expect(m.tokens, name).toBe(SEQS * shape.layers * (PROMPT + STEPS));
      expect(m.indexBytes, name).toBeGreaterThan(0);
      expect(m.plan.residentBytes + m.plan.indexBytes + m.plan.hotTierBytes + m.plan.fetchBytes + m.plan.selectArenaBytes + m.plan.ioBufferBytes + m.plan.dramTierBytes).toBe(opts.dramBudget);
      expect(m.dram.reservedBytes).toBeLessThanOrEqual(m.plan.dramTierBytes);
      // The hot tier is counted at what it allocated (well under its cap here), not at the cap.
      expect(m.plan.hotTierBytes, name).toBe(hotTierBytesOf(opts));
      if (opts.hotTier) expect(m.plan.hotTierBytes, name).toBeLessThan(opts.hotTier.maxBytes / 4);
      const t = m.traffic;
      expect(t.chunks).toBe(t.hotChunks + t.dramChunks + t.ssdChunks + t.tailChunks);
      if (opts.ssd) {
        expect(t.ssdChunks, name).toBeGreaterThan(0);
        expect(m.ssdSegments, name).toBe(SEQS * shape.layers * 2);
        expect(readdirSync(opts.ssd.dir).length).toBeGreaterThan(1);
      } else {
        expect(t.ssdChunks).toBe(0);
        expect(t.dramChunks, name).toBeGreaterThan(0);
      }
      if (opts.hotTier) expect(t.hotChunks, name).toBeGreaterThan(0);
      await rt.close();
      expect(fds(), `${name}: file descriptors after close`).toBe(fdsBefore);
      // close deletes the runtime's segments
      if (opts.ssd) expect(readdirSync(opts.ssd.dir).filter((f) => f.endsWith('.kvseg')).length).toBe(0);
    }
  });

  it('prefill with an observation window (obsQ) ranks the DRAM tier and warms the hot tier; outputs equal the default runtime with the same tier', async () => {
    const W = 16;
    const run = async (opts: RuntimeOptions) => {
      const rt = await openRuntime(opts);
      const s = rt.createSequence();
      for (let l = 0; l < shape.layers; l++)
        await rt.prefill(s, l, kvt(input.prompt(13, 0, l, 0), PROMPT), kvt(input.prompt(13, 0, l, 1), PROMPT), randn(W * shape.qHeads * shape.headDim, 900 + l));
      const outs: Float32Array[] = [];
      for (let t = 0; t < 12; t++) for (let l = 0; l < shape.layers; l++) outs.push(...(await rt.attend(l, batchOf([s], 13, l, t))));
      const st = await rt.stats();
      await rt.close();
      return { outs, st };
    };
    const hotTier = HOT;
    const reference = await run({ ...base, maxSequences: 1, hotTier });
    const mem = await run({ ...base, maxSequences: 1, hotTier, dramBudget: SMALL + hotTierBytesOf({ ...base, maxSequences: 1, hotTier }), sealTokens: SEAL, ssd: { dir: tmp() } });
    expect(mem.outs.map(bits)).toEqual(reference.outs.map(bits));
    expect(mem.st.warmedChunks).toBe(reference.st.warmedChunks);
    expect(mem.st.warmedChunks).toBeGreaterThan(0);
    expect(mem.st.memory!.traffic.hotChunks).toBeGreaterThan(0);
  });

  it('a budget covering the context equals dense attention (f16 KV kept as f16, DRAM+SSD)', async () => {
    const rt = await openRuntime({ ...base, budget: 512, dtype: 'f16', dramBudget: 8 * MiB + ioBufferBytes(), sealTokens: SEAL, ssd: { dir: tmp() } });
    const [s] = await prefillAll(rt, 9, 1);
    const f16 = (x: Float32Array) => fromF32(x, 'f16') as Uint16Array;
    const ks = Array.from({ length: shape.layers }, (_, l) => [f16(input.prompt(9, 0, l, 0))]);
    const vs = Array.from({ length: shape.layers }, (_, l) => [f16(input.prompt(9, 0, l, 1))]);
    for (let t = 0; t < 40; t++)
      for (let l = 0; l < shape.layers; l++) {
        const [e] = batchOf([s!], 9, l, t);
        const [out] = await rt.attend(l, [e!]);
        ks[l]!.push(f16(e!.kNew));
        vs[l]!.push(f16(e!.vNew));
        const n = PROMPT + t + 1;
        const cat = (parts: Uint16Array[]) => {
          const a = new Uint16Array(n * row);
          let o = 0;
          for (const p of parts) a.set(p, (o += p.length) - p.length);
          return a;
        };
        const dense = attendDense({ q: e!.q, qHeads: shape.qHeads, k: kvt(cat(ks[l]!), n, 'f16'), v: kvt(cat(vs[l]!), n, 'f16') });
        expect(bits(out!)).toBe(bits(dense.out));
      }
    const m = (await rt.stats()).memory!;
    expect(m.ssdWrittenBytes).toBeGreaterThan(0);
    // f16 storage: a sealed token costs 2 bytes per element on SSD (plus extent checksums / alignment), not 4.
    expect(m.plan.kvBytesPerTokenLayer).toBe(2 * row * 2);
    await rt.close();
  });

  it('without SSD the DRAM tier must hold every chunk: E_BUDGET naming the bytes needed; a budget too small for the fixed parts too', async () => {
    await expectKvdError(() => openRuntime({ ...base, dramBudget: 1 * MiB }), 'E_BUDGET', /no SSD store.*at least \d+ bytes/);
    await expectKvdError(() => openRuntime({ ...base, dramBudget: 4096, ssd: { dir: tmp() } }), 'E_BUDGET');
    await expectKvdError(() => openRuntime({ ...base, sealTokens: 30 }), 'E_CONFIG', /sealTokens/);
    // Everything declared in DRAM past the largest DRAM tier (255 arena blocks of 1 GiB; 4 TiB of f32
    // KV here): a clear E_BUDGET saying what to do, before anything is allocated.
    await expectKvdError(
      () => openRuntime({ ...base, shape: { layers: 32, qHeads: 8, kvHeads: 8, headDim: 128 }, maxSequences: 1, maxTokens: 2 ** 24 }),
      'E_BUDGET',
      /DRAM tier of at most \d+ chunks \(255 arena blocks of 1073741824 bytes\).*give an ssd store/,
    );
    // Without dramBudget: exactly what holds everything declared (f16 halves the DRAM tier's part).
    const plan = async (o: RuntimeOptions) => {
      const rt = await openRuntime(o);
      const p = (await rt.stats()).memory.plan;
      await rt.close();
      return p;
    };
    const f32 = await plan(base);
    const f16 = await plan({ ...base, dtype: 'f16' });
    expect(f16.kvBytesPerTokenLayer * 2).toBe(f32.kvBytesPerTokenLayer);
    expect(f16.dramTierBytes).toBeLessThan(f32.dramTierBytes);
    // one byte less than that default is refused, naming the bytes needed
    await expectKvdError(() => openRuntime({ ...base, dramBudget: f32.dramBudgetBytes - 1 }), 'E_BUDGET', new RegExp(`at least ${f32.dramBudgetBytes} bytes`));
  });

  it('a prefill in f32 or f16 bits gives the same f16 runtime state; a second prefill of a layer is refused', async () => {
    const outs: string[] = [];
    for (const bitsIn of [false, true]) {
      const rt = await openRuntime({ ...base, dtype: 'f16', dramBudget: 64 * MiB });
      const s = rt.createSequence();
      for (let l = 0; l < shape.layers; l++) {
        const k = input.prompt(3, 0, l, 0);
        const v = input.prompt(3, 0, l, 1);
        if (bitsIn) await rt.prefill(s, l, kvt(fromF32(k, 'f16'), PROMPT, 'f16'), kvt(fromF32(v, 'f16'), PROMPT, 'f16'));
        else await rt.prefill(s, l, kvt(k, PROMPT), kvt(v, PROMPT));
      }
      await expectKvdError(() => rt.prefill(s, 0, kvt(input.prompt(3, 0, 0, 0), PROMPT), kvt(input.prompt(3, 0, 0, 1), PROMPT)), 'E_CONFIG');
      await expectKvdError(() => rt.prefill(s, 1, kvt(new Uint16Array(PROMPT * row), PROMPT, 'bf16'), kvt(new Uint16Array(PROMPT * row), PROMPT, 'bf16')), 'E_DTYPE');
      const [o] = await rt.attend(0, batchOf([s], 3, 0, 0));
      outs.push(bits(o!));
      await rt.close();
    }
    expect(outs[1]).toBe(outs[0]);
  });
});

describe('Budgets measured, not asserted', () => {
  it('DRAM+SSD: the resident set grows by at most the DRAM budget plus the stated overhead while the KV on SSD is larger than the budget', async () => {
    const big = { layers: 2, qHeads: 8, kvHeads: 2, headDim: 64 };
    const T = 32768;
    const brow = big.kvHeads * big.headDim;
    const kvBytes = big.layers * T * 2 * brow * 2; // f16 K + V
    // index reserve ~19.5 MiB with the key sketch (0.6x the f16 KV at head dim 64), DRAM tier ~2 MiB,
    // and a small I/O engine's reserve (one ring of 2 x 4 bounce buffers, 2.1 MiB: inside the budget)
    const io = { queueDepth: 4, maxBatches: 1 };
    const dramBudget = 24 * MiB + ioBufferBytes(io);
    const before = processMemory()!;
    const rt = await openRuntime({ shape: big, budget: 256, dtype: 'f16', dramBudget, ssd: { dir: tmp(), io }, maxSequences: 1, maxTokens: T + 16 });
    const s = rt.createSequence();
    for (let l = 0; l < big.layers; l++) {
      const k = fromF32(randn(T * brow, 40 + l), 'f16');
      const v = fromF32(randn(T * brow, 50 + l), 'f16');
      await rt.prefill(s, l, { data: k, dtype: 'f16', tokens: T, heads: big.kvHeads, dim: big.headDim }, { data: v, dtype: 'f16', tokens: T, heads: big.kvHeads, dim: big.headDim });
    }
    for (let t = 0; t < 8; t++)
      for (let l = 0; l < big.layers; l++) await rt.attend(l, [{ seq: s, q: randn(big.qHeads * big.headDim, 60 + t), kNew: randn(brow, 70 + t), vNew: randn(brow, 80 + t) }]);
    const after = processMemory()!;
    const m = (await rt.stats()).memory!;
    expect(m.ssdWrittenBytes).toBeGreaterThanOrEqual(kvBytes * 0.99);
    expect(kvBytes).toBeGreaterThan(dramBudget);
    const check = checkMemory(
      [{ what: 'dramBudget', bytes: dramBudget }],
      [
        { what: 'process before open', bytes: before.rssBytes },
        // randn's f32 rows and their f16 copies for K and V of one layer, possibly not collected yet for two layers
        { what: 'prompt inputs of two layers (f32 + f16, K and V)', bytes: 2 * 2 * T * brow * (4 + 2) },
        { what: 'V8 heap growth and native scratch (stated slack)', bytes: 24 * MiB },
      ],
      after.rssBytes,
    );
    expect(check.within, formatMemoryCheck(check)).toBe(true);
    await rt.close();
  });
});
