// The compact kvdrive index of offloaded decodes (native/index/key_sketch.h, native/index/layer_index.h): the
// 4-bit key sketch (two codes per byte) and releaseChunkMeans (full segments drop their f32 chunk
// means). The sketch's scores must stay within the quantization bound of exact q·k at both widths
// and be bit-identical at every SIMD level (including head dims with a partial 64-dim block);
// released chunk means must be gone from indexBytes() exactly, with the same selection when the
// re-rank covered every candidate anyway; and the options that would leave select without a
// level-3 re-rank are refused.
import { describe, expect, it } from 'vitest';
import { type PolicyOptions } from '../src/index.js';
import { createPolicy, NativeSelectionPolicy } from '../src/index/policy.js';
import { indexKernelLevel } from '../src/index/kernels.js';
import { offloadedPolicyOptions } from '../src/index/options.js';
import { prefixView } from '../src/eval/replay.js';
import { expectKvdError } from './helpers.js';
import { traceReplay } from './trace-replay.js';

function randomKeys(tokens: number, heads: number, dim: number, seed: number) {
  const data = new Float32Array(tokens * heads * dim);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < data.length; i++) {
    x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + 0x6b43a9b5) >>> 0;
    // A few loud channels, as real keys have: per-channel scales keep them from flattening the rest.
    data[i] = (x / 2 ** 31 - 1) * ((i % dim) % 17 === 3 ? 8 : 1);
  }
  return { data, dtype: 'f32' as const, tokens, heads, dim };
}

function randomQuery(n: number, seed: number): Float32Array {
  const q = new Float32Array(n);
  let x = seed;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x ^ (x >>> 13), 0x5bd1e995) + 0x165667b1) >>> 0;
    q[i] = x / 2 ** 31 - 1;
  }
  return q;
}

function sketchPolicy(options: PolicyOptions, shape: { kvHeads: number; headDim: number; qHeads: number }): NativeSelectionPolicy {
  const p = createPolicy('kvdrive', { keySketch: true, ...options, ...shape });
  if (!(p instanceof NativeSelectionPolicy)) throw new Error('expected the native policy');
  return p;
}

