import { describe, expect, it } from 'vitest';
import { type KvTensor, type PolicyName, type Selection } from '../src/index.js';
import { createPolicy, NativeSelectionPolicy } from '../src/index/policy.js';
import { centroidTiles, chunkMeans, indexKernelLevel, scoreCentroids } from '../src/index/kernels.js';
import { structuredCase } from './index-data.js';
import { expectKvdError, randn } from './helpers.js';

// Index-only selection (levels 1-2; no key sketch, no shadowkv outlier chunks): what these tests
// check. The sketch re-rank is tested in index-sketch.test.ts, the outliers in index-shadowkv.test.ts.
const INDEX_ONLY = { kvdrive: { keySketch: false }, quest: {}, shadowkv: { outlierChunks: 0 } } as const satisfies Record<PolicyName, object>;

const POLICIES: PolicyName[] = ['kvdrive', 'quest', 'shadowkv'];
const C = structuredCase({ tokens: 1500, kvHeads: 2, qHeads: 4, dim: 16, seed: 2, queries: 2 });

function kv(tokens = C.tokens, data: Float32Array = C.keys): KvTensor {
  return { data: data.subarray(0, tokens * C.kvHeads * C.dim), dtype: 'f32', tokens, heads: C.kvHeads, dim: C.dim };
}

function f32ToBf16(a: Float32Array): Uint16Array {
  const u = new Uint32Array(a.buffer.slice(0));
  const out = new Uint16Array(a.length);
  for (let i = 0; i < a.length; i++) out[i] = (u[i]! + 0x7fff + ((u[i]! >>> 16) & 1)) >>> 16;
  return out;
}

/** Tokens of kv head h the selection attends beside sinks and tail. */
function selectedTokens(sel: Selection, h: number): number {
  let n = 0;
  for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) {
    const j = sel.chunkIds[i]!;
    n += Math.min((j + 1) * sel.chunkSize, sel.tailStart) - Math.max(j * sel.chunkSize, sel.sinkEnd);
  }
  return n;
}

function checkShape(sel: Selection, heads: number): void {
  expect(sel.offsets.length).toBe(heads + 1);
  expect(sel.offsets[0]).toBe(0);
  expect(sel.offsets[heads]).toBe(sel.chunkIds.length);
  for (let h = 0; h < heads; h++)
    for (let i = sel.offsets[h]! + 1; i < sel.offsets[h + 1]!; i++) expect(sel.chunkIds[i]!).toBeGreaterThan(sel.chunkIds[i - 1]!);
  for (const j of sel.chunkIds) {
    expect((j + 1) * sel.chunkSize).toBeGreaterThan(sel.sinkEnd);
    expect(j * sel.chunkSize).toBeLessThan(sel.tailStart);
  }
}

describe('index kernels', () => {
  it('scoreCentroids = max over the group of q·c, and chunkMeans = mean keys (vs plain TS), odd sizes', () => {
    for (const [g, dim] of [[3, 37], [4, 16], [5, 8], [1, 130]] as const) {
      const n = 29;
      const q = randn(g * dim, g);
      const c = randn(n * dim, dim);
      const got = scoreCentroids(q, g, c, n, dim);
      expect(scoreCentroids(q, g, centroidTiles(c, n, dim), n, dim, 'tiles')).toEqual(got);
      for (let i = 0; i < n; i++) {
        let want = -Infinity;
        for (let j = 0; j < g; j++) {
          let s = 0;
          for (let d = 0; d < dim; d++) s += q[j * dim + d]! * c[i * dim + d]!;
          want = Math.max(want, s);
        }
        expect(got[i]!).toBeCloseTo(want, 4);
      }
    }
    const m = chunkMeans(kv(), { start: 8, end: 20, chunkSize: 3, head: 1 });
    expect(m.length).toBe(4 * 16);
    for (let j = 0; j < 4; j++)
      for (let d = 0; d < 16; d++) {
        let s = 0;
        for (let t = 8 + 3 * j; t < 11 + 3 * j; t++) s += C.keys[(t * 2 + 1) * 16 + d]!;
        expect(m[j * 16 + d]!).toBeCloseTo(s / 3, 5);
      }
  });
});

