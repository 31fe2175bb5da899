/**
 * SSD tier: a store directory with a manifest and one extent file per sealed segment
 * (format: native/storage/extent_store.h). Layout per segment file: per (layer, kv head) region, that head's
 * chunks packed cluster by cluster (the caller's membership order, so one cluster = one extent =
 * one sequential read), each chunk page-first: its chunkSize K rows, then its chunkSize V rows.
 *
 * Durability: a segment file is written to `<name>.tmp`, fsynced, renamed and its directory fsynced
 * before the manifest lists it; the manifest itself is replaced the same way (temp, fsync, rename,
 * fsync dir). After a crash the store therefore holds each segment whole or not at all; the store's
 * own files that the manifest does not list (leftovers of an interrupted write: segments and temporary
 * files) are deleted at open. Nothing else in the directory is ever touched. One open store at a
 * time holds a directory (an flock on its LOCK file, dropped by the kernel if the process dies).
 */
import { mkdir, open as openFile, readdir, readFile, rename, rm, stat, unlink } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { z } from 'zod';
import { describe as describeValue, fail, fromNative, KvdriveError } from '../errors.js';
import { native } from '../native.js';
import type { Dtype, KvTensor } from '../types.js';
import { IoEngine, type IoEngineInfo, ioEngineOptionsSchema, type IoEngineOptions, parseOptions } from './io-engine.js';

/**
 * Store manifest format version; a manifest of another version is refused with E_VERSION. Version 2
 * stores hold segments of format 2 (a checksum per chunk, so reads fetch only the chunks asked for);
 * version 1 stores (one checksum per extent) must be re-created.
 */
export const SSD_MANIFEST_VERSION = 2;
const MANIFEST = 'manifest.json';
/** The directory's lock file (native/storage/store_lock.cc): empty, kept; the flock on it is the lock. */
const LOCK = 'LOCK';
const SEGMENT_EXT = '.kvseg';

/** The KV geometry every segment of a store shares. */
export interface StoreShape {
  layers: number;
  kvHeads: number;
  headDim: number;
  dtype: Dtype;
  /** Tokens per chunk (DESIGN.md: 4). */
  chunkSize: number;
}

export const storeShapeSchema = z
  .object({
    layers: z.number().int().min(1).max(4096),
    kvHeads: z.number().int().min(1).max(4096),
    headDim: z.number().int().min(1).max(65536),
    dtype: z.enum(['f32', 'f16', 'bf16']),
    chunkSize: z.number().int().min(1).max(65536),
  })
  .strict();

/** Bytes of one page-first chunk: 2 (K and V) x chunkSize rows x headDim x dtype size. */
export function chunkBytesOf(shape: StoreShape): number {
  shape = parseOptions(storeShapeSchema, shape, 'store shape');
  return 2 * shape.chunkSize * shape.headDim * (shape.dtype === 'f32' ? 4 : 2);
}

/** Options of {@link SsdStore.open}. */
export interface SsdStoreOptions extends IoEngineOptions {
  /** Store directory (created when missing and `create` is true). */
  dir: string;
  /** Required for a new store; when the store exists it must match the manifest (E_CONFIG). */
  shape?: StoreShape;
  /** Create the directory and an empty manifest when missing (default true). */
  create?: boolean;
  /** Open segment files with O_DIRECT (default false; aligned bounce reads, no page cache; ignored by kind 'mmap'). */
  direct?: boolean;
  /**
   * Start empty (default false; needs `shape`): an existing store's segments and temporary files
   * are deleted and its manifest rewritten for `shape`, whatever shape it had. For a store used as
   * scratch, as the runtime's is (its sequences live in the process: what a runtime that never
   * closed left can never be read again).
   */
  reset?: boolean;
  /**
   * Chunks of one read separated by at most this many bytes in the file are read as one I/O
   * (default for a store: {@link SSD_DEFAULT_GAP_BYTES}, at most maxIoBytes).
   */
  coalesceGapBytes?: number;
}

