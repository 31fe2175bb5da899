/**
 * GGUF v3 reader: header, metadata key/values (every value type, arrays included), tensor infos,
 * alignment and data offsets. Only the header region is read (positioned reads through a small
 * window, never the whole file); tensor data stays on disk and is memory-mapped by the native
 * model (native/model/) from the offsets found here.
 *
 * File layout (little-endian):
 *   u32 magic "GGUF" · u32 version (3) · u64 tensor_count · u64 metadata_kv_count
 *   metadata_kv_count × { string key, u32 value_type, value }       string = u64 length + UTF-8
 *   tensor_count × { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
 *   padding to `general.alignment` (default 32) · tensor data (each tensor at data_start + offset)
 * ne[0] is the innermost (contiguous) dimension: a weight matrix of `out` rows × `in` columns has
 * ne = [in, out].
 *
 * Every malformed or unsupported file is a KvdriveError: E_MODEL_FORMAT (truncated, wrong magic,
 * bad value type, unknown tensor type, data outside the file, misaligned offset), E_VERSION
 * (another GGUF version), E_NOT_FOUND / E_IO for the file itself.
 */
import { closeSync, fstatSync, openSync, readSync } from 'node:fs';
import { KvdriveError } from '../../errors.js';
import { failFormat } from '../format-error.js';
import {
  describeGgmlType,
  GGML_BLOCKS,
  GGUF_DEFAULT_ALIGNMENT,
  GGUF_MAGIC,
  GGUF_SCALAR_BYTES,
  GGUF_VERSION,
  ggmlTypeName,
  ggufValueTypeName,
  type GgmlTypeName,
  type GgufScalarType,
  type GgufValue,
} from './ggml-types.js';

/** One tensor's description; its bytes are [offset, offset + bytes) of the file. */
export interface GgufTensorInfo {
  name: string;
  /** ne[0] first (innermost). */
  dims: number[];
  type: GgmlTypeName;
  /** Absolute file offset of the first byte. */
  offset: number;
  bytes: number;
  /** Elements (product of dims). */
  elements: number;
}

/** A parsed GGUF file (metadata and tensor table; data stays on disk). */
export interface GgufFile {
  path: string;
  version: number;
  fileBytes: number;
  alignment: number;
  /** Absolute offset where tensor data starts. */
  dataOffset: number;
  metadata: Map<string, GgufValue>;
  tensors: GgufTensorInfo[];
  tensorByName: Map<string, GgufTensorInfo>;
}

/** Caps that reject garbage counts before allocating for them. */
const MAX_STRING = 1 << 28;
const MAX_COUNT = 1 << 28;
const MAX_DIMS = 4;

/** Reads forward through a file with positioned reads into a sliding window buffer. */
class FileCursor {
  pos = 0;
  private buf = Buffer.alloc(1 << 20);
  private bufStart = 0;
  private bufEnd = 0;

  constructor(
    private readonly fd: number,
    readonly size: number,
    private readonly path: string,
  ) {}

  /** Makes [pos, pos + n) available in the window and returns its start index in `buf`. */
  private need(n: number, what: string): number {
    if (this.pos + n > this.size)
      failFormat('E_MODEL_FORMAT', `GGUF ${this.path} ${what}`, `${n} bytes at offset ${this.pos}`, `${this.size - this.pos} bytes (file truncated)`);
    if (this.pos >= this.bufStart && this.pos + n <= this.bufEnd) return this.pos - this.bufStart;
    if (n > this.buf.length) this.buf = Buffer.alloc(Math.max(n, this.buf.length * 2));
    const want = Math.min(this.buf.length, this.size - this.pos);
    let got = 0;
    while (got < want) {
      const r = readSync(this.fd, this.buf, got, want - got, this.pos + got);
      if (r === 0) break;
      got += r;
    }
    if (got < n) failFormat('E_MODEL_FORMAT', `GGUF ${this.path} ${what}`, `${n} bytes at offset ${this.pos}`, `${got} bytes readable (file truncated)`);
    this.bufStart = this.pos;
    this.bufEnd = this.pos + got;
    return 0;
  }

