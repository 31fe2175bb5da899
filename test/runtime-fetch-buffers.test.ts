/**
 * The memory model's fetch buffers (KvMemory.acquireFetchBuffer): the `concurrency` buffers the
 * plan counts are reused across steps, so a decode step allocates no buffer for its SSD reads;
 * without an SSD nothing is ever read into one, and the plan counts none.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { KvMemory } from '../src/runtime/kv-memory.js';
import { resolvePolicyOptions } from '../src/index/options.js';
import { SsdStore } from '../src/storage/ssd-store.js';
import { expectKvdError } from './helpers.js';

const dirs: string[] = [];
const stores: SsdStore[] = [];
afterAll(async () => {
  for (const s of stores) await s.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A memory model of the test's shape with an SSD store (its fetch buffers are planned). */
async function withSsd(concurrency: number): Promise<KvMemory> {
  const dir = mkdtempSync(join(tmpdir(), 'kvd-fetchbuf-'));
  dirs.push(dir);
  const ssd = await SsdStore.open({ dir, shape: { layers: 1, kvHeads: 2, headDim: 16, dtype: 'f16', chunkSize: resolvePolicyOptions('kvdrive', { qHeads: 4, kvHeads: 2, headDim: 16 }).chunkSize } });
  stores.push(ssd);
  return memory(concurrency, ssd);
}

function memory(concurrency: number, ssd?: SsdStore): KvMemory {
  const shape = { layers: 1, qHeads: 4, kvHeads: 2, headDim: 16 };
  const policyInput = { qHeads: 4, kvHeads: 2, headDim: 16 };
  return KvMemory.open({
    shape,
    dtype: 'f16',
    policy: 'kvdrive',
    policyOptions: resolvePolicyOptions('kvdrive', policyInput),
    policyInput,
    budget: 64,
    maxSequences: 1,
    maxTokens: 1024,
    sealTokens: 256,
    hotTierBytes: 0,
    concurrency,
    selectArenaBytes: 0,
    maxChunksPerHead: 16,
    ...(ssd ? { ssd, dramBudget: 256 << 20 } : {}),
  });
}

describe('KvMemory fetch buffers', () => {
  it('hands out the planned buffers, reuses them after release, and never pools a transient one', async () => {
    const mem = await withSsd(2);
    const cap = mem.plan.fetchBytes / 2;
    expect(cap).toBe(2 * 16 * mem.chunkBytes);
    const a = mem.acquireFetchBuffer(3 * mem.chunkBytes);
    const b = mem.acquireFetchBuffer(cap);
    expect(a).not.toBe(b);
    expect([a.length, b.length]).toEqual([cap, cap]);
    // A third entry in flight (more than the plan counts) gets a buffer of its own, sized to ask.
    const c = mem.acquireFetchBuffer(mem.chunkBytes);
    expect(c.length).toBe(mem.chunkBytes);
    mem.releaseFetchBuffer(c);
    mem.releaseFetchBuffer(a);
    expect(mem.acquireFetchBuffer(0)).toBe(a);
    mem.releaseFetchBuffer(b);
    mem.releaseFetchBuffer(a);
    const again = [mem.acquireFetchBuffer(cap), mem.acquireFetchBuffer(cap)];
    expect(new Set(again)).toEqual(new Set([a, b]));
  });

  it('a request beyond the planned size is E_INTERNAL', async () => {
    const mem = await withSsd(1);
    expectKvdError(() => mem.acquireFetchBuffer(mem.plan.fetchBytes + 1), 'E_INTERNAL');
    expectKvdError(() => mem.acquireFetchBuffer(-1), 'E_INTERNAL');
  });

  it('without an SSD the plan counts no fetch buffer, and a read into one is E_INTERNAL', () => {
    const mem = memory(2);
    expect(mem.plan.fetchBytes).toBe(0);
    expect(mem.acquireFetchBuffer(0).length).toBe(0);
    expectKvdError(() => mem.acquireFetchBuffer(mem.chunkBytes), 'E_INTERNAL');
  });
});

describe('KvMemory sealing without an SSD', () => {
  it('the DRAM tier holds the only copy: every sealed chunk stays unevictable, whatever scores prefill ranked it by', async () => {
    const mem = memory(1);
    mem.openSequence(0);
    const lk = mem.layer(0, 0);
    const tokens = 256;
    const row = 2 * 16;
    const kv = new Uint16Array(tokens * row).fill(0x3c00); // f16 1.0
    const chunks = tokens / mem.config.policyOptions.chunkSize;
    // An observation window's ranking (finite scores) must not make the only copy evictable.
    const scores = Float32Array.from({ length: 2 * chunks }, (_, i) => i / 100);
    await mem.seal(0, 0, lk, kv, kv, tokens, scores);
    for (let h = 0; h < 2; h++)
      for (let c = 0; c < chunks; c++) {
        const slot = mem.dram.lookup(lk.segments[0]!, 0, h, c);
        expect(slot).toBeGreaterThanOrEqual(0);
        expect(mem.dram.scoreOf(slot)).toBe(3.4028234663852886e38);
      }
  });
});
