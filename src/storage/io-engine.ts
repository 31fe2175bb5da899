/**
 * The batched read engine behind the SSD tier (native/storage/io_engine.cc): io_uring (when the addon was
 * built with liburing and the kernel accepts a ring) or a pread thread pool, chosen at run time, or
 * — asked for by name — memory-mapped reads. Used directly by benchmarks and tests; {@link SsdStore}
 * owns one per store. bench/storage.md compares the three.
 */
import { z } from 'zod';
import { fail, KvdriveError } from '../errors.js';
import { native } from '../native.js';

/**
 * Which engine to run. 'auto' picks io_uring and falls back to pread when missing or refused.
 * 'mmap' maps each file read-only and copies from the page cache (no read syscalls, no bounce
 * buffers; the extent store verifies checksums straight from the mapping). `direct` is ignored
 * there (it reads through the page cache), and before touching a page it checks the file's
 * current size, so a truncated file is E_CORRUPT, never SIGBUS; page faults do the I/O on the
 * reading thread (queueDepth / threads do not apply).
 */
export type IoEngineKind = 'auto' | 'uring' | 'pread' | 'mmap';

/** Options of an I/O engine; every field is optional. */
export interface IoEngineOptions {
  /** Engine choice (default 'auto'); 'uring' fails with E_CONFIG/E_IO when io_uring is unavailable; 'mmap': memory-mapped reads. */
  kind?: IoEngineKind;
  /** Physical reads in flight per batch (io_uring queue depth), 1..4096 (default 32). */
  queueDepth?: number;
  /**
   * Batches of concurrent callers in flight at once, 1..64 (default 4). io_uring: each has a ring
   * and 2 x queueDepth bounce buffers of its own (made on first need, kept until close; the memory
   * plan reserves all of them, see {@link IoEngineInfo.bufferBytes}), so one
   * step's reads never wait for another step's whole batch; a caller beyond the limit waits for a
   * ring. The pread pool serves one batch at a time whatever this says; mmap needs no limit.
   */
  maxBatches?: number;
  /** pread pool threads, 1..256 (default min(queueDepth, 64)): the pread engine's queue depth. */
  threads?: number;
  /** Largest physical read after coalescing, bytes, multiple of 4096 (default 256 KiB). */
  maxIoBytes?: number;
  /** Merge neighbouring requests separated by at most this many bytes (default 0: touching only). */
  coalesceGapBytes?: number;
  /** Merge neighbouring requests into larger reads (default true). */
  coalesce?: boolean;
  /** Register bounce buffers with the ring as fixed buffers (default true; io_uring only). */
  fixedBuffers?: boolean;
}

export const ioEngineOptionsSchema = z
  .object({
    kind: z.enum(['auto', 'uring', 'pread', 'mmap']).optional(),
    queueDepth: z.number().int().min(1).max(4096).optional(),
    maxBatches: z.number().int().min(1).max(64).optional(),
    threads: z.number().int().min(1).max(256).optional(),
    maxIoBytes: z
      .number()
      .int()
      .min(4096)
      .max(64 << 20)
      .refine((v) => v % 4096 === 0, 'a multiple of 4096')
      .optional(),
    coalesceGapBytes: z.number().int().min(0).optional(),
    coalesce: z.boolean().optional(),
    fixedBuffers: z.boolean().optional(),
  })
  .strict();

/** What the engine actually runs with. */
export interface IoEngineInfo {
  kind: 'io_uring' | 'pread' | 'mmap';
  /** Why 'auto' did not get io_uring ('' when it did). */
  fallbackReason: string;
  fixedBuffers: boolean;
  queueDepth: number;
  maxBatches: number;
  threads: number;
  maxIoBytes: number;
  coalesce: boolean;
  coalesceGapBytes: number;
  /**
   * The most memory this engine allocates, bytes, fixed by its options: io_uring, maxBatches x
   * (2 x queueDepth bounce buffers of maxIoBytes + 8 KiB, plus the ring's mappings); pread, threads
   * bounce buffers of maxIoBytes + 8 KiB; mmap, 0 (its mapped file pages are page cache). The
   * runtime's memory plan reserves it inside dramBudget (`MemoryPlan.ioBufferBytes`). Allocated:
   * pread at creation; io_uring one ring at creation and one more per batch in flight beyond the
   * rings made so far, kept until close; touched when allocated, so {@link IoEngine.stats}'s
   * `bufferBytes` is resident.
   */
  bufferBytes: number;
}

