/**
 * GGML tensor types and GGUF metadata value types: the numeric codes of the GGUF v3 format and the
 * block geometry of each weight type kvdrive reads. A quantized type stores a row of `ne0` elements
 * as ne0 / blockElems blocks of blockBytes bytes each (ne0 must be a multiple of blockElems).
 */

/** Weight types kvdrive reads (name → GGML type code). */
export const GGML_TYPES = {
  F32: 0,
  F16: 1,
  Q4_0: 2,
  Q8_0: 8,
  Q4_K: 12,
  Q6_K: 14,
  BF16: 30,
} as const;

export type GgmlTypeName = keyof typeof GGML_TYPES;

/** Elements and bytes per block of each supported type (F32/F16/BF16 are blocks of one element). */
export const GGML_BLOCKS: Record<GgmlTypeName, { elems: number; bytes: number }> = {
  F32: { elems: 1, bytes: 4 },
  F16: { elems: 1, bytes: 2 },
  BF16: { elems: 1, bytes: 2 },
  // f16 scale d, 16 bytes of 4-bit quants: value = (q - 8) * d.
  Q4_0: { elems: 32, bytes: 18 },
  // f16 scale d, 32 int8 quants: value = q * d.
  Q8_0: { elems: 32, bytes: 34 },
  // f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs for 8 sub-blocks, 128 bytes of 4-bit quants.
  Q4_K: { elems: 256, bytes: 144 },
  // 128 bytes low 4 bits, 64 bytes high 2 bits, 16 int8 sub-block scales, f16 d.
  Q6_K: { elems: 256, bytes: 210 },
};

/** Names of the other GGML types, for error messages about files kvdrive cannot read. */
const OTHER_GGML_TYPES: Record<number, string> = {
  3: 'Q4_1', 6: 'Q5_0', 7: 'Q5_1', 9: 'Q8_1', 10: 'Q2_K', 11: 'Q3_K', 13: 'Q5_K', 15: 'Q8_K', 16: 'IQ2_XXS',
  17: 'IQ2_XS', 18: 'IQ3_XXS', 19: 'IQ1_S', 20: 'IQ4_NL', 21: 'IQ3_S', 22: 'IQ2_S', 23: 'IQ4_XS', 24: 'I8',
  25: 'I16', 26: 'I32', 27: 'I64', 28: 'F64', 29: 'IQ1_M', 34: 'TQ1_0', 35: 'TQ2_0', 39: 'MXFP4',
};

const BY_CODE = new Map<number, GgmlTypeName>(Object.entries(GGML_TYPES).map(([n, c]) => [c, n as GgmlTypeName]));

/** The supported type with this code, or undefined. */
export function ggmlTypeName(code: number): GgmlTypeName | undefined {
  return BY_CODE.get(code);
}

/** A readable name for any type code ("Q5_K (13)", "unknown type 99"). */
export function describeGgmlType(code: number): string {
  const n = BY_CODE.get(code) ?? OTHER_GGML_TYPES[code];
  return n ? `${n} (${code})` : `unknown type ${code}`;
}

/** Bytes of a row of `ne0` elements of `type`; ne0 must be a multiple of the block size. */
export function rowBytes(type: GgmlTypeName, ne0: number): number {
  const b = GGML_BLOCKS[type];
  return (ne0 / b.elems) * b.bytes;
}

/** GGUF metadata value types. */
export const GGUF_VALUE_TYPES = {
  u8: 0,
  i8: 1,
  u16: 2,
  i16: 3,
  u32: 4,
  i32: 5,
  f32: 6,
  bool: 7,
  string: 8,
  array: 9,
  u64: 10,
  i64: 11,
  f64: 12,
} as const;

export type GgufScalarType = Exclude<keyof typeof GGUF_VALUE_TYPES, 'array'>;

/** Bytes of a fixed-size scalar value type (strings are variable). */
export const GGUF_SCALAR_BYTES: Record<Exclude<GgufScalarType, 'string'>, number> = {
  u8: 1, i8: 1, u16: 2, i16: 2, u32: 4, i32: 4, f32: 4, bool: 1, u64: 8, i64: 8, f64: 8,
};

const VALUE_TYPE_BY_CODE = new Map<number, keyof typeof GGUF_VALUE_TYPES>(
  Object.entries(GGUF_VALUE_TYPES).map(([n, c]) => [c, n as keyof typeof GGUF_VALUE_TYPES]),
);

export function ggufValueTypeName(code: number): keyof typeof GGUF_VALUE_TYPES | undefined {
  return VALUE_TYPE_BY_CODE.get(code);
}

/**
 * A metadata value with its GGUF type. Integers up to 32 bits, floats and bools are numbers /
 * booleans; 64-bit integers are bigints. Arrays hold one element type: numeric arrays are plain
 * number / bigint arrays, string arrays string[], nested arrays GgufValue[].
 */
export type GgufValue =
  | { type: Exclude<GgufScalarType, 'string' | 'bool' | 'u64' | 'i64'>; value: number }
  | { type: 'u64' | 'i64'; value: bigint }
  | { type: 'bool'; value: boolean }
  | { type: 'string'; value: string }
  | { type: 'array'; itemType: 'string'; value: string[] }
  | { type: 'array'; itemType: Exclude<GgufScalarType, 'string' | 'bool' | 'u64' | 'i64'>; value: number[] }
  | { type: 'array'; itemType: 'u64' | 'i64'; value: bigint[] }
  | { type: 'array'; itemType: 'bool'; value: boolean[] }
  | { type: 'array'; itemType: 'array'; value: GgufValue[] };

/** "GGUF" read as a little-endian uint32. */
export const GGUF_MAGIC = 0x46554747;
export const GGUF_VERSION = 3;
export const GGUF_DEFAULT_ALIGNMENT = 32;
