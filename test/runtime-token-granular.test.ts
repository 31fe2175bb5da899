// The memory model attends exactly the tokens kvdrive selects (token-granular, on the key sketch)
// although the tiers hold whole chunks: for every step and sequence the runtime's output equals
// attendSparse over a contiguous cache with the selection that `eval --offloaded` makes (the same
// policy code and options, replayed here), bit for bit, whichever tier served a token (DRAM tier in
// place, SSD reads, hot-tier slots, the open tail), in both modes; a budget covering the context
// equals dense attention.
import { afterAll, describe, expect, it } from 'vitest';
import { openRuntime, type RuntimeOptions } from '../src/runtime/runtime.js';
import { attendDense, attendSparse } from '../src/attention/kernels.js';
import { createPolicy } from '../src/index/policy.js';
import { offloadedPolicyOptions } from '../src/index/options.js';
import type { KvTensor } from '../src/types.js';
import { hotTierBytesOf, ioBufferBytes, randn } from './helpers.js';
import { removeTempDirs, tempDir } from './storage-kv.js';

const shape = { layers: 2, qHeads: 4, kvHeads: 2, headDim: 16 };
const row = shape.kvHeads * shape.headDim;
const PROMPT = 300;
const SEQS = 2;
const STEPS = 40; // decoded tokens leave the local window (64) and are sealed (sealTokens 32)
const SEAL = 32;
const MiB = 2 ** 20;
const tmp = () => tempDir('rt-tok');
afterAll(removeTempDirs);

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');
const kvt = (data: Float32Array, tokens: number): KvTensor => ({ data: data.subarray(0, tokens * row), dtype: 'f32', tokens, heads: shape.kvHeads, dim: shape.headDim });
const prompt = (i: number, l: number, kind: number) => randn(PROMPT * row, 1000 * i + 100 * l + kind + 1);
const qOf = (i: number, l: number, t: number) => randn(shape.qHeads * shape.headDim, 7919 * (1 + i) + 131 * l + 17 * t);
const kvOf = (i: number, l: number, t: number, kind: number) => randn(row, 7919 * (1 + i) + 131 * l + 17 * t + 3 + kind);

/** Runs the runtime: outputs per (step, layer, sequence) in that order. */
async function runtimeOutputs(opts: RuntimeOptions): Promise<{ outs: Float32Array[]; traffic: Record<string, number> }> {
  const rt = await openRuntime(opts);
  const seqs = Array.from({ length: SEQS }, () => rt.createSequence());
  for (const [i, s] of seqs.entries()) for (let l = 0; l < shape.layers; l++) await rt.prefill(s, l, kvt(prompt(i, l, 0), PROMPT), kvt(prompt(i, l, 1), PROMPT));
  const outs: Float32Array[] = [];
  for (let t = 0; t < STEPS; t++)
    for (let l = 0; l < shape.layers; l++)
      outs.push(...(await rt.attend(l, seqs.map((s, i) => ({ seq: s, q: qOf(i, l, t), kNew: kvOf(i, l, t, 0), vNew: kvOf(i, l, t, 1) })))));
  const traffic = { ...(await rt.stats()).memory!.traffic } as unknown as Record<string, number>;
  await rt.close();
  return { outs, traffic };
}

