/**
 * kvdrive traces (DESIGN.md §7): a safetensors file holding, per layer l,
 *   layers.{l}.k, layers.{l}.v          T × Hkv × D   prompt keys (after RoPE) and values
 *   layers.{l}.q                        S × Hq × D    queries (after RoPE) of positions T..T+S-1
 *   layers.{l}.k_new, layers.{l}.v_new  S × Hkv × D   those positions' own keys and values
 * with `__metadata__.kvdrive` = JSON {version, layers, qHeads, kvHeads, headDim, promptTokens,
 * decodeSteps}. All five tensors of every layer share one dtype (F32, F16 or BF16). Query head h
 * uses kv head floor(h / (Hq/Hkv)); the softmax scale is 1/sqrt(D). Unknown tensors are ignored.
 *
 * Readers load one layer at a time (a 128K-token Llama-3-8B layer is ~0.5 GiB in f16).
 */
import { z } from 'zod';
import { KvdriveError, fail } from '../errors.js';
import type { Dtype, KvTensor } from '../types.js';
import { bf16ArrayToF32, f16ArrayToF32, fromF32 } from '../util/f16.js';
import { SafetensorsFile, SafetensorsWriter, type DataDtype, type Tensor, type TensorSpec } from './safetensors.js';
import { expectObject } from '../util/check.js';
import { kvArray } from '../util/kv-array.js';

const positiveInt = z.number().int().positive();

/** Zod schema of the trace metadata (`__metadata__.kvdrive`). */
export const TraceMetaSchema = z
  .object({
    /** Format version; only 1 exists. */
    version: z.literal(1),
    /** Number of layers L. */
    layers: positiveInt,
    /** Query heads Hq (a multiple of kvHeads). */
    qHeads: positiveInt,
    /** KV heads Hkv. */
    kvHeads: positiveInt,
    /** Head dimension D. */
    headDim: positiveInt,
    /** Prompt tokens T held in layers.{l}.k / .v. */
    promptTokens: positiveInt,
    /** Decode steps S held in layers.{l}.q / .k_new / .v_new. */
    decodeSteps: positiveInt,
  })
  .refine((m) => m.qHeads % m.kvHeads === 0, {
    message: 'qHeads must be a multiple of kvHeads (GQA groups of equal size)',
    path: ['qHeads'],
  });

/** Shape of a trace: see {@link TraceMetaSchema}. */
export type TraceMeta = z.infer<typeof TraceMetaSchema>;

/** One layer of a trace, ready for the kernels (KV in 'thd' layout, storage dtype kept). */
export interface TraceLayer {
  /** Prompt keys, tokens = promptTokens. */
  k: KvTensor;
  /** Prompt values, tokens = promptTokens. */
  v: KvTensor;
  /** Queries as f32, decodeSteps × qHeads × headDim (step-major). */
  q: Float32Array;
  /** Keys of the decoded tokens, tokens = decodeSteps. */
  kNew: KvTensor;
  /** Values of the decoded tokens, tokens = decodeSteps. */
  vNew: KvTensor;
}

/**
 * One layer's data to write: k/v (T×Hkv×D) and kNew/vNew (S×Hkv×D) in the trace dtype's storage
 * (Float32Array for f32, Uint16Array bits for f16/bf16); q (S×Hq×D) either as f32 values
 * (converted on write) or already in the trace dtype's storage.
 */
export interface TraceLayerData {
  k: Float32Array | Uint16Array;
  v: Float32Array | Uint16Array;
  q: Float32Array | Uint16Array;
  kNew: Float32Array | Uint16Array;
  vNew: Float32Array | Uint16Array;
}

/** A trace opened for reading, from a file ({@link openTrace}) or generated in memory. */
export interface TraceReader {
  readonly meta: TraceMeta;
  readonly dtype: Dtype;
  /** Loads layer `l` (0-based); E_RANGE outside [0, layers). */
  layer(l: number): Promise<TraceLayer>;
  /**
   * Loads a tensor stored beside the layers (e.g. `synthetic.needles`), or undefined when the
   * trace has none of that name.
   */
  extra(name: string): Promise<Tensor | undefined>;
  /** Releases the file (no-op for in-memory traces). */
  close(): Promise<void>;
}

