/**
 * Every SIMD level the CPU offers agrees with the scalar reference, primitive by primitive (odd
 * lengths, every dtype, every GQA group size) and end to end through the attention kernels; the
 * scalar fallback itself is exercised through setSimdLevel('scalar').
 */
import { afterAll, describe, expect, it } from 'vitest';
import { cpuFeatures, type Dtype } from '../src/index.js';
import { attendDense, attendSparse, computePeak } from '../src/attention/kernels.js';
import { setSimdLevel, type SimdLevel, native } from '../src/native.js';
import { randn } from './helpers.js';
import { allChunks, encode, randomKv, range, referenceAttention, relErr } from './attention-reference.js';

const DIMS = [1, 3, 17, 64, 128];
const DTYPES: Dtype[] = ['f32', 'f16', 'bf16'];
const levels = cpuFeatures().levels as SimdLevel[];
const vectorLevels = levels.filter((l) => l !== 'scalar');

afterAll(() => {
  setSimdLevel('best');
});

/** |a - b| <= 1e-5 * scale, where scale bounds the magnitude of the terms summed (no cancellation excuse). */
function expectClose(a: number, b: number, scale: number): void {
  expect(Math.abs(a - b)).toBeLessThanOrEqual(1e-5 * Math.max(scale, 1e-30));
}

function absDot(a: Float32Array, b: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < b.length; i++) s += Math.abs(a[i]! * b[i]!);
  return s;
}

describe('computePeak (the arithmetic baseline)', () => {
  it('runs the same twelve multiply-add chains at every level, on every thread', () => {
    const lanesOf: Record<SimdLevel, number> = { scalar: 1, avx2: 8, avx512: 16 };
    setSimdLevel('scalar');
    const perChain = computePeak(1000).sum / 1;
    for (const level of levels) {
      setSimdLevel(level);
      for (const threads of [1, 2]) {
        const r = computePeak(1000, threads);
        expect(r.flops).toBe(1000 * 12 * lanesOf[level] * 2 * threads);
        // Every lane of every chain computes the same values (an FMA, or a multiply then an add: f32
        // rounding apart; a missing lane or chain would be off by over 5%).
        expect(Math.abs(r.sum / (lanesOf[level] * threads) - perChain)).toBeLessThanOrEqual(1e-3 * perChain);
      }
    }
    setSimdLevel('best');
  });
});

