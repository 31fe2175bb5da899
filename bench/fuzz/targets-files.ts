/**
 * Fuzz targets for the file readers: safetensors, traces, llama2.c checkpoints and tokenizers, and
 * the SSD store (manifest and segment/extent files). Each input is a mutation recipe applied to a
 * valid file built once per child, so inputs stay small to describe and exactly reproducible.
 * Segment mutations can re-seal the footer / index checksums so the parser is driven past them.
 */
import { mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadCheckpoint, parseCheckpointHeader } from '../../src/model/checkpoint.js';
import { loadTokenizer } from '../../src/model/tokenizer.js';
import { GgufTransformer, loadGgufModel } from '../../src/model/gguf/model.js';
import { createBackend } from '../../src/model/backends.js';
import { readGguf } from '../../src/model/gguf/reader.js';
import { MODEL_SHAPES, writeRandomModel, type RandomWeightType } from '../../src/model/gguf/random-model.js';
import { native } from '../../src/native.js';
import { SSD_MANIFEST_VERSION, SsdStore } from '../../src/storage/ssd-store.js';
import { openSafetensors, writeSafetensors } from '../../src/trace/safetensors.js';
import { generateSyntheticTrace } from '../../src/trace/synthetic.js';
import { openTrace } from '../../src/trace/trace.js';
import { defineTarget, type FuzzContext, type FuzzTarget, type Gen } from './harness.js';

/** Byte-level edits of a file. */
type ByteOp =
  | { op: 'set'; at: number; byte: number }
  | { op: 'u32'; at: number; value: number }
  | { op: 'truncate'; length: number }
  | { op: 'append'; bytes: number };

function byteOps(g: Gen, size: number, hot: number): ByteOp[] {
  const ops: ByteOp[] = [];
  const n = g.int(1, 4);
  for (let i = 0; i < n; i++) {
    // Most edits land in the first `hot` bytes (headers), the rest anywhere.
    const at = g.bool(0.7) ? g.int(0, Math.max(0, Math.min(hot, size) - 1)) : g.int(0, Math.max(0, size - 1));
    const k = g.int(0, 9);
    if (k < 4) ops.push({ op: 'set', at, byte: g.pick([0, 0xff, 0x7f, 0x80, 1, g.int(0, 255)]) });
    else if (k < 8) ops.push({ op: 'u32', at: at & ~3, value: g.edgeNumber() });
    else if (k < 9) ops.push({ op: 'truncate', length: g.int(0, size) });
    else ops.push({ op: 'append', bytes: g.int(1, 64) });
  }
  return ops;
}

function applyOps(base: Uint8Array, ops: readonly ByteOp[]): Uint8Array {
  let b: Uint8Array = Uint8Array.from(base);
  for (const o of ops) {
    if (o.op === 'set' && o.at < b.length) b[o.at] = o.byte;
    else if (o.op === 'u32' && o.at + 4 <= b.length) new DataView(b.buffer).setUint32(o.at, Number.isFinite(o.value) ? o.value >>> 0 : 0xffffffff, true);
    else if (o.op === 'truncate') b = b.subarray(0, o.length);
    else if (o.op === 'append') {
      const c = new Uint8Array(b.length + o.bytes);
      c.set(b);
      c.fill(0xa5, b.length);
      b = c;
    }
  }
  return b;
}

/** A JSON edit: set (or delete) the value at a path. */
interface JsonOp {
  path: (string | number)[];
  value: unknown;
  del?: boolean;
}

function jsonValue(g: Gen): unknown {
  return g.pick<() => unknown>([
    () => g.edgeNumber(),
    () => g.pick(['F32', 'F16', 'BF16', 'I32', 'I64', 'F64', 'U8', '', 'f32', 'x'.repeat(300)]),
    () => [g.edgeNumber(), g.edgeNumber()],
    () => [],
    () => null,
    () => ({}),
    () => true,
    () => Array.from({ length: g.int(0, 5) }, () => g.pick([0, 1, 2, 8, -1, 2 ** 31, 1.5])),
  ])();
}