/** The eval's offloaded path over a contiguous cache: same policy options, attendSparse with its selection. */
async function referenceOutputs(budget: number, dense = false): Promise<Float32Array[]> {
  const outs: Float32Array[][] = [];
  const K = Array.from({ length: SEQS }, (_, i) => Array.from({ length: shape.layers }, (_, l) => new Float32Array((PROMPT + STEPS) * row).fill(0)));
  const V = K.map((ls) => ls.map((a) => new Float32Array(a.length)));
  const policies = [];
  for (let i = 0; i < SEQS; i++)
    for (let l = 0; l < shape.layers; l++) {
      K[i]![l]!.set(prompt(i, l, 0));
      V[i]![l]!.set(prompt(i, l, 1));
      const p = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { qHeads: shape.qHeads, kvHeads: shape.kvHeads, headDim: shape.headDim }));
      await p.build(kvt(K[i]![l]!, PROMPT), PROMPT);
      policies.push(p);
    }
  for (let t = 0; t < STEPS; t++)
    for (let l = 0; l < shape.layers; l++) {
      const step: Float32Array[] = [];
      for (let i = 0; i < SEQS; i++) {
        const n = PROMPT + t + 1;
        K[i]![l]!.set(kvOf(i, l, t, 0), (n - 1) * row);
        V[i]![l]!.set(kvOf(i, l, t, 1), (n - 1) * row);
        const k = kvt(K[i]![l]!, n);
        const v = kvt(V[i]![l]!, n);
        const q = qOf(i, l, t);
        if (dense) {
          step.push(attendDense({ q, qHeads: shape.qHeads, k, v }).out);
          continue;
        }
        const p = policies[i * shape.layers + l]!;
        p.extend(k, n);
        const sel = p.select(q, budget);
        expect(sel.chunkSize).toBe(1); // single tokens: the budget counts tokens attended
        p.setPrior(sel); // the next step starts from this one's selection, as the runtime's and the eval's do
        step.push(attendSparse({ q, qHeads: shape.qHeads, k, v, selection: sel }).out);
      }
      outs.push(step);
    }
  return outs.flat();
}

const base: RuntimeOptions = { shape, budget: 32, policy: 'kvdrive', microBatch: 2, maxSequences: SEQS, maxTokens: 512, sealTokens: SEAL };
/** A hot tier under a generous cap (the budget adds what it allocates: hotTierBytesOf). */
const HOT = { windows: 2, maxBytes: MiB };

describe('Runtime memory model: token-granular attention inside fetched chunks', () => {
  it('equals attendSparse over a contiguous cache with the eval --offloaded selection, whichever tier served a token, both modes', async () => {
    const want = await referenceOutputs(base.budget);
    // + the I/O engine's reserve (4 batches pipelined, 1 sequential); the DRAM tier holds a fraction
    // of the sealed chunks: most come from SSD
    const small = 600_000 + ioBufferBytes();
    const smallPipelined = 600_000 + ioBufferBytes({}, 'pipelined');
    const configs: Array<[string, RuntimeOptions]> = [
      ['dram-only sequential', { ...base, dramBudget: 64 * MiB }],
      ['dram-only pipelined', { ...base, mode: 'pipelined', dramBudget: 64 * MiB }],
      ['dram+ssd sequential', { ...base, dramBudget: small, ssd: { dir: tmp() } }],
      ['dram+ssd pipelined', { ...base, mode: 'pipelined', dramBudget: smallPipelined, ssd: { dir: tmp() } }],
      ['hot+dram+ssd pipelined', { ...base, mode: 'pipelined', dramBudget: smallPipelined + hotTierBytesOf({ ...base, hotTier: HOT }), ssd: { dir: tmp() }, hotTier: HOT }],
    ];
    for (const [name, opts] of configs) {
      const { outs, traffic } = await runtimeOutputs(opts);
      expect(outs.length).toBe(want.length);
      for (let i = 0; i < want.length; i++) expect(bits(outs[i]!), `${name} output ${i}`).toBe(bits(want[i]!));
      expect(traffic.dramChunks, name).toBeGreaterThan(0);
      expect(traffic.tailChunks, name).toBeGreaterThan(0);
      if (opts.ssd) expect(traffic.ssdChunks, name).toBeGreaterThan(0);
      if (opts.hotTier) expect(traffic.hotChunks, name).toBeGreaterThan(0);
    }
  });

  it('a budget covering the context equals dense attention (DRAM+SSD, token-granular)', async () => {
    const want = await referenceOutputs(512, true);
    const { outs } = await runtimeOutputs({ ...base, budget: 512, dramBudget: 2 * MiB + ioBufferBytes(), ssd: { dir: tmp() } });
    for (let i = 0; i < want.length; i++) expect(bits(outs[i]!), `output ${i}`).toBe(bits(want[i]!));
  });
});
