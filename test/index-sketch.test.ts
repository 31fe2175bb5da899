// kvdrive's key sketch (native/index/key_sketch.h): select() without the keys re-ranks on int8 codes
// kept by the policy. It must keep the keyed select's recall on a demo-like trace, pick exactly
// the keyless selection when told to prefer it over given keys, select the same tokens at every
// SIMD level and thread count, cost dim + 4 bytes per token and kv head, and still report NaN keys.
import { describe, expect, it } from 'vitest';
import { type PolicyOptions, type Selection } from '../src/index.js';
import { createPolicy } from '../src/index/policy.js';
import { indexKernelLevel } from '../src/index/kernels.js';
import { prefixView } from '../src/eval/replay.js';
import { expectKvdError, randn } from './helpers.js';
import { readFileSync } from 'node:fs';
import { fromF32 } from '../src/util/f16.js';
import { offloadedPolicyOptions } from '../src/index/options.js';
import { traceReplay } from './trace-replay.js';

// Seed 11: no default was tuned on it (the demo uses 1; bench/index-tune.ts tuned on 1, 2, 3).
const T = 8192;
const STEPS = 3;
const BUDGET = 128;
const shape = { qHeads: 8, kvHeads: 2, headDim: 64 };
const tr = await traceReplay({ T, steps: STEPS, budget: BUDGET, shape, seed: 11 });
const { k, qAt } = tr;
const replay = (options: PolicyOptions, keyed: boolean) => tr.replay({ keySketch: true, ...options }, keyed);

const ids = (sels: Selection[]) => sels.map((s) => Array.from(s.chunkIds));

describe('kvdrive key sketch', () => {
  it('keyless select with the sketch keeps the keyed recall and needles', async () => {
    const keyed = await replay({}, true);
    const sketch = await replay({}, false);
    const none = await replay({ keySketch: false }, false);
    console.log(`recall / oracle (seed 11): keyed ${keyed.ratio.toFixed(4)} (needles ${keyed.found}/${keyed.total}), keyless sketch ${sketch.ratio.toFixed(4)} (${sketch.found}/${sketch.total}), ` +
      `keyless without sketch ${none.ratio.toFixed(4)}`);
    expect(sketch.total).toBeGreaterThan(0);
    expect(sketch.found).toBeGreaterThanOrEqual(keyed.found);
    expect(sketch.ratio).toBeGreaterThan(none.ratio);
    expect(sketch.ratio).toBeGreaterThanOrEqual(keyed.ratio - 0.01);
    // The bar on a held-out seed: measured 0.9775 (keyed 0.9775, 3 of 4 needles both).
    expect(sketch.ratio).toBeGreaterThanOrEqual(0.97);
    for (const sel of sketch.sels) expect(sel.chunkSize).toBe(1);
    // Sketch rows are counted as read: dim + 4 bytes each, fewer than f16 key rows (2 * dim).
    expect(sketch.stats.bytesScored).toBeLessThan(keyed.stats.bytesScored);
    // dim + 4 bytes per token and kv head, plus the per-channel scales, plus the slot order of the
    // full segment (chunks [1, 1024): 1023 chunks) whose sketch rows it permutes: slot -> chunk and
    // chunk -> slot (int32 per chunk). Each cluster's slot run is in the cluster table, which both
    // indexes hold.
    const tokens = T + STEPS;
    const slotOrder = 2 * 1023 * 4;
    expect(sketch.bytes - none.bytes).toBe(shape.kvHeads * (tokens * (shape.headDim + 4) + shape.headDim * 4 + slotOrder));
  });

  it('preferSketch with the keys is the keyless selection', async () => {
    const keyless = await replay({}, false);
    const preferred = await replay({ preferSketch: true }, true);
    expect(ids(preferred.sels)).toEqual(ids(keyless.sels));
  });

  it('selects the same tokens at every SIMD level and thread count', async () => {
    const best = indexKernelLevel('best');
    const want = ids((await replay({ threads: 1 }, false)).sels);
    for (const level of ['scalar', 'avx2', 'avx512'] as const) {
      indexKernelLevel(level);
      expect(ids((await replay({ threads: 2 }, false)).sels)).toEqual(want);
    }
    indexKernelLevel('best');
    expect(indexKernelLevel()).toBe(best);
  });

  it('a host that starts at position 0 gets a sketch as its context grows', () => {
    const p = createPolicy('kvdrive', { keySketch: true, ...shape });
    p.buildSync(prefixView(k, 0), 0);
    for (let t = 1; t <= 600; t++) p.extend(prefixView(k, t), t);
    const sel = p.select(qAt(0), 32);
    expect(sel.chunkSize).toBe(1);
    for (let h = 0; h < shape.kvHeads; h++) expect(sel.offsets[h + 1]! - sel.offsets[h]!).toBe(32);
  });

  it('a sketch of 4 MiB or more lies on 2 MiB pages over the rows it was built with, never beyond them', async () => {
    // One kv head at 4 bits and dim 128: 64 B per token. 36,864 tokens write 2.25 MiB of rows into
    // room for twice the context (4.75 MiB: such a block starts on a 2 MiB boundary), so exactly one
    // whole 2 MiB page lies inside the written rows; 4,096 tokens (256 KiB in 768 KiB) hold none.
    let thp = 'never';
    try {
      thp = /\[(\w+)\]/.exec(readFileSync('/sys/kernel/mm/transparent_hugepage/enabled', 'utf8'))?.[1] ?? 'never';
    } catch {
      // no THP in this kernel: nothing is advised
    }
    const one = { qHeads: 4, kvHeads: 1, headDim: 128 };
    for (const [tokens, pages] of [[36864, 1], [4096, 0]] as const) {
      const p = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', one));
      await p.build({ data: fromF32(randn(tokens * 128, 5), 'f16'), dtype: 'f16', tokens, heads: 1, dim: 128 }, tokens);
      // The native index's geometry (not part of the policy interface: read here for the test only).
      const geo = (p as unknown as { index: { geometry(): { sketchHugePageBytes: number } } }).index.geometry();
      expect(geo.sketchHugePageBytes, `${tokens} tokens, THP ${thp}`).toBe(thp === 'never' ? 0 : pages * (2 << 20));
      expect(p.select(randn(4 * 128, 6), 64).chunkIds.length).toBe(64);
    }
  });

  it('a NaN key is reported by the keyless re-rank (E_NONFINITE, naming the token)', async () => {
    const data = Uint16Array.from(prefixView(k, 2048).data as Uint16Array);
    data[2040 * shape.kvHeads * shape.headDim] = 0x7e00; // f16 NaN in the tail, kv head 0
    const bad = { ...prefixView(k, 2048), data };
    const p = createPolicy('kvdrive', { keySketch: true, ...shape });
    await p.build(bad, 2048);
    expectKvdError(() => p.select(qAt(0), 64), 'E_NONFINITE', /kv head 0, token 2040/);
    expectKvdError(() => createPolicy('kvdrive', { keySketch: 1 as never }), 'E_CONFIG', /keySketch: expected a boolean, got 1/);
    expectKvdError(() => createPolicy('quest', { preferSketch: true }), 'E_CONFIG', /kvdrive-only/);
    expectKvdError(() => createPolicy('kvdrive', { preferSketch: true, keySketch: false }), 'E_CONFIG', /preferSketch: expected keySketch not false/);
  });
});
