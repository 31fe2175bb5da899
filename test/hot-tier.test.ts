import { afterEach, describe, expect, it } from 'vitest';
import { HotTier, type HotTierOptions } from '../src/cache/hot-tier.js';
import { importanceScores, importanceScoresAsync, rankChunks, warmUp, warmUpAsync } from '../src/cache/warmup.js';
import { attendSparse } from '../src/attention/kernels.js';
import type { Selection } from '../src/index/selection.js';
import type { Dtype, KvTensor } from '../src/types.js';
import { f32ArrayToF16 } from '../src/util/f16.js';
import { expectKvdError, randn, rng } from './helpers.js';

const tiers: HotTier[] = [];
afterEach(() => {
  while (tiers.length) tiers.pop()!.destroy();
});
function tier(o: Partial<HotTierOptions> & Pick<HotTierOptions, 'windows'>): HotTier {
  const t = new HotTier({ layers: 2, kvHeads: 2, headDim: 8, dtype: 'f32', chunkSize: 4, budget: 16, maxBytes: 1 << 24, ...o });
  tiers.push(t);
  return t;
}

function kvTensor(tokens: number, heads: number, dim: number, dtype: Dtype, seed: number): KvTensor {
  const f = randn(tokens * heads * dim, seed);
  return { data: dtype === 'f32' ? f : f32ArrayToF16(f), dtype, tokens, heads, dim };
}

/** Random selection of `perHead` chunks per kv head (some overlapping sinks/tail), with a lookahead pool. */
function randomSelection(r: () => number, tokens: number, heads: number, c: number, perHead: number, hot: number[]): Selection {
  const nChunks = Math.ceil(tokens / c);
  const sinkEnd = 4;
  const tailStart = tokens - 6;
  const offsets = new Int32Array(heads + 1);
  const ids: number[] = [];
  const poolOffsets = new Int32Array(heads + 1);
  const poolIds: number[] = [];
  const poolScores: number[] = [];
  for (let h = 0; h < heads; h++) {
    const set = new Set<number>();
    // Temporal locality: mostly from a slowly drifting hot set, some random.
    while (set.size < perHead) set.add(r() < 0.7 ? hot[Math.floor(r() * hot.length)]! : Math.floor(r() * nChunks));
    const sorted = [...set].sort((a, b) => a - b);
    ids.push(...sorted);
    offsets[h + 1] = ids.length;
    const pool = [...sorted, ...hot.filter((x) => !set.has(x)).slice(0, 3)];
    pool.forEach((id, i) => {
      poolIds.push(id);
      poolScores.push(10 - i * 0.1);
    });
    poolOffsets[h + 1] = poolIds.length;
  }
  return {
    chunkSize: c,
    tokens,
    sinkEnd,
    tailStart,
    offsets,
    chunkIds: Int32Array.from(ids),
    poolOffsets,
    poolIds: Int32Array.from(poolIds),
    poolScores: Float32Array.from(poolScores),
  };
}