/** An extra tensor stored beside the layers (e.g. `synthetic.needles`); readers ignore it. */
export interface TraceExtraTensor {
  name: string;
  dtype: 'I32' | 'I64' | 'F32';
  shape: number[];
  data: Int32Array | BigInt64Array | Float32Array;
}

const ST_DTYPE: Record<Dtype, DataDtype> = { f32: 'F32', f16: 'F16', bf16: 'BF16' };
const FROM_ST: Partial<Record<string, Dtype>> = { F32: 'f32', F16: 'f16', BF16: 'bf16' };

function checkDtype(dtype: unknown): asserts dtype is Dtype {
  if (dtype !== 'f32' && dtype !== 'f16' && dtype !== 'bf16') fail('E_DTYPE', 'trace dtype', 'f32, f16 or bf16', dtype);
}

/** Tensor names of layer l. */
export function traceTensorNames(l: number): { k: string; v: string; q: string; kNew: string; vNew: string } {
  return { k: `layers.${l}.k`, v: `layers.${l}.v`, q: `layers.${l}.q`, kNew: `layers.${l}.k_new`, vNew: `layers.${l}.v_new` };
}

/** Validates metadata given by a caller (E_CONFIG) — files use {@link parseMetaFromFile}. */
export function validateTraceMeta(meta: unknown): TraceMeta {
  const r = TraceMetaSchema.safeParse(meta);
  if (!r.success) fail('E_CONFIG', 'trace metadata', zodExpectation(r.error), meta);
  return r.data;
}

function zodExpectation(err: z.ZodError): string {
  return err.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ');
}

function describeLayerLength(what: string, expected: number, got: number, shape: string): never {
  fail('E_SHAPE', what, `${expected} elements (${shape})`, got);
}

function checkLayerIndex(meta: TraceMeta, l: number): void {
  if (!Number.isInteger(l) || l < 0 || l >= meta.layers) fail('E_RANGE', 'trace layer', `an integer in [0, ${meta.layers})`, l);
}

function kv(data: Float32Array | Uint16Array, dtype: Dtype, tokens: number, meta: TraceMeta): KvTensor {
  return { data, dtype, tokens, heads: meta.kvHeads, dim: meta.headDim, layout: 'thd' };
}

/** Validates one layer's data against meta/dtype; returns q in the trace's storage dtype. */
function checkLayerData(meta: TraceMeta, dtype: Dtype, l: number, d: TraceLayerData): Float32Array | Uint16Array {
  const { promptTokens: T, decodeSteps: S, kvHeads: H, qHeads: Hq, headDim: D } = meta;
  const storage = dtype === 'f32' ? Float32Array : Uint16Array;
  const storageName = dtype === 'f32' ? 'Float32Array' : 'Uint16Array (bits)';
  const n = traceTensorNames(l);
  for (const [key, tokens] of [['k', T], ['v', T], ['kNew', S], ['vNew', S]] as const) {
    const a = d?.[key];
    if (!(a instanceof storage)) fail('E_DTYPE', `layer ${l} ${key} (${n[key]})`, `a ${storageName} for dtype ${dtype}`, a);
    if (a.length !== tokens * H * D) describeLayerLength(`layer ${l} ${key} length`, tokens * H * D, a.length, `${tokens} × ${H} × ${D}`);
  }
  const q = d.q;
  if (!(q instanceof Float32Array) && !(q instanceof storage)) fail('E_DTYPE', `layer ${l} q`, `a Float32Array or ${storageName}`, q);
  if (q.length !== S * Hq * D) describeLayerLength(`layer ${l} q length`, S * Hq * D, q.length, `${S} × ${Hq} × ${D}`);
  return q instanceof Float32Array ? fromF32(q, dtype) : q;
}

