// shadowkv as its paper selects: chunk-8 landmarks (chunk means) scored against the query, plus
// static outlier chunks — those whose keys have the lowest cosine similarity to their landmark —
// selected first whatever the query, within the budget (at most a quarter of its chunks).
import { describe, expect, it } from 'vitest';
import { type Selection } from '../src/index.js';
import { createPolicy } from '../src/index/policy.js';
import { expectKvdError, randn } from './helpers.js';

const tokens = 4096;
const heads = 2;
const dim = 32;
// Keys drift slowly (neighbours alike, chunks coherent); in a few chunks one key points the other
// way: those chunks' keys are least aligned with their mean.
const OUTLIER_CHUNKS = [37, 150, 301, 444];
function keys(): Float32Array {
  const base = randn(heads * dim, 1);
  const noise = randn(tokens * heads * dim, 2);
  const k = new Float32Array(tokens * heads * dim);
  for (let t = 0; t < tokens; t++)
    for (let i = 0; i < heads * dim; i++) k[t * heads * dim + i] = base[i]! + 0.05 * noise[t * heads * dim + i]!;
  for (const c of OUTLIER_CHUNKS)
    for (let i = 0; i < heads * dim; i++) k[(c * 8 + 3) * heads * dim + i] = -3 * base[i]!;
  return k;
}
const kv = { data: keys(), dtype: 'f32' as const, tokens, heads, dim };
const ids = (sel: Selection, h: number) => Array.from(sel.chunkIds.subarray(sel.offsets[h]!, sel.offsets[h + 1]!));

describe('shadowkv outlier chunks', () => {
  it('selects the least-aligned chunks first, within the budget, for any query', async () => {
    const p = createPolicy('shadowkv', { outlierChunks: OUTLIER_CHUNKS.length });
    const plain = createPolicy('shadowkv', { outlierChunks: 0 });
    await p.build(kv, tokens);
    await plain.build(kv, tokens);
    for (const seed of [3, 4, 5]) {
      const q = randn(4 * dim, seed);
      // Budget 128 = 16 chunks: the 4 outliers (a quarter) plus the 12 best landmarks.
      const sel = p.select(q, 128);
      const base = plain.select(q, 128, { pool: 128 });
      for (let h = 0; h < heads; h++) {
        const got = ids(sel, h);
        expect(got.length).toBe(16);
        for (const c of OUTLIER_CHUNKS) expect(got).toContain(c);
        const best = Array.from(base.poolIds!.subarray(base.poolOffsets![h]!, base.poolOffsets![h + 1]!)).filter((c) => !OUTLIER_CHUNKS.includes(c));
        for (const c of best.slice(0, 12)) expect(got).toContain(c);
      }
      // A budget of 8 chunks reserves 2 for outliers; the other 6 go by landmark score.
      const small = p.select(q, 64);
      const smallBase = plain.select(q, 64, { pool: 64 });
      for (let h = 0; h < heads; h++) {
        const got = ids(small, h);
        expect(got.length).toBe(8);
        expect(got.filter((c) => OUTLIER_CHUNKS.includes(c)).length).toBeGreaterThanOrEqual(2);
        const best = Array.from(smallBase.poolIds!.subarray(smallBase.poolOffsets![h]!, smallBase.poolOffsets![h + 1]!));
        for (const c of best.slice(0, 6)) expect(got).toContain(c);
      }
    }
    expect(p.indexBytes()).toBeGreaterThan(plain.indexBytes());
    expectKvdError(() => createPolicy('kvdrive', { outlierChunks: 3 }), 'E_CONFIG', /shadowkv-only options/);
    expectKvdError(() => createPolicy('shadowkv', { outlierChunks: -1 }), 'E_CONFIG', /outlierChunks: expected an integer in \[0, 2\^20\], got -1/);
  });
});