/**
 * A store's default read gap, 32 KiB: requested chunks at most this far apart in a file are read in
 * one I/O, the pages between them included. On the development VM's virtio disk one more 4 KiB I/O
 * cost ~20 us of CPU (200 random O_DIRECT reads: 4 ms of process CPU) and queue time, a 4 KiB page
 * inside a larger read ~2 us of transfer; in the 128K demo this gap cut the DRAM+SSD run's extra
 * CPU per layer-step from 5.9 to 3.4 ms (bench/runtime-memory.md).
 */
export const SSD_DEFAULT_GAP_BYTES = 32 << 10;

const ssdStoreOptionsSchema = ioEngineOptionsSchema.extend({
  dir: z.string().min(1),
  shape: storeShapeSchema.optional(),
  create: z.boolean().optional(),
  direct: z.boolean().optional(),
  reset: z.boolean().optional(),
});

/** Cluster membership of one (layer, kv head): CSR offsets over chunkIds (a permutation of chunks). */
export interface ClusterLayout {
  /** nClusters + 1 increasing offsets from 0 to the segment's chunk count. */
  offsets: Int32Array;
  /** Every chunk id of the segment exactly once, cluster by cluster. */
  chunkIds: Int32Array;
}

/** KV of one segment to seal. */
export interface SegmentData {
  /** Per layer, the segment's keys and values (tokens x kvHeads x headDim, store dtype). */
  layers: Array<{ k: KvTensor; v: KvTensor }>;
  /**
   * Per (layer, kv head), index layer * kvHeads + head: the cluster membership that decides the
   * on-disk order. Omitted: chunks in order, `extentChunks` per extent.
   */
  clusters?: ClusterLayout[];
  /** Chunks per extent when `clusters` is omitted (default 4). */
  extentChunks?: number;
}

/** A sealed segment as the manifest records it. */
export interface SegmentInfo {
  id: string;
  file: string;
  tokens: number;
  chunks: number;
  bytes: number;
  extents: number;
  /** 'corrupt' when the file failed validation at open (reads of it throw E_CORRUPT). */
  status: 'ok' | 'corrupt';
}

/** One item of a batched read: chunks of one (segment, layer, kv head). */
export interface ChunkReadItem {
  segment: string;
  layer: number;
  kvHead: number;
  chunkIds: Int32Array | readonly number[];
}

/** Counters of one SSD read. */
export interface SsdReadStats {
  chunks: number;
  /** Bytes of requested chunks. */
  payloadBytes: number;
  /** Extents (clusters) the requested chunks lie in. */
  extents: number;
  /** Bytes of those whole extents: what reading whole extents would transfer (only the chunks are read). */
  extentBytes: number;
  /** Sequential reads after merging neighbouring chunks. */
  runs: number;
  /** Physical I/Os submitted and bytes transferred (alignment included). */
  ios: number;
  bytesRead: number;
  cancelled: boolean;
}

interface ManifestEntry {
  id: string;
  file: string;
  tokens: number;
  chunks: number;
  bytes: number;
  extents: number;
}
interface Manifest {
  format: 'kvdrive-ssd-store';
  version: number;
  shape: StoreShape;
  segments: ManifestEntry[];
}

interface OpenSegment {
  entry: ManifestEntry;
  handle: number;
}

const SEGMENT_ID = /^[A-Za-z0-9._-]{1,128}$/;

function errnoToKvd(e: unknown, what: string): KvdriveError {
  const code = (e as { code?: string }).code;
  const msg = `${what}: ${(e as Error).message}`;
  if (code === 'ENOSPC' || code === 'EDQUOT') return new KvdriveError('E_NOSPC', msg, { cause: e });
  if (code === 'ENOENT') return new KvdriveError('E_NOT_FOUND', msg, { cause: e });
  return new KvdriveError('E_IO', msg, { cause: e });
}

/** Files a store writes besides its manifest: segments and the temporary files of both. */
const isStoreFile = (f: string): boolean => f.endsWith(SEGMENT_EXT) || f.endsWith(`${SEGMENT_EXT}.tmp`) || f === `${MANIFEST}.tmp`;

const errnoOf = (e: unknown): string | undefined => (e as { code?: string }).code;