describe('selection policies', () => {
  it.each(POLICIES)('%s: geometry, every chunk at a budget >= context, budget respected below', async (name) => {
    const p = createPolicy(name, { ...INDEX_ONLY[name], qHeads: 4, kvHeads: 2, headDim: 16 });
    await p.build(kv(), C.tokens);
    const c = p.chunkSize;
    const q = C.queries[0]!;
    const all = p.select(q, C.tokens);
    expect(all.chunkSize).toBe(c);
    expect(all.tokens).toBe(C.tokens);
    expect(all.sinkEnd).toBe(4);
    // Tail = local window (64) plus the unsealed remainder: starts at a chunk boundary.
    expect(all.tailStart).toBe(Math.floor((C.tokens - 64) / c) * c);
    checkShape(all, 2);
    const first = Math.floor(4 / c);
    const nChunks = all.tailStart / c - first;
    for (let h = 0; h < 2; h++) {
      expect(all.offsets[h + 1]! - all.offsets[h]!).toBe(nChunks);
      expect(selectedTokens(all, h)).toBe(all.tailStart - all.sinkEnd);
    }
    for (const budget of [1, 7, 64, 100, 333]) {
      const sel = p.select(q, budget);
      checkShape(sel, 2);
      for (let h = 0; h < 2; h++) {
        const n = selectedTokens(sel, h);
        expect(n).toBeLessThanOrEqual(budget);
        expect(n).toBeGreaterThan(budget - c); // filled up to less than one chunk short
      }
    }
    expect(p.indexBytes()).toBeGreaterThan(0);
    const st = p.lastSelectStats();
    expect(st.vectorsScored).toBeGreaterThan(0);
    // Index vectors are f32 (4 bytes per element) except kvdrive's centroids, scored as 4-bit tiles:
    // dim / 2 bytes of codes (dim a multiple of 8 here) plus a 4-byte scale each.
    let centroids = 0;
    if (p instanceof NativeSelectionPolicy)
      for (let h = 0; h < 2; h++) for (const seg of p.clusters(h)) centroids += seg.k;
    if (name === 'kvdrive') expect(centroids).toBeGreaterThan(0);
    expect(st.bytesScored).toBe((st.vectorsScored - centroids) * 16 * 4 + centroids * (16 / 2 + 4));
  });

  it.each(POLICIES)('%s: lookahead pool ranks best first and contains the selection', async (name) => {
    const p = createPolicy(name, INDEX_ONLY[name]);
    await p.build(kv(), C.tokens);
    const sel = p.select(C.queries[1]!, 128, { pool: 256 });
    for (let h = 0; h < 2; h++) {
      const ids = sel.poolIds!.subarray(sel.poolOffsets![h]!, sel.poolOffsets![h + 1]!);
      const sc = sel.poolScores!.subarray(sel.poolOffsets![h]!, sel.poolOffsets![h + 1]!);
      let toks = 0;
      for (let i = 0; i < ids.length; i++) {
        if (i > 0) expect(sc[i]!).toBeLessThanOrEqual(sc[i - 1]!);
        toks += Math.min((ids[i]! + 1) * p.chunkSize, sel.tailStart) - Math.max(ids[i]! * p.chunkSize, sel.sinkEnd);
      }
      expect(toks).toBeLessThanOrEqual(256);
      expect(toks).toBeGreaterThan(256 - p.chunkSize);
      const pool = new Set(ids);
      for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) expect(pool.has(sel.chunkIds[i]!)).toBe(true);
    }
    expect(p.select(C.queries[1]!, 128).poolIds).toBeUndefined();
  });

  it('shadowkv scores match q·chunk-mean (max over the group): top chunk is the argmax', async () => {
    const p = createPolicy('shadowkv', { outlierChunks: 0, sinks: 0, local: 0 });
    await p.build(kv(), C.tokens);
    const sel = p.select(C.queries[0]!, 8, { pool: 8 });
    for (let h = 0; h < 2; h++) {
      const means = chunkMeans(kv(), { chunkSize: 8, head: h, end: 1496 });
      const s = scoreCentroids(C.queries[0]!.subarray(h * 32, (h + 1) * 32), 2, means, means.length / 16, 16);
      let best = 0;
      for (let j = 1; j < s.length; j++) if (s[j]! > s[best]!) best = j;
      expect(sel.poolIds![sel.poolOffsets![h]!]).toBe(best);
      expect(sel.poolScores![sel.poolOffsets![h]!]).toBeCloseTo(s[best]!, 3);
    }
  });

  it('kvdrive: deterministic, CSR membership covers every indexed chunk exactly once, per segment', async () => {
    const opts = { keySketch: false, segmentTokens: 512, seed: 9 };
    const a = createPolicy('kvdrive', opts) as NativeSelectionPolicy;
    const b = createPolicy('kvdrive', opts) as NativeSelectionPolicy;
    await a.build(kv(), C.tokens);
    await b.build(kv(), C.tokens);
    const sel = a.select(C.queries[0]!, C.tokens);
    for (let h = 0; h < 2; h++) {
      const segs = a.clusters(h);
      expect(b.clusters(h)).toEqual(segs);
      expect(segs.length).toBe(3); // 1436 indexed tokens in segments of 512
      const seen = new Map<number, number>();
      for (const s of segs) {
        expect(s.offsets.length).toBe(s.k + 1);
        expect(s.offsets[s.k]).toBe(s.endChunk - s.firstChunk);
        expect(s.k).toBe(Math.ceil(((s.endChunk - s.firstChunk) * 4) / 16));
        for (const m of s.members) {
          expect(m).toBeGreaterThanOrEqual(s.firstChunk);
          expect(m).toBeLessThan(s.endChunk);
          seen.set(m, (seen.get(m) ?? 0) + 1);
        }
      }
      const ids = sel.chunkIds.subarray(sel.offsets[h]!, sel.offsets[h + 1]!);
      expect(seen.size).toBe(ids.length);
      for (const j of ids) expect(seen.get(j)).toBe(1);
    }
    expect(a.select(C.queries[1]!, 100)).toEqual(b.select(C.queries[1]!, 100));
  });

  it('extend seals chunks incrementally; a filled segment is re-clustered; selections stay complete', async () => {
    // reclusterDelay 0: the k-means runs inside the extend that fills (the deferred re-clustering is
    // test/index-recluster.test.ts).
    const p = createPolicy('kvdrive', { keySketch: false, segmentTokens: 256, reclusterDelay: 0 }) as NativeSelectionPolicy;
    await p.build(kv(600), 600);
    const before = p.clusters(0);
    expect(before.at(-1)!.full).toBe(false); // 600 - 64 = 536 tokens: the third segment is partial
    for (let t = 601; t <= 900; t++) p.extend(kv(), t);
    const sel = p.select(C.queries[0]!, 10_000);
    expect(sel.tokens).toBe(900);
    expect(sel.tailStart).toBe(Math.floor((900 - 64) / 4) * 4);
    const segs = p.clusters(0);
    expect(segs.length).toBe(4);
    expect(segs.slice(0, 3).every((s) => s.full)).toBe(true);
    expect(segs[3]!.full).toBe(false);
    let chunks = 0;
    for (const s of segs) {
      chunks += s.members.length;
      // Online growth keeps ~tokensPerCluster tokens per cluster.
      expect(s.k).toBe(Math.ceil(((s.endChunk - s.firstChunk) * 4) / 16));
    }
    expect(chunks).toBe(sel.tailStart / 4 - 1);
    expect(sel.offsets[1]).toBe(chunks);
    // The re-clustered segments equal a fresh build over the same tokens.
    const fresh = createPolicy('kvdrive', { keySketch: false, segmentTokens: 256, reclusterDelay: 0 }) as NativeSelectionPolicy;
    await fresh.build(kv(), 900);
    expect(fresh.clusters(0).slice(0, 3)).toEqual(segs.slice(0, 3));
    // Quest / shadowkv extend too.
    for (const name of ['quest', 'shadowkv'] as const) {
      const f = createPolicy(name, INDEX_ONLY[name]);
      await f.build(kv(300), 300);
      f.extend(kv(), 700);
      const s = f.select(C.queries[0]!, 10_000);
      expect(s.tailStart).toBe(Math.floor((700 - 64) / f.chunkSize) * f.chunkSize);
      expect(selectedTokens(s, 1)).toBe(s.tailStart - 4);
    }
  });

  it('reads f16 and bf16 keys (same selection as their f32 values)', async () => {
    const bits = f32ToBf16(C.keys);
    const widened = new Float32Array(new Uint32Array(Array.from(bits, (b) => b << 16)).buffer);
    for (const name of POLICIES) {
      const a = createPolicy(name, INDEX_ONLY[name]);
      const b = createPolicy(name, INDEX_ONLY[name]);
      await a.build({ ...kv(), data: bits, dtype: 'bf16' }, C.tokens);
      await b.build(kv(C.tokens, widened), C.tokens);
      expect(a.select(C.queries[0]!, 200)).toEqual(b.select(C.queries[0]!, 200));
    }
    const half = new Uint16Array(C.keys.length).fill(0x3c00); // f16 1.0
    const p = createPolicy('kvdrive', { keySketch: false });
    await p.build({ ...kv(), data: half, dtype: 'f16' }, C.tokens);
    expect(chunkMeans({ ...kv(), data: half, dtype: 'f16' }, { start: 4, end: 12 })[0]).toBe(1);
  });

  it('kvdrive clusters and selections are bit-identical at every index-kernel SIMD level, and for the htd layout', async () => {
    const run = async (level: 'scalar' | 'avx2' | 'avx512' | 'best', k: KvTensor) => {
      indexKernelLevel(level);
      try {
        const p = createPolicy('kvdrive', { keySketch: false, segmentTokens: 512 }) as NativeSelectionPolicy;
        await p.build(k, C.tokens);
        return { clusters: p.clusters(1), sel: p.select(C.queries[0]!, 300, { pool: 400 }) };
      } finally {
        indexKernelLevel('best');
      }
    };
    const ref = await run('scalar', kv());
    for (const level of ['avx2', 'avx512', 'best'] as const) expect(await run(level, kv())).toEqual(ref);
    // The same keys stored head-major ([H, T, D]).
    const htd = new Float32Array(C.keys.length);
    for (let t = 0; t < C.tokens; t++)
      for (let h = 0; h < 2; h++) htd.set(C.keys.subarray((t * 2 + h) * 16, (t * 2 + h + 1) * 16), (h * C.tokens + t) * 16);
    expect(await run('best', { ...kv(), data: htd, layout: 'htd' })).toEqual(ref);
  });

  it('index build of a layer runs off the JS thread (the event loop keeps turning)', async () => {
    const big = structuredCase({ tokens: 8192, kvHeads: 4, qHeads: 4, dim: 64, seed: 1, queries: 1 });
    const p = createPolicy('kvdrive', { keySketch: false });
    let ticks = 0;
    const timer = setInterval(() => ticks++, 0);
    const done = p.build({ data: big.keys, dtype: 'f32', tokens: 8192, heads: 4, dim: 64 }, 8192);
    await expectKvdError(() => p.select(big.queries[0]!, 64), 'E_CONFIG', /build\(\) in progress/);
    await done;
    clearInterval(timer);
    expect(ticks).toBeGreaterThan(0);
  });
});

