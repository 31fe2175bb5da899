/**
 * Fuzz targets for the exported functions and the native bindings: the attention kernels, the
 * fetched attention and hot-tier admission, selection policies, the hot tier, and two
 * generic targets that call EVERY export of src/index.ts and EVERY native binding with random
 * arguments. Structured targets build a valid call (random shapes, dtypes, layouts, selections)
 * and then apply 0-3 random mutations (edge numbers, wrong array types and lengths, bad ids and
 * offsets, NaN / Inf, missing fields), so both valid and invalid calls are exercised.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as publicApi from '../../src/index.js';
import { attendDense, attendSparse, mergeAttention } from '../../src/attention/kernels.js';
import { createPolicy } from '../../src/index/policy.js';
import { offloadedPolicyOptions } from '../../src/index/options.js';
import { setSimdLevel } from '../../src/native.js';
import { registerBackend } from '../../src/model/backends.js';
import { openTrace, writeTrace } from '../../src/trace/trace.js';
import { generateSyntheticTrace } from '../../src/trace/synthetic.js';
import { convertLlama2c } from '../../src/model/gguf/convert.js';
import { native } from '../../src/native.js';
// Parts that are not in the public index but are exported by their modules, fuzzed all the same.
import { attendDenseAsync, attendSparseAsync, attentionWeights } from '../../src/attention/kernels.js';
import { attendFetched, attendFetchedAsync } from '../../src/storage/fetched-attention.js';
import { centroidTiles, scoreCentroids } from '../../src/index/kernels.js';
import { HotTier } from '../../src/cache/hot-tier.js';
import { DramStore } from '../../src/storage/dram-store.js';
import { f32ArrayToF16 } from '../../src/util/f16.js';
import { defineTarget, type FuzzTarget, type Gen } from './harness.js';

/**
 * What the api-exports target calls: the public API (src/index.ts) plus the tool functions that
 * left it (policies, kernels, traces, conversion), so the fuzz coverage did not shrink with the API.
 */
const api = { ...publicApi, attendDense, attendSparse, mergeAttention, createPolicy, setSimdLevel, registerBackend, openTrace, writeTrace, generateSyntheticTrace, convertLlama2c };

type Obj = Record<string, unknown>;
type Dt = 'f32' | 'f16' | 'bf16';

// ---- building valid arguments ----

interface Shape {
  kvHeads: number;
  group: number;
  dim: number;
  tokens: number;
  dtype: Dt;
  layout: 'thd' | 'htd';
}

function shape(g: Gen): Shape {
  return {
    kvHeads: g.pick([1, 1, 2, 3, 4]),
    group: g.pick([1, 2, 4]),
    dim: g.pick([1, 2, 3, 4, 8, 16]),
    tokens: g.pick([0, 1, 3, 4, 5, 16, 17, 40, 96]),
    dtype: g.pick(['f32', 'f16', 'bf16'] as const),
    layout: g.bool(0.8) ? 'thd' : 'htd',
  };
}

function kv(g: Gen, s: Shape, tokens = s.tokens, layout = s.layout, dtype: Dt = s.dtype): Obj {
  const n = tokens * s.kvHeads * s.dim;
  const nonFinite = g.bool(0.03);
  const data = dtype === 'f32' ? g.f32(n, nonFinite) : f32ArrayToF16(g.f32(n, nonFinite));
  const o: Obj = { data, dtype, tokens, heads: s.kvHeads, dim: s.dim };
  if (layout === 'htd') o.layout = 'htd';
  return o;
}

/** A valid Selection over `tokens` tokens (chunks ascending per kv head). */
function selection(g: Gen, kvHeads: number, tokens: number, chunkSize = g.pick([1, 2, 4, 8, 16]), before = tokens): Obj {
  const sinkEnd = g.int(0, Math.min(4, tokens));
  const tailStart = g.int(sinkEnd, tokens);
  const end = Math.min(before, tokens);
  const maxChunks = Math.ceil(end / chunkSize);
  const offsets = new Int32Array(kvHeads + 1);
  const ids: number[] = [];
  for (let h = 0; h < kvHeads; h++) {
    for (let c = 0; c < maxChunks; c++) if (g.bool(0.4)) ids.push(c);
    offsets[h + 1] = ids.length;
  }
  return { chunkSize, tokens, sinkEnd, tailStart, offsets, chunkIds: Int32Array.from(ids) };
}

// ---- mutations ----

const ARRAY_KINDS = [Float32Array, Uint16Array, Int32Array, Uint32Array, Float64Array, Uint8Array, Int8Array, BigInt64Array] as const;

function randomTyped(g: Gen, len: number): unknown {
  const K = g.pick(ARRAY_KINDS);
  const a = new K(len) as unknown as { [i: number]: number | bigint; length: number };
  for (let i = 0; i < len; i++) a[i] = K === BigInt64Array ? BigInt(g.int(-3, 100)) : g.int(-3, 100);
  return a;
}