  u32(what: string): number {
    const i = this.need(4, what);
    this.pos += 4;
    return this.buf.readUInt32LE(i);
  }

  /** u64 as a number; values above 2^53 are a format error (no file holds such counts). */
  u64(what: string): number {
    const i = this.need(8, what);
    this.pos += 8;
    const v = this.buf.readBigUInt64LE(i);
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) failFormat('E_MODEL_FORMAT', `GGUF ${this.path} ${what}`, 'a count below 2^53', String(v));
    return Number(v);
  }

  string(what: string): string {
    const len = this.u64(`${what} length`);
    if (len > MAX_STRING) failFormat('E_MODEL_FORMAT', `GGUF ${this.path} ${what} length`, `at most ${MAX_STRING} bytes`, `${len}`);
    const i = this.need(len, what);
    this.pos += len;
    return this.buf.toString('utf8', i, i + len);
  }

  scalar(type: Exclude<GgufScalarType, 'string'>, what: string): number | bigint | boolean {
    const n = GGUF_SCALAR_BYTES[type];
    const i = this.need(n, what);
    this.pos += n;
    const b = this.buf;
    switch (type) {
      case 'u8': return b.readUInt8(i);
      case 'i8': return b.readInt8(i);
      case 'u16': return b.readUInt16LE(i);
      case 'i16': return b.readInt16LE(i);
      case 'u32': return b.readUInt32LE(i);
      case 'i32': return b.readInt32LE(i);
      case 'f32': return b.readFloatLE(i);
      case 'f64': return b.readDoubleLE(i);
      case 'bool': {
        const v = b.readUInt8(i);
        if (v > 1) failFormat('E_MODEL_FORMAT', `GGUF ${this.path} ${what}`, 'a bool (0 or 1)', String(v));
        return v === 1;
      }
      case 'u64': return b.readBigUInt64LE(i);
      case 'i64': return b.readBigInt64LE(i);
    }
  }
}

function valueType(c: FileCursor, path: string, what: string): ReturnType<typeof ggufValueTypeName> & string {
  const code = c.u32(`${what} type`);
  const t = ggufValueTypeName(code);
  if (t === undefined) failFormat('E_MODEL_FORMAT', `GGUF ${path} ${what} type`, 'a value type in 0..12', String(code));
  return t;
}

function readValue(c: FileCursor, type: ReturnType<typeof ggufValueTypeName> & string, path: string, what: string, depth = 0): GgufValue {
  if (type === 'string') return { type, value: c.string(what) };
  if (type !== 'array') return { type, value: c.scalar(type, what) } as GgufValue;
  if (depth > 2) failFormat('E_MODEL_FORMAT', `GGUF ${path} ${what}`, 'arrays nested at most 3 deep', 'deeper nesting');
  const itemType = valueType(c, path, `${what} item`);
  const n = c.u64(`${what} length`);
  if (n > MAX_COUNT) failFormat('E_MODEL_FORMAT', `GGUF ${path} ${what} length`, `at most ${MAX_COUNT} items`, String(n));
  // A fixed-size array must fit in the rest of the file: reject before allocating for it.
  if (itemType !== 'string' && itemType !== 'array' && n * GGUF_SCALAR_BYTES[itemType] > c.size - c.pos)
    failFormat('E_MODEL_FORMAT', `GGUF ${path} ${what}`, `${n} × ${itemType} at offset ${c.pos}`, `${c.size - c.pos} bytes left (file truncated)`);
  const value: unknown[] = new Array(n);
  for (let i = 0; i < n; i++) {
    if (itemType === 'string') value[i] = c.string(`${what}[${i}]`);
    else if (itemType === 'array') value[i] = readValue(c, 'array', path, `${what}[${i}]`, depth + 1);
    else value[i] = c.scalar(itemType, `${what}[${i}]`);
  }
  return { type: 'array', itemType, value } as GgufValue;
}