describe('selection policies reject bad input with typed errors', () => {
  it('options', async () => {
    await expectKvdError(() => createPolicy('magic' as never), 'E_POLICY', /one of 'kvdrive', 'quest', 'shadowkv', got "magic"/);
    await expectKvdError(() => createPolicy('kvdrive', { chunkSize: 0 }), 'E_CONFIG', /chunkSize: expected an integer in \[1, 65536\], got 0/);
    await expectKvdError(() => createPolicy('kvdrive', { local: 2.5 }), 'E_CONFIG', /local: .*got 2.5/);
    await expectKvdError(() => createPolicy('kvdrive', { candidateFactor: 0.5 }), 'E_CONFIG', /candidateFactor: expected a number in \[1, 1e6\], got 0.5/);
    await expectKvdError(() => createPolicy('kvdrive', { segmentTokens: 1001 }), 'E_CONFIG', /multiple of chunkSize 4, got 1001/);
    await expectKvdError(() => createPolicy('kvdrive', { bogus: 1 } as never), 'E_CONFIG', /unknown 'bogus'/);
    await expectKvdError(() => createPolicy('quest', { tokensPerCluster: 8 }), 'E_CONFIG', /kvdrive-only.*got tokensPerCluster/);
    await expectKvdError(() => createPolicy('kvdrive', { qHeads: 6, kvHeads: 4 }), 'E_CONFIG', /multiple of kvHeads 4, got 6/);
    await expectKvdError(() => createPolicy('kvdrive', 5 as never), 'E_CONFIG', /options object, got 5/);
  });

  it('build / extend', async () => {
    const p = createPolicy('kvdrive', { keySketch: false, kvHeads: 2, headDim: 16 });
    await expectKvdError(() => p.select(C.queries[0]!, 10), 'E_CONFIG', /build\(\) to have completed first/);
    await expectKvdError(() => p.extend(kv(), 10), 'E_CONFIG', /build\(\) to have completed first/);
    await expectKvdError(() => p.build(kv(), C.tokens + 1), 'E_SHAPE', /at most k.tokens = 1500, got 1501/);
    await expectKvdError(() => p.build(kv(), -1), 'E_RANGE', /non-negative integer, got -1/);
    await expectKvdError(() => p.build({ ...kv(), heads: 4, dim: 8 }, 10), 'E_SHAPE', /kvHeads = 2, got 4/);
    await expectKvdError(() => p.build({ ...kv(), dtype: 'f16' }, 10), 'E_DTYPE', /Uint16Array, got a Float32Array/);
    await expectKvdError(() => p.build({ ...kv(), dtype: 'f8' as never }, 10), 'E_DTYPE', /'f32', 'f16' or 'bf16', got 'f8'/);
    await expectKvdError(() => p.build({ ...kv(), tokens: 1400 }, 10), 'E_SHAPE', /expected 44800 elements, got 48000/);
    await expectKvdError(() => p.build({ ...kv(), layout: 'xyz' as never }, 10), 'E_CONFIG', /layout: expected 'thd' or 'htd', got 'xyz'/);
    const bad = C.keys.slice();
    bad[(700 * 2 + 1) * 16 + 3] = Infinity;
    await expectKvdError(() => p.build(kv(C.tokens, bad), C.tokens), 'E_NONFINITE', /NaN or Inf in kv head 1, tokens \[700, 704\)/);
    await p.build(kv(800), 800);
    await expectKvdError(() => p.extend(kv(), 700), 'E_RANGE', /expected >= 800 \(the context only grows\), got 700/);
    const bad2 = C.keys.slice();
    bad2[(900 * 2 + 1) * 16] = NaN;
    await expectKvdError(() => p.extend(kv(C.tokens, bad2), 1000), 'E_NONFINITE', /kv head 1, tokens \[900, 904\)/);
    // A failed extend leaves the index as it was.
    p.extend(kv(), 1000);
    expect(p.select(C.queries[0]!, 10_000).tailStart).toBe(936);
    const q = createPolicy('quest');
    await q.build({ data: new Float32Array(0), dtype: 'f32', tokens: 0, heads: 2, dim: 16 }, 0);
    await expectKvdError(() => q.extend({ ...kv(), heads: 1, data: new Float32Array(1500 * 16) }, 1500), 'E_SHAPE', /2 kv heads x dim 16 as at build, got 1 x 16/);
  });

  it('select', async () => {
    const p = createPolicy('kvdrive', { keySketch: false, qHeads: 4, headDim: 16 }) as NativeSelectionPolicy;
    await p.build(kv(), C.tokens);
    const q = C.queries[0]!;
    await expectKvdError(() => p.select(q, 0), 'E_BUDGET', /budget.*expected an integer >= 1, got 0/);
    await expectKvdError(() => p.select(q, 1.5), 'E_BUDGET', /got 1.5/);
    await expectKvdError(() => p.select(q, 64, { pool: 32 }), 'E_BUDGET', /pool.*>= the budget 64, got 32/);
    await expectKvdError(() => p.select(q.subarray(0, 48), 64), 'E_SHAPE', /qHeads\*headDim = 64 elements, got Float32Array\(48\)/);
    await expectKvdError(() => p.select(Array.from(q) as never, 64), 'E_TYPE', /Float32Array/);
    const nan = q.slice();
    nan[17] = NaN;
    await expectKvdError(() => p.select(nan, 64), 'E_NONFINITE', /select q: expected finite values, got NaN at element 17/);
    await expectKvdError(() => p.clusters(2), 'E_RANGE', /clusters head: expected an integer in \[0, 1\], got 2/);
    const loose = createPolicy('shadowkv', { outlierChunks: 0 });
    await loose.build(kv(), C.tokens);
    await expectKvdError(() => loose.select(q.subarray(0, 40), 64), 'E_SHAPE', /multiple of kvHeads 2 and dim 16, got 40/);
  });

  it('kernels', async () => {
    const q = randn(32, 1);
    await expectKvdError(() => scoreCentroids(q, 2, new Float32Array(48), 4, 16), 'E_SHAPE', /centroids \(n\*dim\): expected 64 elements, got 48/);
    await expectKvdError(() => scoreCentroids(q, 3, new Float32Array(48), 3, 16), 'E_SHAPE', /q \(groupSize\*dim\): expected 48 elements, got 32/);
    await expectKvdError(() => scoreCentroids(q, 0, new Float32Array(48), 3, 16), 'E_RANGE', /groupSize: expected an integer in \[1, 4096\], got 0/);
    const inf = q.slice();
    inf[3] = -Infinity;
    await expectKvdError(() => scoreCentroids(inf, 2, new Float32Array(48), 3, 16), 'E_NONFINITE', /scoreCentroids q: expected finite values, got Inf at element 3/);
    await expectKvdError(() => scoreCentroids(q, 2, new Uint16Array(48) as never, 3, 16), 'E_DTYPE', /Float32Array, got a Uint16Array/);
    await expectKvdError(() => scoreCentroids(q, 2, new Float32Array(48), 3, 16, 'tiles'), 'E_SHAPE', /tiles: ceil\(n\/16\)\*16\*dim\): expected 256 elements, got 48/);
    await expectKvdError(() => scoreCentroids(q, 2, new Float32Array(48), 3, 16, 'cols' as never), 'E_CONFIG', /expected 'rows', 'tiles', 'tiles8' or 'tiles4', got 'cols'/);
    await expectKvdError(() => chunkMeans(kv(), { chunkSize: 0 }), 'E_RANGE', /chunkSize: expected an integer in \[1, 1048576\], got 0/);
    await expectKvdError(() => chunkMeans(kv(), { start: 0, end: 10, chunkSize: 4 }), 'E_SHAPE', /multiple of chunkSize 4, got 10/);
    await expectKvdError(() => chunkMeans(kv(), { head: 2 }), 'E_RANGE', /head: expected an integer in \[0, 1\], got 2/);
    await expectKvdError(() => chunkMeans(kv(), { end: 2000 }), 'E_RANGE', /end: expected an integer in \[0, 1500\], got 2000/);
  });
});
