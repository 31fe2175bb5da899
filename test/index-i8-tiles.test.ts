import { describe, expect, it } from 'vitest';
import { centroidTiles, indexKernelLevel, scoreCentroids } from '../src/index/kernels.js';
import { expectKvdError, randn, rng } from './helpers.js';

const LEVELS = ['scalar', 'avx2', 'avx512'] as const;
// (query heads, dim, centroids) every scoring kernel is checked on: groups 1-8 cover the kernels'
// blocks of query heads (AVX2: fours while three or more are left, a three repeating its last head,
// then a pair or a single; VNNI: fours); dims 37 and 5 a partial quad; dims 36 and 20 an odd number
// of quads (the int8 VNNI loop takes quads in pairs; a 4-bit block's high nibbles unused).
const KERNEL_SHAPES = [[4, 128, 40], [3, 37, 29], [5, 64, 16], [8, 128, 33], [1, 5, 1], [4, 36, 21], [2, 20, 17], [6, 64, 18], [7, 37, 23]] as const;
const dim4 = (dim: number) => Math.ceil(dim / 4) * 4;

/** Round half to even (the native side's nearbyint in the default rounding mode). */
function roundEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/**
 * One row's codes and scale, as the native quantizer (QuantizeCodes, key_sketch.h) computes them in
 * f32: `levels` 127 for a query head, 63 for a centroid (the index's 7-bit codes, kCentroidLevels).
 */
function quantize(x: Float32Array, levels = 127): { codes: Int8Array; scale: number } {
  let m = 0;
  for (const v of x) m = Math.max(m, Math.abs(v));
  const scale = Math.fround(m / levels);
  const inv = scale > 0 ? Math.fround(1 / scale) : 0;
  const codes = new Int8Array(x.length);
  for (let d = 0; d < x.length; d++) codes[d] = Math.min(levels, Math.max(-levels, roundEven(Math.fround(x[d]! * inv))));
  return { codes, scale };
}

/** Byte of centroid i, dim d in the tile layout (tiles of 16 lanes, quads of 4 dims). */
const tileByte = (i: number, d: number, dim: number) => Math.floor(i / 16) * 16 * dim4(dim) + Math.floor(d / 4) * 64 + (i % 16) * 4 + (d % 4);

/** Reference scores: exact integer dots of the query codes with the tile bytes, then the f32 epilogue. */
// With `spread`, the select's level-1 term coef[j] * var[i] is added to each head's score (each
// operation rounded to f32 once, in this order) before the max.
// The padding of a tile layout: every code of a lane past the n centroids or of a dim past dim (up
// to `dims`, the layout's padded dims) reads `zero`, and every scale past n is 0.
function expectPadding(scales: Float32Array, n: number, dim: number, dims: number, codeAt: (i: number, d: number) => number, zero: number): void {
  let nonzero = 0;
  for (let i = 0; i < Math.ceil(n / 16) * 16; i++)
    for (let d = 0; d < dims; d++) if ((i >= n || d >= dim) && codeAt(i, d) !== zero) nonzero++;
  expect(nonzero).toBe(0);
  for (let i = n; i < scales.length; i++) expect(scales[i]).toBe(0);
}

function reference(
  q: Float32Array,
  g: number,
  tiles: Int8Array,
  scales: Float32Array,
  n: number,
  dim: number,
  spread?: { var: Float32Array; coef: Float32Array },
): Float32Array {
  const out = new Float32Array(n).fill(-Infinity);
  for (let j = 0; j < g; j++) {
    const { codes, scale } = quantize(q.subarray(j * dim, (j + 1) * dim));
    for (let i = 0; i < n; i++) {
      let dot = 0;
      for (let d = 0; d < dim; d++) dot += codes[d]! * tiles[tileByte(i, d, dim)]!;
      let s = Math.fround(Math.fround(dot * scale) * scales[i]!);
      if (spread) s = Math.fround(s + Math.fround(spread.coef[j]! * spread.var[i]!));
      out[i] = Math.max(out[i]!, s);
    }
  }
  return out;
}

/** scoreCentroids over `tiles` equals the integer reference at every SIMD level; the level is restored to best after (checked). */
function expectReferenceAtEveryLevel(...args: Parameters<typeof reference>): void {
  const [q, g, tiles, scales, n, dim, spread] = args;
  const best = indexKernelLevel('best');
  const want = reference(...args);
  for (const level of LEVELS) {
    indexKernelLevel(level);
    expect(scoreCentroids(q, g, { tiles, scales }, n, dim, 'tiles8', spread)).toEqual(want);
  }
  indexKernelLevel('best');
  expect(indexKernelLevel()).toBe(best);
}

