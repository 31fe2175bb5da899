/**
 * The kvdrive attention backend — the runtime (src/runtime/runtime.ts, memory model, sequential,
 * DRAM only) the reference host's "kvdrive" backend runs through — against dense attention, per
 * layer-step (brief: a few seconds in all).
 *
 * 1. long context: one layer of a Llama-3-8B-like shape (32 query heads, 8 kv heads, head dim 128)
 *    with a KV cache of 4096 positions filled with random keys/values. The runtime is prefilled with
 *    the first 3583 tokens (the index build, timed separately) and then decodes positions 3583..
 *    with a fresh random query and the cache's row as the new token per step. Baselines
 *    measured in the same run on the same caches and queries: the native dense kernel
 *    (attendDense, 1 thread, what a non-sparse native host would run) and the host's dense TS
 *    reference (DenseTsAttention). Reported as baseline ms per layer-step / kvdrive ms per
 *    layer-step, median of 3 interleaved rounds. Random keys make the selection itself meaningless
 *    (recall is measured by `kvdrive eval` on traces); the cost does not depend on what is picked.
 * 2. stories260K end to end (when the fixture is present): greedy generation of 256 positions,
 *    dense TS backend vs kvdrive backend at budget 64, tokens/s ratio. The model is tiny (head dim 8,
 *    context ≤ 256), so this mostly measures per-call overheads, not attention.
 *
 * Run: npm run build:ts && node dist/bench/model-kvdrive-backend.js
 */
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { attendDense } from '../src/attention/kernels.js';
import type { PolicyName } from '../src/index/selection.js';
import type { AttentionBackend, AttentionShape } from '../src/model/attention-backend.js';
import { loadCheckpoint } from '../src/model/checkpoint.js';
import { DenseTsAttention } from '../src/model/dense-attention.js';
import { attentionShape } from '../src/model/forward.js';
import { generate } from '../src/model/generate.js';
import { RuntimeAttention } from '../src/model/runtime-attention.js';
import { openRuntime } from '../src/runtime/runtime.js';
import { loadTokenizer } from '../src/model/tokenizer.js';
import { median } from './bench-util.js';

function random(n: number, seed: number): Float32Array {
  let a = seed >>> 0;
  return Float32Array.from({ length: n }, () => {
    a = (Math.imul(a, 1664525) + 1013904223) >>> 0;
    return a / 2 ** 32 - 0.5;
  });
}


const shape: AttentionShape = { nLayers: 1, nHeads: 32, nKvHeads: 8, headSize: 128, seqLen: 4096 };
const kvDim = shape.nKvHeads * shape.headSize;
const START = 3583;
const STEPS = 64;
const TS_STEPS = 4; // the TS reference is slow: fewer steps, same positions
const kCache = random(shape.seqLen * kvDim, 1);
const vCache = random(shape.seqLen * kvDim, 2);
const queries = Array.from({ length: STEPS + 1 }, (_, i) => random(shape.nHeads * shape.headSize, 100 + i).map((x) => x * 4));

/** ms per layer-step of `attend` over positions START+1 .. START+steps (the call at START is warm-up / index build). */
function timeBackend(attend: (pos: number, q: Float32Array) => unknown, steps: number): { first: number; perStep: number } {
  const t0 = performance.now();
  attend(START, queries[0]!);
  const t1 = performance.now();
  for (let s = 1; s <= steps; s++) attend(START + s, queries[s]!);
  return { first: t1 - t0, perStep: (performance.now() - t1) / steps };
}

/** ms per layer-step of the runtime over positions START .. START+steps-1 after a prefill of START tokens (`first`: the prefill). */
async function timeRuntime(policy: PolicyName, budget: number, steps: number) {
  const rt = await openRuntime({
    shape: { layers: 1, qHeads: shape.nHeads, kvHeads: shape.nKvHeads, headDim: shape.headSize },
    budget,
    policy,
    maxSequences: 1,
    maxTokens: shape.seqLen,
    dramBudget: 256 * 2 ** 20, // the backend's default; holds this KV (32 MiB) whole
  });
  const seq = rt.createSequence();
  const view = (c: Float32Array, a: number, b: number) => ({ data: c.subarray(a * kvDim, b * kvDim), dtype: 'f32' as const, tokens: b - a, heads: shape.nKvHeads, dim: shape.headSize });
  const t0 = performance.now();
  await rt.prefill(seq, 0, view(kCache, 0, START), view(vCache, 0, START));
  const t1 = performance.now();
  for (let s = 0; s < steps; s++) {
    const p = START + s;
    await rt.attend(0, [{ seq, q: queries[s]!, kNew: kCache.subarray(p * kvDim, (p + 1) * kvDim), vNew: vCache.subarray(p * kvDim, (p + 1) * kvDim) }]);
  }
  const perStep = (performance.now() - t1) / steps;
  const st = await rt.stats();
  await rt.close();
  return { first: t1 - t0, perStep, select: st.selectionMs / st.attendCalls, attend: (st.fetchMs + st.computeMs) / st.attendCalls };
}

