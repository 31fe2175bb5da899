/**
 * Whole-model decode on a GGUF file: kvdrive (native forward pass, attention dense or sparse
 * through the AttentionBackend) against llama.cpp (node-llama-cpp, bench/llama-cpp/, run as a child
 * process) at several context depths, same threads, in one run; prefill tokens/s beside it.
 *
 *   node dist/src/cli/main.js random-gguf --shape llama-3.2-1b --type Q8_0 --out /tmp/l1b.gguf
 *   node dist/bench/gguf-decode.js --model /tmp/l1b.gguf [--depths 4096,16384,32768] [--steps 6]
 *        [--threads 1] [--prefill 128] [--budget-share 0.0156] [--sparse-depths all|none|4096,...]
 *        [--weights huge-pages|mmap] [--storage DIR --dram-budget-gib N]
 *
 * The KV cache at each depth is filled directly in both engines (random keys and values; attention
 * cost depends on the number of positions, not on their values), because prefilling 32K positions
 * on two cores takes far longer than the decode being measured. kvdrive's dense attention is the
 * native attendDense kernel (f32 cache); llama.cpp's is its CPU path with an f16 cache and flash
 * attention off. Sparse is the kvdrive backend at budget = share × depth (1.56% by default); its
 * first step (which builds the index over the filled context) is reported apart, and each engine's
 * first decode step is a warm-up left out. Per-step figures are process CPU time (user + system,
 * all threads), median and minimum over `steps` positions: on a machine shared with other work the
 * wall time mostly measures the wait for a core and the median absorbs others' cache and memory
 * traffic, so the minimum is the steadiest estimate of each engine's own cost (with --threads 1 both
 * run one thread). Ratios are tok/s of kvdrive over tok/s of llama.cpp.
 *
 * At each depth llama.cpp runs first (its child process and its KV are gone before kvdrive fills
 * its own cache), so the largest depths need one engine's memory at a time. The sparse column's
 * runtime time per token (selection, fetch, attention; wall, from the runtime's stats) is printed
 * below the table. The weights pass is compared with the memory-read roofline: memoryRead over a
 * huge-page buffer of the weights' bytes, against the weights-only part of a decode step (a step at
 * the smallest depth minus its attention).
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadavg } from 'node:os';
import { attendDense, memoryRead } from '../src/attention/kernels.js';
import { native } from '../src/native.js';
import type { AttentionBackend, AttentionShape } from '../src/model/attention-backend.js';
import { createBackend } from '../src/model/backends.js';
import { GgufTransformer, loadGgufModel } from '../src/model/gguf/model.js';
import { median, uniform } from './bench-util.js';

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1]! : fallback;
}

const modelPath = arg('model', '');
if (!modelPath) throw new Error('usage: node dist/bench/gguf-decode.js --model file.gguf [--depths 4096,16384,32768] [--steps 6] [--threads 1] [--prefill 128]');
const depths = arg('depths', '4096,16384,32768').split(',').map(Number);
const steps = Number(arg('steps', '8'));
const threads = Number(arg('threads', '1'));
const prefill = Number(arg('prefill', '128'));
const share = Number(arg('budget-share', '0.0156'));
const sparseArg = arg('sparse-depths', 'all');
const sparseAt = (depth: number): boolean => sparseArg === 'all' || (sparseArg !== 'none' && sparseArg.split(',').map(Number).includes(depth));
const weights = arg('weights', 'huge-pages') as 'huge-pages' | 'mmap';
// --storage DIR: the sparse runtime seals the context to an SSD store under DIR and caches part of it
// in a DRAM tier under --dram-budget-gib (default 5); without it the DRAM tier holds the whole context.
const storageDir = arg('storage', '');
const dramBudgetGiB = Number(arg('dram-budget-gib', '5'));
const load = (): string => loadavg().map((x) => x.toFixed(2)).join(', ');
const here = dirname(fileURLToPath(import.meta.url));
const llamaDir = join(here, '..', '..', 'bench', 'llama-cpp');
const haveLlama = existsSync(join(llamaDir, 'node_modules', 'node-llama-cpp'));

/** Dense attention with the native kernel over the host's f32 cache (positions [0, pos]). */
class NativeDense implements AttentionBackend {
  /** CPU milliseconds spent in attend() since the last reset (to split a step into weights and attention). */
  cpuMs = 0;
  constructor(private readonly shape: AttentionShape) {}
  attend(_layer: number, pos: number, q: Float32Array, kCache: Float32Array, vCache: Float32Array): Float32Array {
    const { nHeads, nKvHeads, headSize, seqLen } = this.shape;
    const c0 = process.cpuUsage();
    const view = (data: Float32Array) => ({ data, dtype: 'f32' as const, tokens: seqLen, heads: nKvHeads, dim: headSize });
    const out = attendDense({ q, qHeads: nHeads, k: view(kCache), v: view(vCache), tokens: pos + 1, threads }).out;
    const c = process.cpuUsage(c0);
    this.cpuMs += (c.user + c.system) / 1000;
    return out;
  }
}