/** Random paths into a JSON value (objects and arrays, depth-first). */
function jsonPaths(v: unknown, prefix: (string | number)[] = [], out: (string | number)[][] = []): (string | number)[][] {
  if (prefix.length) out.push(prefix);
  if (Array.isArray(v)) v.forEach((x, i) => jsonPaths(x, [...prefix, i], out));
  else if (v && typeof v === 'object') for (const [k, x] of Object.entries(v)) jsonPaths(x, [...prefix, k], out);
  return out;
}

function jsonOps(g: Gen, doc: unknown): JsonOp[] {
  const paths = jsonPaths(doc);
  return Array.from({ length: g.int(1, 3) }, () => ({ path: g.pick(paths), value: jsonValue(g), del: g.bool(0.15) }));
}

function applyJson(doc: unknown, ops: readonly JsonOp[]): unknown {
  const d = JSON.parse(JSON.stringify(doc)) as Record<string | number, unknown>;
  for (const o of ops) {
    let at: Record<string | number, unknown> | undefined = d;
    for (let i = 0; i < o.path.length - 1 && at; i++) at = at[o.path[i]!] as Record<string | number, unknown> | undefined;
    if (!at || typeof at !== 'object') continue;
    const last = o.path[o.path.length - 1]!;
    if (o.del) delete at[last];
    else at[last] = o.value;
  }
  return d;
}

/** Built once per child (lazily). */
function once<T>(f: () => Promise<T>): () => Promise<T> {
  let p: Promise<T> | undefined;
  return () => (p ??= f());
}

// ---- safetensors / trace ----

interface StInput {
  header?: JsonOp[];
  bytes?: ByteOp[];
}

/** A valid safetensors file's bytes split into the header JSON and the data. */
function splitSafetensors(buf: Uint8Array): { header: unknown; data: Uint8Array } {
  const n = Number(new DataView(buf.buffer, buf.byteOffset).getBigUint64(0, true));
  return { header: JSON.parse(Buffer.from(buf.subarray(8, 8 + n)).toString('utf8')), data: buf.subarray(8 + n) };
}

function joinSafetensors(header: unknown, data: Uint8Array): Uint8Array {
  const h = Buffer.from(JSON.stringify(header), 'utf8');
  const out = new Uint8Array(8 + h.length + data.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(h.length), true);
  out.set(h, 8);
  out.set(data, 8 + h.length);
  return out;
}

function stInput(g: Gen, base: { header: unknown; bytes: number }): StInput {
  const k = g.int(0, 2);
  if (k === 0) return { header: jsonOps(g, base.header) };
  if (k === 1) return { bytes: byteOps(g, base.bytes, 256) };
  return { header: jsonOps(g, base.header), bytes: byteOps(g, base.bytes, 64) };
}

function stBytes(base: Uint8Array, x: StInput): Uint8Array {
  let b = base;
  if (x.header) {
    const { header, data } = splitSafetensors(base);
    b = joinSafetensors(applyJson(header, x.header), data);
  }
  return x.bytes ? applyOps(b, x.bytes) : b;
}

const safetensorsBase = (ctx: FuzzContext): (() => Promise<{ bytes: Uint8Array; header: unknown }>) =>
  once(async () => {
    const path = join(ctx.dir, 'base.safetensors');
    await writeSafetensors(
      path,
      [
        { name: 'a', dtype: 'F32', shape: [2, 3], data: Float32Array.from([1, 2, 3, 4, 5, 6]) },
        { name: 'b', dtype: 'F16', shape: [4], data: Uint16Array.from([0x3c00, 0, 0x4000, 0xbc00]) },
        { name: 'c', dtype: 'I32', shape: [1, 2], data: Int32Array.from([7, -7]) },
      ],
      { note: 'fuzz' },
    );
    const bytes = new Uint8Array(readFileSync(path));
    return { bytes, header: splitSafetensors(bytes).header };
  });

let stBaseOf: (() => Promise<{ bytes: Uint8Array; header: unknown }>) | undefined;
let traceBaseOf: (() => Promise<{ bytes: Uint8Array; header: unknown }>) | undefined;

