// attendFetched (src/storage/fetched-attention.ts), the attention every runtime step computes
// through: it checks its staged chunks and selection against the tensors, and hot-tier admission
// refuses pages that do not hold a missed chunk (nothing is ever attended from garbage).
import { describe, expect, it } from 'vitest';
import { HotTier } from '../src/cache/hot-tier.js';
import type { Selection } from '../src/index/selection.js';
import { native } from '../src/native.js';
import { attendFetched } from '../src/storage/fetched-attention.js';
import type { KvTensor } from '../src/types.js';
import { randn } from './helpers.js';

const T = 512;
const qHeads = 4;
const kvHeads = 2;
const D = 16;

describe('attendFetched', () => {
  it('rejects a staged buffer or selection that does not match the tensors', () => {
    const k: KvTensor = { data: randn(T * kvHeads * D, 1), dtype: 'f32', tokens: T, heads: kvHeads, dim: D };
    const v: KvTensor = { ...k, data: randn(T * kvHeads * D, 2) };
    const sel: Selection = { chunkSize: 4, tokens: T, sinkEnd: 4, tailStart: T - 16, offsets: Int32Array.of(0, 1, 1), chunkIds: Int32Array.of(3) };
    const sink = { k, v };
    const o = { q: new Float32Array(qHeads * D), qHeads, sink, tail: sink, tailBase: 0, selection: sel, fetched: new Uint8Array(10) };
    expect(() => attendFetched(o)).toThrow(/at least 512 bytes/);
    expect(() => attendFetched({ ...o, fetched: new Uint8Array(512), fetchedOffsets: Int32Array.of(0, 1, 1), fetchedIds: Int32Array.of(4) })).toThrow(
      /chunk 3 of kv head 0 is selected but neither fetched nor resident/,
    );
    try {
      attendFetched({ ...o, fetched: new Uint8Array(512), tailBase: T - 8 });
      expect.unreachable();
    } catch (e) {
      expect((e as { code: string }).code).toBe('E_RANGE');
    }
  });

  it('hot-tier admission from pages that lack a missed chunk is refused', () => {
    const tier = new HotTier({ layers: 2, kvHeads, headDim: D, dtype: 'f32', chunkSize: 4, budget: 16, windows: 1, maxBytes: 1 << 24 });
    const sel: Selection = { chunkSize: 4, tokens: T, sinkEnd: 4, tailStart: T - 16, offsets: Int32Array.of(0, 1, 1), chunkIds: Int32Array.of(3) };
    expect(() =>
      native.hotTierAdmitPages({ hot: { handle: tier.handle, layer: 0 }, selection: sel, tokens: T, pages: new Uint8Array(512), pageOffsets: Int32Array.of(0, 1, 1), pageIds: Int32Array.of(5) }),
    ).toThrow(/chunk 3 of kv head 0 must be admitted but the page source does not hold it/);
    tier.destroy();
  });
});
