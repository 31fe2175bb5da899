/**
 * Minimal safetensors writer (F32 only) for the trace recorder, used until the trace module's
 * writer (src/trace/safetensors.ts) is merged; the signature matches it so the switch is an import.
 *
 * Format: u64 little-endian header length N, then N bytes of JSON
 * `{"<name>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ..., "__metadata__": {...}}`
 * (padded with spaces so the data starts 8-byte aligned), then the tensors' bytes back to back;
 * offsets are relative to the start of the data section.
 */
import { openSync, writeSync, closeSync } from 'node:fs';
import { KvdriveError, fail } from '../errors.js';

/** One tensor to write. `data.length` must equal the product of `shape`. */
export interface F32Tensor {
  name: string;
  dtype: 'F32';
  shape: number[];
  data: Float32Array;
}

/** Writes `tensors` and string `metadata` to `path` as a safetensors file (overwrites). */
export function writeSafetensors(path: string, tensors: F32Tensor[], metadata: Record<string, string>): void {
  const header: Record<string, unknown> = {};
  let offset = 0;
  const names = new Set<string>();
  for (const t of tensors) {
    if (t.name === '__metadata__' || names.has(t.name)) fail('E_CONFIG', 'safetensors tensor name', 'unique names other than __metadata__', t.name);
    names.add(t.name);
    if (t.dtype !== 'F32') fail('E_DTYPE', `safetensors tensor ${t.name} dtype`, 'F32', t.dtype);
    const n = t.shape.reduce((a, b) => a * b, 1);
    if (!t.shape.every((d) => Number.isInteger(d) && d >= 0) || n !== t.data.length)
      fail('E_SHAPE', `safetensors tensor ${t.name}`, `data length equal to the product of shape [${t.shape.join(', ')}]`, t.data.length);
    header[t.name] = { dtype: 'F32', shape: t.shape, data_offsets: [offset, offset + t.data.byteLength] };
    offset += t.data.byteLength;
  }
  header.__metadata__ = metadata;
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - ((8 + Buffer.byteLength(json)) % 8)) % 8);
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));

  let fd: number | undefined;
  try {
    fd = openSync(path, 'w');
    writeAll(fd, head);
    writeAll(fd, Buffer.from(json, 'utf8'));
    for (const t of tensors) writeAll(fd, new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength));
  } catch (e) {
    const code = (e as { code?: string }).code;
    if (code === 'ENOSPC') throw new KvdriveError('E_NOSPC', `writing ${path}: disk full`, { cause: e });
    if (code === 'ENOENT') throw new KvdriveError('E_NOT_FOUND', `writing ${path}: directory not found`, { cause: e });
    throw new KvdriveError('E_IO', `writing ${path}: ${(e as Error).message}`, { cause: e });
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/** writeSync may write fewer bytes than asked; loop until all are written. */
function writeAll(fd: number, bytes: Uint8Array): void {
  for (let done = 0; done < bytes.byteLength; ) done += writeSync(fd, bytes, done, bytes.byteLength - done);
}