// Recipes need the base header's shape to pick JSON paths; it is fixed, so describe it statically.
const ST_HEADER_SKELETON = {
  __metadata__: { note: 'fuzz' },
  a: { dtype: 'F32', shape: [2, 3], data_offsets: [0, 24] },
  b: { dtype: 'F16', shape: [4], data_offsets: [24, 32] },
  c: { dtype: 'I32', shape: [1, 2], data_offsets: [32, 40] },
};
const TRACE_META = { version: 1, layers: 2, qHeads: 4, kvHeads: 2, headDim: 8, promptTokens: 24, decodeSteps: 2 };
const TRACE_HEADER_SKELETON = {
  __metadata__: { kvdrive: JSON.stringify(TRACE_META) },
  'layers.0.k': { dtype: 'F16', shape: [24, 2, 8], data_offsets: [0, 768] },
  'layers.0.q': { dtype: 'F16', shape: [2, 4, 8], data_offsets: [768, 896] },
  'layers.1.v_new': { dtype: 'F16', shape: [2, 2, 8], data_offsets: [896, 960] },
};

export const safetensorsTarget = defineTarget<StInput>({
  name: 'safetensors',
  input: (g) => stInput(g, { header: ST_HEADER_SKELETON, bytes: 128 }),
  async run(x, ctx) {
    stBaseOf ??= safetensorsBase(ctx);
    const base = await stBaseOf();
    const path = join(ctx.dir, 'in.safetensors');
    writeFileSync(path, stBytes(base.bytes, x));
    const f = await openSafetensors(path);
    try {
      for (const n of f.names()) await f.read(n);
    } finally {
      await f.close();
    }
  },
});

interface TraceInput extends StInput {
  meta?: JsonOp[];
}

export const traceTarget = defineTarget<TraceInput>({
  name: 'trace',
  input(g) {
    const x: TraceInput = g.bool(0.4) ? { meta: jsonOps(g, TRACE_META) } : stInput(g, { header: TRACE_HEADER_SKELETON, bytes: 512 });
    return x;
  },
  async run(x, ctx) {
    traceBaseOf ??= once(async () => {
      const path = join(ctx.dir, 'base.trace');
      const { version: _v, ...opts } = TRACE_META;
      await generateSyntheticTrace({ ...opts, dtype: 'f16', seed: 3 }).write(path);
      const bytes = new Uint8Array(readFileSync(path));
      return { bytes, header: splitSafetensors(bytes).header };
    });
    const base = await traceBaseOf();
    let bytes: Uint8Array;
    if (x.meta) {
      const { header, data } = splitSafetensors(base.bytes);
      const h = header as { __metadata__: { kvdrive: string } };
      h.__metadata__.kvdrive = JSON.stringify(applyJson(JSON.parse(h.__metadata__.kvdrive), x.meta));
      bytes = joinSafetensors(h, data);
    } else bytes = stBytes(base.bytes, x);
    const path = join(ctx.dir, 'in.trace');
    writeFileSync(path, bytes);
    const t = await openTrace(path);
    try {
      for (let l = 0; l < t.meta.layers && l < 8; l++) await t.layer(l);
      await t.extra('synthetic.needles');
    } finally {
      await t.close();
    }
  },
});

// ---- llama2.c checkpoint and tokenizer ----

interface CkptInput {
  header: (number | undefined)[]; // 7 header ints (undefined: keep)
  bytes?: ByteOp[];
}

const CKPT = [8, 16, 2, 2, 1, 32, 16]; // dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len

function checkpointBytes(h: readonly number[]): Uint8Array {
  const [dim, hd, L, nh, nkv, V, seq] = h as [number, number, number, number, number, number, number];
  const head = dim / nh;
  const kvDim = nkv * head;
  const floats = V * dim + L * dim + L * dim * dim + 2 * L * dim * kvDim + L * dim * dim + L * dim + 3 * L * dim * hd + dim + seq * head;
  const b = new Uint8Array(28 + 4 * floats);
  const dv = new DataView(b.buffer);
  h.forEach((v, i) => dv.setInt32(i * 4, v, true));
  for (let i = 0; i < floats; i++) dv.setFloat32(28 + 4 * i, ((i * 7919) % 1000) / 1000 - 0.5, true);
  return b;
}

