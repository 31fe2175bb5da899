/**
 * Reference-host benchmarks (brief: a few seconds in all).
 *
 * 1. matmul: the forward pass's matmul (four independent accumulators) against the plain
 *    single-accumulator loop (the baseline, llama2.c's loop written in TS), on the projection shapes
 *    of the llama2.c TinyStories models; reported as baseline time / ours.
 * 2. forward: tokens/s of the full stories260K forward pass with dense TS attention over 128
 *    positions (when the fixture is present). An absolute figure for orientation only (there is
 *    no second implementation to compare with in the same run); it is not a performance claim.
 *
 * 3. encode: the tokenizer's heap-based BPE merge against llama2.c's quadratic merge loop (the
 *    baseline, same result) on a 1,500-character story prompt; reported as baseline time / ours.
 *
 * Run: npm run build:ts && node dist/bench/model-forward.js
 */
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Bench } from 'tinybench';
import { loadCheckpoint, type Checkpoint } from '../src/model/checkpoint.js';
import { DenseTsAttention } from '../src/model/dense-attention.js';
import { bpeMerge, bpeMergeNaive, type PairLookup } from '../src/model/bpe.js';
import { attentionShape, matmul, Transformer } from '../src/model/forward.js';
import { loadTokenizer, type Tokenizer } from '../src/model/tokenizer.js';

/** Baseline: one accumulator, as in llama2.c's matmul. */
function matmulBaseline(y: Float32Array, x: Float32Array, w: Float32Array, n: number, d: number): void {
  for (let i = 0; i < d; i++) {
    let s = 0;
    for (let j = 0; j < n; j++) s += w[i * n + j]! * x[j]!;
    y[i] = s;
  }
}

function random(n: number, seed: number): Float32Array {
  let a = seed >>> 0;
  return Float32Array.from({ length: n }, () => {
    a = (Math.imul(a, 1664525) + 1013904223) >>> 0;
    return a / 2 ** 32 - 0.5;
  });
}

function meanMs(bench: Bench, name: string): number {
  const t = bench.getTask(name)?.result;
  if (!t || !('latency' in t)) throw new Error(`bench task ${name} did not complete`);
  return t.latency.mean;
}

async function benchMatmul(): Promise<void> {
  // (n in, d out): stories15M wq (288×288), stories15M w1 (288→768), stories110M wq (768×768).
  for (const [n, d] of [
    [288, 288],
    [288, 768],
    [768, 768],
  ] as const) {
    const w = random(n * d, 1);
    const x = random(n, 2);
    const y = new Float32Array(d);
    const bench = new Bench({ time: 300, warmupTime: 100 });
    bench.add('baseline', () => matmulBaseline(y, x, w, n, d)).add('ours', () => matmul(y, x, w, n, d));
    await bench.run();
    const base = meanMs(bench, 'baseline');
    const ours = meanMs(bench, 'ours');
    console.log(`matmul ${d}×${n}: baseline ${(base * 1000).toFixed(1)} µs, ours ${(ours * 1000).toFixed(1)} µs, speedup ×${(base / ours).toFixed(2)}`);
  }
}

/** Mean time per token of 128 consecutive positions (attention grows with the position). */
async function benchForward(ck: Checkpoint): Promise<void> {
  const steps = 128;
  const run = (t: Transformer): void => {
    t.reset();
    for (let pos = 0; pos < steps; pos++) t.forward((pos * 7) % ck.config.vocabSize, pos);
  };
  const ours = new Transformer(ck, new DenseTsAttention(attentionShape(ck.config)));
  const bench = new Bench({ time: 1000, warmupTime: 200 });
  bench.add('forward', () => run(ours));
  await bench.run();
  const ms = meanMs(bench, 'forward');
  console.log(`forward stories260K, ${steps} positions: ${(ms / steps).toFixed(3)} ms/token, ${((steps / ms) * 1000).toFixed(0)} tokens/s`);
}

async function benchEncode(tok: Tokenizer): Promise<void> {
  const text = ' ' + 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park. '.repeat(16);
  const pieces = Array.from({ length: tok.vocabSize }, (_, i) => Buffer.from(tok.piece(i)).toString('latin1'));
  const ids = new Map<string, number>();
  pieces.forEach((p, i) => ids.has(p) || ids.set(p, i));
  const lookup: PairLookup = (a, b) => {
    const id = ids.get(pieces[a]! + pieces[b]!);
    return id === undefined ? undefined : { id, score: tok.score(id) };
  };
  const symbols = [...text].map((ch) => ids.get(ch)!);
  const a = bpeMerge(symbols, lookup);
  const b = bpeMergeNaive(symbols, lookup);
  if (a.length !== b.length || a.some((x, i) => x !== b[i])) throw new Error('bpeMerge and the baseline disagree');
  const bench = new Bench({ time: 500, warmupTime: 100, iterations: 3 });
  bench.add('baseline', () => bpeMergeNaive(symbols, lookup)).add('ours', () => bpeMerge(symbols, lookup));
  await bench.run();
  const base = meanMs(bench, 'baseline');
  const ours = meanMs(bench, 'ours');
  console.log(`BPE merge, ${symbols.length} symbols → ${a.length} tokens: baseline ${base.toFixed(1)} ms, ours ${ours.toFixed(2)} ms, speedup ×${(base / ours).toFixed(1)}`);
}

const here = dirname(fileURLToPath(import.meta.url));
const fixtures = process.env.KVDRIVE_FIXTURES ?? resolve(here, '..', '..', '..', 'shared', 'fixtures');
await benchMatmul();
const ckPath = join(fixtures, 'stories260K', 'stories260K.bin');
if (existsSync(ckPath)) {
  await benchForward(loadCheckpoint(ckPath));
  await benchEncode(loadTokenizer(join(fixtures, 'stories260K', 'tok512.bin')));
} else console.log(`NOTICE: ${ckPath} not found; forward and encode benchmarks skipped`);
