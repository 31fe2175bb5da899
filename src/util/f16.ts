/**
 * IEEE half (f16) and bfloat16 (bf16) conversions on typed arrays.
 *
 * 16-bit values are handled as their bit patterns in a Uint16Array (the storage form of
 * {@link DtypeArray}). f32 → 16-bit conversions round to nearest, ties to even, like hardware
 * `vcvtps2ph` / `__float2bfloat16_rn`: overflow goes to ±Inf, tiny values to f16 subnormals or ±0,
 * NaN stays NaN (quiet, sign and top payload bits kept). 16-bit → f32 is exact.
 *
 * The array functions read the f32 bit patterns through a Uint32Array view of the input (no copy),
 * so they cost a few integer operations per element.
 */
import { fail } from '../errors.js';
import type { Dtype } from '../types.js';
import { expectArray } from './check.js';

// One scratch word for the scalar functions (JS numbers are f64; fround + the view give f32 bits).
const scratchF32 = new Float32Array(1);
const scratchU32 = new Uint32Array(scratchF32.buffer);

/**
 * f16 bits of the f32 whose bit pattern is `x` (unsigned 32-bit), rounded to nearest even.
 * Kept as a plain function of integers so V8 inlines it into the array loops.
 */
export function f32BitsToF16Bits(x: number): number {
  const sign = (x >>> 16) & 0x8000;
  const abs = x & 0x7fffffff;
  if (abs >= 0x47800000) {
    // |x| >= 65536 (always rounds to Inf), Inf, or NaN.
    if (abs > 0x7f800000) return sign | 0x7e00 | ((abs >>> 13) & 0x3ff);
    return sign | 0x7c00;
  }
  if (abs >= 0x38800000) {
    // Normal f16 range (|x| >= 2^-14): rebias exponent 127 → 15, round the 13 dropped bits.
    // Carry out of the mantissa bumps the exponent, and 65520..65535 correctly become Inf.
    const odd = (abs >>> 13) & 1;
    return sign | ((abs - 0x38000000 + 0xfff + odd) >>> 13);
  }
  // Subnormal f16 (or zero): value / 2^-24 = mant * 2^(e-126) with the implicit bit restored.
  const e = abs >>> 23;
  if (e < 102) return sign; // |x| < 2^-25: rounds to ±0 (2^-25 exactly is a tie to even 0 too)
  const mant = (abs & 0x7fffff) | 0x800000;
  const shift = 126 - e; // 14..24
  let r = mant >>> shift;
  const rem = mant & ((1 << shift) - 1);
  const half = 1 << (shift - 1);
  if (rem > half || (rem === half && (r & 1) === 1)) r++; // may carry into the smallest normal: still right
  return sign | r;
}

/** bf16 bits of the f32 whose bit pattern is `x`, rounded to nearest even; NaN stays quiet NaN. */
export function f32BitsToBf16Bits(x: number): number {
  if ((x & 0x7fffffff) > 0x7f800000) return ((x >>> 16) | 0x40) & 0xffff;
  // x + 0x7fff + lsb never exceeds 2^32 for non-NaN x, so plain addition is exact here.
  return ((x >>> 0) + 0x7fff + ((x >>> 16) & 1)) >>> 16;
}

/** f16 bits of a number (first rounded to f32, as storing into a Float32Array would). */
export function f32ToF16(v: number): number {
  scratchF32[0] = v;
  return f32BitsToF16Bits(scratchU32[0]!);
}

/** bf16 bits of a number (first rounded to f32). */
export function f32ToBf16(v: number): number {
  scratchF32[0] = v;
  return f32BitsToBf16Bits(scratchU32[0]!);
}

// f16 → f32 lookup: 65536 entries (256 KiB), built on first use.
let f16Table: Float32Array | undefined;

function buildF16Table(): Float32Array {
  const t = new Float32Array(65536);
  const u = new Uint32Array(t.buffer);
  for (let h = 0; h < 65536; h++) {
    const sign = (h & 0x8000) << 16;
    const exp = (h >>> 10) & 0x1f;
    const mant = h & 0x3ff;
    if (exp === 0x1f) {
      u[h] = (sign | 0x7f800000 | (mant << 13)) >>> 0; // Inf / NaN with payload
    } else if (exp === 0) {
      t[h] = (sign ? -1 : 1) * mant * 2 ** -24; // zero or subnormal, exact in f32
    } else {
      u[h] = (sign | ((exp + 112) << 23) | (mant << 13)) >>> 0;
    }
  }
  return t;
}

