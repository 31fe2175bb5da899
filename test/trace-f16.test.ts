import { describe, expect, it } from 'vitest';
import {
  bf16ArrayToF32,
  bf16ToF32,
  f16ArrayToF32,
  f16ToF32,
  f32ArrayToBf16,
  f32ArrayToF16,
  f32ToBf16,
  f32ToF16,
} from '../src/util/f16.js';
import { expectKvdError, randn } from './helpers.js';

const f32FromBits = (b: number) => new Float32Array(new Uint32Array([b >>> 0]).buffer)[0]!;

describe('f32 → f16 (round to nearest even)', () => {
  const cases: [string, number, number][] = [
    ['+0', 0, 0x0000],
    ['-0', -0, 0x8000],
    ['1', 1, 0x3c00],
    ['-2', -2, 0xc000],
    ['max normal 65504', 65504, 0x7bff],
    ['65519 rounds down to max', 65519, 0x7bff],
    ['65520 (tie) rounds to Inf', 65520, 0x7c00],
    ['1e6 overflows to Inf', 1e6, 0x7c00],
    ['-1e6 overflows to -Inf', -1e6, 0xfc00],
    ['+Inf', Infinity, 0x7c00],
    ['-Inf', -Infinity, 0xfc00],
    ['smallest normal 2^-14', 2 ** -14, 0x0400],
    ['largest subnormal', 1023 * 2 ** -24, 0x03ff],
    ['smallest subnormal 2^-24', 2 ** -24, 0x0001],
    ['-smallest subnormal', -(2 ** -24), 0x8001],
    ['2^-25 (tie) rounds to even 0', 2 ** -25, 0x0000],
    ['just above 2^-25 rounds to 2^-24', f32FromBits(0x33000001), 0x0001],
    ['1.5 × 2^-24 (tie) rounds to even 2', 1.5 * 2 ** -24, 0x0002],
    ['2.5 × 2^-24 (tie) rounds to even 2', 2.5 * 2 ** -24, 0x0002],
    ['subnormal rounding carries into the smallest normal', 1023.5 * 2 ** -24, 0x0400],
    ['1 + 2^-11 (tie) rounds to even 1', 1 + 2 ** -11, 0x3c00],
    ['1 + 3·2^-11 (tie) rounds up to odd+1', 1 + 3 * 2 ** -11, 0x3c02],
    ['1 + 2^-11 + 2^-20 rounds up', 1 + 2 ** -11 + 2 ** -20, 0x3c01],
    ['1e-10 underflows to +0', 1e-10, 0x0000],
  ];
  for (const [name, v, bits] of cases) {
    it(name, () => {
      expect(f32ToF16(v).toString(16)).toBe(bits.toString(16));
      expect(f32ArrayToF16(new Float32Array([v]))[0]!.toString(16)).toBe(bits.toString(16));
    });
  }

  it('keeps NaN a NaN (quiet, sign kept)', () => {
    const h = f32ToF16(NaN);
    expect(h & 0x7c00).toBe(0x7c00);
    expect(h & 0x03ff).not.toBe(0);
    expect(Number.isNaN(f16ToF32(h))).toBe(true);
    const neg = f32ArrayToF16(new Float32Array([f32FromBits(0xffc00001)]))[0]!;
    expect(neg & 0x8000).toBe(0x8000);
    expect(Number.isNaN(f16ToF32(neg))).toBe(true);
    // A signalling NaN whose payload lives only in the low bits must not become Inf.
    const snan = f32ArrayToF16(new Float32Array([f32FromBits(0x7f800001)]))[0]!;
    expect(Number.isNaN(f16ToF32(snan))).toBe(true);
  });
});

describe('f16 → f32', () => {
  it('decodes known bit patterns exactly', () => {
    expect(f16ToF32(0x3c00)).toBe(1);
    expect(Object.is(f16ToF32(0x8000), -0)).toBe(true);
    expect(f16ToF32(0x0001)).toBe(2 ** -24);
    expect(f16ToF32(0x03ff)).toBe(1023 * 2 ** -24);
    expect(f16ToF32(0x7bff)).toBe(65504);
    expect(f16ToF32(0xfc00)).toBe(-Infinity);
    expect(Number.isNaN(f16ToF32(0x7e00))).toBe(true);
  });

  it('round-trips every finite f16 bit pattern exactly', () => {
    const all = new Uint16Array(65536).map((_, i) => i);
    const back = f32ArrayToF16(f16ArrayToF32(all));
    for (let i = 0; i < 65536; i++) {
      const isNaN = (i & 0x7c00) === 0x7c00 && (i & 0x3ff) !== 0;
      if (!isNaN && back[i] !== i) throw new Error(`f16 0x${i.toString(16)} came back as 0x${back[i]!.toString(16)}`);
    }
  });

  it('rounds random values within half an f16 ulp', () => {
    const x = randn(4096, 3);
    const y = f16ArrayToF32(f32ArrayToF16(x));
    for (let i = 0; i < x.length; i++) expect(Math.abs(y[i]! - x[i]!)).toBeLessThanOrEqual(Math.abs(x[i]!) * 2 ** -11 + 2 ** -25);
  });
});

describe('bf16', () => {
  const cases: [string, number, number][] = [
    ['+0', 0, 0x0000],
    ['-0', -0, 0x8000],
    ['1', 1, 0x3f80],
    ['-Inf', -Infinity, 0xff80],
    ['1 + 2^-8 (tie) rounds to even 1', 1 + 2 ** -8, 0x3f80],
    ['1 + 3·2^-8 (tie) rounds up', 1 + 3 * 2 ** -8, 0x3f82],
    ['f32 max rounds to Inf', f32FromBits(0x7f7fffff), 0x7f80],
    ['smallest f32 subnormal rounds to 0', f32FromBits(0x00000001), 0x0000],
    ['f32 subnormal kept', f32FromBits(0x00010000), 0x0001],
  ];
  for (const [name, v, bits] of cases) {
    it(name, () => {
      expect(f32ToBf16(v).toString(16)).toBe(bits.toString(16));
      expect(f32ArrayToBf16(new Float32Array([v]))[0]!.toString(16)).toBe(bits.toString(16));
    });
  }

  it('keeps NaN (including low-payload NaN) a NaN', () => {
    const h = f32ArrayToBf16(new Float32Array([f32FromBits(0x7f800001), NaN]));
    expect(Number.isNaN(bf16ToF32(h[0]!))).toBe(true);
    expect(Number.isNaN(bf16ToF32(h[1]!))).toBe(true);
  });

  it('decodes exactly and round-trips bits', () => {
    const bits = new Uint16Array([0x3f80, 0xc000, 0x0001, 0x7f7f]);
    const f = bf16ArrayToF32(bits);
    expect(f[0]).toBe(1);
    expect(f[1]).toBe(-2);
    expect(Array.from(f32ArrayToBf16(f))).toEqual(Array.from(bits));
  });

  it('rejects an output of the wrong length with E_SHAPE', async () => {
    await expectKvdError(() => f32ArrayToBf16(new Float32Array(4), new Uint16Array(3)), 'E_SHAPE', /expected 4/);
    await expectKvdError(() => f16ArrayToF32(new Uint16Array(2), new Float32Array(5)), 'E_SHAPE', /got 5/);
  });
});
