/**
 * Reader and writer of the safetensors format (https://github.com/huggingface/safetensors):
 *
 *   [8 bytes: N, little-endian u64][N bytes: JSON header][data buffer]
 *
 * The header maps tensor names to `{dtype, shape, data_offsets: [begin, end]}` (byte offsets
 * relative to the start of the data buffer, end exclusive) plus an optional `"__metadata__"`
 * object of string → string. Data is little-endian, row-major.
 *
 * The reader validates the whole header when the file is opened and then loads tensors lazily, one
 * by one, with positioned reads: a multi-GiB file is never read (or held) whole. The writer takes
 * every tensor's spec up front (the header comes first), then streams each tensor's bytes to disk
 * in the declared order; it writes to a temporary name and renames on close, so a reader never
 * sees a half-written file under the final name.
 */
import { open, rename, rm, stat, type FileHandle } from 'node:fs/promises';
import { endianness } from 'node:os';
import { KvdriveError, describe, fail } from '../errors.js';

/** Every dtype the safetensors format defines, with its element size in bytes. */
export const SAFETENSORS_DTYPE_SIZES = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  F8_E4M3: 1,
  F8_E5M2: 1,
  U16: 2,
  I16: 2,
  F16: 2,
  BF16: 2,
  U32: 4,
  I32: 4,
  F32: 4,
  U64: 8,
  I64: 8,
  F64: 8,
} as const;

/** A dtype name of the safetensors format. */
export type SafetensorsDtype = keyof typeof SAFETENSORS_DTYPE_SIZES;

/** Dtypes this module reads into and writes from typed arrays. */
export const DATA_DTYPES = ['F32', 'F16', 'BF16', 'I32', 'I64'] as const;
export type DataDtype = (typeof DATA_DTYPES)[number];

/**
 * Typed-array form of each supported dtype: F32 → Float32Array, F16/BF16 → Uint16Array of bit
 * patterns, I32 → Int32Array, I64 → BigInt64Array.
 */
export type TensorData = Float32Array | Uint16Array | Int32Array | BigInt64Array;

/** One header entry, validated. `begin`/`end` are byte offsets relative to the data buffer. */
export interface TensorInfo {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  begin: number;
  end: number;
}

/** A loaded tensor. */
export interface Tensor {
  name: string;
  dtype: DataDtype;
  shape: number[];
  data: TensorData;
}

/** What the writer needs to know about a tensor before any data is written. */
export interface TensorSpec {
  name: string;
  dtype: DataDtype;
  shape: readonly number[];
}

/** The largest header the reader accepts (real headers are kilobytes). */
export const MAX_HEADER_BYTES = 100 * 1024 * 1024;

// Reads and writes go in pieces of at most this many bytes (Linux caps one read at ~2 GiB).
const IO_PIECE = 1 << 30;

function formatError(path: string, what: string, expected: string, given: string): never {
  throw new KvdriveError('E_TRACE_FORMAT', `${path}: ${what}: expected ${expected}, got ${given}`);
}

function assertLittleEndianHost(): void {
  if (endianness() !== 'LE') fail('E_INTERNAL', 'host byte order', 'little-endian (safetensors is little-endian)', endianness());
}

function isDtype(d: unknown): d is SafetensorsDtype {
  return typeof d === 'string' && Object.prototype.hasOwnProperty.call(SAFETENSORS_DTYPE_SIZES, d);
}

function isDataDtype(d: string): d is DataDtype {
  return (DATA_DTYPES as readonly string[]).includes(d);
}

