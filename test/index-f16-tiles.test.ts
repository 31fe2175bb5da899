import { describe, expect, it } from 'vitest';
import { centroidTiles, indexKernelLevel, scoreCentroids } from '../src/index/kernels.js';
import { expectKvdError, randn } from './helpers.js';

/** f32 -> nearest f16 -> f32, through the platform's own rounding (Float16 is not in Node 20). */
function roundF16(x: Float32Array): Float32Array {
  const out = new Float32Array(x.length);
  const f = new Float32Array(1);
  const u = new Uint32Array(f.buffer);
  for (let i = 0; i < x.length; i++) {
    f[0] = x[i]!;
    const b = u[0]!;
    const sign = b & 0x80000000;
    let exp = ((b >>> 23) & 0xff) - 127;
    let man = b & 0x7fffff;
    // Normal f16 range only (the test data is); round mantissa to 10 bits, ties to even.
    const drop = 13;
    const rem = man & ((1 << drop) - 1);
    man >>>= drop;
    if (rem > 1 << (drop - 1) || (rem === 1 << (drop - 1) && (man & 1) === 1)) man++;
    if (man === 1 << 10) {
      man = 0;
      exp++;
    }
    u[0] = (sign | ((exp + 127) << 23) | (man << drop)) >>> 0;
    out[i] = f[0]!;
  }
  return out;
}

describe('f16 centroid tiles (what the index stores and scores)', () => {
  it('tiles16 scores equal f32 scores of the f16-rounded centroids, bit-identically at every SIMD level', () => {
    const best = indexKernelLevel('best');
    for (const [g, dim, n] of [[4, 128, 40], [3, 37, 29], [1, 16, 1]] as const) {
      const q = randn(g * dim, 11 + g);
      const c = randn(n * dim, 7 + dim);
      const t16 = centroidTiles(c, n, dim, 'f16');
      expect(t16).toBeInstanceOf(Uint16Array);
      expect(t16.length).toBe(Math.ceil(n / 16) * 16 * dim);
      const want = scoreCentroids(q, g, centroidTiles(roundF16(c), n, dim), n, dim, 'tiles');
      const levels = ['scalar', 'avx2', 'avx512'] as const;
      for (const level of levels) {
        indexKernelLevel(level);
        expect(scoreCentroids(q, g, t16, n, dim, 'tiles16')).toEqual(want);
      }
      indexKernelLevel('best');
    }
    expect(indexKernelLevel()).toBe(best);
  });

  it('typed errors', () => {
    const q = randn(32, 1);
    expectKvdError(() => centroidTiles(randn(48, 2), 3, 16, 'bf16' as never), 'E_DTYPE', /centroidTiles dtype: expected 'f32' or 'f16', got 'bf16'/);
    expectKvdError(() => scoreCentroids(q, 2, new Uint16Array(48), 3, 16, 'tiles16'), 'E_SHAPE', /tiles16: ceil\(n\/16\)\*16\*dim\): expected 256 elements, got 48/);
    expectKvdError(() => scoreCentroids(q, 2, new Float32Array(256), 3, 16, 'tiles16'), 'E_DTYPE', /f16 tiles/);
    const bad = randn(48, 3);
    bad[5] = NaN;
    expectKvdError(() => centroidTiles(bad, 3, 16, 'f16'), 'E_NONFINITE', /centroidTiles centroids: expected finite values, got NaN at element 5/);
  });
});