/** A random value of any kind (the generic targets' argument pool). */
export function randomValue(g: Gen, depth = 0): unknown {
  const k = g.int(0, depth > 1 ? 6 : 9);
  switch (k) {
    case 0:
    case 1:
      return g.edgeNumber();
    case 2:
      return g.pick(['f32', 'f16', 'bf16', 'thd', 'htd', 'kvdrive', 'quest', 'shadowkv', 'lookahead', 'lru', 'scalar', 'best', '', 'x', 'fuzz.tmp', '1GiB', '-1', 'NaN']);
    case 3:
      return g.pick([undefined, null, true, false]);
    case 4:
    case 5:
      return randomTyped(g, g.pick([0, 1, 2, 3, 4, 8, 9, 16, 64]));
    case 6:
      return g.pick([[], [1, 2], [[1]], ['a']]);
    default: {
      const o: Obj = {};
      const keys = ['data', 'dtype', 'tokens', 'heads', 'dim', 'layout', 'k', 'v', 'q', 'qHeads', 'selection', 'offsets', 'chunkIds', 'chunkSize', 'sinkEnd', 'tailStart', 'layer', 'sequence', 'budget', 'windows', 'maxBytes', 'layers', 'kvHeads', 'headDim', 'scale', 'threads', 'handle', 'hot', 'sink', 'tail', 'fetched', 'positions', 'pool'];
      for (let i = g.int(0, 6); i > 0; i--) o[g.pick(keys)] = randomValue(g, depth + 1);
      if (g.bool(0.3)) o.k = { data: g.f32(8), dtype: 'f32', tokens: 2, heads: 1, dim: 4 };
      return o;
    }
  }
}

/** Paths to every mutable leaf (numbers, strings, typed arrays, nested objects). */
function leaves(v: unknown, prefix: string[] = [], out: string[][] = []): string[][] {
  if (v && typeof v === 'object' && !ArrayBuffer.isView(v) && !Array.isArray(v)) {
    for (const [k, x] of Object.entries(v as Obj)) {
      out.push([...prefix, k]);
      leaves(x, [...prefix, k], out);
    }
  }
  return out;
}

function mutateLeaf(g: Gen, v: unknown): unknown {
  if (ArrayBuffer.isView(v) && !(v instanceof DataView)) {
    const a = v as unknown as { length: number; [i: number]: number; slice(a: number, b?: number): unknown; constructor: new (n: number) => unknown };
    const k = g.int(0, 4);
    if (k === 0 && a.length > 0 && !(v instanceof BigInt64Array)) {
      const c = a.slice(0) as { [i: number]: number };
      c[g.int(0, a.length - 1)] = g.edgeNumber();
      return c;
    }
    if (k === 1) return randomTyped(g, a.length);
    if (k === 2) return a.slice(0, Math.max(0, a.length - g.int(1, 3)));
    if (k === 3) return new a.constructor(a.length + g.int(1, 5));
    return new a.constructor(0);
  }
  if (typeof v === 'number') return g.bool(0.8) ? g.edgeNumber() : v + g.pick([-1, 1]);
  return randomValue(g);
}

function mutate(g: Gen, o: Obj, times = g.pick([0, 0, 1, 1, 2, 3])): Obj {
  for (let i = 0; i < times; i++) {
    const paths = leaves(o);
    if (!paths.length) break;
    const p = g.pick(paths);
    let at = o;
    for (const k of p.slice(0, -1)) at = at[k] as Obj;
    const last = p[p.length - 1]!;
    if (g.bool(0.1)) delete at[last];
    else at[last] = mutateLeaf(g, at[last]);
  }
  return o;
}

/** Awaits a result that may be a promise (async APIs must reject, never throw late). */
async function settle(x: unknown): Promise<unknown> {
  return x instanceof Promise ? await x : x;
}

// ---- attention kernels ----

interface Call {
  fn: string;
  args: unknown[];
}

const KERNELS = ['attendDense', 'attendDenseAsync', 'attendSparse', 'attendSparseAsync', 'attentionWeights', 'mergeAttention', 'attendFetched', 'attendFetchedAsync', 'scoreCentroids'] as const;

// A selection index handle per (kv heads, dim, tokens): built once on fixed keys with the
// runtime's offloaded options, kept for the run; -1 where that shape cannot be indexed.
const selectHandles = new Map<string, number>();
const selectPolicies: unknown[] = [];
function selectHandle(kvHeads: number, dim: number, tokens: number): number {
  const key = `${kvHeads}/${dim}/${tokens}`;
  let h = selectHandles.get(key);
  if (h === undefined) {
    h = -1;
    try {
      const p = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { kvHeads, headDim: dim, chunkSize: 4, segmentTokens: 64 }));
      const data = Float32Array.from({ length: tokens * kvHeads * dim }, (_, i) => Math.sin(i * 0.7) + ((i * 37) % 11) / 11);
      p.buildSync({ data, dtype: 'f32', tokens, heads: kvHeads, dim }, tokens);
      selectPolicies.push(p);
      h = p.handle();
    } catch {
      // not indexable (the call then gets -1: E_CLOSED)
    }
    selectHandles.set(key, h);
  }
  return h;
}