describe('int8 centroid tiles (what the index stores and scores)', () => {
  it("quantizes each centroid with its own scale into the index's 7-bit codes, in the 16-lane x 4-dim tile layout", () => {
    for (const [dim, n] of [[128, 40], [37, 29], [5, 1]] as const) {
      const c = randn(n * dim, 3 + dim);
      const t = centroidTiles(c, n, dim, 'i8');
      expect(t.tiles).toBeInstanceOf(Int8Array);
      expect(t.tiles.length).toBe(Math.ceil(n / 16) * 16 * dim4(dim));
      expect(t.scales.length).toBe(Math.ceil(n / 16) * 16);
      for (let i = 0; i < n; i++) {
        const { codes, scale } = quantize(c.subarray(i * dim, (i + 1) * dim), 63);
        expect(t.scales[i]).toBe(scale);
        for (let d = 0; d < dim; d++) {
          expect(t.tiles[tileByte(i, d, dim)]).toBe(codes[d]);
          expect(Math.abs(codes[d]! * scale - c[i * dim + d]!)).toBeLessThanOrEqual(scale * 0.5001);
        }
      }
      // Padding (dims past dim, lanes past n) is zero.
      expectPadding(t.scales, n, dim, dim4(dim), (i, d) => t.tiles[tileByte(i, d, dim)]!, 0);
    }
  });

  it('tiles8 scores equal the exact integer reference, bit-identically at every SIMD level', () => {
    const best = indexKernelLevel('best');
    for (const [g, dim, n] of KERNEL_SHAPES) {
      const q = randn(g * dim, 11 + g);
      const c = randn(n * dim, 7 + dim);
      const t = centroidTiles(c, n, dim, 'i8');
      const want = reference(q, g, t.tiles, t.scales, n, dim);
      for (const level of LEVELS) {
        indexKernelLevel(level);
        expect(scoreCentroids(q, g, t, n, dim, 'tiles8')).toEqual(want);
      }
      indexKernelLevel('best');
      // The quantized scores approximate the f32 ones: error below 2% of the largest |q|·|c| here.
      const exact = scoreCentroids(q, g, c, n, dim);
      let tol = 0;
      for (let i = 0; i < n; i++) {
        let cn = 0;
        for (let d = 0; d < dim; d++) cn += c[i * dim + d]! ** 2;
        for (let j = 0; j < g; j++) {
          let qn = 0;
          for (let d = 0; d < dim; d++) qn += q[j * dim + d]! ** 2;
          tol = Math.max(tol, 0.02 * Math.sqrt(cn * qn));
        }
      }
      for (let i = 0; i < n; i++) expect(Math.abs(want[i]! - exact[i]!)).toBeLessThan(tol);
    }
    expect(indexKernelLevel()).toBe(best);
  });

  it('with the spread term (coef[j] * var[i]) too: the reference bits at every SIMD level', () => {
    const best = indexKernelLevel('best');
    // Group 6 covers a partial block of four query heads; n 37 a partial last tile.
    for (const [g, dim, n] of [[4, 128, 40], [6, 64, 37], [1, 16, 5]] as const) {
      const q = randn(g * dim, 21 + g);
      const t = centroidTiles(randn(n * dim, 5 + n), n, dim, 'i8');
      const r = rng(g + n);
      const spread = { var: Float32Array.from({ length: n }, () => r() * 3), coef: Float32Array.from({ length: g }, () => r() * 0.7) };
      const want = reference(q, g, t.tiles, t.scales, n, dim, spread);
      expect(want).not.toEqual(reference(q, g, t.tiles, t.scales, n, dim));
      for (const level of LEVELS) {
        indexKernelLevel(level);
        expect(scoreCentroids(q, g, t, n, dim, 'tiles8', spread)).toEqual(want);
      }
    }
    indexKernelLevel('best');
    expect(indexKernelLevel()).toBe(best);
  });

  it("7-bit tiles (every byte in [-63, 63], the index's centroids) take AVX2's unsigned-byte kernel: the reference bits at every level, spread term too", () => {
    for (const [g, dim, n] of [[4, 128, 40], [3, 37, 29], [8, 128, 33], [1, 5, 1], [6, 64, 18], [7, 37, 23], [2, 20, 17]] as const) {
      const r = rng(3 * g + dim);
      const tiles = new Int8Array(Math.ceil(n / 16) * 16 * dim4(dim));
      for (let i = 0; i < n; i++) for (let d = 0; d < dim; d++) tiles[tileByte(i, d, dim)] = Math.floor(r() * 127) - 63;
      // The extremes in the first centroid: the pair sums the kernel must not saturate.
      for (let d = 0; d < dim; d++) tiles[tileByte(0, d, dim)] = d % 2 ? 63 : -63;
      const scales = new Float32Array(Math.ceil(n / 16) * 16).map((_, i) => (i < n ? 0.02 * (i + 1) : 0));
      const q = randn(g * dim, 40 + g);
      if (g > 1) q.fill(0, 0, dim); // an all-zero query head: scale 0, every dot 0
      const spread = { var: Float32Array.from({ length: n }, () => r() * 3), coef: Float32Array.from({ length: g }, () => r() * 0.7) };
      for (const sp of [undefined, spread]) expectReferenceAtEveryLevel(q, g, tiles, scales, n, dim, sp);
    }
  });

  it('7-bit tiles with one byte outside [-63, 63] (anywhere, the last tile too) still score exactly: the AVX2 kernel checks the bytes as it reads them', () => {
    const [g, dim, n] = [4, 37, 40];
    const r = rng(17);
    const base = new Int8Array(Math.ceil(n / 16) * 16 * dim4(dim));
    for (let i = 0; i < n; i++) for (let d = 0; d < dim; d++) base[tileByte(i, d, dim)] = Math.floor(r() * 127) - 63;
    const scales = new Float32Array(Math.ceil(n / 16) * 16).map((_, i) => (i < n ? 0.03 * (i + 1) : 0));
    const q = randn(g * dim, 23);
    for (const [i, d, b] of [[0, 0, 64], [17, 20, -64], [n - 1, dim - 1, -128], [n - 1, 36, 127], [33, 5, 100]] as const) {
      const tiles = base.slice();
      tiles[tileByte(i, d, dim)] = b;
      expectReferenceAtEveryLevel(q, g, tiles, scales, n, dim);
    }
  });

  it('any tile byte (-128 too) scores exactly at every level', () => {
    const [g, dim, n] = [4, 128, 32];
    const r = rng(5);
    const tiles = new Int8Array(Math.ceil(n / 16) * 16 * dim4(dim));
    for (let i = 0; i < tiles.length; i++) tiles[i] = Math.floor(r() * 256) - 128;
    for (let i = 0; i < 64; i++) tiles[i] = -128;
    const scales = new Float32Array(n).map((_, i) => 0.01 * (i + 1));
    const q = randn(g * dim, 9);
    q.fill(0, 0, dim); // an all-zero query head: scale 0, every dot 0
    expectReferenceAtEveryLevel(q, g, tiles, scales, n, dim);
  });

  it('typed errors', () => {
    const q = randn(32, 1);
    const t = centroidTiles(randn(48, 2), 3, 16, 'i8');
    expectKvdError(() => centroidTiles(randn(48, 2), 3, 16, 'f16' as never), 'E_DTYPE', /centroidTiles dtype: expected 'f32', 'i8' or 'u4', got 'f16'/);
    expectKvdError(() => scoreCentroids(q, 2, { tiles: new Int8Array(48), scales: t.scales }, 3, 16, 'tiles8'), 'E_SHAPE', /centroids.tiles \(ceil\(n\/16\)\*16\*ceil4\(dim\)\): expected 256 elements, got 48/);
    expectKvdError(() => scoreCentroids(q, 2, { tiles: t.tiles, scales: new Float32Array(3) }, 3, 16, 'tiles8'), 'E_SHAPE', /centroids.scales \(ceil\(n\/16\)\*16\): expected 16 elements, got 3/);
    const spread = { var: new Float32Array(3), coef: new Float32Array(2) };
    expectKvdError(() => scoreCentroids(q, 2, t, 3, 16, 'tiles8', { ...spread, var: new Float32Array(2) }), 'E_SHAPE', /spread.var \(n\): expected 3 elements, got 2/);
    expectKvdError(() => scoreCentroids(q, 2, t, 3, 16, 'tiles8', { ...spread, coef: new Float32Array([1, NaN]) }), 'E_NONFINITE', /spread.coef/);
    expectKvdError(() => scoreCentroids(q, 2, new Float32Array(48), 3, 16, 'rows', spread), 'E_CONFIG', /spread: expected it only with layout 'tiles8' or 'tiles4'/);
    // A huge n with small arrays is a shape error, before any output of n floats is allocated
    // (found by the kernels fuzz target: the allocation came first and aborted the process).
    expectKvdError(() => scoreCentroids(q, 2, t, 2 ** 40, 16, 'tiles8'), 'E_SHAPE', /centroids.tiles/);
    expectKvdError(() => scoreCentroids(q, 2, new Float32Array(48), 2 ** 40, 16, 'tiles'), 'E_SHAPE', /centroids \(tiles/);
    expectKvdError(() => scoreCentroids(q, 2, new Float32Array(48), 2 ** 40, 16), 'E_SHAPE', /centroids \(n\*dim\)/);
    expectKvdError(() => scoreCentroids(q, 2, { tiles: new Uint8Array(256) as never, scales: t.scales }, 3, 16, 'tiles8'), 'E_DTYPE', /expected an Int8Array, got a Uint8Array/);
    expectKvdError(() => scoreCentroids(q, 2, new Float32Array(256), 3, 16, 'tiles8'), 'E_TYPE', /centroids \(tiles8\): expected an options object \{ tiles: Int8Array, scales: Float32Array \}, got a typed array/);
    expectKvdError(() => scoreCentroids(q, 2, [1, 2] as never, 3, 16, 'tiles8'), 'E_TYPE', /centroids \(tiles8\): expected an options object \{ tiles: Int8Array, scales: Float32Array \}, got an array/);
    expectKvdError(() => scoreCentroids(q, 2, undefined as never, 3, 16, 'tiles8'), 'E_TYPE', /centroids \(tiles8\): expected an options object .*, got undefined/);
    const nanScales = t.scales.slice();
    nanScales[1] = NaN;
    expectKvdError(() => scoreCentroids(q, 2, { tiles: t.tiles, scales: nanScales }, 3, 16, 'tiles8'), 'E_NONFINITE', /centroids.scales: expected finite values, got NaN at element 1/);
    const bad = randn(48, 3);
    bad[5] = NaN;
    expectKvdError(() => centroidTiles(bad, 3, 16, 'i8'), 'E_NONFINITE', /centroidTiles centroids: expected finite values, got NaN at element 5/);
  });
});

/** Byte of centroid i, dim d in the 4-bit tile layout, and whether d sits in its high nibble. */
const tileBlocks4 = (dim: number) => Math.ceil(dim4(dim) / 8);
const tileByte4 = (i: number, d: number, dim: number) => Math.floor(i / 16) * tileBlocks4(dim) * 64 + Math.floor(d / 8) * 64 + (i % 16) * 4 + (d % 4);
const high4 = (d: number) => Math.floor(d / 4) % 2 === 1;
/** The codes of 4-bit tiles as int8 tiles (same centroids, same dims): what the reference scores. */
function unpack4(tiles: Uint8Array, n: number, dim: number): Int8Array {
  const out = new Int8Array(Math.ceil(n / 16) * 16 * dim4(dim));
  for (let i = 0; i < Math.ceil(n / 16) * 16; i++)
    for (let d = 0; d < dim4(dim); d++) {
      const b = tiles[tileByte4(i, d, dim)]!;
      out[tileByte(i, d, dim)] = (high4(d) ? b >> 4 : b & 15) - 8;
    }
  return out;
}

describe('4-bit centroid tiles (what the index stores and level 1 scores)', () => {
  it('quantizes each centroid with its own scale into codes in [-7, 7], two 4-dim groups per 64-byte block, padding code 0', () => {
    for (const [dim, n] of [[128, 40], [37, 29], [36, 17], [5, 1]] as const) {
      const c = randn(n * dim, 13 + dim);
      const t = centroidTiles(c, n, dim, 'u4');
      expect(t.tiles).toBeInstanceOf(Uint8Array);
      expect(t.tiles.length).toBe(Math.ceil(n / 16) * tileBlocks4(dim) * 64);
      expect(t.scales.length).toBe(Math.ceil(n / 16) * 16);
      const codes8 = unpack4(t.tiles, n, dim);
      for (let i = 0; i < n; i++) {
        const { codes, scale } = quantize(c.subarray(i * dim, (i + 1) * dim), 7);
        expect(t.scales[i]).toBe(scale);
        for (let d = 0; d < dim; d++) {
          expect(codes8[tileByte(i, d, dim)]).toBe(codes[d]);
          expect(Math.abs(codes[d]! * scale - c[i * dim + d]!)).toBeLessThanOrEqual(scale * 0.5001);
        }
      }
      // Padding (dims past dim, lanes past n, a missing last odd group of 4 dims) is code 0 (nibble 8).
      expectPadding(t.scales, n, dim, tileBlocks4(dim) * 8, (i, d) => {
        const b = t.tiles[tileByte4(i, d, dim)]!;
        return high4(d) ? b >> 4 : b & 15;
      }, 8);
    }
  });

  it('tiles4 scores equal the exact integer reference and the int8 kernel over the same codes, bit-identically at every SIMD level, spread term too', () => {
    const best = indexKernelLevel('best');
    for (const [g, dim, n] of KERNEL_SHAPES) {
      const q = randn(g * dim, 31 + g);
      if (g > 1) q.fill(0, 0, dim); // an all-zero query head: scale 0, every dot 0
      const t = centroidTiles(randn(n * dim, 17 + dim), n, dim, 'u4');
      const codes8 = unpack4(t.tiles, n, dim);
      const r = rng(g * n + dim);
      const spread = { var: Float32Array.from({ length: n }, () => r() * 3), coef: Float32Array.from({ length: g }, () => r() * 0.7) };
      for (const sp of [undefined, spread]) {
        const want = reference(q, g, codes8, t.scales, n, dim, sp);
        for (const level of LEVELS) {
          indexKernelLevel(level);
          expect(scoreCentroids(q, g, t, n, dim, 'tiles4', sp)).toEqual(want);
          expect(scoreCentroids(q, g, { tiles: codes8, scales: t.scales }, n, dim, 'tiles8', sp)).toEqual(want);
        }
        indexKernelLevel('best');
      }
    }
    expect(indexKernelLevel()).toBe(best);
  });

  it('any nibble (the extremes 0 and 15 too) scores exactly at every level', () => {
    const [g, dim, n] = [4, 128, 32];
    const r = rng(8);
    const tiles = new Uint8Array(Math.ceil(n / 16) * tileBlocks4(dim) * 64);
    for (let i = 0; i < tiles.length; i++) tiles[i] = Math.floor(r() * 256);
    tiles.fill(0xff, 0, 64);
    tiles.fill(0x00, 64, 128);
    const scales = new Float32Array(n).map((_, i) => 0.01 * (i + 1));
    const q = randn(g * dim, 19);
    const want = reference(q, g, unpack4(tiles, n, dim), scales, n, dim);
    const best = indexKernelLevel('best');
    for (const level of LEVELS) {
      indexKernelLevel(level);
      expect(scoreCentroids(q, g, { tiles, scales }, n, dim, 'tiles4')).toEqual(want);
    }
    indexKernelLevel('best');
    expect(indexKernelLevel()).toBe(best);
  });

  it('typed errors', () => {
    const q = randn(32, 1);
    const t = centroidTiles(randn(48, 2), 3, 16, 'u4');
    expectKvdError(() => scoreCentroids(q, 2, { tiles: new Uint8Array(48), scales: t.scales }, 3, 16, 'tiles4'), 'E_SHAPE', /centroids.tiles \(ceil\(n\/16\)\*ceil\(ceil\(dim\/4\)\/2\)\*64\): expected 128 elements, got 48/);
    expectKvdError(() => scoreCentroids(q, 2, { tiles: new Int8Array(128) as never, scales: t.scales }, 3, 16, 'tiles4'), 'E_DTYPE', /expected a Uint8Array, got an Int8Array/);
    expectKvdError(() => scoreCentroids(q, 2, t, 2 ** 40, 16, 'tiles4'), 'E_SHAPE', /centroids.tiles/);
    expectKvdError(() => scoreCentroids(q, 2, new Float32Array(128), 3, 16, 'tiles4'), 'E_TYPE', /centroids \(tiles4\): expected an options object \{ tiles: Uint8Array, scales: Float32Array \}, got a typed array/);
    const nanScales = t.scales.slice();
    nanScales[2] = Infinity;
    expectKvdError(() => scoreCentroids(q, 2, { tiles: t.tiles, scales: nanScales }, 3, 16, 'tiles4'), 'E_NONFINITE', /centroids.scales: expected finite values, got Inf at element 2/);
    expectKvdError(() => scoreCentroids(q, 2, t, 3, 16, 'tiles4', { var: new Float32Array(2), coef: new Float32Array(2) }), 'E_SHAPE', /spread.var \(n\): expected 3 elements, got 2/);
    const bad = randn(48, 4);
    bad[7] = NaN;
    expectKvdError(() => centroidTiles(bad, 3, 16, 'u4'), 'E_NONFINITE', /centroidTiles centroids: expected finite values, got NaN at element 7/);
    expectKvdError(() => centroidTiles(randn(40, 4), 3, 16, 'u4'), 'E_SHAPE', /centroidTiles centroids \(n\*dim\): expected 48 elements, got 40/);
  });
});
