import { describe, expect, it } from 'vitest';
import { createPolicy } from '../src/index/policy.js';
import { expectKvdError, randn } from './helpers.js';

describe('async index build failure', () => {
  it('rejects NaN keys with E_NONFINITE, leaves the policy unbuilt (not busy), and a later build works', async () => {
    const T = 512, H = 2, D = 16;
    const data = randn(T * H * D, 3);
    data[100 * H * D] = Number.NaN; // token 100, kv head 0: inside the indexed range (sinks are 0..3)
    const k = { data, dtype: 'f32' as const, tokens: T, heads: H, dim: D };
    const p = createPolicy('kvdrive', { qHeads: 4, kvHeads: H, headDim: D });
    await expectKvdError(() => p.build(k, T), 'E_NONFINITE', /kv head 0, tokens \[100, 104\)/);
    // A failed build must clear the in-progress flag: select reports "never built", not "busy".
    await expectKvdError(() => p.select(new Float32Array(4 * D).fill(0.1), 32), 'E_CONFIG', /never built/);
    data[100 * H * D] = 0.5;
    await p.build(k, T);
    const sel = p.select(new Float32Array(4 * D).fill(0.1), 32);
    expect(sel.offsets.length).toBe(H + 1);
    expect(sel.chunkIds.length).toBeGreaterThan(0);
  });
});