/** Forwards to whichever backend the bench is measuring (the transformer keeps one cache). */
class Switch implements AttentionBackend {
  current!: AttentionBackend;
  attend(layer: number, pos: number, q: Float32Array, k: Float32Array, v: Float32Array): Float32Array | Promise<Float32Array> {
    return this.current.attend(layer, pos, q, k, v);
  }
}

interface StepStats {
  wall: number;
  cpu: number;
  cpuMin: number;
}
const stats = (wall: number[], cpu: number[]): StepStats => ({ wall: median(wall), cpu: median(cpu), cpuMin: Math.min(...cpu) });

interface LlamaResult {
  decodeMs?: number[];
  decodeCpuMs?: number[];
  prefillMs?: number;
  prefillCpuMs?: number;
  prefillTokens?: number;
}

/** Wall and process CPU milliseconds of fn (every thread of the process counts). */
async function timed(fn: () => Promise<unknown>): Promise<{ ms: number; cpu: number }> {
  const t0 = performance.now();
  const c0 = process.cpuUsage();
  await fn();
  const c = process.cpuUsage(c0);
  return { ms: performance.now() - t0, cpu: (c.user + c.system) / 1000 };
}
function llamaCpp(depth: number, prefillTokens: number): LlamaResult | undefined {
  if (!haveLlama) return undefined;
  const out = execFileSync(process.execPath, [join(llamaDir, 'decode.mjs'), modelPath, String(depth), String(steps + 1), String(threads), String(prefillTokens)], {
    cwd: llamaDir,
    encoding: 'utf8',
    maxBuffer: 1 << 20,
  });
  return JSON.parse(out.trim().split('\n').pop()!) as LlamaResult;
}

const model = loadGgufModel(modelPath, { threads, weights });
const c = model.config;
const kvDim = c.nKvHeads * c.headSize;
console.log(`model ${modelPath}: ${c.arch}, ${c.nLayers} layers, dim ${c.dim}, ${c.nHeads}/${c.nKvHeads} heads × ${c.headSize}, ${c.weightType}; threads ${threads}; weights ${weights}; ${steps} decode steps per cell`);
console.log(`load average at start: ${load()}`);
if (!haveLlama) console.log('NOTICE: node-llama-cpp is not installed in bench/llama-cpp (npm install --omit=optional there); llama.cpp columns are empty');

// Prefill: kvdrive in chunks of 64 with native dense attention, llama.cpp with its batch of 512.
{
  const sw = new Switch();
  const tf = new GgufTransformer(model, sw, prefill + 1);
  sw.current = new NativeDense(model.attentionShape(prefill + 1));
  const toks = Array.from({ length: prefill }, (_, i) => 5 + ((i * 7919) % Math.min(1000, c.vocabSize - 10)));
  const kv = await timed(async () => {
    for (let p = 0; p < prefill; p += 64) await tf.forwardAsync(toks.slice(p, p + 64), p);
  });
  const ll = llamaCpp(0, prefill);
  const tps = (ms: number): string => ((prefill / ms) * 1000).toFixed(1);
  console.log(`\nprefill ${prefill} tokens, tok/s by wall (CPU) time: kvdrive ${tps(kv.ms)} (${tps(kv.cpu)})` +
    (ll?.prefillMs && ll.prefillCpuMs ? `, llama.cpp ${tps(ll.prefillMs)} (${tps(ll.prefillCpuMs)}); kvdrive / llama.cpp ${(ll.prefillMs / kv.ms).toFixed(2)} (${(ll.prefillCpuMs / kv.cpu).toFixed(2)})` : ''));
}

