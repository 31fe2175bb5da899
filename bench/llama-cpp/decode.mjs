// llama.cpp (node-llama-cpp, prebuilt CPU build) decode and prefill speed on a GGUF file, for
// bench/gguf-decode.ts, which runs it as a child process so each engine has its own memory.
//
//   node bench/llama-cpp/decode.mjs <model.gguf> <depth> <steps> <threads> <prefillTokens>
//
// The KV cache at `depth` is filled directly: a sequence state file (llama.cpp's "ggsq" format,
// version 3: tokens, cell metadata, then per layer the K rows and the transposed V of f16) with
// random f16 keys and values is written and loaded, so decode attends `depth` positions without a
// prefill of that length (which takes too long on two cores). Attention cost depends on the number
// of positions, not on their values. Prints one JSON line: wall and process CPU milliseconds per
// decode step (CPU time is the fairer figure on a machine shared with other work).
import { closeSync, openSync, unlinkSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { getLlama } from 'node-llama-cpp';
import { readGguf } from '../../dist/src/model/gguf/reader.js';
import { llamaConfig } from '../../dist/src/model/gguf/llama-config.js';
import { f32ToF16 } from '../../dist/src/util/f16.js';

const [path, depthArg, stepsArg, threadsArg, prefillArg] = process.argv.slice(2);
const depth = Number(depthArg);
const steps = Number(stepsArg ?? 8);
const threads = Number(threadsArg ?? 2);
const prefillTokens = Number(prefillArg ?? 0);
const c = llamaConfig(readGguf(path));
const kvDim = c.nKvHeads * c.headSize;

/** Writes a llama.cpp sequence state of `n` positions with random f16 K/V (flash attention off: V transposed). */
function writeState(file, n) {
  const fd = openSync(file, 'w');
  const u32 = (...v) => Buffer.from(new Uint32Array(v).buffer);
  // f16 values of roughly unit-normal numbers, picked at random.
  const table = Uint16Array.from({ length: 4096 }, (_, i) => f32ToF16(Math.sqrt(-2 * Math.log((i + 0.5) / 4096)) * Math.cos(i * 2.399)));
  let seed = 12345;
  const rows = (count) => {
    const a = new Uint16Array(count);
    for (let i = 0; i < count; i++) {
      seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
      a[i] = table[seed >>> 20];
    }
    return Buffer.from(a.buffer);
  };
  const w = (b) => writeSync(fd, b);
  w(u32(0x67677371, 3, n));
  w(Buffer.from(Int32Array.from({ length: n }, (_, i) => 5 + ((i * 7919) % Math.min(1000, c.vocabSize - 10))).buffer));
  w(u32(1, n)); // one stream, n cells
  const cells = new Int32Array(3 * n);
  for (let i = 0; i < n; i++) cells.set([i, 1, 0], 3 * i); // pos, one sequence id, id 0
  w(Buffer.from(cells.buffer));
  w(u32(1, c.nLayers)); // V transposed, layers
  const chunk = 4096;
  for (let l = 0; l < c.nLayers; l++) {
    const h = Buffer.alloc(12);
    h.writeInt32LE(1, 0); // F16
    h.writeBigUInt64LE(BigInt(kvDim * 2), 4);
    w(h);
    for (let i = 0; i < n; i += chunk) w(rows(Math.min(chunk, n - i) * kvDim));
  }
  for (let l = 0; l < c.nLayers; l++) {
    w(u32(1, 2, kvDim)); // F16, element size, rows of the transposed V
    for (let j = 0; j < kvDim; j++) w(rows(n));
  }
  closeSync(fd);
}

const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' });
const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
const ctx = await model.createContext({ contextSize: Math.max(depth + steps + 8, prefillTokens + 8), threads, flashAttention: false, batchSize: 512 });
const result = { engine: 'llama.cpp', depth, steps, threads };
if (prefillTokens > 0) {
  const seq = ctx.getSequence();
  const t0 = performance.now();
  const c0 = process.cpuUsage();
  await seq.evaluateWithoutGeneratingNewTokens(Array.from({ length: prefillTokens }, (_, i) => 5 + ((i * 7919) % Math.min(1000, c.vocabSize - 10))));
  result.prefillTokens = prefillTokens;
  result.prefillMs = performance.now() - t0;
  const c1 = process.cpuUsage(c0);
  result.prefillCpuMs = (c1.user + c1.system) / 1000;
  seq.dispose();
}
if (depth > 0) {
  const seq = ctx.getSequence();
  const file = join(tmpdir(), `kvdrive-llama-state-${process.pid}.bin`);
  writeState(file, depth);
  await seq.loadStateFromFile(file, { acceptRisk: true });
  unlinkSync(file);
  let input = [[5, { generateNext: { token: true, options: { temperature: 0 } } }]];
  const ms = [];
  const cpu = [];
  for (let s = 0; s < steps; s++) {
    const t0 = performance.now();
    const c0 = process.cpuUsage();
    const r = await seq.controlledEvaluate(input);
    const c1 = process.cpuUsage(c0);
    ms.push(performance.now() - t0);
    cpu.push((c1.user + c1.system) / 1000);
    input = [[r[0].next.token, { generateNext: { token: true, options: { temperature: 0 } } }]];
  }
  result.decodeMs = ms;
  result.decodeCpuMs = cpu;
  result.contextTokens = seq.contextTokens.length;
}
await ctx.dispose();
await model.dispose();
console.log(JSON.stringify(result));