/** Element count of a validated shape (product of dims; 1 for a scalar). */
export function shapeSize(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

function allocate(dtype: DataDtype, n: number): TensorData {
  switch (dtype) {
    case 'F32':
      return new Float32Array(n);
    case 'F16':
    case 'BF16':
      return new Uint16Array(n);
    case 'I32':
      return new Int32Array(n);
    case 'I64':
      return new BigInt64Array(n);
  }
}

/** The typed-array class a dtype's data must be given in. */
function dataClassName(dtype: DataDtype): string {
  return { F32: 'Float32Array', F16: 'Uint16Array', BF16: 'Uint16Array', I32: 'Int32Array', I64: 'BigInt64Array' }[dtype];
}

function hasDataClass(dtype: DataDtype, data: unknown): data is TensorData {
  switch (dtype) {
    case 'F32':
      return data instanceof Float32Array;
    case 'F16':
    case 'BF16':
      return data instanceof Uint16Array;
    case 'I32':
      return data instanceof Int32Array;
    case 'I64':
      return data instanceof BigInt64Array;
  }
}

function bytesOf(data: ArrayBufferView): Uint8Array {
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

function ioError(path: string, e: unknown, doing: string): KvdriveError {
  const err = e as NodeJS.ErrnoException;
  if (err?.code === 'ENOENT') return new KvdriveError('E_NOT_FOUND', `${path}: no such file`, { cause: e });
  if (err?.code === 'ENOSPC') return new KvdriveError('E_NOSPC', `${path}: disk full while ${doing}`, { cause: e });
  return new KvdriveError('E_IO', `${path}: ${doing} failed: ${err?.message ?? String(e)}`, { cause: e });
}

/** Reads exactly `dst.length` bytes at `position`, in pieces; a short file is an error. */
async function readFully(fh: FileHandle, path: string, dst: Uint8Array, position: number): Promise<void> {
  let done = 0;
  while (done < dst.length) {
    const want = Math.min(IO_PIECE, dst.length - done);
    let n: number;
    try {
      ({ bytesRead: n } = await fh.read(dst, done, want, position + done));
    } catch (e) {
      throw ioError(path, e, 'reading');
    }
    if (n === 0) {
      throw new KvdriveError(
        'E_CORRUPT',
        `${path}: file ended at byte ${position + done} while reading ${dst.length} bytes at ${position} (truncated while open?)`,
      );
    }
    done += n;
  }
}

async function writeFully(fh: FileHandle, path: string, src: Uint8Array, position: number): Promise<void> {
  let done = 0;
  while (done < src.length) {
    const len = Math.min(IO_PIECE, src.length - done);
    try {
      const { bytesWritten } = await fh.write(src, done, len, position + done);
      done += bytesWritten;
    } catch (e) {
      throw ioError(path, e, 'writing');
    }
  }
}

/** Validates a parsed header object; returns tensors (in header order) and metadata. */
function parseHeader(
  path: string,
  header: unknown,
  bufferBytes: number,
): { tensors: Map<string, TensorInfo>; metadata: Record<string, string> } {
  if (header === null || typeof header !== 'object' || Array.isArray(header)) {
    formatError(path, 'header', 'a JSON object', Array.isArray(header) ? 'a JSON array' : `JSON ${header === null ? 'null' : typeof header}`);
  }
  const tensors = new Map<string, TensorInfo>();
  let metadata: Record<string, string> = {};
  for (const [name, entry] of Object.entries(header as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) {
        formatError(path, '"__metadata__"', 'an object of string values', describe(entry));
      }
      for (const [k, v] of Object.entries(entry as Record<string, unknown>)) {
        if (typeof v !== 'string') formatError(path, `"__metadata__"."${k}"`, 'a string', describe(v));
      }
      metadata = entry as Record<string, string>;
      continue;
    }
    const where = `tensor "${name}"`;
    if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) {
      formatError(path, where, 'an object {dtype, shape, data_offsets}', describe(entry));
    }
    const { dtype, shape, data_offsets: offsets } = entry as Record<string, unknown>;
    if (!isDtype(dtype)) {
      formatError(path, `${where} dtype`, `one of ${Object.keys(SAFETENSORS_DTYPE_SIZES).join(', ')}`, describe(dtype));
    }
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      formatError(path, `${where} shape`, 'an array of non-negative integers', Array.isArray(shape) ? JSON.stringify(shape) : describe(shape));
    }
    if (
      !Array.isArray(offsets) ||
      offsets.length !== 2 ||
      !offsets.every((o) => Number.isSafeInteger(o) && o >= 0) ||
      offsets[0] > offsets[1]
    ) {
      formatError(path, `${where} data_offsets`, '[begin, end] with 0 <= begin <= end', Array.isArray(offsets) ? JSON.stringify(offsets) : describe(offsets));
    }
    const [begin, end] = offsets as [number, number];
    if (end > bufferBytes) {
      formatError(path, `${where} data_offsets`, `within the data buffer of ${bufferBytes} bytes`, `[${begin}, ${end}]`);
    }
    const expectBytes = shapeSize(shape as number[]) * SAFETENSORS_DTYPE_SIZES[dtype];
    if (end - begin !== expectBytes) {
      formatError(
        path,
        `${where} data_offsets length`,
        `${expectBytes} bytes (shape [${(shape as number[]).join(', ')}] × ${SAFETENSORS_DTYPE_SIZES[dtype]} bytes of ${dtype})`,
        `${end - begin} bytes ([${begin}, ${end}])`,
      );
    }
    tensors.set(name, { name, dtype, shape: [...(shape as number[])], begin, end });
  }
  // Overlaps: sort the non-empty extents by start; each must begin at or after the previous end.
  const extents = [...tensors.values()].filter((t) => t.end > t.begin).sort((a, b) => a.begin - b.begin);
  for (let i = 1; i < extents.length; i++) {
    const prev = extents[i - 1]!;
    const cur = extents[i]!;
    if (cur.begin < prev.end) {
      formatError(
        path,
        `tensors "${prev.name}" [${prev.begin}, ${prev.end}) and "${cur.name}" [${cur.begin}, ${cur.end})`,
        'non-overlapping data_offsets',
        'overlapping byte ranges',
      );
    }
  }
  return { tensors, metadata };
}