describe('kvdrive compact index', () => {
  it('sketch scores are within the quantization bound of exact q·k (8 and 4 bits)', () => {
    const T = 3000;
    const shape = { qHeads: 4, kvHeads: 2, headDim: 96 };
    const D = shape.headDim;
    const k = randomKeys(T, shape.kvHeads, D, 7);
    const g = shape.qHeads / shape.kvHeads;
    const tokens = Int32Array.from({ length: 400 }, (_, i) => (i * 7919) % T);
    const worst: Record<number, number> = {};
    for (const bits of [8, 4] as const) {
      const M = bits === 8 ? 127 : 7;
      // Query levels: int16 at 8 bits, int8 at 4 bits (the VNNI kernel's byte products).
      const levels = Math.min(bits === 8 ? 32767 : 127, Math.floor((2 ** 31 - 1) / (D * (bits === 8 ? 127 : 15))));
      const p = sketchPolicy({ sketchBits: bits }, shape);
      p.buildSync(k, T);
      worst[bits] = 0;
      for (let h = 0; h < shape.kvHeads; h++) {
        // Channel scales: max |k| per channel over the build's tokens (the calibration).
        const c = new Float64Array(D);
        for (let t = 0; t < T; t++) for (let d = 0; d < D; d++) c[d] = Math.max(c[d]!, Math.abs(k.data[(t * shape.kvHeads + h) * D + d]!));
        const q = randomQuery(g * D, 100 + h);
        const got = p.sketchScores(q, h, tokens);
        for (let j = 0; j < g; j++) {
          let qc = 0;
          let qmax = 0;
          for (let d = 0; d < D; d++) {
            qc += Math.abs(q[j * D + d]! * c[d]!);
            qmax = Math.max(qmax, Math.abs(q[j * D + d]! * c[d]!));
          }
          const qs = qmax / levels;
          tokens.forEach((t, i) => {
            let exact = 0;
            let st = 0;
            for (let d = 0; d < D; d++) {
              const x = k.data[(t * shape.kvHeads + h) * D + d]!;
              exact += q[j * D + d]! * x;
              st = Math.max(st, Math.abs(x / c[d]!));
            }
            st /= M;
            // Key rounding: at most st/2 per normalised channel, times |q_d c_d|; query rounding: at
            // most qs/2 per channel, times |code| <= M. Plus f32 arithmetic.
            const bound = (st / 2) * qc + (qs / 2) * st * M * D;
            const err = Math.abs(got[j * tokens.length + i]! - exact);
            expect(err, `bits ${bits} head ${h} q ${j} token ${t}`).toBeLessThanOrEqual(bound * 1.001 + 1e-4);
            worst[bits] = Math.max(worst[bits]!, err / bound);
          });
        }
      }
    }
    console.log(`sketch error / bound, worst: 8-bit ${worst[8]!.toFixed(3)}, 4-bit ${worst[4]!.toFixed(3)}`);
  });

  it('4-bit scores are bit-identical at every SIMD level for any row count (the VNNI kernel\'s 16-row tiles and their leftovers)', () => {
    // Tiles take 4 positions of each of 4 streams; counts around multiples of 16 leave 0-3 rows per
    // stream and 0-3 after the streams to the one-row body.
    const best = indexKernelLevel('best');
    for (const [D, group] of [[128, 4], [256, 8]] as const) {
      const shape = { qHeads: group, kvHeads: 1, headDim: D };
      const T = 600;
      const p = sketchPolicy({ sketchBits: 4 }, shape);
      p.buildSync(randomKeys(T, shape.kvHeads, D, D + group), T);
      const q = randomQuery(group * D, D + 1);
      for (const n of [1, 3, 15, 16, 17, 31, 64, 67, 79, 255, 600]) {
        const tokens = Int32Array.from({ length: n }, (_, i) => (i * 53 + (i % 7 === 0 ? 1 : 0)) % T);
        indexKernelLevel('scalar');
        const want = Array.from(p.sketchScores(q, 0, tokens));
        indexKernelLevel('avx512');
        expect(Array.from(p.sketchScores(q, 0, tokens)), `dim ${D} group ${group} rows ${n}`).toEqual(want);
      }
      indexKernelLevel('best');
    }
    expect(indexKernelLevel()).toBe(best);
  });

  it('4-bit scores are bit-identical at every SIMD level, for whole and partial 64-dim blocks and any group', () => {
    const best = indexKernelLevel('best');
    // Groups of 4 and 8 over 1-4 whole blocks take the AVX2 body's compile-time-block path; the
    // rest (partial blocks, a group of 2) its general one.
    for (const [D, group] of [[128, 4], [64, 4], [192, 4], [256, 4], [96, 4], [37, 4], [128, 8], [128, 2], [320, 4]] as const) {
      const shape = { qHeads: 2 * group, kvHeads: 2, headDim: D };
      const T = 700;
      const p = sketchPolicy({ sketchBits: 4 }, shape);
      p.buildSync(randomKeys(T, shape.kvHeads, D, D), T);
      const tokens = Int32Array.from({ length: 97 }, (_, i) => (i * 31) % T);
      const q = randomQuery(group * D, D);
      indexKernelLevel('scalar');
      const want = Array.from(p.sketchScores(q, 1, tokens));
      for (const level of ['avx2', 'avx512'] as const) {
        indexKernelLevel(level);
        expect(Array.from(p.sketchScores(q, 1, tokens)), `dim ${D} group ${group} level ${level}`).toEqual(want);
      }
      indexKernelLevel('best');
    }
    expect(indexKernelLevel()).toBe(best);
  });

  it('the sketch quantized at every SIMD level is the same: scores and selections bit-identical (8 and 4 bits)', () => {
    // The build quantizes each key row (QuantizeCodes: a scalar loop, or AVX2 passes at the vector
    // levels). Scored at one level, sketches built at different levels must agree exactly; keys of
    // very different magnitudes, exact zeros and -0 rows exercise the rounding and the zero scale.
    const best = indexKernelLevel('best');
    const shape = { qHeads: 8, kvHeads: 2, headDim: 72 };
    const T = 900;
    const k = randomKeys(T, shape.kvHeads, shape.headDim, 5);
    for (let t = 0; t < T; t++) {
      const row = k.data.subarray(t * shape.kvHeads * shape.headDim, (t + 1) * shape.kvHeads * shape.headDim);
      if (t % 50 === 7) row.fill(0);
      else if (t % 50 === 9) row.fill(-0);
      else if (t % 3 === 0) for (let i = 0; i < row.length; i++) row[i]! *= 10 ** ((t % 11) - 5);
    }
    const tokens = Int32Array.from({ length: 300 }, (_, i) => (i * 37) % T);
    const q = randomQuery(4 * shape.headDim, 9);
    const qAll = randomQuery(shape.qHeads * shape.headDim, 10);
    for (const bits of [8, 4] as const) {
      const built = (['scalar', 'avx2', 'avx512'] as const).map((level) => {
        indexKernelLevel(level);
        const p = sketchPolicy({ sketchBits: bits }, shape);
        p.buildSync(k, T);
        return p;
      });
      indexKernelLevel('scalar');
      const want = Array.from(built[0]!.sketchScores(q, 1, tokens));
      const wantSel = Array.from(built[0]!.select(qAll, 64).chunkIds);
      for (const p of built.slice(1)) {
        expect(Array.from(p.sketchScores(q, 1, tokens)), `bits ${bits}`).toEqual(want);
        expect(Array.from(p.select(qAll, 64).chunkIds), `bits ${bits}`).toEqual(wantSel);
      }
      indexKernelLevel('best');
    }
    expect(indexKernelLevel()).toBe(best);
  });

  it('releaseChunkMeans: full segments hold no chunk means, same selection when every candidate was re-ranked', async () => {
    const T = 8192;
    const shape = { qHeads: 8, kvHeads: 2, headDim: 64 };
    const tr = await traceReplay({ T, steps: 3, budget: 64, shape, seed: 11 });
    const seg = 1024;
    // rerankFactor large: the re-rank covers every candidate with or without the chunk means.
    const base: PolicyOptions = { keySketch: true, sketchBits: 4, segmentTokens: seg, rerankFactor: 1e6 };
    const kept = await tr.replay(base, false);
    const released = await tr.replay({ ...base, releaseChunkMeans: true }, false);
    expect(released.sels.map((s) => Array.from(s.chunkIds))).toEqual(kept.sels.map((s) => Array.from(s.chunkIds)));
    // After the replay, T + 3 tokens: chunks [1, endChunk) indexed; with release only the open
    // segment's rows stay (4 * dim + 4 bytes each: the f32 mean and the variance).
    const endChunk = Math.floor((T + 3 - 64) / 4);
    const openFirst = Math.floor(endChunk / (seg / 4)) * (seg / 4);
    const rowBytes = 4 * shape.headDim + 4;
    expect(kept.bytes - released.bytes).toBe(shape.kvHeads * rowBytes * (openFirst - 1));
    console.log(`index bytes per token, dim 64 x 2 heads: chunk means kept ${(kept.bytes / (T + 3)).toFixed(1)}, released ${(released.bytes / (T + 3)).toFixed(1)}`);
  });

  it('releaseChunkMeans across extend: segments filled online drop their means too', () => {
    const shape = { qHeads: 4, kvHeads: 2, headDim: 64 };
    const T = 5000;
    const k = randomKeys(T, shape.kvHeads, shape.headDim, 3);
    const opts = { sketchBits: 4 as const, segmentTokens: 512 };
    const kept = sketchPolicy(opts, shape);
    const released = sketchPolicy({ ...opts, releaseChunkMeans: true }, shape);
    let last = 100;
    for (const p of [kept, released]) {
      p.buildSync(prefixView(k, 100), 100);
      for (let t = 101; t <= T; t += 13) p.extend(prefixView(k, (last = t)), t);
    }
    const rows = (kept.indexBytes() - released.indexBytes()) / (shape.kvHeads * (4 * shape.headDim + 4));
    // Every row but the open segment's (128 chunks per segment) was released.
    const endChunk = Math.floor((last - 64) / 4);
    expect(rows).toBe(Math.floor(endChunk / 128) * 128 - 1);
    const sel = released.select(randomQuery(shape.qHeads * shape.headDim, 5), 64);
    for (let h = 0; h < shape.kvHeads; h++) expect(sel.offsets[h + 1]! - sel.offsets[h]!).toBe(64);
  });

  it('releaseChunkMeans: an extend that seals several segments at once ends where small extends do', () => {
    // Released rows keep one segment's room (ReleaseChunkMeans); an extend sealing more than a
    // segment grows past it, and the release gives the excess back: same bytes and selection. (The
    // build covers 4096 tokens, so no extend re-measures the sketch's channel scales.)
    const shape = { qHeads: 4, kvHeads: 2, headDim: 64 };
    const [T0, T] = [4200, 6000];
    const k = randomKeys(T, shape.kvHeads, shape.headDim, 4);
    const opts = { sketchBits: 4 as const, segmentTokens: 512, releaseChunkMeans: true };
    const [stepped, jumped] = [sketchPolicy(opts, shape), sketchPolicy(opts, shape)];
    for (const p of [stepped, jumped]) p.buildSync(prefixView(k, T0), T0);
    for (let t = T0 + 1; t <= T; t += 7) stepped.extend(prefixView(k, t), t);
    stepped.extend(k, T);
    jumped.extend(k, T);
    expect(jumped.indexBytes()).toBe(stepped.indexBytes());
    for (let t = T - 100; t <= T; t += 25) {
      const q = randomQuery(shape.qHeads * shape.headDim, t);
      expect(Array.from(jumped.select(q, 64).chunkIds)).toEqual(Array.from(stepped.select(q, 64).chunkIds));
    }
  });

  it('full segments hold their sketch rows cluster by cluster: every token scores as in token order', () => {
    // Small segments fill (their rows move into slot order) and large ones never do; both calibrate
    // on the same tokens, so each token's sketch score must be the same bits. Grown from a short
    // build, the channel scales are re-measured as the context doubles (every row rewritten in token
    // order, full segments reordered again).
    const shape = { qHeads: 8, kvHeads: 2, headDim: 64 };
    const D = shape.headDim;
    const T = 3000;
    const k = randomKeys(T, shape.kvHeads, D, 5);
    const all = Int32Array.from({ length: T }, (_, i) => i);
    for (const bits of [4, 8] as const) {
      const [ordered, plain] = [128, 8192].map((segmentTokens) => sketchPolicy({ sketchBits: bits, segmentTokens }, shape));
      const [grown, grownPlain] = [128, 8192].map((segmentTokens) => sketchPolicy({ sketchBits: bits, segmentTokens, releaseChunkMeans: true }, shape));
      for (const p of [ordered, plain]) p.buildSync(k, T);
      for (const p of [grown, grownPlain]) {
        p.buildSync(prefixView(k, 40), 40);
        for (let t = 41; t <= T; t += 37) p.extend(prefixView(k, t), t);
        p.extend(k, T);
      }
      for (let h = 0; h < shape.kvHeads; h++) {
        const q = randomQuery(4 * D, 9 + h);
        expect(Array.from(ordered.sketchScores(q, h, all)), `${bits} bits, head ${h}, built`).toEqual(Array.from(plain.sketchScores(q, h, all)));
        expect(Array.from(grown.sketchScores(q, h, all)), `${bits} bits, head ${h}, grown`).toEqual(Array.from(grownPlain.sketchScores(q, h, all)));
      }
    }
  });

  it('refuses options that would leave select without a re-rank, and bad sketch widths', () => {
    expectKvdError(() => createPolicy('kvdrive', { releaseChunkMeans: true }), 'E_CONFIG', /releaseChunkMeans: expected keySketch true.*got keySketch false/);
    expectKvdError(() => createPolicy('kvdrive', { releaseChunkMeans: true, keySketch: true, rerankFactor: 0 }), 'E_CONFIG', /got rerankFactor 0/);
    expectKvdError(() => createPolicy('quest', { releaseChunkMeans: true }), 'E_CONFIG', /kvdrive-only/);
    expectKvdError(() => createPolicy('kvdrive', { keySketch: true, sketchBits: 6 as never }), 'E_CONFIG', /sketchBits: expected 4 or 8, got 6/);
    const p = sketchPolicy({}, { qHeads: 2, kvHeads: 1, headDim: 8 });
    p.buildSync(randomKeys(200, 1, 8, 1), 200);
    expectKvdError(() => p.sketchScores(new Float32Array(8), 0, Int32Array.of(200)), 'E_RANGE', /tokens\[0\]: expected a token in \[0, 200\), got 200/);
    const none = createPolicy('kvdrive', { qHeads: 2, kvHeads: 1, headDim: 8 }) as NativeSelectionPolicy;
    none.buildSync(randomKeys(200, 1, 8, 1), 200);
    expectKvdError(() => none.sketchScores(new Float32Array(8), 0, Int32Array.of(0)), 'E_CONFIG', /without a sketch/);
  });

  it('the offloaded select marks the same best tokens at every SIMD level, ties at the cut included', () => {
    // The runtime's select: every candidate re-ranked on the sketch, the best K tokens marked by a
    // radix cut whose passes split the entries branch-free (AVX-512 compresses 16 at a time). Keys
    // drawn from 6 rows only make whole groups of tokens share one score, so the cut falls inside a
    // tie, which ByRank breaks by token id at every level.
    const best = indexKernelLevel('best');
    const shape = { qHeads: 8, kvHeads: 2, headDim: 128 };
    const T = 3000;
    const distinct = randomKeys(6, shape.kvHeads, shape.headDim, 5);
    const row = shape.kvHeads * shape.headDim;
    const tied = new Float32Array(T * row);
    for (let t = 0; t < T; t++) tied.set(distinct.data.subarray(((t * 7) % 6) * row, (((t * 7) % 6) + 1) * row), t * row);
    for (const [name, keys] of [['random keys', randomKeys(T, shape.kvHeads, shape.headDim, 9).data], ['tied keys', tied]] as const) {
      const p = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { ...shape, segmentTokens: 512 })) as NativeSelectionPolicy;
      p.buildSync({ data: keys, dtype: 'f32', tokens: T, heads: shape.kvHeads, dim: shape.headDim }, T);
      const q = randomQuery(shape.qHeads * shape.headDim, 3);
      for (const budget of [1, 37, 256, 700, T]) {
        indexKernelLevel('scalar');
        const want = p.select(q, budget);
        for (const level of ['avx2', 'avx512'] as const) {
          indexKernelLevel(level);
          expect(p.select(q, budget), `${name}, budget ${budget}, ${level}`).toEqual(want);
        }
        indexKernelLevel('best');
        // Token-granular: at most the budget per head (sinks and the local window beside them).
        for (let h = 0; h < shape.kvHeads; h++) expect(want.offsets[h + 1]! - want.offsets[h]!).toBeLessThanOrEqual(budget);
      }
    }
    expect(indexKernelLevel()).toBe(best);
  });

  it('4-bit keyless select keeps the int8 recall on a demo-like trace (seed 11)', async () => {
    const tr = await traceReplay({ T: 8192, steps: 3, budget: 128, shape: { qHeads: 8, kvHeads: 2, headDim: 64 }, seed: 11 });
    const int8 = await tr.replay({ keySketch: true }, false);
    const int4 = await tr.replay({ keySketch: true, sketchBits: 4, releaseChunkMeans: true }, false);
    console.log(`recall / oracle (seed 11, keyless): int8 ${int8.ratio.toFixed(4)} (${int8.found}/${int8.total}), 4-bit + released means ${int4.ratio.toFixed(4)} (${int4.found}/${int4.total})`);
    expect(int4.found).toBeGreaterThanOrEqual(int8.found);
    expect(int4.ratio).toBeGreaterThanOrEqual(int8.ratio - 0.01);
    // Sketch rows read: ceil(dim / 2) + 4 bytes each at 4 bits.
    expect(int4.stats.bytesScored).toBeLessThan(int8.stats.bytesScored);
  });
});