/**
 * Creates directory `dir` and its missing parents (`mkdir -p`). Not `mkdir(dir, { recursive: true })`:
 * Node 20's spins forever (a core at 100%, the promise never settles) when a parent exists but the
 * kernel still answers ENOENT for the child — a path under /proc, a dangling symbolic link — so a
 * host given such a storage directory would hang without a word. Here each level is created at most
 * twice: once, and once more after its parents were made.
 */
async function makeDirectory(dir: string): Promise<void> {
  dir = resolve(dir);
  try {
    await mkdir(dir);
    return;
  } catch (e) {
    if (errnoOf(e) === 'EEXIST') return checkDirectory(dir);
    const parent = dirname(dir);
    if (errnoOf(e) !== 'ENOENT' || parent === dir) throw errnoToKvd(e, `creating ${dir}`);
    await makeDirectory(parent);
  }
  try {
    await mkdir(dir);
  } catch (e) {
    if (errnoOf(e) === 'EEXIST') return checkDirectory(dir);
    throw errnoToKvd(e, `creating ${dir}: expected a directory that can be made in ${dirname(dir)} (which exists); mkdir said`);
  }
}

/** `dir` exists: it must be a directory (stat follows links, so a dangling one fails here). */
async function checkDirectory(dir: string): Promise<void> {
  let isDir: boolean;
  try {
    isDir = (await stat(dir)).isDirectory();
  } catch (e) {
    throw errnoToKvd(e, `creating ${dir}: it exists but cannot be opened (a dangling link?)`);
  }
  if (!isDir) throw new KvdriveError('E_IO', `creating ${dir}: expected a directory, got a file that is not one`);
}

async function fsyncDir(dir: string): Promise<void> {
  const d = await openFile(dir, 'r');
  try {
    await d.sync();
  } finally {
    await d.close();
  }
}

/**
 * The SSD extent store. Open with {@link SsdStore.open}; all reads are batched, asynchronous and
 * verified (crc32c per chunk: only requested chunks are read). Native objects (engine, segments) are reachable by integer handle
 * from worker threads: see {@link SsdStore.engineHandle} and {@link SsdStore.segmentHandle}.
 */
export class SsdStore {
  readonly dir: string;
  readonly shape: StoreShape;
  /** Bytes of one page-first chunk. */
  readonly chunkBytes: number;
  private readonly engine: IoEngine;
  private readonly direct: boolean;
  private readonly open = new Map<string, OpenSegment>();
  private readonly broken = new Map<string, { entry: ManifestEntry; error: KvdriveError }>();
  private readonly writing = new Set<string>();
  private manifestChain: Promise<void> = Promise.resolve();
  private readonly inflight = new Set<Promise<unknown>>();
  private closed = false;

  /** Descriptor of the directory's lock (native storeLock), released at close. */
  private readonly lock: number;

  private constructor(dir: string, shape: StoreShape, engine: IoEngine, direct: boolean, lock: number) {
    this.lock = lock;
    this.dir = dir;
    this.shape = shape;
    this.chunkBytes = chunkBytesOf(shape);
    this.engine = engine;
    this.direct = direct;
  }

  /**
   * Opens (or creates) a store; removes files of interrupted writes; validates every listed segment.
   * The store holds its directory's lock until close(): a second open of the directory, in this
   * process or another, is E_BUSY until then.
   */
  static async open(options: SsdStoreOptions): Promise<SsdStore> {
    const o = parseOptions(ssdStoreOptionsSchema, options, 'SsdStore options');
    const { dir, shape, create = true } = o;
    if (o.reset && !shape) fail('E_CONFIG', 'SsdStore options.shape', 'a shape to reset the store to (reset: true)', undefined);
    // The lock file is made only in a directory that is, or is about to become, a store.
    if (create && shape) await makeDirectory(dir);
    if (!(await stat(join(dir, MANIFEST)).then(() => true, () => false))) {
      if (!create) throw new KvdriveError('E_NOT_FOUND', `SSD store ${dir}: expected a store with ${MANIFEST}, got none (pass create: true to make one)`);
      if (!shape) fail('E_CONFIG', 'SsdStore options.shape', 'a shape to create a new store', undefined);
      // The directory may hold anyone's files: none is touched. Segment files without a manifest,
      // though, are a store that lost its manifest (never a state an interrupted write leaves):
      // refused rather than written over.
      const stray = (await readdir(dir)).filter((f) => isStoreFile(f) && f !== `${MANIFEST}.tmp`);
      if (stray.length > 0)
        throw new KvdriveError('E_CONFIG', `SSD store ${dir}: expected an empty directory or a store with ${MANIFEST}, got ${stray.length} segment file(s) (${stray.slice(0, 3).join(', ')}) and no ${MANIFEST}: move them away or pick another directory`);
    }
    const lock = native.storeLock(join(dir, LOCK)) as number;
    try {
      return await SsdStore.openLocked(o, lock);
    } catch (e) {
      native.storeUnlock(lock);
      throw e;
    }
  }