/**
 * An open safetensors file. The header is validated on open; tensor data is read on demand.
 * Call {@link close} when done (reads after close fail with E_CLOSED).
 */
export class SafetensorsFile {
  private fh: FileHandle | undefined;

  private constructor(
    /** Path the file was opened from. */
    readonly path: string,
    fh: FileHandle,
    /** Total file size in bytes. */
    readonly fileSize: number,
    /** Absolute file offset of the data buffer (8 + header length). */
    readonly dataStart: number,
    private readonly tensors: Map<string, TensorInfo>,
    /** The header's `__metadata__` (empty when absent). */
    readonly metadata: Readonly<Record<string, string>>,
  ) {
    this.fh = fh;
  }

  /**
   * Opens and validates a safetensors file. Errors: E_NOT_FOUND (no such file), E_TRACE_FORMAT
   * (any malformed header; the message names what was expected and what was found), E_IO.
   */
  static async open(path: string): Promise<SafetensorsFile> {
    assertLittleEndianHost();
    if (typeof path !== 'string' || path.length === 0) fail('E_CONFIG', 'safetensors path', 'a non-empty string', path);
    let fh: FileHandle;
    try {
      fh = await open(path, 'r');
    } catch (e) {
      throw ioError(path, e, 'opening');
    }
    try {
      const size = (await fh.stat()).size;
      if (size < 8) formatError(path, 'file size', 'at least 8 bytes (the header length)', `${size} bytes`);
      const lenBytes = new Uint8Array(8);
      await readFully(fh, path, lenBytes, 0);
      const n = new DataView(lenBytes.buffer).getBigUint64(0, true);
      if (n > BigInt(MAX_HEADER_BYTES)) {
        formatError(path, 'header length', `at most ${MAX_HEADER_BYTES} bytes`, `${n} bytes`);
      }
      const headerLen = Number(n);
      if (headerLen > size - 8) {
        formatError(path, 'header length', `at most ${size - 8} bytes (file is ${size} bytes)`, `${headerLen} bytes`);
      }
      const headerBytes = new Uint8Array(headerLen);
      await readFully(fh, path, headerBytes, 8);
      let text: string;
      try {
        text = new TextDecoder('utf-8', { fatal: true }).decode(headerBytes);
      } catch {
        formatError(path, 'header', 'UTF-8 JSON text', 'invalid UTF-8 bytes');
      }
      let header: unknown;
      try {
        header = JSON.parse(text);
      } catch (e) {
        formatError(path, 'header', 'valid JSON', `unparsable text (${(e as Error).message}): ${describe(text)}`);
      }
      const { tensors, metadata } = parseHeader(path, header, size - 8 - headerLen);
      return new SafetensorsFile(path, fh, size, 8 + headerLen, tensors, metadata);
    } catch (e) {
      await fh.close().catch(() => undefined);
      throw e;
    }
  }

  /** Tensor names in header order. */
  names(): string[] {
    return [...this.tensors.keys()];
  }

  /** True when the file holds a tensor of this name. */
  has(name: string): boolean {
    return this.tensors.has(name);
  }

  /** Header entry of a tensor; E_NOT_FOUND when absent. */
  info(name: string): TensorInfo {
    const t = this.tensors.get(name);
    if (!t) throw new KvdriveError('E_NOT_FOUND', `${this.path}: no tensor named ${JSON.stringify(name)}`);
    return t;
  }