/** Opens and parses a GGUF file's header, metadata and tensor table. */
export function readGguf(path: string): GgufFile {
  let fd: number;
  try {
    fd = openSync(path, 'r');
  } catch (e) {
    const code = (e as { code?: string }).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') throw new KvdriveError('E_NOT_FOUND', `GGUF model not found: ${path}`, { cause: e });
    throw new KvdriveError('E_IO', `cannot open GGUF model ${path}: ${(e as Error).message}`, { cause: e });
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) failFormat('E_MODEL_FORMAT', `GGUF ${path}`, 'a regular file', st.isDirectory() ? 'a directory' : 'a special file');
    return parse(new FileCursor(fd, st.size, path), path);
  } finally {
    closeSync(fd);
  }
}

function parse(c: FileCursor, path: string): GgufFile {
  const magic = c.u32('magic');
  if (magic !== GGUF_MAGIC) {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(magic);
    failFormat('E_MODEL_FORMAT', `GGUF ${path} magic`, '"GGUF"', JSON.stringify(b.toString('latin1')));
  }
  const version = c.u32('version');
  if (version !== GGUF_VERSION) failFormat('E_VERSION', `GGUF ${path} version`, `${GGUF_VERSION}`, `${version}`);
  const nTensors = c.u64('tensor count');
  const nKv = c.u64('metadata count');
  if (nTensors > MAX_COUNT || nKv > MAX_COUNT)
    failFormat('E_MODEL_FORMAT', `GGUF ${path} header`, `counts at most ${MAX_COUNT}`, `${nTensors} tensors, ${nKv} metadata entries`);

  const metadata = new Map<string, GgufValue>();
  for (let i = 0; i < nKv; i++) {
    const key = c.string(`metadata key ${i}`);
    const t = valueType(c, path, `metadata "${key}"`);
    if (metadata.has(key)) failFormat('E_MODEL_FORMAT', `GGUF ${path} metadata`, 'unique keys', `"${key}" twice`);
    metadata.set(key, readValue(c, t, path, `metadata "${key}"`));
  }

  let alignment = GGUF_DEFAULT_ALIGNMENT;
  const al = metadata.get('general.alignment');
  if (al !== undefined) {
    if (al.type !== 'u32' || al.value === 0 || (al.value & (al.value - 1)) !== 0)
      failFormat('E_MODEL_FORMAT', `GGUF ${path} general.alignment`, 'a u32 power of two', `${al.type} ${String(al.value)}`);
    alignment = al.value;
  }

  const raw: { name: string; dims: number[]; code: number; rel: number }[] = [];
  for (let i = 0; i < nTensors; i++) {
    const name = c.string(`tensor ${i} name`);
    const nd = c.u32(`tensor "${name}" n_dims`);
    if (nd < 1 || nd > MAX_DIMS) failFormat('E_MODEL_FORMAT', `GGUF ${path} tensor "${name}" n_dims`, `1..${MAX_DIMS}`, String(nd));
    const dims: number[] = [];
    for (let d = 0; d < nd; d++) dims.push(c.u64(`tensor "${name}" ne[${d}]`));
    const code = c.u32(`tensor "${name}" type`);
    const rel = c.u64(`tensor "${name}" offset`);
    raw.push({ name, dims, code, rel });
  }
  const dataOffset = Math.ceil(c.pos / alignment) * alignment;

  const tensors: GgufTensorInfo[] = [];
  const tensorByName = new Map<string, GgufTensorInfo>();
  for (const { name, dims, code, rel } of raw) {
    const type = ggmlTypeName(code);
    if (type === undefined)
      failFormat('E_MODEL_FORMAT', `GGUF ${path} tensor "${name}" type`, `one of ${Object.keys(GGML_BLOCKS).join(', ')}`, describeGgmlType(code));
    const blk = GGML_BLOCKS[type];
    if (dims[0]! % blk.elems !== 0)
      failFormat('E_MODEL_FORMAT', `GGUF ${path} tensor "${name}" ne[0]`, `a multiple of ${blk.elems} (the ${type} block)`, String(dims[0]));
    if (rel % alignment !== 0)
      failFormat('E_MODEL_FORMAT', `GGUF ${path} tensor "${name}" offset`, `a multiple of the alignment ${alignment}`, String(rel));
    const elements = dims.reduce((a, b) => a * b, 1);
    const bytes = (elements / blk.elems) * blk.bytes;
    const offset = dataOffset + rel;
    if (!Number.isSafeInteger(bytes) || offset + bytes > c.size)
      failFormat('E_MODEL_FORMAT', `GGUF ${path} tensor "${name}" data`, `${bytes} bytes at offset ${offset}`, `a ${c.size}-byte file (truncated)`);
    if (tensorByName.has(name)) failFormat('E_MODEL_FORMAT', `GGUF ${path} tensors`, 'unique names', `"${name}" twice`);
    const info: GgufTensorInfo = { name, dims, type, offset, bytes, elements };
    tensors.push(info);
    tensorByName.set(name, info);
  }
  return { path, version: GGUF_VERSION, fileBytes: c.size, alignment, dataOffset, metadata, tensors, tensorByName };
}