describe('SIMD levels', () => {
  it('offers the scalar fallback and every level the CPU reports', () => {
    expect(levels[0]).toBe('scalar');
    const f = cpuFeatures();
    if (f.avx2 && f.fma && f.f16c) expect(levels).toContain('avx2');
    if (f.avx512f && f.avx512bw) expect(levels).toContain('avx512');
  });

  for (const level of levels) {
    describe(`level ${level} vs scalar`, () => {
      for (const dim of DIMS) {
        it(`dot_f32, dot_rows, logits_rows, axpy_row, to_f32 agree (n = ${dim})`, () => {
          const a = randn(dim, dim);
          const b = randn(dim, dim + 1);
          expectClose(native.simdDotF32(level, a, b), native.simdDotF32('scalar', a, b), absDot(a, b));
          for (const dtype of DTYPES) {
            const { data: row, exact } = encode(randn(dim, 7 * dim), dtype);
            expect(Array.from(native.simdToF32(level, row, dtype) as Float32Array)).toEqual(Array.from(exact));
            for (const nq of [1, 2, 3, 4, 5, 8, 11]) {
              const qs = randn(nq * dim, nq + dim);
              const got = native.simdDotRows(level, qs, nq, row, dtype) as Float32Array;
              const want = native.simdDotRows('scalar', qs, nq, row, dtype) as Float32Array;
              for (let j = 0; j < nq; j++) expectClose(got[j]!, want[j]!, absDot(qs.subarray(j * dim, (j + 1) * dim), exact));
            }
            // logits_rows: a tile of rows against a GQA group, written group-major.
            for (const nq of [1, 3, 4, 8, 10]) {
              const nrows = 5;
              const { data: rows, exact: rowsExact } = encode(randn(nrows * dim, 3 * dim + nq), dtype);
              const qs = randn(nq * dim, 5 * nq + dim);
              const got = native.simdLogitsRows(level, qs, nq, rows, dtype) as Float32Array;
              const want = native.simdLogitsRows('scalar', qs, nq, rows, dtype) as Float32Array;
              expect(got.length).toBe(nq * nrows);
              for (let j = 0; j < nq; j++)
                for (let r = 0; r < nrows; r++)
                  expectClose(got[j * nrows + r]!, want[j * nrows + r]!, absDot(qs.subarray(j * dim, (j + 1) * dim), rowsExact.subarray(r * dim, (r + 1) * dim)));
            }
            const acc0 = randn(dim, 3);
            const got = acc0.slice();
            const want = acc0.slice();
            native.simdAxpyRow(level, got, 0.37, row, dtype);
            native.simdAxpyRow('scalar', want, 0.37, row, dtype);
            for (let i = 0; i < dim; i++) expectClose(got[i]!, want[i]!, Math.abs(acc0[i]!) + Math.abs(0.37 * exact[i]!));
          }
        });

        it(`scale_max, exp_sum, weighted_rows agree (n = ${dim})`, () => {
          const len = dim * 5 + 3; // odd lengths for the logit passes too
          const x = randn(len, len);
          const xs = x.slice();
          const xr = x.slice();
          const ms = native.simdScaleMax(level, xs, 0.7) as { max: number; finite: boolean };
          const mr = native.simdScaleMax('scalar', xr, 0.7) as { max: number; finite: boolean };
          expect(ms).toEqual(mr);
          expect(Array.from(xs)).toEqual(Array.from(xr));
          const bad = x.slice();
          bad[len - 1] = Infinity;
          expect((native.simdScaleMax(level, bad, 1) as { finite: boolean }).finite).toBe(false);
          bad[len - 1] = NaN;
          expect((native.simdScaleMax(level, bad, 1) as { finite: boolean }).finite).toBe(false);

          const es = xs.slice();
          const er = xr.slice();
          // Include far-below-max values (underflow to 0) as softmax meets them.
          es[0] = er[0] = mr.max - 120;
          const ss = native.simdExpSum(level, es, mr.max) as number;
          const sr = native.simdExpSum('scalar', er, mr.max) as number;
          expectClose(ss, sr, sr);
          for (let i = 0; i < len; i++) expect(Math.abs(es[i]! - er[i]!)).toBeLessThanOrEqual(1e-6 * Math.max(er[i]!, 1e-30));

          for (const dtype of DTYPES) {
            for (const nq of [1, 2, 4, 5, 8, 9]) {
              const nrows = 37;
              const { data: rows, exact } = encode(randn(nrows * dim, dim + nq), dtype);
              const w = randn(nq * nrows, nq);
              const acc0 = randn(nq * dim, 2);
              const got = acc0.slice();
              const want = acc0.slice();
              native.simdWeightedRows(level, got, nq, w, rows, dtype);
              native.simdWeightedRows('scalar', want, nq, w, rows, dtype);
              for (let j = 0; j < nq; j++)
                for (let d = 0; d < dim; d++) {
                  let bound = Math.abs(acc0[j * dim + d]!);
                  for (let r = 0; r < nrows; r++) bound += Math.abs(w[j * nrows + r]! * exact[r * dim + d]!);
                  expectClose(got[j * dim + d]!, want[j * dim + d]!, bound);
                }
            }
          }
        });
      }
    });
  }

  for (const dim of DIMS) {
    it(`attention agrees across levels and with the reference (dim ${dim})`, () => {
      const kvHeads = 2;
      const qHeads = 8;
      const tokens = 150;
      const k = randomKv(tokens, kvHeads, dim, 'f16', dim, 1.5);
      const v = randomKv(tokens, kvHeads, dim, 'f16', dim + 1);
      const q = randn(qHeads * dim, dim + 2);
      const sel = allChunks(tokens, kvHeads, 4, 4, tokens - 16);
      expect(setSimdLevel('scalar')).toBe('scalar');
      const dScalar = attendDense({ q, qHeads, k: k.tensor, v: v.tensor });
      const sScalar = attendSparse({ q, qHeads, k: k.tensor, v: v.tensor, selection: sel });
      const ref = referenceAttention(q, qHeads, k, v, () => range(tokens));
      expect(relErr(dScalar.out, ref.out)).toBeLessThan(1e-5);
      expect(Array.from(sScalar.out)).toEqual(Array.from(dScalar.out));
      for (const level of vectorLevels) {
        expect(setSimdLevel(level)).toBe(level);
        const d = attendDense({ q, qHeads, k: k.tensor, v: v.tensor });
        const s = attendSparse({ q, qHeads, k: k.tensor, v: v.tensor, selection: sel });
        expect(relErr(d.out, dScalar.out)).toBeLessThan(1e-5);
        expect(relErr(d.lse, dScalar.lse)).toBeLessThan(1e-5);
        expect(relErr(s.chunkMass, sScalar.chunkMass)).toBeLessThan(1e-5);
        expect(Array.from(s.out)).toEqual(Array.from(d.out));
      }
      setSimdLevel('best');
    });
  }
});
