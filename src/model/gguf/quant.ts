/**
 * GGML block encodings in TypeScript: quantizers (f32 → F32, F16, BF16, Q8_0, Q4_0, the types
 * `kvdrive convert` writes; rounding as ggml's reference quantizers) and dequantizers for every
 * type kvdrive reads (the reference the native matrix-vector kernels are tested against). Block
 * layouts are described in ggml-types.ts.
 */
import { fail } from '../../errors.js';
import { f16ToF32, bf16ToF32, f32ToBf16, f32ToF16 } from '../../util/f16.js';
import { GGML_BLOCKS, type GgmlTypeName } from './ggml-types.js';

/** Types {@link quantize} can write. */
export const QUANTIZE_TYPES = ['F32', 'F16', 'BF16', 'Q8_0', 'Q4_0'] as const;
export type QuantizeType = (typeof QUANTIZE_TYPES)[number];

/** Encodes `x` (a whole number of blocks) as `type`. */
export function quantize(x: Float32Array, type: QuantizeType): Uint8Array {
  const blk = GGML_BLOCKS[type];
  if (x.length % blk.elems !== 0) fail('E_SHAPE', `quantize ${type} input length`, `a multiple of ${blk.elems}`, x.length);
  const out = new Uint8Array((x.length / blk.elems) * blk.bytes);
  const dv = new DataView(out.buffer);
  switch (type) {
    case 'F32':
      new Float32Array(out.buffer).set(x);
      break;
    case 'F16':
      for (let i = 0; i < x.length; i++) dv.setUint16(2 * i, f32ToF16(x[i]!), true);
      break;
    case 'BF16':
      for (let i = 0; i < x.length; i++) dv.setUint16(2 * i, f32ToBf16(x[i]!), true);
      break;
    case 'Q8_0':
      for (let b = 0; b < x.length / 32; b++) {
        const o = b * 34;
        let amax = 0;
        for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[b * 32 + j]!));
        const d = amax / 127;
        const id = d ? 1 / d : 0;
        dv.setUint16(o, f32ToF16(d), true);
        for (let j = 0; j < 32; j++) dv.setInt8(o + 2 + j, Math.round(x[b * 32 + j]! * id));
      }
      break;
    case 'Q4_0':
      for (let b = 0; b < x.length / 32; b++) {
        const o = b * 18;
        // The signed value of largest magnitude maps to -8, so the scale keeps its sign.
        let amax = 0;
        let max = 0;
        for (let j = 0; j < 32; j++) {
          const v = x[b * 32 + j]!;
          if (Math.abs(v) > amax) [amax, max] = [Math.abs(v), v];
        }
        const d = max / -8;
        const id = d ? 1 / d : 0;
        dv.setUint16(o, f32ToF16(d), true);
        const q = (v: number): number => Math.min(15, Math.trunc(v * id + 8.5));
        for (let j = 0; j < 16; j++) out[o + 2 + j] = q(x[b * 32 + j]!) | (q(x[b * 32 + 16 + j]!) << 4);
      }
      break;
  }
  return out;
}

/** Q4_K: the 6-bit scale and min of sub-block j (ggml's get_scale_min_k4). */
function scaleMinK4(j: number, s: Uint8Array, o: number): [number, number] {
  if (j < 4) return [s[o + j]! & 63, s[o + j + 4]! & 63];
  return [(s[o + j + 4]! & 0xf) | ((s[o + j - 4]! >> 6) << 4), (s[o + j + 4]! >> 4) | ((s[o + j]! >> 6) << 4)];
}

/** Decodes `n` elements of `type` from `src` (starting at its first byte). */
export function dequantize(src: Uint8Array, type: GgmlTypeName, n: number): Float32Array {
  const blk = GGML_BLOCKS[type];
  if (n % blk.elems !== 0) fail('E_SHAPE', `dequantize ${type} length`, `a multiple of ${blk.elems}`, n);
  if (src.byteLength < (n / blk.elems) * blk.bytes) fail('E_SHAPE', `dequantize ${type} bytes`, `at least ${(n / blk.elems) * blk.bytes}`, src.byteLength);
  const y = new Float32Array(n);
  const dv = new DataView(src.buffer, src.byteOffset, src.byteLength);
  const h = (o: number): number => f16ToF32(dv.getUint16(o, true));
  switch (type) {
    case 'F32':
      for (let i = 0; i < n; i++) y[i] = dv.getFloat32(4 * i, true);
      break;
    case 'F16':
      for (let i = 0; i < n; i++) y[i] = h(2 * i);
      break;
    case 'BF16':
      for (let i = 0; i < n; i++) y[i] = bf16ToF32(dv.getUint16(2 * i, true));
      break;
    case 'Q8_0':
      for (let b = 0; b < n / 32; b++) {
        const d = h(b * 34);
        for (let j = 0; j < 32; j++) y[b * 32 + j] = dv.getInt8(b * 34 + 2 + j) * d;
      }
      break;
    case 'Q4_0':
      for (let b = 0; b < n / 32; b++) {
        const o = b * 18;
        const d = h(o);
        for (let j = 0; j < 16; j++) {
          const q = src[o + 2 + j]!;
          y[b * 32 + j] = ((q & 0xf) - 8) * d;
          y[b * 32 + 16 + j] = ((q >> 4) - 8) * d;
        }
      }
      break;
    case 'Q4_K':
      for (let b = 0; b < n / 256; b++) {
        const o = b * 144;
        const d = h(o);
        const dmin = h(o + 2);
        let q = o + 16;
        let yi = b * 256;
        for (let j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
          const [s1, m1] = scaleMinK4(is, src, o + 4);
          const [s2, m2] = scaleMinK4(is + 1, src, o + 4);
          for (let l = 0; l < 32; l++) y[yi++] = d * s1 * (src[q + l]! & 0xf) - dmin * m1;
          for (let l = 0; l < 32; l++) y[yi++] = d * s2 * (src[q + l]! >> 4) - dmin * m2;
        }
      }
      break;
    case 'Q6_K':
      for (let b = 0; b < n / 256; b++) {
        const o = b * 210;
        const d = h(o + 208);
        let ql = o;
        let qh = o + 128;
        let sc = o + 192;
        let yi = b * 256;
        for (let half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, yi += 128) {
          for (let l = 0; l < 32; l++) {
            const is = l >> 4;
            const hb = src[qh + l]!;
            const q1 = ((src[ql + l]! & 0xf) | ((hb & 3) << 4)) - 32;
            const q2 = ((src[ql + l + 32]! & 0xf) | (((hb >> 2) & 3) << 4)) - 32;
            const q3 = ((src[ql + l]! >> 4) | (((hb >> 4) & 3) << 4)) - 32;
            const q4 = ((src[ql + l + 32]! >> 4) | (((hb >> 6) & 3) << 4)) - 32;
            y[yi + l] = d * dv.getInt8(sc + is) * q1;
            y[yi + l + 32] = d * dv.getInt8(sc + is + 2) * q2;
            y[yi + l + 64] = d * dv.getInt8(sc + is + 4) * q3;
            y[yi + l + 96] = d * dv.getInt8(sc + is + 6) * q4;
          }
        }
      }
      break;
  }
  return y;
}