  /**
   * Loads one tensor with a positioned read of exactly its bytes. F16/BF16 come back as bit
   * patterns (Uint16Array). Errors: E_NOT_FOUND (no such tensor), E_DTYPE (a valid safetensors
   * dtype this module does not load, e.g. U8), E_CLOSED, E_IO.
   */
  async read(name: string): Promise<Tensor> {
    const t = this.info(name);
    if (!isDataDtype(t.dtype)) {
      fail('E_DTYPE', `${this.path}: tensor "${name}" dtype`, `one of ${DATA_DTYPES.join(', ')} to load`, t.dtype);
    }
    const data = allocate(t.dtype, shapeSize(t.shape));
    await this.readBytes(t, bytesOf(data));
    return { name, dtype: t.dtype, shape: [...t.shape], data };
  }

  /** Reads a tensor's raw bytes into `dst` (which must be exactly the tensor's byte length). */
  async readBytes(t: TensorInfo, dst: Uint8Array): Promise<void> {
    if (!this.fh) throw new KvdriveError('E_CLOSED', `${this.path}: read after close`);
    if (dst.length !== t.end - t.begin) fail('E_SHAPE', `${this.path}: destination for "${t.name}"`, `${t.end - t.begin} bytes`, `${dst.length} bytes`);
    await readFully(this.fh, this.path, dst, this.dataStart + t.begin);
  }

  /** Closes the file handle (idempotent). */
  async close(): Promise<void> {
    const fh = this.fh;
    this.fh = undefined;
    await fh?.close();
  }
}

/** Opens a safetensors file; see {@link SafetensorsFile.open}. */
export function openSafetensors(path: string): Promise<SafetensorsFile> {
  return SafetensorsFile.open(path);
}

function validateSpecs(specs: readonly TensorSpec[]): void {
  if (!Array.isArray(specs)) fail('E_CONFIG', 'tensor specs', 'an array of { name, dtype, shape }', specs);
  const seen = new Set<string>();
  for (const s of specs) {
    if ((s as unknown) === null || typeof (s as unknown) !== 'object') fail('E_CONFIG', 'tensor spec', 'an object { name, dtype, shape }', s);
    if (typeof s.name !== 'string' || s.name.length === 0 || s.name === '__metadata__') {
      fail('E_CONFIG', 'tensor name', 'a non-empty string other than "__metadata__"', s.name);
    }
    if (seen.has(s.name)) fail('E_CONFIG', 'tensor name', 'unique names', s.name);
    seen.add(s.name);
    if (!isDataDtype(s.dtype)) fail('E_DTYPE', `tensor "${s.name}" dtype`, `one of ${DATA_DTYPES.join(', ')}`, s.dtype);
    if (!Array.isArray(s.shape) || !s.shape.every((d: number) => Number.isSafeInteger(d) && d >= 0)) {
      fail('E_SHAPE', `tensor "${s.name}" shape`, 'an array of non-negative integers', s.shape);
    }
  }
}

/**
 * Streams a safetensors file to disk. Create it with every tensor's spec, {@link write} each
 * tensor's data in the declared order, then {@link close}. The file appears under `path` only
 * after a successful close; {@link abort} (or any failed write) removes the partial file.
 */
export class SafetensorsWriter {
  private next = 0; // index of the next spec to write
  private position: number; // absolute file offset of the next tensor's bytes
  private fh: FileHandle | undefined;

  private constructor(
    readonly path: string,
    private readonly tmpPath: string,
    fh: FileHandle,
    private readonly specs: readonly TensorSpec[],
    dataStart: number,
  ) {
    this.fh = fh;
    this.position = dataStart;
  }