export const checkpointTarget = defineTarget<CkptInput>({
  name: 'checkpoint',
  input(g) {
    const header = CKPT.map((v) => (g.bool(0.25) ? g.pick([g.edgeNumber(), v * 2, v + 1, -v, 0, 1]) : undefined));
    return { header, bytes: g.bool(0.4) ? byteOps(g, 4096, 28) : undefined };
  },
  run(x, ctx) {
    // The body is sized for the (possibly edited) header when that header is small enough to
    // build; otherwise the base body is kept (the size check must reject it).
    const h = CKPT.map((v, i) => (x.header[i] === undefined ? v : Number.isFinite(x.header[i]!) ? x.header[i]! | 0 : 0));
    const buildable = h.every((v) => v >= 1 && v <= 64) && h[0]! % h[3]! === 0;
    let b = checkpointBytes(buildable ? h : CKPT);
    const dv = new DataView(b.buffer);
    h.forEach((v, i) => dv.setInt32(i * 4, v, true));
    if (x.bytes) b = applyOps(b, x.bytes);
    parseCheckpointHeaderSafe(b);
    const path = join(ctx.dir, 'in.bin');
    writeFileSync(path, b);
    loadCheckpoint(path);
  },
});

function parseCheckpointHeaderSafe(b: Uint8Array): void {
  try {
    parseCheckpointHeader(b);
  } catch (e) {
    // The same error surfaces from loadCheckpoint below; a non-KvdriveError is rethrown by it too.
    if (!(e instanceof Error) || e.name !== 'KvdriveError') throw e;
  }
}

interface TokInput {
  bytes: ByteOp[];
  vocabSize?: number;
}

function tokenizerBytes(): Uint8Array {
  const pieces = ['<unk>', '<s>', '</s>', ...Array.from({ length: 256 }, (_, i) => `<0x${i.toString(16).toUpperCase().padStart(2, '0')}>`), ' a', 'ab', ' ab'];
  const parts: number[] = [];
  const push32 = (v: number, f = false) => {
    const b = new Uint8Array(4);
    if (f) new DataView(b.buffer).setFloat32(0, v, true);
    else new DataView(b.buffer).setInt32(0, v, true);
    parts.push(...b);
  };
  push32(8);
  pieces.forEach((p, i) => {
    push32(-i / 10, true);
    push32(p.length);
    parts.push(...Buffer.from(p, 'latin1'));
  });
  return Uint8Array.from(parts);
}
const TOK = tokenizerBytes();

export const tokenizerTarget = defineTarget<TokInput>({
  name: 'tokenizer',
  input: (g) => ({ bytes: byteOps(g, TOK.length, 64), vocabSize: g.bool(0.3) ? g.pick([262, 261, 263, 1, 0, -1, 2 ** 31, 0.5, NaN]) : undefined }),
  run(x, ctx) {
    const path = join(ctx.dir, 'tok.bin');
    writeFileSync(path, applyOps(TOK, x.bytes));
    const t = loadTokenizer(path, x.vocabSize === undefined ? {} : { vocabSize: x.vocabSize });
    t.encode('ab a', { bos: true, eos: true });
  },
});

// ---- SSD store: manifest and segment (extent) files ----

const SSD_SHAPE = { layers: 2, kvHeads: 2, headDim: 4, dtype: 'f16' as const, chunkSize: 4 };
const FOOTER = 64;

interface SsdInput {
  manifest?: JsonOp[];
  /** Segment edits; `reseal` recomputes the index and footer checksums afterwards. */
  segment?: { ops: ByteOp[]; target: 'footer' | 'index' | 'any'; reseal: boolean };
  /**
   * Reads; `done`: through SsdStore.readArrays with a completion flag (a valid one, an empty one, or
   * the wrong type) instead of readChunks.
   */
  reads: { layer: number; head: number; ids: number[]; done?: 'flag' | 'items' | 'empty' | 'f32' }[];
  /** I/O engine the store reads through (a small pool keeps each input cheap). */
  engine: 'pread' | 'auto';
}