/** Counters of one batch. */
export interface IoBatchStats {
  /** Logical requests after splitting at maxIoBytes. */
  requests: number;
  /** Physical reads submitted (coalescing makes this smaller than requests). */
  ios: number;
  bytesRequested: number;
  /** Bytes transferred from the device (alignment and gaps included). */
  bytesRead: number;
  /** Physical reads that went through a bounce buffer. */
  bounced: number;
  cancelled: boolean;
}

/** One read: `length` bytes at `offset` of `file` into `dest` at `destOffset`. */
export interface IoRead {
  file: number;
  offset: number;
  length: number;
  destOffset: number;
}

/** Validates options with zod and rethrows failures as E_CONFIG naming the field. */
export function parseOptions<T>(schema: z.ZodType<T>, value: unknown, what: string): T {
  const r = schema.safeParse(value ?? {});
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const path = issue.path.length ? `${what}.${issue.path.join('.')}` : what;
  const given = issue.path.reduce<unknown>((o, k) => (o && typeof o === 'object' ? (o as Record<PropertyKey, unknown>)[k as PropertyKey] : undefined), value);
  // zod says "Invalid input: expected object, received number"; fail() adds "expected" and "got".
  const expected = issue.message.replace(/^Invalid input: /, '').replace(/^expected /, '').replace(/, received [^,]*$/, '');
  fail('E_CONFIG', path, expected, given);
}

/** Whether this build has io_uring and whether the kernel accepts a ring right now. */
export function ioUringAvailable(): { built: boolean; usable: boolean; reason: string } {
  return native.ioUringAvailable();
}

/**
 * A native I/O engine reached by an integer handle (process-global, usable from worker threads
 * through `handle`). Close it when done: it owns threads, rings and bounce buffers.
 */
export class IoEngine {
  readonly handle: number;
  readonly info: IoEngineInfo;
  private closed = false;

  constructor(options: IoEngineOptions = {}) {
    const o = parseOptions(ioEngineOptionsSchema, options, 'ioEngine options');
    const r = native.ioEngineCreate(o) as IoEngineInfo & { handle: number };
    this.handle = r.handle;
    const { handle: _h, ...info } = r;
    this.info = info;
  }

  private check(): void {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'I/O engine: expected an open engine, got a closed one');
  }

  /** Opens a file for reading; `direct` asks for O_DIRECT (ignored where the file system lacks it). */
  open(path: string, direct = false): { file: number; direct: boolean } {
    this.check();
    return native.ioEngineOpen(this.handle, path, direct);
  }

  /**
   * Drops the file's clean pages from the page cache (posix_fadvise DONTNEED): the next buffered or
   * memory-mapped read comes from the device. For benchmarks comparing cold reads across engines.
   */
  dropCache(file: number): void {
    this.check();
    native.ioEngineDropCache(this.handle, file);
  }

  closeFile(file: number): void {
    this.check();
    native.ioEngineCloseFile(this.handle, file);
  }

  /** Reads every request into `dest`; resolves when all arrived. */
  async read(reads: readonly IoRead[], dest: Uint8Array, cancelFlag?: number): Promise<IoBatchStats> {
    this.check();
    if (!Array.isArray(reads)) fail('E_TYPE', 'IoEngine.read reads', 'an array of { file, offset, length, destOffset }', reads);
    const n = reads.length;
    const files = new Int32Array(n);
    const offsets = new Float64Array(n);
    const lengths = new Float64Array(n);
    const destOffsets = new Float64Array(n);
    for (let i = 0; i < n; i++) {
      const r = reads[i]!;
      if (r === null || typeof r !== 'object') fail('E_TYPE', `IoEngine.read reads[${i}]`, 'an object { file, offset, length, destOffset }', r);
      files[i] = r.file;
      offsets[i] = r.offset;
      lengths[i] = r.length;
      destOffsets[i] = r.destOffset;
    }
    return this.readArrays({ files, offsets, lengths, destOffsets, dest }, cancelFlag);
  }

  /** Like {@link read} with the request already in typed arrays (no per-read objects). */
  async readArrays(
    req: { files: Int32Array; offsets: Float64Array; lengths: Float64Array; destOffsets: Float64Array; dest: Uint8Array },
    cancelFlag?: number,
  ): Promise<IoBatchStats> {
    this.check();
    return native.ioEngineRead(this.handle, req, cancelFlag);
  }

  /**
   * `peakBatches`: the most batches that were in flight at once since creation; `bufferBytes`: bounce
   * buffers and rings allocated now (at most `info.bufferBytes`).
   */
  stats(): { peakBatches: number; bufferBytes: number } {
    this.check();
    return native.ioEngineStats(this.handle);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    native.ioEngineRelease(this.handle);
  }
}