function kernelCall(g: Gen): Call {
  const fn = g.pick(KERNELS);
  const s = shape(g);
  const qHeads = s.kvHeads * s.group;
  const q = g.f32(qHeads * s.dim, g.bool(0.03));
  if (fn === 'mergeAttention') {
    const heads = g.int(1, 4), dim = g.int(1, 8);
    const lse = () => Float32Array.from({ length: heads }, () => g.pick([0, 1.5, -Infinity, -3]));
    const args = { outA: g.f32(heads * dim), lseA: lse(), outB: g.f32(heads * dim), lseB: lse(), heads, dim };
    const m = mutate(g, args);
    return { fn, args: [m.outA, m.lseA, m.outB, m.lseB, m.heads, m.dim] };
  }
  if (fn === 'scoreCentroids') {
    // The select's level 1: 4-bit (the index's) or int8 tiles of n centroids, the GQA group's
    // queries, maybe the spread term ({ var: n, coef: group }), every argument possibly mutated
    // (a tile set given under the other layout too).
    const n = g.int(0, 40), dim = g.pick([1, 5, 16, 20, 37, 128]), group = g.int(1, 9);
    const four = g.bool(0.5);
    const tiles = four ? centroidTiles(g.f32(n * dim), n, dim, 'u4') : centroidTiles(g.f32(n * dim), n, dim, 'i8');
    const spread = g.bool(0.5) ? { var: g.f32(n, g.bool(0.05)), coef: g.f32(group, g.bool(0.05)) } : undefined;
    const own = four ? 'tiles4' : 'tiles8';
    const layout = g.bool(0.85) ? own : g.pick(['rows', 'tiles', 'x', four ? 'tiles8' : 'tiles4']);
    const m = mutate(g, { q: g.f32(group * dim, g.bool(0.03)), group, tiles, n, dim, layout, spread });
    return { fn, args: [m.q, m.group, m.tiles, m.n, m.dim, m.layout, m.spread] };
  }
  if (g.bool(0.04)) {
    // A KV view whose claimed size overflows 64 bits: tokens*heads*dim = 2^40 * 256 * 65536 = 2^64
    // wraps to 0, matching an empty array, with q sized for the claimed shape (the issue's reproducer).
    const dtype = g.pick(['f32', 'f16', 'bf16'] as const);
    const huge = (): Obj => ({ data: dtype === 'f32' ? new Float32Array(0) : new Uint16Array(0), dtype, tokens: 2 ** 40, heads: 256, dim: 65536 });
    const o: Obj = { q: new Float32Array(256 * 65536), qHeads: 256, k: huge(), v: huge(), tokens: g.pick([64, 0, 2 ** 40]) };
    if (fn.startsWith('attendSparse'))
      o.selection = { chunkSize: 4, tokens: 64, sinkEnd: 0, tailStart: 64, offsets: new Int32Array(257), chunkIds: new Int32Array(0) };
    if (fn.startsWith('attendFetched')) Object.assign(o, { sink: { k: huge(), v: huge() }, tail: { k: huge(), v: huge() }, tailBase: 0, fetched: new Uint8Array(0), selection: { chunkSize: 4, tokens: 64, sinkEnd: 0, tailStart: 64, offsets: new Int32Array(257), chunkIds: new Int32Array(0) } });
    return { fn, args: [o] };
  }
  if (fn === 'attendDense' || fn === 'attendDenseAsync' || fn === 'attentionWeights') {
    const o: Obj = { q, qHeads, k: kv(g, s), v: kv(g, s) };
    if (fn === 'attentionWeights') delete o.v;
    if (g.bool(0.5)) o.tokens = g.int(0, s.tokens);
    if (g.bool(0.2)) o.scale = g.pick([0.5, 1, 0.125]);
    if (g.bool(0.2)) o.threads = g.int(1, 4);
    if (fn === 'attentionWeights' && g.bool(0.3)) {
      // The caller's output: the right length, one off, or not a Float32Array.
      const n = qHeads * ((o.tokens as number | undefined) ?? s.tokens);
      o.into = g.pick([new Float32Array(n), new Float32Array(n + (n > 0 ? g.pick([-1, 1]) : 1)), new Uint8Array(n)]);
    }
    return { fn, args: [mutate(g, o)] };
  }
  if (fn === 'attendSparse' || fn === 'attendSparseAsync') {
    const o: Obj = { q, qHeads, k: kv(g, s), v: kv(g, s), selection: selection(g, s.kvHeads, g.int(0, s.tokens)) };
    if (g.bool(0.2)) o.threads = g.int(1, 4);
    return { fn, args: [mutate(g, o)] };
  }
  // attendFetched(Async): sinks and tail in small tensors, the selected chunks page-first in `fetched`.
  const tokens = s.tokens;
  const sel = selection(g, s.kvHeads, tokens, undefined);
  const tailStart = sel.tailStart as number, sinkEnd = sel.sinkEnd as number, cs = sel.chunkSize as number;
  const maxChunks = Math.ceil(tailStart / cs);
  const ids = Array.from(sel.chunkIds as Int32Array).filter((c) => c < maxChunks);
  // Re-derive offsets after dropping chunks at or past tailStart.
  const offsets = new Int32Array(s.kvHeads + 1);
  const kept: number[] = [];
  for (let h = 0; h < s.kvHeads; h++) {
    for (let i = (sel.offsets as Int32Array)[h]!; i < (sel.offsets as Int32Array)[h + 1]!; i++) if ((sel.chunkIds as Int32Array)[i]! < maxChunks) kept.push((sel.chunkIds as Int32Array)[i]!);
    offsets[h + 1] = kept.length;
  }
  void ids;
  const tailBase = g.int(Math.max(sinkEnd, 0), tailStart);
  const es = s.dtype === 'f32' ? 4 : 2;
  const o: Obj = {
    q, qHeads,
    sink: { k: kv(g, s, Math.max(sinkEnd, g.int(0, 3)), 'thd'), v: undefined },
    tail: { k: kv(g, s, tokens - tailBase, 'thd'), v: undefined },
    tailBase,
    selection: { ...sel, offsets, chunkIds: Int32Array.from(kept) },
    fetched: new Uint8Array(kept.length * 2 * cs * s.dim * es),
  };
  (o.sink as Obj).v = { ...((o.sink as Obj).k as Obj) };
  (o.tail as Obj).v = { ...((o.tail as Obj).k as Obj) };
  if (g.bool(0.3)) {
    // Instead of page lists, a DRAM tier read in place (dramTier): a chain of one or two segments
    // that may not cover the selection, slot maps of any length holding any slots (free, past the
    // arenas), arena blocks of any size; now and then the page lists too (E_CONFIG).
    const pb = 2 * cs * s.dim * es;
    const nChain = g.int(0, maxChunks + 2);
    const cut = g.int(0, nChain);
    const two = g.bool(0.5);
    const segStart = two ? Int32Array.of(0, cut, nChain) : Int32Array.of(0, nChain);
    const perBlock = g.int(1, 8);
    const blocks = g.int(0, 3);
    const maps = Array.from({ length: segStart.length - 1 }, (_, seg) =>
      Int32Array.from({ length: g.int(0, s.kvHeads * (segStart[seg + 1]! - segStart[seg]!) + 1) }, () => g.int(-2, perBlock * Math.max(1, blocks) + 1)),
    );
    const arenas = Array.from({ length: blocks }, () => new Uint8Array(g.int(0, perBlock) * pb + g.int(0, 1)));
    o.dramTier = { segStart, maps, layer: g.int(0, 1), arenas, slotsPerBlock: perBlock };
    if (!g.bool(0.1)) delete o.fetched;
    if (g.bool(0.3)) {
      // The selection made by the call (select): a real index of this shape over this many tokens,
      // a budget of any size, or a handle and select that are not one; now and then both (E_CONFIG).
      if (!g.bool(0.1)) delete o.selection;
      const handle = g.bool(0.8) ? selectHandle(s.kvHeads, s.dim, tokens) : g.int(-3, 1000);
      o.select = g.bool(0.9) ? { handle, budget: g.pick([-1, 0, 1, 3, 16, 100, 9000, 2 ** 40]) } : g.pick([null, 5, { handle }]);
    }
  } else if (g.bool(0.3)) {
    // Reads "in flight": flags landed, failed or never set (a short timeout then leaves those heads out).
    const items = g.int(0, 4);
    o.landing = [{ done: Int32Array.from({ length: 1 + items }, () => g.pick([0, 1, 1, 2])), itemHead: Int32Array.from({ length: items }, () => g.int(0, s.kvHeads - 1)) }];
    o.landingTimeoutMs = g.int(0, 3);
  }
  return { fn, args: [mutate(g, o)] };
}