const ssdBase = (ctx: FuzzContext) =>
  once(async () => {
    const dir = join(ctx.dir, 'ssd-base');
    rmSync(dir, { recursive: true, force: true });
    const s = await SsdStore.open({ dir, shape: SSD_SHAPE });
    const tokens = 32;
    const kv = () => ({ data: Uint16Array.from({ length: tokens * 2 * 4 }, (_, i) => 0x3c00 + (i % 97)), dtype: 'f16' as const, tokens, heads: 2, dim: 4 });
    await s.writeSegment('s0', {
      layers: [0, 1].map(() => ({ k: kv(), v: kv() })),
      clusters: Array.from({ length: 4 }, () => ({ offsets: Int32Array.from([0, 3, 5, 8]), chunkIds: Int32Array.from([5, 0, 2, 7, 1, 3, 4, 6]) })),
    });
    await s.close();
    const files = Object.fromEntries(readdirSync(dir).map((f) => [f, new Uint8Array(readFileSync(join(dir, f)))]));
    return files;
  });
let ssdBaseOf: (() => Promise<Record<string, Uint8Array>>) | undefined;

const MANIFEST_SKELETON = {
  format: 'kvdrive-ssd-store',
  version: SSD_MANIFEST_VERSION,
  shape: SSD_SHAPE,
  segments: [{ id: 's0', file: 's0.kvseg', tokens: 32, chunks: 8, bytes: 0, extents: 12, status: 'ok' }],
};

function reseal(b: Uint8Array): void {
  if (b.length < FOOTER) return;
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const f = b.length - FOOTER;
  const indexOffset = Number(dv.getBigUint64(f + 40, true));
  const indexBytes = Number(dv.getBigUint64(f + 48, true));
  if (indexOffset + indexBytes <= f) dv.setUint32(f + 56, native.crc32c(b.subarray(indexOffset, indexOffset + indexBytes)) as number, true);
  dv.setUint32(f + 60, native.crc32c(b.subarray(f, f + 60)) as number, true);
}

/**
 * One read of segment s0 through readArrays with a completion flag; checks the flag's contract: 1
 * when the read resolved, 2 when it failed after starting (0: refused before it started).
 */
async function readWithFlag(s: SsdStore, r: SsdInput['reads'][number], kind: 'flag' | 'items' | 'empty' | 'f32'): Promise<void> {
  const n = r.ids.length;
  // 'items': the end flag and the one item's landing flag (element 1).
  const done =
    kind === 'flag' || kind === 'items' ? new Int32Array(new SharedArrayBuffer(kind === 'items' ? 8 : 4)) : kind === 'empty' ? new Int32Array(0) : (new Float32Array(1) as unknown as Int32Array);
  const req = {
    segments: Int32Array.from([s.segmentHandle('s0')]),
    layers: Int32Array.from([r.layer]),
    heads: Int32Array.from([r.head]),
    itemOffsets: Int32Array.from([0, n]),
    chunkIds: Int32Array.from(r.ids),
    dest: new Uint8Array(n * s.chunkBytes),
    destOffsets: Float64Array.from(r.ids, (_, k) => k * s.chunkBytes),
    done,
  };
  let resolved = false;
  try {
    await s.readArrays(req);
    resolved = true;
  } finally {
    if (kind === 'flag' || kind === 'items') {
      const v = Atomics.load(done, 0);
      if (resolved ? v !== 1 : v !== 0 && v !== 2) throw new Error(`readArrays done flag: expected ${resolved ? '1 after a read that resolved' : '0 or 2 after one that failed'}, got ${v}`);
    }
    if (kind === 'items') {
      // The item landed iff the read resolved (an item with chunks never lands in a read that failed).
      const v = Atomics.load(done, 1);
      if (resolved ? v !== 1 : n > 0 && v !== 0) throw new Error(`readArrays item flag: expected ${resolved ? 1 : 0} after a read that ${resolved ? 'resolved' : 'failed'}, got ${v}`);
    }
  }
}