  /** open() once the directory's lock is held (`lock`: its descriptor, kept by the store). */
  private static async openLocked(o: z.infer<typeof ssdStoreOptionsSchema>, lock: number): Promise<SsdStore> {
    const { dir, shape, create = true, direct = false, reset = false, ...engineOptions } = o;
    const manifestPath = join(dir, MANIFEST);
    let manifest: Manifest;
    let text: string | undefined;
    try {
      text = await readFile(manifestPath, 'utf8');
    } catch (e) {
      if ((e as { code?: string }).code !== 'ENOENT') throw errnoToKvd(e, `reading ${manifestPath}`);
    }
    if (text === undefined || reset) {
      if (!create && text === undefined) throw new KvdriveError('E_NOT_FOUND', `SSD store ${dir}: expected a store with ${MANIFEST}, got none (pass create: true to make one)`);
      if (!shape) fail('E_CONFIG', 'SsdStore options.shape', 'a shape to create a new store', undefined);
      manifest = { format: 'kvdrive-ssd-store', version: SSD_MANIFEST_VERSION, shape, segments: [] };
      await SsdStore.writeManifest(dir, manifest);
      // reset: the old manifest (readable or not) is replaced first, so every segment file is
      // unlisted before it goes; a crash in between leaves only leftovers the next open removes.
      if (text !== undefined) for (const f of await readdir(dir)) if (isStoreFile(f)) await rm(join(dir, f), { force: true });
    } else {
      manifest = SsdStore.parseManifest(text, manifestPath);
      if (shape) {
        const a = JSON.stringify(storeShapeSchema.parse(manifest.shape));
        const b = JSON.stringify(shape);
        if (a !== b) throw new KvdriveError('E_CONFIG', `SsdStore options.shape for ${dir}: expected the stored shape ${a}, got ${b} (a runtime resets its store; another directory or a deleted store takes a new shape)`);
      }
      // Leftovers of interrupted writes: the temporary files this store writes, and segment files
      // the manifest does not list (never sealed). Nothing else in the directory is touched.
      const listed = new Set(manifest.segments.map((s) => s.file));
      for (const f of await readdir(dir))
        if (isStoreFile(f) && !listed.has(f)) await rm(join(dir, f), { force: true });
    }
    const gap = engineOptions.coalesceGapBytes ?? Math.min(SSD_DEFAULT_GAP_BYTES, engineOptions.maxIoBytes ?? 256 << 10);
    const engine = new IoEngine({ ...engineOptions, coalesceGapBytes: gap });
    const store = new SsdStore(dir, manifest.shape, engine, direct, lock);
    for (const entry of manifest.segments) {
      try {
        store.attach(entry);
      } catch (e) {
        const err = fromNative(e);
        if (err instanceof KvdriveError && (err.code === 'E_CORRUPT' || err.code === 'E_NOT_FOUND' || err.code === 'E_VERSION')) {
          store.broken.set(entry.id, { entry, error: err.code === 'E_NOT_FOUND' ? new KvdriveError('E_CORRUPT', `segment '${entry.id}': its file ${join(dir, entry.file)} is missing`) : err });
        } else {
          engine.close();
          throw err;
        }
      }
    }
    return store;
  }