const kernelFns: Record<string, (...a: unknown[]) => unknown> = {
  attendDense: api.attendDense as never,
  attendDenseAsync: attendDenseAsync as never,
  attendSparse: api.attendSparse as never,
  attendSparseAsync: attendSparseAsync as never,
  attentionWeights: attentionWeights as never,
  mergeAttention: api.mergeAttention as never,
  attendFetched: attendFetched as never,
  attendFetchedAsync: attendFetchedAsync as never,
  scoreCentroids: scoreCentroids as never,
};

export const kernelsTarget = defineTarget<Call>({
  name: 'kernels',
  input: kernelCall,
  run: async (c) => settle(kernelFns[c.fn]!(...c.args)),
});

// ---- selection policies ----

interface PolicyInput {
  name: unknown;
  options: Obj | undefined;
  ops: { op: 'build' | 'buildSync' | 'extend' | 'select' | 'setPrior'; args: unknown[] }[];
}

const policyTargetOf = (name: string, sketch: boolean): FuzzTarget =>
  defineTarget<PolicyInput>({
  name,
  input(g) {
    const s = shape(g);
    const total = g.pick([8, 40, 100, 200]);
    const full = kv(g, { ...s, tokens: total });
    const options: Obj | undefined = g.bool(0.3)
      ? undefined
      : mutate(g, { chunkSize: g.pick([1, 2, 4, 8]), tokensPerCluster: g.pick([4, 16]), sinks: g.int(0, 4), local: g.pick([0, 8, 16]), segmentTokens: g.pick([16, 64, 4096]), reclusterDelay: g.pick([0, 4, 16, 256]), kmeansIters: g.int(0, 4), threads: g.int(1, 2), ...(g.bool(0.2) ? { reuseCandidateFactor: g.pick([0, 1, 5]) } : {}), ...(sketch ? sketchOptions(g) : {}) }, g.pick([0, 0, 1]));
    const ops: PolicyInput['ops'] = [];
    const built = g.int(0, total);
    ops.push({ op: g.bool() ? 'build' : 'buildSync', args: mutate(g, { k: full, tokens: built }, g.pick([0, 0, 0, 1])) ? [full, g.bool(0.9) ? built : g.edgeNumber()] : [] });
    // Up to 6 ops: enough extends to fill a 16-token segment and reach its re-clustering's install.
    for (let i = g.int(0, 6), at = built; i > 0; i--) {
      if (g.bool(0.4)) ops.push({ op: 'extend', args: [full, g.num((at = g.int(at, total)), 0.15)] });
      // A prior over the tokens indexed so far (sometimes more, mutated, or null).
      else if (g.bool(0.3)) ops.push({ op: 'setPrior', args: [g.bool(0.1) ? null : mutate(g, selection(g, s.kvHeads, g.bool(0.9) ? at : g.int(0, total)), g.pick([0, 0, 1]))] });
      else {
        const qHeads = s.kvHeads * s.group;
        const opts: Obj = {};
        if (g.bool(0.3)) opts.pool = g.num(g.int(1, 64), 0.2);
        if (g.bool(0.4)) opts.keys = full;
        ops.push({ op: 'select', args: [g.f32(g.bool(0.9) ? qHeads * s.dim : g.int(0, 9), g.bool(0.03)), g.num(g.int(1, 64), 0.2), mutate(g, opts, g.pick([0, 0, 1]))] });
      }
    }
    return { name: g.bool(0.9) ? g.pick(['kvdrive', 'quest', 'shadowkv']) : randomValue(g), options, ops };
  },
  async run(x) {
    const p = api.createPolicy(x.name as never, x.options as never);
    for (const o of x.ops) await settle((p as unknown as Record<string, (...a: unknown[]) => unknown>)[o.op]!(...o.args));
  },
});

