/**
 * GGUF v3 writer (layout in reader.ts). The header and tensor table are written first (tensor sizes
 * follow from dims and type), then each tensor's data in order, streamed: a tensor's bytes may come
 * from a callback that writes them piece by piece, so files far larger than memory (random-weight
 * models of real shapes) are written without building them whole.
 */
import { closeSync, openSync, writeSync } from 'node:fs';
import { fail, KvdriveError } from '../../errors.js';
import { failFormat } from '../format-error.js';
import {
  GGML_BLOCKS,
  GGML_TYPES,
  GGUF_DEFAULT_ALIGNMENT,
  GGUF_MAGIC,
  GGUF_SCALAR_BYTES,
  GGUF_VALUE_TYPES,
  GGUF_VERSION,
  type GgmlTypeName,
  type GgufScalarType,
  type GgufValue,
} from './ggml-types.js';

/** One tensor to write. */
export interface GgufTensorSpec {
  name: string;
  /** ne[0] first (innermost); ne[0] a multiple of the type's block size. */
  dims: number[];
  type: GgmlTypeName;
  /** The encoded bytes, or a producer that calls `write` with consecutive pieces of them. */
  data: Uint8Array | ((write: (chunk: Uint8Array) => void) => void);
}

/** What {@link writeGguf} writes. */
export interface GgufWriteSpec {
  /** Metadata in file order. `general.alignment` is added when `alignment` is not 32. */
  metadata: [string, GgufValue][];
  tensors: GgufTensorSpec[];
  /** Power of two; default 32. */
  alignment?: number;
}

/** Bytes a tensor of this type and shape occupies. */
export function tensorBytes(type: GgmlTypeName, dims: number[]): number {
  const blk = GGML_BLOCKS[type];
  if (dims[0]! % blk.elems !== 0) fail('E_SHAPE', `GGUF tensor ne[0] for ${type}`, `a multiple of ${blk.elems}`, dims[0]);
  return (dims.reduce((a, b) => a * b, 1) / blk.elems) * blk.bytes;
}

/** Accumulates little-endian header bytes. */
class Bytes {
  private readonly parts: Buffer[] = [];
  length = 0;
  push(b: Buffer): void {
    this.parts.push(b);
    this.length += b.length;
  }
  u32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    this.push(b);
  }
  u64(v: number | bigint): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.push(b);
  }
  string(s: string): void {
    const b = Buffer.from(s, 'utf8');
    this.u64(b.length);
    this.push(b);
  }
  scalar(type: Exclude<GgufScalarType, 'string'>, v: number | bigint | boolean): void {
    const b = Buffer.alloc(GGUF_SCALAR_BYTES[type]);
    switch (type) {
      case 'u8': b.writeUInt8(v as number); break;
      case 'i8': b.writeInt8(v as number); break;
      case 'u16': b.writeUInt16LE(v as number); break;
      case 'i16': b.writeInt16LE(v as number); break;
      case 'u32': b.writeUInt32LE(v as number); break;
      case 'i32': b.writeInt32LE(v as number); break;
      case 'f32': b.writeFloatLE(v as number); break;
      case 'f64': b.writeDoubleLE(v as number); break;
      case 'bool': b.writeUInt8(v ? 1 : 0); break;
      case 'u64': b.writeBigUInt64LE(BigInt(v as bigint)); break;
      case 'i64': b.writeBigInt64LE(BigInt(v as bigint)); break;
    }
    this.push(b);
  }
  value(v: GgufValue): void {
    if (v.type === 'string') return this.string(v.value);
    if (v.type !== 'array') return this.scalar(v.type, v.value);
    this.u32(GGUF_VALUE_TYPES[v.itemType]);
    this.u64(v.value.length);
    for (const item of v.value as unknown[]) {
      if (v.itemType === 'string') this.string(item as string);
      else if (v.itemType === 'array') {
        const inner = item as GgufValue;
        this.value(inner);
      } else this.scalar(v.itemType, item as number);
    }
  }
  concat(): Buffer {
    return Buffer.concat(this.parts);
  }
}

/** Writes a GGUF file; returns its size in bytes. */
export function writeGguf(path: string, spec: GgufWriteSpec): number {
  const alignment = spec.alignment ?? GGUF_DEFAULT_ALIGNMENT;
  if (!Number.isInteger(alignment) || alignment < 1 || (alignment & (alignment - 1)) !== 0)
    fail('E_CONFIG', 'GGUF alignment', 'a power of two', alignment);
  const metadata = spec.metadata.filter(([k]) => k !== 'general.alignment');
  if (alignment !== GGUF_DEFAULT_ALIGNMENT) metadata.push(['general.alignment', { type: 'u32', value: alignment }]);

  const h = new Bytes();
  h.u32(GGUF_MAGIC);
  h.u32(GGUF_VERSION);
  h.u64(spec.tensors.length);
  h.u64(metadata.length);
  for (const [key, v] of metadata) {
    h.string(key);
    h.u32(GGUF_VALUE_TYPES[v.type]);
    h.value(v);
  }
  const sizes: number[] = [];
  let rel = 0;
  for (const t of spec.tensors) {
    if (!(t.type in GGML_TYPES)) fail('E_DTYPE', `GGUF tensor "${t.name}" type`, Object.keys(GGML_TYPES).join(', '), t.type);
    h.string(t.name);
    h.u32(t.dims.length);
    for (const d of t.dims) h.u64(d);
    h.u32(GGML_TYPES[t.type]);
    h.u64(rel);
    const n = tensorBytes(t.type, t.dims);
    sizes.push(n);
    rel += Math.ceil(n / alignment) * alignment;
  }
  const header = h.concat();
  const pad = (n: number): Buffer => Buffer.alloc((alignment - (n % alignment)) % alignment);

  let fd: number;
  try {
    fd = openSync(path, 'w');
  } catch (e) {
    throw new KvdriveError('E_IO', `cannot create GGUF file ${path}: ${(e as Error).message}`, { cause: e });
  }
  let written = 0;
  const out = (b: Uint8Array): void => {
    let off = 0;
    while (off < b.byteLength) off += writeSync(fd, b, off, b.byteLength - off);
    written += b.byteLength;
  };
  try {
    out(header);
    out(pad(header.length));
    spec.tensors.forEach((t, i) => {
      const start = written;
      if (t.data instanceof Uint8Array) out(t.data);
      else t.data(out);
      const got = written - start;
      if (got !== sizes[i])
        failFormat('E_SHAPE', `GGUF tensor "${t.name}" data`, `${sizes[i]} bytes (${t.type} ${t.dims.join('×')})`, `${got} bytes`);
      out(pad(got));
    });
  } finally {
    closeSync(fd);
  }
  return written;
}
