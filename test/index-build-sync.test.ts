import { describe, expect, it } from 'vitest';
import { type KvTensor, type PolicyName } from '../src/index.js';
import { createPolicy, NativeSelectionPolicy } from '../src/index/policy.js';
import { structuredCase } from './index-data.js';
import { expectKvdError } from './helpers.js';

const POLICIES: PolicyName[] = ['kvdrive', 'quest', 'shadowkv'];
const C = structuredCase({ tokens: 700, kvHeads: 2, qHeads: 4, dim: 16, seed: 3, queries: 2 });
const shape = { qHeads: 4, kvHeads: 2, headDim: 16 };

function kv(tokens: number, data: Float32Array = C.keys): KvTensor {
  return { data: data.subarray(0, tokens * C.kvHeads * C.dim), dtype: 'f32', tokens, heads: C.kvHeads, dim: C.dim };
}

describe('SelectionPolicy.buildSync', () => {
  it.each(POLICIES)('%s: gives the same index and selections as the async build', async (name) => {
    const a = createPolicy(name, shape);
    const b = createPolicy(name, shape);
    await a.build(kv(C.tokens), C.tokens);
    b.buildSync(kv(C.tokens), C.tokens);
    expect(b.indexBytes()).toBe(a.indexBytes());
    for (const q of C.queries) for (const budget of [16, 64, 256]) expect(b.select(q, budget)).toEqual(a.select(q, budget));
    if (name === 'kvdrive') expect((b as NativeSelectionPolicy).clusters(1)).toEqual((a as NativeSelectionPolicy).clusters(1));
  });

  it.each(POLICIES)('%s: starts from a context shorter than sinks + local and grows one token at a time', (name) => {
    // Default sinks 4 / local 64: nothing is sealed before 68 tokens (kvdrive's firstChunk is 1 here).
    for (const start of [0, 1, 30, 67, 68, 69]) {
      const p = createPolicy(name, shape);
      p.buildSync(kv(start), start);
      const c = p.chunkSize;
      const first = Math.floor(4 / c);
      const sealedEnd = Math.max(first, Math.floor(Math.max(0, start - 64) / c));
      const sel = p.select(C.queries[0]!, 1000);
      expect(sel.tokens).toBe(start);
      expect(sel.sinkEnd).toBe(Math.min(4, start));
      expect(sel.tailStart).toBe(sealedEnd > first ? sealedEnd * c : Math.min(4, start));
      expect(sel.chunkIds.length).toBe(2 * (sealedEnd - first));
    }
    const p = createPolicy(name, shape);
    p.buildSync(kv(1), 1);
    const ref = createPolicy(name, shape);
    for (let t = 2; t <= 400; t++) p.extend(kv(t), t);
    ref.buildSync(kv(400), 400);
    const full = p.select(C.queries[1]!, 1000);
    // Grown online or built at once: the same geometry and, at a budget covering it, every chunk.
    expect(full.tailStart).toBe(ref.select(C.queries[1]!, 1000).tailStart);
    expect(full.chunkIds).toEqual(ref.select(C.queries[1]!, 1000).chunkIds);
    expect(full.tailStart).toBe(Math.floor((400 - 64) / p.chunkSize) * p.chunkSize);
  });

  it('keeps the previous index when it fails; typed errors', async () => {
    const p = createPolicy('kvdrive', shape);
    p.buildSync(kv(300), 300);
    const before = p.select(C.queries[0]!, 32);
    await expectKvdError(() => p.buildSync(kv(10), 11), 'E_SHAPE', /buildSync tokens: expected at most k\.tokens = 10, got 11/);
    await expectKvdError(() => p.buildSync(kv(10), -1), 'E_RANGE', /buildSync tokens: expected a non-negative integer, got -1/);
    await expectKvdError(() => p.buildSync({ ...kv(10), heads: 1, data: C.keys.subarray(0, 160) }, 10), 'E_SHAPE', /buildSync k\.heads: expected kvHeads = 2, got 1/);
    const bad = C.keys.slice(0, 300 * 32);
    bad[100 * 32 + 16 + 5] = NaN; // token 100, kv head 1
    await expectKvdError(() => p.buildSync(kv(300, bad), 300), 'E_NONFINITE', /kv head 1, tokens \[100, 104\)/);
    expect(p.select(C.queries[0]!, 32)).toEqual(before);
    // While an async build runs, a synchronous one is refused.
    const pending = p.build(kv(300), 300);
    await expectKvdError(() => p.buildSync(kv(300), 300), 'E_CONFIG', /buildSync: expected no build\(\) in progress/);
    await pending;
  });
});