console.log('\nCPU ms per decoded token, median / min (wall median); ratio = kvdrive tok/s ÷ llama.cpp tok/s by median / by min CPU\n');
console.log('| depth | kvdrive dense | kvdrive sparse (budget) | llama.cpp | dense ÷ llama.cpp | sparse ÷ llama.cpp | sparse index build, CPU ms |');
console.log('|---|---|---|---|---|---|---|');
const notes: string[] = [];
let weightsOnly: number | undefined;
for (const depth of depths) {
  // llama.cpp first: its process (and its KV) is gone before kvdrive fills its own cache.
  const ll = llamaCpp(depth, 0);
  const llt = ll?.decodeMs && ll.decodeCpuMs ? stats(ll.decodeMs.slice(1), ll.decodeCpuMs.slice(1)) : undefined;
  const seqLen = depth + 2 * steps + 4;
  const sw = new Switch();
  const tf = new GgufTransformer(model, sw, seqLen);
  for (let l = 0; l < c.nLayers; l++) {
    tf.kCache[l]!.set(uniform(depth * kvDim, 2 * l + 1));
    tf.vCache[l]!.set(uniform(depth * kvDim, 2 * l + 2));
  }
  const shape = model.attentionShape(seqLen);
  // One warm-up position, then `steps` measured ones.
  const run = async (start: number): Promise<StepStats> => {
    await tf.forwardAsync([4], start);
    const r: { ms: number; cpu: number }[] = [];
    for (let s = 0; s < steps; s++) r.push(await timed(() => tf.forwardAsync([5 + s], start + 1 + s)));
    return stats(r.map((x) => x.ms), r.map((x) => x.cpu));
  };
  const nd = new NativeDense(shape);
  sw.current = nd;
  await tf.forwardAsync([4], depth);
  // The weights-only cost: per step CPU minus its attention, minimum over the steps.
  const rest: number[] = [];
  const dr: { ms: number; cpu: number }[] = [];
  for (let s = 0; s < steps; s++) {
    nd.cpuMs = 0;
    const t = await timed(() => tf.forwardAsync([5 + s], depth + 1 + s));
    dr.push(t);
    rest.push(t.cpu - nd.cpuMs);
  }
  const dense = stats(dr.map((x) => x.ms), dr.map((x) => x.cpu));
  weightsOnly ??= Math.min(...rest);
  let sp: StepStats | undefined;
  let first: { ms: number; cpu: number } | undefined;
  const budget = Math.max(1, Math.round(share * depth));
  if (sparseAt(depth)) {
    // The sparse backend is the runtime (by default its DRAM tier holds the whole f32 context; with
    // --storage the context is sealed to SSD and the DRAM tier caches part of it).
    const kvBytes = 2 * c.nLayers * seqLen * kvDim * 4;
    const tiers = storageDir ? { storage: storageDir, dramBudget: Math.round(dramBudgetGiB * 2 ** 30) } : { dramBudget: Math.ceil(kvBytes * 1.5) + 256 * 2 ** 20 };
    const sparse = createBackend('kvdrive', shape, { budget, ...tiers }) as AttentionBackend & {
      stats(): Promise<{ selectionMs: number; fetchMs: number; computeMs: number; wallMs: number } | undefined>;
    };
    sw.current = sparse;
    // The sparse backend's first step hands it the filled context (prefill: index build, sealing).
    first = await timed(() => tf.forwardAsync([4], depth + steps + 1));
    await tf.forwardAsync([4], depth + steps + 2);
    const before = (await sparse.stats())!;
    const r: { ms: number; cpu: number }[] = [];
    for (let s = 0; s < steps; s++) r.push(await timed(() => tf.forwardAsync([5 + s], depth + steps + 3 + s)));
    sp = stats(r.map((x) => x.ms), r.map((x) => x.cpu));
    const after = (await sparse.stats())!;
    const per = (k: 'selectionMs' | 'fetchMs' | 'computeMs' | 'wallMs'): string => ((after[k] - before[k]) / steps).toFixed(1);
    notes.push(`depth ${depth}: sparse runtime wall ms per token (${c.nLayers} layers): attend ${per('wallMs')} = selection ${per('selectionMs')} + fetch ${per('fetchMs')} + attention ${per('computeMs')} (+ append/checks); step CPU median ${sp.cpu.toFixed(0)}`);
    await sparse.close?.();
  }
  const cell = (t: StepStats): string => `${t.cpu.toFixed(0)} / ${t.cpuMin.toFixed(0)} (${t.wall.toFixed(0)})`;
  const ratio = (t: StepStats | undefined): string => (llt && t ? `${(llt.cpu / t.cpu).toFixed(2)} / ${(llt.cpuMin / t.cpuMin).toFixed(2)}` : '–');
  console.log(`| ${depth} | ${cell(dense)} | ${sp ? `${cell(sp)} (${budget})` : '–'} | ${llt ? cell(llt) : '–'} | ${ratio(dense)} | ${ratio(sp)} | ${first ? first.cpu.toFixed(0) : '–'} |`);
}
for (const n of notes) console.log(n);
// The memory-read roofline of the weights pass: one SIMD read of as many bytes, huge pages like the weights.
{
  const bytes = model.file.tensors.reduce((a, t) => a + t.bytes, 0);
  const buf = new Float32Array(Math.ceil(bytes / 4));
  native.adviseHugePages(buf);
  buf.fill(1);
  const read: number[] = [];
  for (let i = 0; i < 5; i++) read.push((await timed(async () => memoryRead(buf, threads))).cpu);
  const mr = Math.min(...read);
  console.log(`weights pass (${(bytes / 2 ** 30).toFixed(2)} GiB): decode step minus attention at depth ${depths[0]}, min CPU ${weightsOnly?.toFixed(1)} ms; memoryRead of as many bytes (${threads} thread${threads > 1 ? 's' : ''}), min CPU ${mr.toFixed(1)} ms (${(bytes / mr / 1e6).toFixed(1)} GB/s): ${((mr / weightsOnly!) * 100).toFixed(0)}% of the roofline`);
}
console.log(`load average at end: ${load()}`);
model.close();