/** Builds the (validated) trace metadata string stored in `__metadata__.kvdrive`. */
function metaString(meta: TraceMeta): string {
  const { version, layers, qHeads, kvHeads, headDim, promptTokens, decodeSteps } = meta;
  return JSON.stringify({ version, layers, qHeads, kvHeads, headDim, promptTokens, decodeSteps });
}

/**
 * Writes a trace file layer by layer: `layers` yields exactly meta.layers entries in order (each
 * written as soon as it arrives, so a generator can produce one layer at a time). `extra` tensors
 * (e.g. `synthetic.needles`) are written after the layers. The file appears at `path` only once
 * complete. Errors: E_CONFIG (bad meta), E_DTYPE/E_SHAPE (layer data), E_RANGE (wrong layer count).
 */
export async function writeTrace(
  path: string,
  meta: TraceMeta,
  dtype: Dtype,
  layers: AsyncIterable<TraceLayerData> | Iterable<TraceLayerData>,
  extra: readonly TraceExtraTensor[] = [],
): Promise<void> {
  const m = validateTraceMeta(meta);
  checkDtype(dtype);
  const st = ST_DTYPE[dtype];
  const { promptTokens: T, decodeSteps: S, kvHeads: H, qHeads: Hq, headDim: D } = m;
  const specs: TensorSpec[] = [];
  for (let l = 0; l < m.layers; l++) {
    const n = traceTensorNames(l);
    specs.push(
      { name: n.k, dtype: st, shape: [T, H, D] },
      { name: n.v, dtype: st, shape: [T, H, D] },
      { name: n.q, dtype: st, shape: [S, Hq, D] },
      { name: n.kNew, dtype: st, shape: [S, H, D] },
      { name: n.vNew, dtype: st, shape: [S, H, D] },
    );
  }
  for (const e of extra) {
    if (e.name.startsWith('layers.')) fail('E_CONFIG', 'extra tensor name', 'a name outside "layers.*"', e.name);
    specs.push({ name: e.name, dtype: e.dtype, shape: e.shape });
  }
  const w = await SafetensorsWriter.create(path, specs, { kvdrive: metaString(m) });
  try {
    let l = 0;
    for await (const d of layers) {
      if (l >= m.layers) fail('E_RANGE', 'layers given to writeTrace', `exactly ${m.layers}`, `more than ${m.layers}`);
      const q = checkLayerData(m, dtype, l, d);
      const n = traceTensorNames(l);
      await w.write(n.k, d.k);
      await w.write(n.v, d.v);
      await w.write(n.q, q);
      await w.write(n.kNew, d.kNew);
      await w.write(n.vNew, d.vNew);
      l++;
    }
    if (l !== m.layers) fail('E_RANGE', 'layers given to writeTrace', `exactly ${m.layers}`, l);
    for (const e of extra) await w.write(e.name, e.data);
    await w.close();
  } catch (e) {
    await w.abort();
    throw e;
  }
}

function parseMetaFromFile(f: SafetensorsFile): TraceMeta {
  const raw = f.metadata.kvdrive;
  if (raw === undefined) {
    throw new KvdriveError(
      'E_TRACE_FORMAT',
      `${f.path}: __metadata__.kvdrive: expected the trace metadata JSON string, got ${Object.keys(f.metadata).length ? `only keys ${Object.keys(f.metadata).join(', ')}` : 'no metadata'}`,
    );
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    throw new KvdriveError('E_TRACE_FORMAT', `${f.path}: __metadata__.kvdrive: expected a JSON object, got unparsable text ${JSON.stringify(raw.slice(0, 80))}`);
  }
  if (parsed !== null && typeof parsed === 'object' && 'version' in parsed && (parsed as { version: unknown }).version !== 1) {
    throw new KvdriveError('E_VERSION', `${f.path}: trace version: expected 1, got ${JSON.stringify((parsed as { version: unknown }).version)}`);
  }
  const r = TraceMetaSchema.safeParse(parsed);
  if (!r.success) throw new KvdriveError('E_TRACE_FORMAT', `${f.path}: __metadata__.kvdrive: expected ${zodExpectation(r.error)}, got ${raw.slice(0, 200)}`);
  return r.data;
}