/** The f16 → f32 table (index = f16 bits). Exposed for hot loops that convert element-wise. */
export function f16Table32(): Float32Array {
  return (f16Table ??= buildF16Table());
}

/** f32 value of f16 bits. */
export function f16ToF32(h: number): number {
  return f16Table32()[h & 0xffff]!;
}

/** f32 value of bf16 bits. */
export function bf16ToF32(h: number): number {
  scratchU32[0] = (h & 0xffff) << 16;
  return scratchF32[0]!;
}

/** The output array: `out` checked (type and length) or a new one of n elements. */
function checkOut<T extends Uint16Array | Float32Array>(name: string, out: T | undefined, n: number, ctor: { new (n: number): T; name: string }): T {
  if (out === undefined) return new ctor(n);
  expectArray(out, ctor, `${name}: out`);
  if (out.length !== n) fail('E_SHAPE', `${name}: output length`, `${n} (the input length)`, out.length);
  return out;
}

/** Converts f32 values to f16 bits (into `out` when given, same length). */
export function f32ArrayToF16(src: Float32Array, out?: Uint16Array): Uint16Array {
  expectArray(src, Float32Array, 'f32ArrayToF16: src');
  out = checkOut('f32ArrayToF16', out, src.length, Uint16Array);
  const bits = new Uint32Array(src.buffer, src.byteOffset, src.length);
  for (let i = 0; i < bits.length; i++) out[i] = f32BitsToF16Bits(bits[i]!);
  return out;
}

/** Converts f32 values to bf16 bits (into `out` when given, same length). */
export function f32ArrayToBf16(src: Float32Array, out?: Uint16Array): Uint16Array {
  expectArray(src, Float32Array, 'f32ArrayToBf16: src');
  out = checkOut('f32ArrayToBf16', out, src.length, Uint16Array);
  const bits = new Uint32Array(src.buffer, src.byteOffset, src.length);
  for (let i = 0; i < bits.length; i++) out[i] = f32BitsToBf16Bits(bits[i]!);
  return out;
}

/** Converts f16 bits to f32 values (into `out` when given, same length). */
export function f16ArrayToF32(src: Uint16Array, out?: Float32Array): Float32Array {
  expectArray(src, Uint16Array, 'f16ArrayToF32: src');
  out = checkOut('f16ArrayToF32', out, src.length, Float32Array);
  const t = f16Table32();
  for (let i = 0; i < src.length; i++) out[i] = t[src[i]!]!;
  return out;
}

/** Converts bf16 bits to f32 values (into `out` when given, same length). */
export function bf16ArrayToF32(src: Uint16Array, out?: Float32Array): Float32Array {
  expectArray(src, Uint16Array, 'bf16ArrayToF32: src');
  out = checkOut('bf16ArrayToF32', out, src.length, Float32Array);
  const bits = new Uint32Array(out.buffer, out.byteOffset, out.length);
  for (let i = 0; i < src.length; i++) bits[i] = src[i]! << 16;
  return out;
}

/** Storage of `dtype` (f32: Float32Array, f16/bf16: bits) → f32 values; f32 input is returned as is. */
export function toF32(data: Float32Array | Uint16Array, dtype: Dtype): Float32Array {
  if (dtype === 'f32') {
    if (!(data instanceof Float32Array)) fail('E_DTYPE', 'toF32: f32 data', 'a Float32Array', data);
    return data;
  }
  if (!(data instanceof Uint16Array)) fail('E_DTYPE', `toF32: ${dtype} data`, 'a Uint16Array of bit patterns', data);
  return dtype === 'f16' ? f16ArrayToF32(data) : bf16ArrayToF32(data);
}

/** f32 values → storage of `dtype` (f32 input returned as is for dtype f32). */
export function fromF32(data: Float32Array, dtype: Dtype): Float32Array | Uint16Array {
  if (dtype === 'f32') return data;
  return dtype === 'f16' ? f32ArrayToF16(data) : f32ArrayToBf16(data);
}