  /**
   * Writes the header for `specs` (data laid out back to back in this order) and returns a writer.
   * `metadata` becomes the header's `__metadata__` (string values only).
   */
  static async create(path: string, specs: readonly TensorSpec[], metadata?: Record<string, string>): Promise<SafetensorsWriter> {
    assertLittleEndianHost();
    if (typeof path !== 'string' || path.length === 0) fail('E_CONFIG', 'safetensors path', 'a non-empty string', path);
    validateSpecs(specs);
    const header: Record<string, unknown> = {};
    if (metadata !== undefined) {
      if (metadata === null || typeof metadata !== 'object') fail('E_CONFIG', 'metadata', 'an object of string values', metadata);
      for (const [k, v] of Object.entries(metadata)) if (typeof v !== 'string') fail('E_CONFIG', `metadata "${k}"`, 'a string', v);
      header.__metadata__ = metadata;
    }
    let offset = 0;
    for (const s of specs) {
      const bytes = shapeSize(s.shape) * SAFETENSORS_DTYPE_SIZES[s.dtype];
      header[s.name] = { dtype: s.dtype, shape: [...s.shape], data_offsets: [offset, offset + bytes] };
      offset += bytes;
    }
    // The reference implementation pads the header with spaces to a multiple of 8 bytes so the data
    // buffer starts 8-aligned; we do the same and nothing more.
    let json = new TextEncoder().encode(JSON.stringify(header));
    const padded = Math.ceil(json.length / 8) * 8;
    if (padded !== json.length) {
      const p = new Uint8Array(padded).fill(0x20);
      p.set(json);
      json = p;
    }
    if (json.length > MAX_HEADER_BYTES) fail('E_CONFIG', 'safetensors header size', `at most ${MAX_HEADER_BYTES} bytes`, json.length);
    const prefix = new Uint8Array(8);
    new DataView(prefix.buffer).setBigUint64(0, BigInt(json.length), true);

    // A directory in the way would fail only the final rename, after every tensor was written.
    if (await stat(path).then((st) => st.isDirectory(), () => false))
      throw new KvdriveError('E_CONFIG', `${path}: expected a file to write, got a directory`);
    const tmpPath = `${path}.partial-${process.pid}`;
    let fh: FileHandle;
    try {
      fh = await open(tmpPath, 'w');
    } catch (e) {
      throw ioError(tmpPath, e, 'creating');
    }
    const w = new SafetensorsWriter(path, tmpPath, fh, specs, 8 + json.length);
    try {
      await writeFully(fh, tmpPath, prefix, 0);
      await writeFully(fh, tmpPath, json, 8);
    } catch (e) {
      await w.abort();
      throw e;
    }
    return w;
  }

  /** Name of the tensor the next {@link write} must supply, or undefined when all are written. */
  get pending(): string | undefined {
    return this.specs[this.next]?.name;
  }

  /**
   * Writes the next tensor's data (`name` must be the next declared tensor). `data` is the dtype's
   * typed array (F16/BF16 as Uint16Array bits) with exactly prod(shape) elements.
   */
  async write(name: string, data: TensorData): Promise<void> {
    if (!this.fh) throw new KvdriveError('E_CLOSED', `${this.path}: write after close`);
    const spec = this.specs[this.next];
    if (!spec) fail('E_RANGE', `${this.path}: write of "${name}"`, 'no more tensors (all declared tensors are written)', name);
    if (spec.name !== name) fail('E_CONFIG', `${this.path}: tensor written`, `"${spec.name}" (declared order)`, name);
    const cls = dataClassName(spec.dtype);
    if (!hasDataClass(spec.dtype, data)) fail('E_DTYPE', `tensor "${name}" (${spec.dtype}) data`, `a ${cls}`, data);
    const n = shapeSize(spec.shape);
    if (data.length !== n) fail('E_SHAPE', `tensor "${name}" data length`, `${n} elements (shape [${spec.shape.join(', ')}])`, data.length);
    try {
      await writeFully(this.fh, this.tmpPath, bytesOf(data), this.position);
    } catch (e) {
      await this.abort();
      throw e;
    }
    this.position += data.byteLength;
    this.next++;
  }

  /** Finishes the file: every declared tensor must have been written. Renames it into place. */
  async close(): Promise<void> {
    if (!this.fh) throw new KvdriveError('E_CLOSED', `${this.path}: close after close`);
    if (this.next < this.specs.length) {
      const missing = this.specs.slice(this.next).map((s) => s.name);
      await this.abort();
      fail('E_SHAPE', `${this.path}: tensors written`, `all ${this.specs.length} declared`, `${this.next} (missing ${missing.slice(0, 5).join(', ')}${missing.length > 5 ? ', ...' : ''})`);
    }
    const fh = this.fh;
    this.fh = undefined;
    try {
      await fh.close();
      await rename(this.tmpPath, this.path);
    } catch (e) {
      await rm(this.tmpPath, { force: true });
      throw ioError(this.path, e, 'finishing');
    }
  }

  /** Drops the partial file (idempotent). */
  async abort(): Promise<void> {
    const fh = this.fh;
    this.fh = undefined;
    await fh?.close().catch(() => undefined);
    await rm(this.tmpPath, { force: true }).catch(() => undefined);
  }
}

/** Writes a whole safetensors file from in-memory tensors (convenience over {@link SafetensorsWriter}). */
export async function writeSafetensors(
  path: string,
  tensors: readonly (TensorSpec & { data: TensorData })[],
  metadata?: Record<string, string>,
): Promise<void> {
  const w = await SafetensorsWriter.create(path, tensors, metadata);
  for (const t of tensors) await w.write(t.name, t.data);
  await w.close();
}