  private static parseManifest(text: string, path: string): Manifest {
    let m: unknown;
    try {
      m = JSON.parse(text);
    } catch {
      throw new KvdriveError('E_CORRUPT', `${path}: expected JSON, got unparsable text (${text.length} bytes)`);
    }
    const obj = m as Partial<Manifest> | null;
    if (!obj || typeof obj !== 'object' || obj.format !== 'kvdrive-ssd-store')
      throw new KvdriveError('E_CORRUPT', `${path}: expected a kvdrive SSD store manifest (format 'kvdrive-ssd-store'), got format ${describeValue(obj?.format)}`);
    if (obj.version !== SSD_MANIFEST_VERSION)
      throw new KvdriveError(
        'E_VERSION',
        `${path}: expected manifest version ${SSD_MANIFEST_VERSION}, got ${describeValue(obj.version)}${obj.version === 1 ? ' (a version 1 store checksums whole extents, which chunk-granular reads cannot verify: delete the directory and re-create the store)' : ''}`,
      );
    // A segment's file is always `<id><ext>` inside the store directory: anything else (a path
    // with '/' or '..') would let a damaged or crafted manifest point reads and deletes outside it.
    const entry = z
      .object({
        id: z.string().regex(SEGMENT_ID),
        file: z.string(),
        tokens: z.number().int(),
        chunks: z.number().int(),
        bytes: z.number().int(),
        extents: z.number().int(),
      })
      .refine((e) => e.file === `${e.id}${SEGMENT_EXT}`, { message: `expected file '<id>${SEGMENT_EXT}' in the store directory`, path: ['file'] });
    const r = z.object({ shape: storeShapeSchema, segments: z.array(entry) }).safeParse(obj);
    if (!r.success) throw new KvdriveError('E_CORRUPT', `${path}: malformed manifest (${r.error.issues[0]!.path.join('.')}: ${r.error.issues[0]!.message})`);
    return { format: 'kvdrive-ssd-store', version: SSD_MANIFEST_VERSION, shape: r.data.shape, segments: r.data.segments };
  }

  private static async writeManifest(dir: string, m: Manifest): Promise<void> {
    const final = join(dir, MANIFEST);
    const tmp = `${final}.tmp`;
    try {
      const fh = await openFile(tmp, 'w');
      try {
        await fh.writeFile(JSON.stringify(m));
        await fh.sync();
      } finally {
        await fh.close();
      }
      await rename(tmp, final);
      await fsyncDir(dir);
    } catch (e) {
      await rm(tmp, { force: true });
      throw errnoToKvd(e, `writing ${final}`);
    }
  }

  private attach(entry: ManifestEntry): OpenSegment {
    const r = native.segmentOpen(this.engine.handle, join(this.dir, entry.file), this.direct) as {
      handle: number;
      tokens: number;
      layers: number;
      kvHeads: number;
      headDim: number;
      dtype: Dtype;
      chunkSize: number;
    };
    const s = this.shape;
    if (r.layers !== s.layers || r.kvHeads !== s.kvHeads || r.headDim !== s.headDim || r.dtype !== s.dtype || r.chunkSize !== s.chunkSize || r.tokens !== entry.tokens) {
      native.segmentRelease(r.handle);
      throw new KvdriveError('E_CORRUPT', `segment '${entry.id}' (${join(this.dir, entry.file)}): its footer disagrees with the manifest (shape or token count)`);
    }
    const seg = { entry, handle: r.handle };
    this.open.set(entry.id, seg);
    return seg;
  }

  private check(): void {
    if (this.closed) throw new KvdriveError('E_CLOSED', `SSD store ${this.dir}: expected an open store, got a closed one`);
  }

  private track<T>(p: Promise<T>): Promise<T> {
    this.inflight.add(p);
    const done = () => this.inflight.delete(p);
    p.then(done, done);
    return p;
  }

  /** What the I/O engine runs with (io_uring or pread, fixed buffers, queue depth). */
  get engineInfo(): IoEngineInfo {
    return this.engine.info;
  }
  /** Native engine handle, for worker threads. */
  get engineHandle(): number {
    return this.engine.handle;
  }