/** Typed metadata access with errors naming the key, the expected type and what was found. */
export class GgufMeta {
  constructor(
    private readonly file: GgufFile,
  ) {}

  has(key: string): boolean {
    return this.file.metadata.has(key);
  }

  private get(key: string, expected: string): GgufValue {
    const v = this.file.metadata.get(key);
    if (v === undefined) failFormat('E_MODEL_FORMAT', `GGUF ${this.file.path} metadata "${key}"`, expected, 'no such key');
    return v;
  }

  /** Any integer type (64-bit ones must be safe integers). */
  int(key: string, fallback?: number): number {
    if (fallback !== undefined && !this.has(key)) return fallback;
    const v = this.get(key, 'an integer');
    if (v.type === 'u64' || v.type === 'i64') {
      if (v.value > BigInt(Number.MAX_SAFE_INTEGER) || v.value < -BigInt(Number.MAX_SAFE_INTEGER))
        failFormat('E_MODEL_FORMAT', `GGUF ${this.file.path} metadata "${key}"`, 'a safe integer', String(v.value));
      return Number(v.value);
    }
    if (['u8', 'i8', 'u16', 'i16', 'u32', 'i32'].includes(v.type)) return v.value as number;
    return failFormat('E_MODEL_FORMAT', `GGUF ${this.file.path} metadata "${key}"`, 'an integer', `a ${v.type}`);
  }

  float(key: string, fallback?: number): number {
    if (fallback !== undefined && !this.has(key)) return fallback;
    const v = this.get(key, 'a number');
    if (v.type === 'f32' || v.type === 'f64') return v.value;
    return this.int(key);
  }

  bool(key: string, fallback: boolean): boolean {
    if (!this.has(key)) return fallback;
    const v = this.get(key, 'a bool');
    if (v.type !== 'bool') failFormat('E_MODEL_FORMAT', `GGUF ${this.file.path} metadata "${key}"`, 'a bool', `a ${v.type}`);
    return v.value;
  }

  string(key: string, fallback?: string): string {
    if (fallback !== undefined && !this.has(key)) return fallback;
    const v = this.get(key, 'a string');
    if (v.type !== 'string') failFormat('E_MODEL_FORMAT', `GGUF ${this.file.path} metadata "${key}"`, 'a string', `a ${v.type}`);
    return v.value;
  }

  stringArray(key: string): string[] {
    const v = this.get(key, 'an array of strings');
    if (v.type !== 'array' || v.itemType !== 'string')
      failFormat('E_MODEL_FORMAT', `GGUF ${this.file.path} metadata "${key}"`, 'an array of strings', v.type === 'array' ? `an array of ${v.itemType}` : `a ${v.type}`);
    return v.value;
  }

  /** A numeric array of any element type up to 32 bits, as numbers; undefined when absent. */
  numberArray(key: string): number[] | undefined {
    if (!this.has(key)) return undefined;
    const v = this.get(key, 'a numeric array');
    if (v.type !== 'array' || v.itemType === 'string' || v.itemType === 'array' || v.itemType === 'bool' || v.itemType === 'u64' || v.itemType === 'i64')
      failFormat('E_MODEL_FORMAT', `GGUF ${this.file.path} metadata "${key}"`, 'an array of numbers', v.type === 'array' ? `an array of ${v.itemType}` : `a ${v.type}`);
    return v.value as number[];
  }
}