/** The offloaded index's options: the key sketch (8 or 4 bits), released chunk means, sketch re-rank. */
function sketchOptions(g: Gen): Obj {
  return { keySketch: g.bool(0.8), sketchBits: g.pick([4, 8]), releaseChunkMeans: g.bool(0.6), preferSketch: g.bool(0.3), tokenGranular: g.bool(0.7), rerankFactor: g.pick([0, 2, 8]) };
}

export const policyTarget = policyTargetOf('policy', false);
/** The same operations on policies built with the offloaded index's options. */
export const policySketchTarget = policyTargetOf('policy-sketch', true);

// ---- hot tier (and hotTierAdmitPages) ----

interface HotInput {
  options: Obj;
  ops: { op: string; args: unknown[] }[];
}

const HOT_OPS = ['fetch', 'fetchAsync', 'attend', 'attendAsync', 'step', 'stepAsync', 'warm', 'warmAsync', 'recordMass', 'stats', 'residents', 'resetSequence', 'check', 'info', 'admitPages', 'split'] as const;

export const hotTierTarget = defineTarget<HotInput>({
  name: 'hot-tier',
  input(g) {
    const s = shape(g);
    s.layout = 'thd';
    const chunkSize = g.pick([1, 2, 4]);
    const layers = g.int(1, 2);
    const sequences = g.int(1, 2);
    const options = mutate(g, {
      layers, kvHeads: s.kvHeads, headDim: s.dim, dtype: s.dtype, chunkSize, budget: g.pick([1, 4, 8, 16]),
      windows: g.pick([0, 1, 2, 3]), maxBytes: g.pick([1 << 20, 1 << 16, 100]), eviction: g.pick(['lookahead', 'lru', 'lfu']), sequences,
    }, g.pick([0, 0, 0, 1]));
    const ops: HotInput['ops'] = [];
    for (let i = g.int(1, 5); i > 0; i--) {
      const op = g.pick(HOT_OPS);
      const k = kv(g, s), v = kv(g, s);
      const sel = selection(g, s.kvHeads, g.int(0, s.tokens), chunkSize);
      if (g.bool(0.3)) {
        const n = (sel.chunkIds as Int32Array).length;
        const po = new Int32Array(s.kvHeads + 1);
        po[s.kvHeads] = n;
        Object.assign(sel, { poolOffsets: po, poolIds: Int32Array.from(sel.chunkIds as Int32Array), poolScores: g.f32(n) });
      }
      const base: Obj = { sequence: g.int(0, sequences - 1), layer: g.int(0, layers - 1), k, v };
      let a: Obj;
      if (op === 'fetch' || op === 'fetchAsync') a = { ...base, selection: sel };
      else if (op === 'attend' || op === 'attendAsync' || op === 'step' || op === 'stepAsync') a = { ...base, selection: sel, q: g.f32(s.kvHeads * s.group * s.dim, g.bool(0.03)), qHeads: s.kvHeads * s.group };
      else if (op === 'warm' || op === 'warmAsync') a = { ...base, offsets: sel.offsets, chunkIds: sel.chunkIds };
      else if (op === 'recordMass') a = { sequence: base.sequence, layer: base.layer, selection: sel, chunkMass: g.f32((sel.chunkIds as Int32Array).length) };
      else if (op === 'admitPages') {
        const cb = 2 * chunkSize * s.dim * (s.dtype === 'f32' ? 4 : 2);
        const n = (sel.chunkIds as Int32Array).length;
        a = { hot: { sequence: base.sequence, layer: base.layer }, selection: sel, tokens: sel.tokens, pages: new Uint8Array(n * cb), pageOffsets: sel.offsets, pageIds: sel.chunkIds };
        // Some pages still "being read": their copies are left for hotTierLandPages (landed, dropped,
        // never made, or asked for with garbage quads).
        if (g.bool(0.5)) Object.assign(a, { pageLanding: Uint8Array.from({ length: n }, () => g.int(0, 1)), land: g.pick(['land', 'drop', 'none', 'garbage']) });
      } else if (op === 'split') {
        // fetchSplit over a finer selection (pageChunkSize a multiple of its chunk size), the tier's residents split out.
        const fine = selection(g, s.kvHeads, sel.tokens as number, g.pick([1, chunkSize]));
        const n = (fine.chunkIds as Int32Array).length;
        const out = { chunkOffsets: new Int32Array(s.kvHeads + 1), chunkIds: new Int32Array(n), tierOffsets: new Int32Array(s.kvHeads + 1), tierIds: new Int32Array(n), tierEntry: new Int32Array(n) };
        const sealed = chunkSize * g.int(0, Math.floor((sel.tokens as number) / chunkSize));
        a = { hot: { sequence: base.sequence, layer: base.layer }, selection: fine, kvHeads: s.kvHeads, pageChunkSize: chunkSize, sealed, out };
      } else a = { sequence: base.sequence, layer: base.layer, head: g.int(0, s.kvHeads - 1) };
      ops.push({ op, args: [mutate(g, a)] });
    }
    return { options, ops };
  },
  async run(x) {
    const t = new HotTier(x.options as never);
    try {
      for (const o of x.ops) {
        const a = o.args[0] as Obj;
        if (o.op === 'admitPages') {
          if (a.hot && typeof a.hot === 'object') (a.hot as Obj).handle = t.handle;
          const { land, ...admit } = a;
          const r = (await settle(native.hotTierAdmitPages(admit))) as { landing?: Int32Array } | undefined;
          if (r?.landing && land !== 'none') {
            const landing = land === 'garbage' ? Int32Array.from(r.landing, (x, i) => (i % 5 === 1 ? x + 3 : x)) : r.landing;
            await settle(native.hotTierLandPages({ hot: admit.hot, tokens: admit.tokens, pages: admit.pages, pageOffsets: admit.pageOffsets, pageIds: admit.pageIds, landing, drop: land === 'drop' }));
          }
        } else if (o.op === 'split') {
          if (a.hot && typeof a.hot === 'object') (a.hot as Obj).handle = t.handle;
          await settle(native.fetchSplit(a));
        } else if (o.op === 'stats') await settle(t.stats(a.sequence as number));
        else if (o.op === 'residents') await settle(t.residents(a.layer as number, a.head as number, a.sequence as number));
        else if (o.op === 'resetSequence') await settle(t.resetSequence(a.sequence as number));
        else if (o.op === 'check') {
          const c = t.check();
          if (c) throw new Error(`hot tier inconsistent after fuzzed calls: ${c}`);
        } else if (o.op === 'info') t.info();
        else await settle((t as unknown as Record<string, (a: unknown) => unknown>)[o.op]!(a));
      }
      const c = t.check();
      if (c) throw new Error(`hot tier inconsistent after fuzzed calls: ${c}`);
    } finally {
      t.destroy();
    }
  },
});

