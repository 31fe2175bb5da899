/**
 * Trace benchmarks, each reported as a ratio against a baseline measured in the same run:
 *  - f32 → f16 conversion vs a plain Float32Array copy of the same data (the memory floor);
 *  - synthetic layer generation (Llama-3-8B heads: 32/8, D 128, f16) vs filling the same K/V arrays
 *    with PRNG bits only (the cost of producing that many random 16-bit values at all);
 *  - reading one layer from a trace file (openTrace().layer) vs one raw positioned read of the
 *    same number of bytes from the same file.
 *
 * Run: npm run build:ts && node dist/bench/trace.js [--tokens N]   (default 8192 prompt tokens;
 * the generator's cost is linear in tokens, so 128K costs ~16× the 8K figure).
 */
import { open, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Bench } from 'tinybench';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { openTrace } from '../src/trace/trace.js';
import { f32ArrayToF16 } from '../src/util/f16.js';

const arg = process.argv.indexOf('--tokens');
const tokens = arg > 0 ? Number(process.argv[arg + 1]) : 8192;

async function ratio(name: string, baseline: string, fn: () => unknown, base: () => unknown, iterations = 5): Promise<void> {
  const bench = new Bench({ iterations, warmupIterations: 1, time: 0 });
  bench.add(baseline, base).add(name, fn);
  await bench.run();
  const [b, f] = bench.tasks.map((t) => t.result as unknown as { latency: { mean: number } });
  const bm = b!.latency.mean;
  const fm = f!.latency.mean;
  console.log(`${name.padEnd(44)} ${fm.toFixed(2).padStart(9)} ms   baseline (${baseline}) ${bm.toFixed(2).padStart(9)} ms   ratio ${(fm / bm).toFixed(2)}×`);
}

// 1. Conversion: 4M values.
const src = new Float32Array(1 << 22).map((_, i) => Math.sin(i) * 100);
const dstF16 = new Uint16Array(src.length);
const dstF32 = new Float32Array(src.length);
await ratio('f32→f16 convert, 4M values', 'Float32Array copy', () => f32ArrayToF16(src, dstF16), () => dstF32.set(src), 10);

// 2. Generation of one Llama-3-8B-shaped layer at `tokens` prompt tokens.
const shape = { layers: 1, qHeads: 32, kvHeads: 8, headDim: 128, promptTokens: tokens, decodeSteps: 16, dtype: 'f16' as const };
const trace = generateSyntheticTrace(shape);
const n = tokens * 8 * 128;
const k = new Uint16Array(n);
const v = new Uint16Array(n);
await ratio(
  `synthetic layer, ${tokens} tokens, 32/8×128 f16`,
  'xorshift fill of K and V',
  () => trace.layerData(0),
  () => {
    let x = 12345;
    for (const a of [k, v]) {
      for (let i = 0; i < n; i += 2) {
        x ^= x << 13;
        x ^= x >>> 17;
        x ^= x << 5;
        a[i] = x & 0xffff;
        a[i + 1] = x >>> 16;
      }
    }
  },
  3,
);

// 3. Reading one layer back from a file.
const path = join(tmpdir(), `kvd-bench-trace-${process.pid}.safetensors`);
await trace.write(path);
const reader = await openTrace(path);
const layerBytes = (2 * tokens * 8 * 128 + 16 * 32 * 128 + 2 * 16 * 8 * 128) * 2;
const raw = new Uint8Array(layerBytes);
const fh = await open(path, 'r');
await ratio(
  `openTrace().layer(0), ${(layerBytes / 2 ** 20).toFixed(0)} MiB`,
  'one raw pread of the same bytes',
  () => reader.layer(0),
  async () => {
    let done = 0;
    while (done < layerBytes) done += (await fh.read(raw, done, layerBytes - done, 8 + done)).bytesRead;
  },
  5,
);
await fh.close();
await reader.close();
await rm(path, { force: true });