export const ssdTarget = defineTarget<SsdInput>({
  name: 'ssd-store',
  input(g) {
    const x: SsdInput = { reads: [], engine: g.bool(0.8) ? 'pread' : 'auto' };
    const k = g.int(0, 3);
    if (k === 0) x.manifest = jsonOps(g, MANIFEST_SKELETON);
    else {
      const target = g.pick(['footer', 'index', 'any'] as const);
      // Offsets relative to the region they target (resolved against the real file in run()).
      x.segment = { ops: byteOps(g, target === 'footer' ? FOOTER : 512, 512), target, reseal: g.bool(0.75) };
    }
    for (let r = g.int(0, 3); r > 0; r--)
      x.reads.push({
        layer: g.num(g.int(0, 1), 0.1),
        head: g.num(g.int(0, 1), 0.1),
        ids: Array.from({ length: g.int(0, 6) }, () => g.num(g.int(0, 7), 0.1)),
        ...(g.bool(0.3) ? { done: g.pick(['flag', 'flag', 'items', 'items', 'empty', 'f32'] as const) } : {}),
      });
    return x;
  },
  async run(x, ctx) {
    ssdBaseOf ??= ssdBase(ctx);
    const base = await ssdBaseOf();
    const dir = join(ctx.dir, 'ssd-in');
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { recursive: true });
    for (const [f, bytes] of Object.entries(base)) {
      let b = bytes;
      if (f === 'manifest.json' && x.manifest) b = Buffer.from(JSON.stringify(applyJson(JSON.parse(Buffer.from(bytes).toString('utf8')), x.manifest)));
      if (f.endsWith('.kvseg') && x.segment) {
        const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
        const footer = bytes.length - FOOTER;
        const indexOffset = Number(dv.getBigUint64(footer + 40, true));
        const shift = x.segment.target === 'footer' ? footer : x.segment.target === 'index' ? indexOffset : 0;
        const ops = x.segment.ops.map((o) => (o.op === 'set' || o.op === 'u32' ? { ...o, at: o.at + shift } : o.op === 'truncate' ? { ...o, length: o.length + shift } : o));
        b = applyOps(bytes, ops);
        if (x.segment.reseal) reseal(b);
      }
      writeFileSync(join(dir, f), b);
    }
    const s = await SsdStore.open({ dir, create: false, kind: x.engine, threads: 1, queueDepth: 4 });
    try {
      for (const r of x.reads) if (s.has('s0')) await (r.done ? readWithFlag(s, r, r.done) : s.readChunks('s0', r.layer, r.head, r.ids));
    } finally {
      await s.close();
    }
  },
});

interface GgufInput {
  type: RandomWeightType;
  bytes: ByteOp[];
  /** Run one forward step on a model that loaded (the native side then reads the mapped weights). */
  forward: boolean;
}

/** A tiny llama-architecture GGUF per weight type, written once per child (header + tensors). */
const ggufBase = new Map<string, Uint8Array>();
function ggufBytes(type: RandomWeightType, dir: string): Uint8Array {
  let b = ggufBase.get(type);
  if (!b) {
    const path = join(dir, `base-${type}.gguf`);
    const shape = { ...MODEL_SHAPES['llama-3.2-1b']!, dim: 64, hiddenDim: 64, layers: 1, heads: 2, kvHeads: 1, headSize: 32, vocab: 300, context: 64 };
    writeRandomModel({ shape, type, out: path, seed: 5 });
    b = new Uint8Array(readFileSync(path));
    ggufBase.set(type, b);
  }
  return b;
}

export const ggufTarget = defineTarget<GgufInput>({
  name: 'gguf',
  input(g) {
    // Headers (magic, version, counts, metadata, tensor table) are the first few KiB of the file.
    return { type: g.pick(['F32', 'Q8_0', 'Q4_K'] as const), bytes: byteOps(g, 64 * 1024, 4096), forward: g.bool(0.3) };
  },
  run(x, ctx) {
    const b = applyOps(ggufBytes(x.type, ctx.dir), x.bytes);
    const path = join(ctx.dir, 'in.gguf');
    writeFileSync(path, b);
    readGguf(path);
    const model = loadGgufModel(path, { threads: 1 });
    try {
      if (x.forward) {
        const ids = model.tokenizer.encode('a b', { bos: true });
        const tf = new GgufTransformer(model, createBackend('dense', model.attentionShape(4), {}), 4);
        tf.forward(ids.slice(0, 4), 0);
      }
    } finally {
      model.close();
    }
  },
});

export const fileTargets: FuzzTarget[] = [safetensorsTarget, traceTarget, checkpointTarget, tokenizerTarget, ssdTarget, ggufTarget];