// ---- DRAM tier lookups, pins and score refreshes (dramLocate, dramPins, dramHeapRefresh: native/cache/dram_tier.cc) ----

interface DramInput {
  chunks: number;
  resident: number[];
  ops: { op: 'locate' | 'pins' | 'refresh'; args: Obj }[];
}

export const dramTierTarget = defineTarget<DramInput>({
  name: 'dram-tier',
  input(g) {
    const chunks = g.int(1, 24);
    const resident = Array.from({ length: 2 * chunks }, () => g.int(0, 1));
    const ops: DramInput['ops'] = [];
    for (let i = g.int(1, 4); i > 0; i--) {
      if (g.bool(0.7)) {
        const sel = selection(g, 2, chunks * 4, 4);
        const n = (sel.chunkIds as Int32Array).length;
        const out = { slots: new Int32Array(n), entries: new Int32Array(n), misses: new Int32Array(n), ...(g.bool(0.7) ? { source: new Uint8Array(n), at: new Float64Array(n) } : {}) };
        ops.push({ op: 'locate', args: mutate(g, { offsets: sel.offsets, chunkIds: sel.chunkIds, kvHeads: 2, layer: 0, pin: g.bool(0.7), ...(g.bool(0.2) ? { skip: new Uint8Array(n).fill(1, 0, n >> 1) } : {}), out }) });
      } else if (g.bool(0.5)) ops.push({ op: 'pins', args: mutate(g, { slots: Int32Array.from({ length: g.int(0, 6) }, () => g.int(-1, 2 * chunks)), delta: g.pick([1, -1]) }) });
      else {
        // A heap's records and positions as SlotHeap keeps them, here with any positions at all:
        // the native pass reads them, so garbage there must not crash it either.
        const cap = g.int(1, 12);
        const records = new Float32Array(3 * cap);
        const pos = new Int32Array(records.buffer);
        for (let s = 0; s < cap; s++) {
          records[3 * s] = g.pick([0, 0.5, 1, -3]);
          records[3 * s + 1] = g.pick([0, 0.25, 2]);
          pos[3 * s + 2] = g.int(-2, 2 * cap);
        }
        const heap = Int32Array.from({ length: cap }, () => g.int(-2, 2 * cap));
        const n = g.int(0, 8);
        const scores = Float32Array.from({ length: g.int(1, 6) }, () => g.pick([0.1, 1, 3, NaN]));
        const keys = Float32Array.from({ length: cap }, () => g.pick([0.1, 1, 3, NaN]));
        const offset = g.pick([undefined, 0, 0.5, 3e38, NaN, Infinity, 'x']);
        const args = { records, heap, keys, slots: Int32Array.from({ length: n }, () => g.int(-1, cap)), entries: Int32Array.from({ length: n }, () => g.int(-1, scores.length)), scores, ...(offset === undefined ? {} : { offset }), out: { slots: new Int32Array(g.int(0, n + 1)), scores: new Float32Array(g.int(0, n + 1)) } };
        ops.push({ op: 'refresh', args: mutate(g, args) });
      }
    }
    return { chunks, resident, ops };
  },
  async run(x) {
    // A store of 2 kv heads x 4-token chunks holding the chunks marked resident, its slot state
    // passed as DramStore.locate / pin pass it (owner, pins, maps of the one-segment chain).
    const shape = { layers: 1, kvHeads: 2, headDim: 2, dtype: 'f32' as const, chunkSize: 4 };
    const cb = 2 * 4 * 2 * 4;
    const dram = new DramStore({ budgetBytes: 2 * x.chunks * (cb + DramStore.metadataBytesPerSlot), shape, blockBytes: 3 * cb });
    dram.addSegment('s', x.chunks * 4);
    for (let h = 0; h < 2; h++)
      for (let c = 0; c < x.chunks; c++) if (x.resident[h * x.chunks + c]) dram.put('s', 0, h, [c], [1], new Uint8Array(cb), [0]);
    const priv = dram as unknown as { slotOwner: Int32Array; pins: Uint16Array; slotsPerBlock: number };
    const chain = { segStart: Int32Array.of(0, x.chunks), maps: [dram.slotMap('s').slots] };
    for (const o of x.ops) {
      const a = o.args;
      if (o.op === 'locate') {
        const before = Uint16Array.from(priv.pins);
        const { pin, ...rest } = a;
        try {
          const r = native.dramLocate({ ...chain, chunkBytes: cb, ...rest, maps: chain.maps, owner: priv.slotOwner, slotsPerBlock: priv.slotsPerBlock, ...(pin ? { pins: priv.pins } : {}) }) as { hits: number };
          if (pin) dram.unpin((a.out as { slots: Int32Array }).slots.subarray(0, r.hits));
        } catch (e) {
          if (!(e instanceof api.KvdriveError)) throw e;
          if (priv.pins.some((p, i) => p !== before[i])) throw new Error('dramLocate failed and left pins changed');
          throw e;
        }
      } else if (o.op === 'refresh') {
        native.dramHeapRefresh(a);
      } else {
        const before = Uint16Array.from(priv.pins);
        try {
          native.dramPins({ owner: priv.slotOwner, pins: priv.pins, ...a });
        } catch (e) {
          if (!(e instanceof api.KvdriveError)) throw e;
          if (priv.pins.some((p, i) => p !== before[i])) throw new Error('dramPins failed and left pins changed');
          throw e;
        }
      }
    }
  },
});