/** Trace reader over a safetensors file. Every layer's tensors are checked when the file opens. */
class FileTraceReader implements TraceReader {
  constructor(
    private readonly file: SafetensorsFile,
    readonly meta: TraceMeta,
    readonly dtype: Dtype,
  ) {}

  async layer(l: number): Promise<TraceLayer> {
    checkLayerIndex(this.meta, l);
    const n = traceTensorNames(l);
    const [k, v, q, kNew, vNew] = await Promise.all([
      this.file.read(n.k),
      this.file.read(n.v),
      this.file.read(n.q),
      this.file.read(n.kNew),
      this.file.read(n.vNew),
    ]);
    const { promptTokens: T, decodeSteps: S } = this.meta;
    const data = (t: typeof k) => t.data as Float32Array | Uint16Array;
    const qf32 = this.dtype === 'f32' ? (q.data as Float32Array) : this.dtype === 'f16' ? f16ArrayToF32(q.data as Uint16Array) : bf16ArrayToF32(q.data as Uint16Array);
    return {
      k: kv(data(k), this.dtype, T, this.meta),
      v: kv(data(v), this.dtype, T, this.meta),
      q: qf32,
      kNew: kv(data(kNew), this.dtype, S, this.meta),
      vNew: kv(data(vNew), this.dtype, S, this.meta),
    };
  }

  async extra(name: string): Promise<Tensor | undefined> {
    if (name.startsWith('layers.')) fail('E_RANGE', 'extra tensor name', 'a name outside "layers.*" (use layer())', name);
    return this.file.has(name) ? this.file.read(name) : undefined;
  }

  close(): Promise<void> {
    return this.file.close();
  }
}

/**
 * Opens a trace file and validates it: metadata present and valid (E_TRACE_FORMAT, or E_VERSION for
 * another version), and for every layer the five tensors present with one float dtype and the
 * shapes the metadata implies (E_TRACE_FORMAT naming the tensor, expected and given shape).
 * Tensor data is loaded per layer by {@link TraceReader.layer}.
 */
export async function openTrace(path: string): Promise<TraceReader> {
  const file = await SafetensorsFile.open(path);
  try {
    const meta = parseMetaFromFile(file);
    const { promptTokens: T, decodeSteps: S, kvHeads: H, qHeads: Hq, headDim: D } = meta;
    let dtype: Dtype | undefined;
    let dtypeFrom = '';
    for (let l = 0; l < meta.layers; l++) {
      const n = traceTensorNames(l);
      const want: [string, number[]][] = [
        [n.k, [T, H, D]],
        [n.v, [T, H, D]],
        [n.q, [S, Hq, D]],
        [n.kNew, [S, H, D]],
        [n.vNew, [S, H, D]],
      ];
      for (const [name, shape] of want) {
        if (!file.has(name)) {
          throw new KvdriveError('E_TRACE_FORMAT', `${path}: tensor "${name}": expected present (metadata says ${meta.layers} layers), got missing`);
        }
        const info = file.info(name);
        const dt = FROM_ST[info.dtype];
        if (!dt) throw new KvdriveError('E_TRACE_FORMAT', `${path}: tensor "${name}" dtype: expected F32, F16 or BF16, got ${info.dtype}`);
        if (dtype === undefined) {
          dtype = dt;
          dtypeFrom = name;
        } else if (dt !== dtype) {
          throw new KvdriveError('E_TRACE_FORMAT', `${path}: tensor "${name}" dtype: expected ${ST_DTYPE[dtype]} (as "${dtypeFrom}"), got ${info.dtype}`);
        }
        if (info.shape.length !== shape.length || info.shape.some((d, i) => d !== shape[i])) {
          throw new KvdriveError('E_TRACE_FORMAT', `${path}: tensor "${name}" shape: expected [${shape.join(', ')}], got [${info.shape.join(', ')}]`);
        }
      }
    }
    return new FileTraceReader(file, meta, dtype!);
  } catch (e) {
    await file.close();
    throw e;
  }
}