describe('hot tier', () => {
  for (const dtype of ['f32', 'f16'] as const) {
    it(`slot-read attention is bit-identical to attendSparse on the contiguous KV (${dtype}, windows 0/1/2/3)`, () => {
      const H = 2, Hq = 4, D = 8, c = 4, T = 96;
      const t = tier({ dtype, kvHeads: H, windows: [[0, 1], [2, 3]], budget: 16 });
      const k = kvTensor(T, H, D, dtype, 1);
      const v = kvTensor(T, H, D, dtype, 2);
      const r = rng(3);
      const hot = Array.from({ length: 8 }, () => Math.floor(r() * (T / c)));
      for (let step = 0; step < 15; step++) {
        if (step % 5 === 4) hot[Math.floor(r() * hot.length)] = Math.floor(r() * (T / c));
        for (let layer = 0; layer < 2; layer++) {
          const q = randn(Hq * D, 100 + step * 2 + layer);
          const perHead = step === 7 ? 6 : 4; // one step selects more chunks than a window ×1 holds
          const sel = randomSelection(r, T - 8 + (step % 8), H, c, perHead, hot);
          const got = t.step({ layer, k, v, q, qHeads: Hq, selection: sel });
          const want = attendSparse({ q, qHeads: Hq, k, v, selection: sel });
          expect(Buffer.from(got.out.buffer).equals(Buffer.from(want.out.buffer))).toBe(true);
          expect(Buffer.from(got.lse.buffer).equals(Buffer.from(want.lse.buffer))).toBe(true);
          expect(Array.from(got.chunkMass)).toEqual(Array.from(want.chunkMass));
          if (layer === 1) expect(got.sourceChunks).toBe(0); // windows ×2/×3 hold every selected chunk
          const s = got.stats.total;
          expect(s.hits + s.misses).toBe(sel.chunkIds.length);
          expect(s.admitted + s.streamed).toBe(s.misses);
        }
        expect(t.check()).toBe('');
      }
      const st = t.stats();
      // window 0 streams everything; larger windows keep chunks and hit.
      expect(st.pairs[0]!.hits).toBe(0);
      expect(st.pairs[0]!.resident).toBe(0);
      expect(st.pairs[3]!.hits).toBeGreaterThan(0);
    });
  }

  it('keeps the slot map invariants and never exceeds capacity under random steps, for every policy', () => {
    for (const eviction of ['lookahead', 'lru', 'lfu'] as const) {
      const t = tier({ eviction, layers: 1, kvHeads: 3, windows: [[1, 2, 3]], budget: 12 });
      const caps = t.info().capacities;
      expect(Array.from(caps)).toEqual([3, 6, 9]);
      const T = 400;
      const k = kvTensor(T, 3, 8, 'f32', 5);
      const v = kvTensor(T, 3, 8, 'f32', 6);
      const r = rng(11);
      const hot = Array.from({ length: 10 }, () => Math.floor(r() * 100));
      for (let step = 0; step < 200; step++) {
        if (step % 3 === 0) hot[Math.floor(r() * hot.length)] = Math.floor(r() * 100);
        const sel = randomSelection(r, T, 3, 4, 3, hot);
        const s = t.fetch({ layer: 0, k, v, selection: sel });
        for (let h = 0; h < 3; h++) {
          const res = t.residents(0, h);
          expect(res.length).toBeLessThanOrEqual(caps[h]!);
          // Every selected chunk is resident after fetch (capacity ≥ one step's chunks).
          for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) expect(res).toContain(sel.chunkIds[i]);
          expect(s.heads[h]!.streamed).toBe(0);
        }
        t.recordMass({ layer: 0, selection: sel, chunkMass: Float32Array.from(sel.chunkIds, () => r()) });
      }
      expect(t.check()).toBe('');
      const st = t.stats();
      expect(st.total.hits + st.total.misses).toBe(200 * 9);
      expect(st.total.evictions).toBe(st.total.admitted - st.pairs.reduce((a, p) => a + p.resident, 0));
    }
  });

  it('resetSequence empties one sequence (others untouched), keeps counters, and refills like a new tier', () => {
    const T = 200;
    const k = kvTensor(T, 1, 8, 'f32', 7);
    const v = kvTensor(T, 1, 8, 'f32', 8);
    const sel = (ids: number[]): Selection => ({ chunkSize: 4, tokens: T, sinkEnd: 0, tailStart: T, offsets: Int32Array.from([0, ids.length]), chunkIds: Int32Array.from(ids) });
    const t = tier({ layers: 1, kvHeads: 1, windows: 2, budget: 8, sequences: 2, eviction: 'lru' });
    for (const s of [0, 1]) t.fetch({ sequence: s, layer: 0, k, v, selection: sel([1, 2, 3, 4]) });
    t.resetSequence(0);
    expect(Array.from(t.residents(0, 0, 0))).toEqual([]);
    expect(Array.from(t.residents(0, 0, 1))).toEqual([1, 2, 3, 4]);
    expect(t.check()).toBe('');
    expect(t.stats(0).total.misses).toBe(4); // counters are per handle since creation
    // after the reset the same selections behave as on a fresh tier: all misses, then LRU order
    const fresh = tier({ layers: 1, kvHeads: 1, windows: 2, budget: 8, sequences: 1, eviction: 'lru' });
    for (const ids of [[5, 6], [5, 7, 8], [9, 10]]) {
      const a = t.fetch({ sequence: 0, layer: 0, k, v, selection: sel(ids) });
      const b = fresh.fetch({ layer: 0, k, v, selection: sel(ids) });
      expect(a.total).toEqual(b.total);
    }
    expect(Array.from(t.residents(0, 0, 0))).toEqual(Array.from(fresh.residents(0, 0)));
    expect(t.check()).toBe('');
    expectKvdError(() => t.resetSequence(2), 'E_RANGE', /resetSequence.sequence: expected an integer in \[0, 1\], got 2/);
    expectKvdError(() => t.resetSequence(0.5), 'E_RANGE', /got 0.5/);
  });

  it('evicts by policy: LRU the least recently selected, LFU the least often, lookahead the lowest mass outside the pool', () => {
    const T = 200;
    const k = kvTensor(T, 1, 8, 'f32', 7);
    const v = kvTensor(T, 1, 8, 'f32', 8);
    const sel = (ids: number[], pool?: [number, number][]): Selection => ({
      chunkSize: 4, tokens: T, sinkEnd: 0, tailStart: T,
      offsets: Int32Array.from([0, ids.length]), chunkIds: Int32Array.from(ids),
      ...(pool ? { poolOffsets: Int32Array.from([0, pool.length]), poolIds: Int32Array.from(pool.map((p) => p[0])), poolScores: Float32Array.from(pool.map((p) => p[1])) } : {}),
    });
    const mk = (eviction: 'lru' | 'lfu' | 'lookahead') => tier({ eviction, layers: 1, kvHeads: 1, windows: 2, budget: 8 }); // 4 slots
    // LRU: 1,2 then 3,1 (1 refreshed) then 3,4 (needs 1 slot? 3 hit, 4 miss: free 0 → evict LRU = 2)
    const lru = mk('lru');
    lru.fetch({ layer: 0, k, v, selection: sel([1, 2]) });
    lru.fetch({ layer: 0, k, v, selection: sel([1, 3]) });
    lru.fetch({ layer: 0, k, v, selection: sel([4, 5]) }); // full now: 1,2,3,4,5? capacity 4 → evict 2 (oldest)
    expect(Array.from(lru.residents(0, 0))).toEqual([1, 3, 4, 5]);
    // LFU: 1 selected 3 times, 2 twice, 3 once; 6,7 arrive → evict 3 then 2? needs 2 slots with 4 used.
    const lfu = mk('lfu');
    lfu.fetch({ layer: 0, k, v, selection: sel([1, 2, 3]) });
    lfu.fetch({ layer: 0, k, v, selection: sel([1, 2]) });
    lfu.fetch({ layer: 0, k, v, selection: sel([1, 4]) });
    lfu.fetch({ layer: 0, k, v, selection: sel([6, 7]) });
    expect(Array.from(lfu.residents(0, 0))).toEqual([1, 2, 6, 7]);
    // Lookahead: after attending 1,2,3,4 with masses, 5,6 arrive; chunk 1 (lowest mass) is in the pool,
    // so the victims are the two lowest-mass non-pool residents.
    const la = mk('lookahead');
    const s0 = sel([1, 2, 3, 4]);
    la.fetch({ layer: 0, k, v, selection: s0 });
    la.recordMass({ layer: 0, selection: s0, chunkMass: Float32Array.from([0.01, 0.5, 0.02, 0.3]) });
    la.fetch({ layer: 0, k, v, selection: sel([5, 6], [[5, 9], [6, 8], [1, 7]]) });
    expect(Array.from(la.residents(0, 0))).toEqual([1, 2, 5, 6]);
  });

  it('warm-up fills each pair with its most important eligible chunks and they hit on the first step', () => {
    const H = 2, Hq = 4, D = 8, c = 4, T = 128;
    const k = kvTensor(T, H, D, 'f32', 21);
    const v = kvTensor(T, H, D, 'f32', 22);
    const W = 8;
    const q = randn(W * Hq * D, 23);
    const positions = Int32Array.from({ length: W }, (_, i) => T - W + i);
    const scores = importanceScores(k, { q, qHeads: Hq, positions }, c);
    expect(scores.length).toBe(H * (T / c));
    for (let h = 0; h < H; h++) {
      let s = 0;
      for (let j = 0; j < T / c; j++) s += scores[h * (T / c) + j]!;
      expect(s).toBeCloseTo(1, 5); // mean of probability distributions
    }
    const t = tier({ layers: 1, kvHeads: H, windows: 2, budget: 16 });
    const placed = warmUp(t, { layer: 0, k, v, q, qHeads: Hq, positions, sinkEnd: 4, tailStart: T - 64 });
    expect(Array.from(placed)).toEqual([8, 8]);
    const ranked = rankChunks(scores, H, c, 4, T - 64);
    for (let h = 0; h < H; h++) {
      const top = Array.from(ranked.chunkIds.subarray(ranked.offsets[h]!, ranked.offsets[h]! + 8)).sort((a, b) => a - b);
      expect(Array.from(t.residents(0, h))).toEqual(top);
      for (const id of top) expect(id * c + c).toBeLessThanOrEqual(T - 64 + c);
    }
    // The first step selecting the top chunks hits all of them; the warm copy is not step traffic.
    const ids0 = t.residents(0, 0).subarray(0, 4);
    const ids1 = t.residents(0, 1).subarray(0, 4);
    const sel: Selection = { chunkSize: c, tokens: T, sinkEnd: 4, tailStart: T - 64, offsets: Int32Array.from([0, 4, 8]), chunkIds: Int32Array.from([...ids0, ...ids1]) };
    const s = t.fetch({ layer: 0, k, v, selection: sel });
    expect(s.total.hits).toBe(8);
    expect(s.total.bytesAdmitted).toBe(0);
    expect(t.stats().total.warmAdmitted).toBe(16);
  });

  it('keeps residency per sequence and tops up a resident chunk whose rows appeared after admission', () => {
    const H = 1, Hq = 2, D = 8, c = 4;
    const t = tier({ layers: 1, kvHeads: H, windows: 2, budget: 8, sequences: 2 });
    const full = kvTensor(40, H, D, 'f32', 51);
    const fullV = kvTensor(40, H, D, 'f32', 52);
    const prefix = (kv: KvTensor, n: number): KvTensor => ({ ...kv, tokens: n, data: kv.data.subarray(0, n * H * D) });
    // 30 tokens: chunk 7 (tokens 28..31) has only 2 rows so far.
    const k30 = prefix(full, 30), v30 = prefix(fullV, 30);
    const sel30: Selection = { chunkSize: c, tokens: 30, sinkEnd: 4, tailStart: 30, offsets: Int32Array.from([0, 2]), chunkIds: Int32Array.from([2, 7]) };
    const s0 = t.fetch({ sequence: 1, layer: 0, k: k30, v: v30, selection: sel30 });
    expect(s0.total.bytesAdmitted).toBe((4 + 2) * D * 4 * 2);
    expect(Array.from(t.residents(0, 0, 1))).toEqual([2, 7]);
    expect(Array.from(t.residents(0, 0, 0))).toEqual([]); // sequence 0 untouched
    // 40 tokens: chunk 7 is complete in the source and fully inside [sinkEnd, tailStart).
    const sel40: Selection = { ...sel30, tokens: 40, tailStart: 36 };
    const q = randn(Hq * D, 53);
    const got = t.step({ sequence: 1, layer: 0, k: full, v: fullV, q, qHeads: Hq, selection: sel40 });
    expect(got.stats.total.hits).toBe(2);
    expect(got.stats.total.bytesAdmitted).toBe(2 * D * 4 * 2); // the two new rows only
    expect(got.sourceChunks).toBe(0);
    const want = attendSparse({ q, qHeads: Hq, k: full, v: fullV, selection: sel40 });
    expect(Buffer.from(got.out.buffer).equals(Buffer.from(want.out.buffer))).toBe(true);
    expect(t.stats(0).total.hits + t.stats(0).total.misses).toBe(0);
    expect(t.stats(1).total.hits).toBe(2);
    expect(t.check()).toBe('');
  });

  it('async variants give bit-identical results and the same residency as the sync ones', async () => {
    const H = 2, Hq = 4, D = 8, c = 4, T = 128;
    const a = tier({ layers: 1, kvHeads: H, windows: 2, budget: 16 });
    const b = tier({ layers: 1, kvHeads: H, windows: 2, budget: 16 });
    const k = kvTensor(T, H, D, 'f32', 31);
    const v = kvTensor(T, H, D, 'f32', 32);
    const W = 4;
    const q0 = randn(W * Hq * D, 33);
    const positions = Int32Array.from({ length: W }, (_, i) => T - W + i);
    const s1 = importanceScores(k, { q: q0, qHeads: Hq, positions }, c);
    const s2 = await importanceScoresAsync(k, { q: q0, qHeads: Hq, positions }, c);
    expect(Array.from(s2)).toEqual(Array.from(s1));
    const warm = { layer: 0, k, v, q: q0, qHeads: Hq, positions, sinkEnd: 4, tailStart: T - 16 };
    expect(Array.from(await warmUpAsync(b, warm))).toEqual(Array.from(warmUp(a, warm)));
    const r = rng(34);
    const hot = Array.from({ length: 8 }, () => Math.floor(r() * (T / c)));
    for (let step = 0; step < 6; step++) {
      const sel = randomSelection(r, T, H, c, 4, hot);
      const q = randn(Hq * D, 40 + step);
      const x = a.step({ layer: 0, k, v, q, qHeads: Hq, selection: sel });
      const y = await b.stepAsync({ layer: 0, k, v, q, qHeads: Hq, selection: sel });
      expect(Buffer.from(y.out.buffer).equals(Buffer.from(x.out.buffer))).toBe(true);
      expect(Array.from(y.chunkMass)).toEqual(Array.from(x.chunkMass));
      expect(y.stats).toEqual(x.stats);
      expect(y.sourceChunks).toBe(0);
    }
    for (let h = 0; h < H; h++) expect(Array.from(b.residents(0, h))).toEqual(Array.from(a.residents(0, h)));
    // Validation errors reject the promise with the typed error.
    const sel = randomSelection(r, T, H, c, 4, hot);
    await expectKvdError(() => b.fetchAsync({ layer: 3, k, v, selection: sel }), 'E_RANGE', /layer/);
    await expectKvdError(() => b.attendAsync({ layer: 0, k, v, selection: sel, q: new Float32Array(1), qHeads: Hq }), 'E_SHAPE', /q \(qHeads\*dim\)/);
    await expectKvdError(() => importanceScoresAsync(k, { q: q0, qHeads: 3, positions }, c), 'E_SHAPE', /multiple of the kv heads/);
  });

  it('rejects bad input with typed errors', async () => {
    const base = { layers: 1, kvHeads: 2, headDim: 8, dtype: 'f32' as const, chunkSize: 4, budget: 16, windows: 2, maxBytes: 1 << 20 };
    // Budget: 2 × 4 slots × 2 heads × 4×8×4×2 bytes = 4096 bytes of slots plus metadata.
    await expectKvdError(() => new HotTier({ ...base, maxBytes: 4096 }), 'E_BUDGET', /need \d+ bytes .*expected maxBytes >= \d+, got 4096/);
    await expectKvdError(() => new HotTier({ ...base, eviction: 'fifo' as never }), 'E_POLICY', /lookahead, lru, lfu/);
    await expectKvdError(() => new HotTier({ ...base, windows: [[1, 2, 3]] }), 'E_SHAPE', /1 rows of 2 windows/);
    await expectKvdError(
      () => new HotTier({ ...base, windows: { version: 1, shape: { layers: 3, kvHeads: 2 }, windows: [[1, 1]] } }),
      'E_SHAPE',
      /1 layers × 2 kv heads, got one for 3 × 2/,
    );
    await expectKvdError(() => new HotTier({ ...base, budget: 0 }), 'E_CONFIG', /budget/);
    await expectKvdError(() => new HotTier({ ...base, windows: -1 }), 'E_CONFIG', /windows/);
    await expectKvdError(() => new HotTier({ ...base, dtype: 'f64' as never }), 'E_CONFIG', /dtype/);
    const t = tier({ ...base });
    const k = kvTensor(64, 2, 8, 'f32', 1);
    const sel: Selection = { chunkSize: 4, tokens: 64, sinkEnd: 4, tailStart: 60, offsets: Int32Array.from([0, 1, 2]), chunkIds: Int32Array.from([3, 5]) };
    await expectKvdError(() => t.fetch({ layer: 1, k, v: k, selection: sel }), 'E_RANGE', /layer: expected an integer in \[0, 0\], got 1/);
    await expectKvdError(() => t.fetch({ layer: 0, k: kvTensor(64, 2, 8, 'f16', 1), v: k, selection: sel }), 'E_DTYPE', /expected the hot tier's dtype 'f32', got 'f16'/);
    await expectKvdError(() => t.fetch({ layer: 0, k: kvTensor(64, 1, 16, 'f32', 1), v: k, selection: sel }), 'E_SHAPE', /expected heads 2 and dim 8/);
    await expectKvdError(() => t.fetch({ layer: 0, k, v: k, selection: { ...sel, chunkSize: 8 } }), 'E_SHAPE', /chunk size 4, got 8/);
    await expectKvdError(() => t.fetch({ layer: 0, k, v: k, selection: { ...sel, offsets: Int32Array.from([0, 2, 2]), chunkIds: Int32Array.from([5, 3]) } }), 'E_RANGE', /ascending unique/);
    await expectKvdError(() => t.fetch({ layer: 0, k, v: k, selection: { ...sel, chunkIds: Int32Array.from([3, 99]) } }), 'E_RANGE', /chunk id in \[0, 16\).*, got 99/);
    await expectKvdError(() => t.fetch({ layer: 0, k, v: k, selection: { ...sel, tokens: 65 } }), 'E_RANGE', /tokens/);
    await expectKvdError(
      () => t.fetch({ layer: 0, k, v: k, selection: { ...sel, poolOffsets: Int32Array.from([0, 1, 2]), poolIds: Int32Array.from([1, 2]), poolScores: Float32Array.from([1, NaN]) } }),
      'E_NONFINITE',
      /poolScores\[1\]/,
    );
    await expectKvdError(() => t.attend({ layer: 0, k, v: k, selection: sel, q: new Float32Array(3), qHeads: 4 }), 'E_SHAPE', /q \(qHeads\*dim\): expected 32 elements, got 3/);
    await expectKvdError(() => t.attend({ layer: 0, k, v: k, selection: sel, q: new Float32Array(24), qHeads: 3 }), 'E_SHAPE', /multiple of the kv heads/);
    await expectKvdError(() => t.recordMass({ layer: 0, selection: sel, chunkMass: new Float32Array(5) }), 'E_SHAPE', /one per selected chunk/);
    await expectKvdError(() => t.warm({ layer: 0, k, v: k, offsets: Int32Array.from([0, 1, 1]), chunkIds: Int32Array.from([40]) }), 'E_RANGE', /got 40/);
    await expectKvdError(() => importanceScores(k, { q: new Float32Array(32), qHeads: 4, positions: new Int32Array(0) }, 4), 'E_SHAPE', /at least one observation query/);
    t.destroy();
    await expectKvdError(() => t.fetch({ layer: 0, k, v: k, selection: sel }), 'E_CLOSED', /destroyed/);
  });
});