  /** Sealed segments (and ones found corrupt at open, with status 'corrupt'). */
  segments(): SegmentInfo[] {
    const out: SegmentInfo[] = [];
    for (const { entry } of this.open.values()) out.push({ ...entry, status: 'ok' });
    for (const { entry } of this.broken.values()) out.push({ ...entry, status: 'corrupt' });
    return out;
  }

  has(id: string): boolean {
    return this.open.has(id);
  }

  /** The native segment handle (for worker threads and native consumers); E_NOT_FOUND when unknown. */
  segmentHandle(id: string): number {
    return this.segment(id).handle;
  }

  private segment(id: string): OpenSegment {
    this.check();
    const s = this.open.get(id);
    if (s) return s;
    const b = this.broken.get(id);
    if (b) throw b.error;
    throw new KvdriveError('E_NOT_FOUND', `segment ${describeValue(id)}: expected a sealed segment of store ${this.dir}, got an unknown id`);
  }

  /**
   * Writes and seals a segment: extents packed in cluster order with checksums, fsynced, then
   * listed in the manifest. Resolves once durable. E_NOSPC when the disk fills (nothing is listed
   * and other segments stay readable); E_CONFIG for a duplicate or malformed id.
   */
  async writeSegment(id: string, data: SegmentData): Promise<SegmentInfo> {
    this.check();
    if (typeof id !== 'string' || !SEGMENT_ID.test(id)) fail('E_CONFIG', 'segment id', 'a string of 1-128 characters [A-Za-z0-9._-]', id);
    if (this.open.has(id) || this.broken.has(id) || this.writing.has(id))
      fail('E_CONFIG', `segment id '${id}'`, 'an id not yet in the store (segments are immutable)', id);
    if (!data || !Array.isArray(data.layers) || data.layers.length !== this.shape.layers)
      fail('E_SHAPE', `segment '${id}'.layers`, `an array of ${this.shape.layers} layers`, data?.layers);
    data.layers.forEach((l, i) => {
      for (const t of [l?.k, l?.v]) {
        if (!t || t.dtype !== this.shape.dtype || t.heads !== this.shape.kvHeads || t.dim !== this.shape.headDim)
          fail('E_SHAPE', `segment '${id}'.layers[${i}]`, `K and V of ${this.shape.kvHeads} kv heads x ${this.shape.headDim} dims in ${this.shape.dtype}`, t ? `${t.heads} x ${t.dim} ${t.dtype}` : t);
      }
    });
    const file = `${id}${SEGMENT_EXT}`;
    this.writing.add(id);
    const work = (async () => {
      try {
        const w = (await native.segmentWrite(join(this.dir, file), {
          layers: data.layers,
          chunkSize: this.shape.chunkSize,
          clusters: data.clusters,
          extentChunks: data.extentChunks,
        })) as { bytes: number; extents: number };
        const tokens = data.layers[0]!.k.tokens;
        const entry: ManifestEntry = { id, file, tokens, chunks: tokens / this.shape.chunkSize, bytes: w.bytes, extents: w.extents };
        const seg = this.attach(entry);
        try {
          await this.updateManifest();
        } catch (e) {
          this.open.delete(id);
          native.segmentRelease(seg.handle);
          await unlink(join(this.dir, file)).catch(() => undefined);
          throw e;
        }
        return { ...entry, status: 'ok' as const };
      } finally {
        this.writing.delete(id);
      }
    })();
    return this.track(work);
  }

  /** Serialised manifest rewrite from the in-memory set of sealed segments. */
  private updateManifest(): Promise<void> {
    const run = this.manifestChain.then(() =>
      SsdStore.writeManifest(this.dir, {
        format: 'kvdrive-ssd-store',
        version: SSD_MANIFEST_VERSION,
        shape: this.shape,
        segments: [...this.open.values(), ...this.broken.values()].map((s) => s.entry),
      }),
    );
    this.manifestChain = run.catch(() => undefined);
    return run;
  }