/**
 * An in-memory trace whose layers come from `produce(l)` (e.g. a generator building them lazily),
 * with optional extra tensors.
 * Layers are not cached: each call produces the layer again, so memory holds only what the caller
 * keeps. `produce` must return data matching `meta` and `dtype` (checked on every call).
 */
export function memoryTrace(
  meta: TraceMeta,
  dtype: Dtype,
  produce: (l: number) => TraceLayerData | Promise<TraceLayerData>,
  extras: readonly TraceExtraTensor[] = [],
): TraceReader {
  const m = validateTraceMeta(meta);
  checkDtype(dtype);
  return {
    meta: m,
    dtype,
    async layer(l: number): Promise<TraceLayer> {
      checkLayerIndex(m, l);
      const d = await produce(l);
      checkLayerData(m, dtype, l, d);
      const q = d.q instanceof Float32Array ? d.q : dtype === 'f16' ? f16ArrayToF32(d.q) : bf16ArrayToF32(d.q);
      return {
        k: kv(d.k, dtype, m.promptTokens, m),
        v: kv(d.v, dtype, m.promptTokens, m),
        q,
        kNew: kv(d.kNew, dtype, m.decodeSteps, m),
        vNew: kv(d.vNew, dtype, m.decodeSteps, m),
      };
    },
    async extra(name: string): Promise<Tensor | undefined> {
      const e = extras.find((x) => x.name === name);
      return e && { name: e.name, dtype: e.dtype, shape: [...e.shape], data: e.data };
    },
    async close() {},
  };
}

/**
 * One KV tensor of promptTokens + decodeSteps tokens per layer: the prompt's K (or V) followed by
 * the decoded tokens' (layout 'thd'), so decode step s attends tokens [0, promptTokens + s + 1).
 * Copies both (the result owns its memory).
 */
export function layerKvWithNew(layer: TraceLayer): { k: KvTensor; v: KvTensor } {
  expectObject(layer, 'layerKvWithNew layer');
  for (const key of ['k', 'v', 'kNew', 'vNew'] as const) {
    const t: unknown = layer[key];
    expectObject(t, `layerKvWithNew layer.${key}`);
    if (!ArrayBuffer.isView(t.data)) fail('E_TYPE', `layerKvWithNew layer.${key}.data`, 'a Float32Array or Uint16Array', t.data);
  }
  const join = (a: KvTensor, b: KvTensor, what: string): KvTensor => {
    if (a.dtype !== b.dtype || a.heads !== b.heads || a.dim !== b.dim || (a.layout ?? 'thd') !== 'thd' || (b.layout ?? 'thd') !== 'thd') {
      fail('E_SHAPE', `layerKvWithNew ${what}`, `prompt and new tensors of one dtype, heads, dim and 'thd' layout`, `${a.dtype}/${a.heads}/${a.dim} and ${b.dtype}/${b.heads}/${b.dim}`);
    }
    const row = a.heads * a.dim;
    if (a.data.length !== a.tokens * row || b.data.length !== b.tokens * row) {
      fail('E_SHAPE', `layerKvWithNew ${what} data`, `${a.tokens * row} and ${b.tokens * row} elements`, `${a.data.length} and ${b.data.length}`);
    }
    const out = kvArray(a.dtype, (a.tokens + b.tokens) * row);
    out.set(a.data, 0);
    out.set(b.data, a.data.length);
    return { data: out, dtype: a.dtype, tokens: a.tokens + b.tokens, heads: a.heads, dim: a.dim, layout: 'thd' };
  };
  return { k: join(layer.k, layer.kNew, 'k'), v: join(layer.v, layer.vNew, 'v') };
}