function nativeDense(pos: number, q: Float32Array): unknown {
  const tokens = pos + 1;
  const view = (c: Float32Array) => ({ data: c.subarray(0, tokens * kvDim), dtype: 'f32' as const, tokens, heads: shape.nKvHeads, dim: shape.headSize });
  return attendDense({ q, qHeads: shape.nHeads, k: view(kCache), v: view(vCache) });
}

async function benchLongContext(): Promise<void> {
  const configs: { policy: PolicyName; budget: number }[] = [
    { policy: 'kvdrive', budget: 256 },
    { policy: 'quest', budget: 256 },
    { policy: 'shadowkv', budget: 256 },
  ];
  const rounds = 3;
  const native: number[] = [];
  const ts: number[] = [];
  const sparse = configs.map(() => ({ perStep: [] as number[], build: [] as number[], select: [] as number[], attend: [] as number[] }));
  for (let r = 0; r < rounds; r++) {
    native.push(timeBackend(nativeDense, STEPS).perStep);
    const dense = new DenseTsAttention(shape);
    ts.push(timeBackend((p, q) => dense.attend(0, p, q, kCache, vCache), TS_STEPS).perStep);
    for (const [i, c] of configs.entries()) {
      const t = await timeRuntime(c.policy, c.budget, STEPS);
      sparse[i]!.perStep.push(t.perStep);
      sparse[i]!.build.push(t.first);
      sparse[i]!.select.push(t.select);
      sparse[i]!.attend.push(t.attend);
    }
  }
  const nat = median(native);
  const tsMs = median(ts);
  console.log(`long context: ${START + 1}..${START + STEPS + 1} tokens, ${shape.nHeads} q heads / ${shape.nKvHeads} kv heads, head dim ${shape.headSize}, f32, 1 thread`);
  console.log(`  baseline native dense (attendDense):  ${nat.toFixed(3)} ms per layer-step`);
  console.log(`  baseline dense TS (DenseTsAttention): ${tsMs.toFixed(3)} ms per layer-step`);
  configs.forEach((c, i) => {
    const ms = median(sparse[i]!.perStep);
    console.log(
      `  kvdrive backend, policy ${c.policy}, budget ${c.budget}: ${ms.toFixed(3)} ms per layer-step ` +
        `(select ${median(sparse[i]!.select).toFixed(3)}, fetch + attend ${median(sparse[i]!.attend).toFixed(3)}; prefill incl. index build over ${START} tokens ${median(sparse[i]!.build).toFixed(1)} ms) ` +
        `→ ×${(nat / ms).toFixed(2)} vs native dense, ×${(tsMs / ms).toFixed(1)} vs dense TS`,
    );
  });
}

async function benchStories(): Promise<void> {
  const here = dirname(fileURLToPath(import.meta.url));
  const dir = [process.env.KVDRIVE_FIXTURES, resolve(here, '..', '..', '..', 'shared', 'fixtures')]
    .filter((p): p is string => !!p)
    .map((p) => join(p, 'stories260K'))
    .find((p) => existsSync(join(p, 'stories260K.bin')));
  if (!dir) {
    console.log('stories260K: fixture not found, skipped');
    return;
  }
  const model = loadCheckpoint(join(dir, 'stories260K.bin'));
  const tokenizer = loadTokenizer(join(dir, 'tok512.bin'), { vocabSize: model.config.vocabSize });
  const shape260 = attentionShape(model.config);
  const run = async (sparse: boolean): Promise<number> => {
    const backend: AttentionBackend = sparse ? new RuntimeAttention(shape260, { budget: 64 }) : new DenseTsAttention(shape260);
    const r = await generate({ model, tokenizer, steps: 256, temperature: 0, prompt: 'Once upon a time', backend });
    await backend.close?.();
    return r.timings.totalMs / r.positions;
  };
  const dense: number[] = [];
  const kv: number[] = [];
  for (let r = 0; r < 3; r++) {
    dense.push(await run(false));
    kv.push(await run(true));
  }
  const d = median(dense);
  const k = median(kv);
  console.log(`stories260K, 256 positions greedy: dense TS ${d.toFixed(3)} ms/token, kvdrive budget 64 ${k.toFixed(3)} ms/token → ×${(d / k).toFixed(2)}`);
}

await benchLongContext();
await benchStories();