  /** Removes a segment from the manifest (durably), then deletes its file. */
  async deleteSegment(id: string): Promise<void> {
    this.check();
    const s = this.open.get(id);
    const b = this.broken.get(id);
    if (!s && !b) this.segment(id);
    this.open.delete(id);
    this.broken.delete(id);
    await this.track(this.updateManifest());
    if (s) native.segmentRelease(s.handle);
    await rm(join(this.dir, (s ?? b)!.entry.file), { force: true });
  }

  /** Layout of one (segment, layer, kv head): extent offsets/sizes and the chunk order on disk. */
  extents(id: string, layer: number, kvHead: number): { offsets: Float64Array; bytes: Float64Array; firstPos: Int32Array; chunks: Int32Array; order: Int32Array } {
    return native.segmentExtents(this.segment(id).handle, layer, kvHead);
  }

  /**
   * Reads chunks of several (segment, layer, kv head) items in one batch: only the requested chunks
   * are read (neighbours in the file merged into one read), each chunk's checksum verified before
   * its bytes are used (E_CORRUPT otherwise), and chunk k of the concatenated request is written
   * page-first at `dest[destOffsets[k]]` (default: back to back from 0).
   */
  async readBatch(items: readonly ChunkReadItem[], dest: Uint8Array, destOffsets?: Float64Array, cancelFlag?: number): Promise<SsdReadStats> {
    this.check();
    const n = items.length;
    const segments = new Int32Array(n);
    const layers = new Int32Array(n);
    const heads = new Int32Array(n);
    const itemOffsets = new Int32Array(n + 1);
    let total = 0;
    for (let i = 0; i < n; i++) {
      const it = items[i]!;
      segments[i] = this.segment(it.segment).handle;
      layers[i] = it.layer;
      heads[i] = it.kvHead;
      total += it.chunkIds.length;
      itemOffsets[i + 1] = total;
    }
    const chunkIds = new Int32Array(total);
    let at = 0;
    for (const it of items) {
      chunkIds.set(it.chunkIds, at);
      at += it.chunkIds.length;
    }
    let dofs = destOffsets;
    if (!dofs) {
      dofs = new Float64Array(total);
      for (let k = 0; k < total; k++) dofs[k] = k * this.chunkBytes;
    }
    return this.readArrays({ segments, layers, heads, itemOffsets, chunkIds, dest, destOffsets: dofs }, cancelFlag);
  }

  /**
   * {@link readBatch} with native segment handles and typed arrays (the per-step hot path). `done`
   * (optional, an Int32Array over a SharedArrayBuffer): element 0 is set by the read's own thread
   * as it ends, 1 when every chunk has landed in `dest` (verified), 2 when it failed or was
   * cancelled, before the promise settles on this thread (poll it with Atomics.load). With at least
   * 1 + items elements, element 1 + i is set to 1 as soon as every chunk of item i has landed
   * (verified), while the other items are still being read.
   */
  readArrays(
    req: { segments: Int32Array; layers: Int32Array; heads: Int32Array; itemOffsets: Int32Array; chunkIds: Int32Array; dest: Uint8Array; destOffsets: Float64Array; done?: Int32Array },
    cancelFlag?: number,
  ): Promise<SsdReadStats> {
    this.check();
    return this.track(native.segmentRead(req, cancelFlag) as Promise<SsdReadStats>);
  }

  /** Reads chunks of one (segment, layer, kv head) into a new (or the given) buffer, in request order. */
  async readChunks(id: string, layer: number, kvHead: number, chunkIds: Int32Array | readonly number[], dest?: Uint8Array): Promise<Uint8Array> {
    const out = dest ?? new Uint8Array(chunkIds.length * this.chunkBytes);
    await this.readBatch([{ segment: id, layer, kvHead, chunkIds }], out);
    return out;
  }

  /** Waits for in-flight work, then releases native segments and the engine. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await Promise.allSettled([...this.inflight, this.manifestChain]);
    for (const s of this.open.values()) native.segmentRelease(s.handle);
    this.open.clear();
    this.engine.close();
    native.storeUnlock(this.lock);
  }
}