// ---- generic: every export of src/index.ts, every native binding ----

/** Exports left out of the generic call: they start worker pools or long runs whose own option
 * parsing (zod) is still fuzzed through the structured targets and tests. */
const API_SKIP = new Set(['openRuntime', 'calibrate', 'generate', 'profileTrace', 'measureWindows', 'generateSyntheticTrace']);
/** Native bindings left out: test hooks that change process-wide behaviour on purpose. */
const NATIVE_SKIP = new Set(['ioTestHooks']);

/**
 * Members TypeScript declares `private` (`Class.member`, `Class.constructor`): not public API, so
 * the generic target does not call them. Read from the compiled declarations (dist/src/**\/*.d.ts).
 */
let privates: Set<string> | undefined;
function privateMembers(): Set<string> {
  if (privates) return privates;
  const found = new Set<string>();
  const walk = (dir: string): void => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.d.ts')) {
        let cls = '';
        for (const line of readFileSync(p, 'utf8').split('\n')) {
          const c = /^export declare class (\w+)/.exec(line);
          if (c) cls = c[1]!;
          const m = /^\s+private (?:static )?(?:readonly )?(\w+)/.exec(line);
          if (m && cls) found.add(`${cls}.${m[1]}`);
        }
      }
    }
  };
  walk(join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'src'));
  return (privates = found);
}

function randomArgs(g: Gen): unknown[] {
  return Array.from({ length: g.int(0, 5) }, () => randomValue(g));
}

interface GenericInput {
  name: string;
  ctor: boolean;
  args: unknown[];
  method?: { name: string; args: unknown[] };
}

function exportsOf(mod: Record<string, unknown>, skip: Set<string>): string[] {
  return Object.keys(mod).filter((k) => typeof mod[k] === 'function' && !skip.has(k)).sort();
}

export const apiTarget = defineTarget<GenericInput>({
  name: 'api-exports',
  input(g) {
    const priv = privateMembers();
    const mod = api as unknown as Record<string, unknown>;
    const publicStatics = (n: string) => Object.getOwnPropertyNames(mod[n]).filter((k) => typeof (mod[n] as Record<string, unknown>)[k] === 'function' && !priv.has(`${n}.${k}`));
    // A class whose constructor is private is reached through its public static factories only.
    const names = exportsOf(mod, API_SKIP).filter((n) => !priv.has(`${n}.constructor`) || publicStatics(n).length > 0);
    const name = g.pick(names);
    const fn = mod[name] as { prototype?: object };
    const isClass = /^[A-Z]/.test(name) && !!fn.prototype;
    const ctor = isClass && !priv.has(`${name}.constructor`);
    const statics = isClass ? publicStatics(name) : [];
    const methods = ctor ? Object.getOwnPropertyNames(fn.prototype!).filter((k) => k !== 'constructor' && !priv.has(`${name}.${k}`)) : [];
    const x: GenericInput = { name, ctor, args: randomArgs(g) };
    if (isClass && statics.length && (!ctor || g.bool(0.5))) x.method = { name: `static ${g.pick(statics)}`, args: randomArgs(g) };
    else if (methods.length) x.method = { name: g.pick(methods), args: randomArgs(g) };
    return x;
  },
  async run(x) {
    const fn = (api as unknown as Record<string, (...a: unknown[]) => unknown>)[x.name]!;
    if (x.method?.name.startsWith('static ')) {
      const r = await settle((fn as unknown as Record<string, (...a: unknown[]) => unknown>)[x.method.name.slice(7)]!(...x.method.args));
      await release(r);
      return;
    }
    const obj = x.ctor ? new (fn as unknown as new (...a: unknown[]) => object)(...x.args) : await settle(fn(...x.args));
    try {
      if (x.method && obj && typeof obj === 'object') {
        const m = (obj as Record<string, unknown>)[x.method.name];
        if (typeof m === 'function') await settle(m.apply(obj, x.method.args));
      }
    } finally {
      await release(obj);
    }
  },
});

/** Frees what a successful call returned (hot tiers, stores, engines, files). */
async function release(o: unknown): Promise<void> {
  if (!o || typeof o !== 'object') return;
  for (const m of ['destroy', 'close']) {
    const f = (o as Record<string, unknown>)[m];
    if (typeof f === 'function') {
      try {
        await settle(f.call(o));
      } catch {
        // already closed, or the close itself rejects a state the fuzzed call left: not a finding
      }
      return;
    }
  }
}

export const nativeTarget = defineTarget<GenericInput>({
  name: 'native-bindings',
  input(g) {
    const names = exportsOf(native, NATIVE_SKIP);
    const name = g.pick(names);
    const args = randomArgs(g);
    // Handles: mostly small integers, so some calls reach live objects of earlier inputs.
    if (/Release|Destroy|Info|Stats|Residents|Check|Read|Open|Close|Extents|Raise|Reset/.test(name) && args.length && g.bool(0.5)) args[0] = g.int(-1, 8);
    return { name, ctor: false, args };
  },
  async run(x) {
    const f = native[x.name] as new (...a: unknown[]) => unknown;
    // Classes (SelectionIndex) are constructed; everything else is called.
    const r = /^[A-Z]/.test(x.name) ? new f(...x.args) : await settle((f as unknown as (...a: unknown[]) => unknown)(...x.args));
    void r;
  },
});

export const apiTargets: FuzzTarget[] = [kernelsTarget, policyTarget, policySketchTarget, hotTierTarget, dramTierTarget, apiTarget, nativeTarget];

