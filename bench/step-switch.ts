/**
 * Same-process comparison of the DRAM-only runtime step's two ways to select: inside the attention
 * call (attendFetched's `select`, the default) or selectEntry, then attendFetched with that
 * selection (src/pipeline/step.ts, setSelectInAttention). One runtime, one pool, one machine phase:
 * each step takes one of the two at random (a fixed hash of the step number), not alternately,
 * since every 4th step's index extend seals a chunk and an alternating pattern of two steps each
 * hands all those steps to one side (bench/RESULTS.md). Before every step, dense attention over the
 * layer on 2 threads runs untimed (caches cold, the pool's thread asleep, as between the layers of
 * a real decode). The workload is the `kvdrive demo` trace's first layer (32 query / 8 kv heads,
 * dim 128, f16), budget 2048. Prints, per way, the median and mean ms per step (the first 4 steps
 * not counted) and inside / separate as ratios. Outputs are the same either way
 * (test/runtime-select-in-attention.test.ts).
 *
 *   node dist/bench/step-switch.js [context=131072] [steps=200] [seed=1]
 */
import { attendDenseAsync } from '../src/attention/kernels.js';
import { setSelectInAttention } from '../src/pipeline/step.js';
import { openRuntime } from '../src/runtime/runtime.js';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { toF32 } from '../src/util/f16.js';
import { mean, median } from './bench-util.js';

const CONTEXT = Number(process.argv[2] ?? 131072);
const STEPS = Number(process.argv[3] ?? 200);
const SEED = Number(process.argv[4] ?? 1);
if (!Number.isInteger(CONTEXT) || CONTEXT < 4096) throw new Error(`context: expected an integer >= 4096, got ${process.argv[2]}`);
if (!Number.isInteger(STEPS) || STEPS < 8) throw new Error(`steps: expected an integer >= 8, got ${process.argv[3]}`);
if (!Number.isInteger(SEED) || SEED < 0) throw new Error(`seed: expected an integer >= 0, got ${process.argv[4]}`);

const Q_HEADS = 32, KV_HEADS = 8, DIM = 128, WARM_STEPS = 4;
const trace = generateSyntheticTrace({ layers: 1, promptTokens: CONTEXT, decodeSteps: STEPS, qHeads: Q_HEADS, kvHeads: KV_HEADS, headDim: DIM, dtype: 'f16', seed: SEED });
const layer = await trace.layer(0);
const rt = await openRuntime({
  shape: { layers: 1, qHeads: Q_HEADS, kvHeads: KV_HEADS, headDim: DIM },
  budget: 2048,
  mode: 'sequential',
  dtype: 'f16',
  maxSequences: 1,
  maxTokens: CONTEXT + STEPS,
  policyOptions: { threads: 2 },
});
const seq = rt.createSequence();
await rt.prefill(seq, 0, layer.k, layer.v);
const qLen = Q_HEADS * DIM, row = KV_HEADS * DIM;
const ms = { inside: [] as number[], separate: [] as number[] };
try {
  for (let s = 0; s < STEPS; s++) {
    const way = (Math.imul(s + 1, 2654435761) >>> 13) & 1 ? 'inside' : 'separate';
    setSelectInAttention(way === 'inside');
    const q = layer.q.subarray(s * qLen, (s + 1) * qLen);
    await attendDenseAsync({ q, qHeads: Q_HEADS, k: layer.k, v: layer.v, threads: 2 });
    const kNew = toF32(layer.kNew.data.subarray(s * row, (s + 1) * row), 'f16');
    const vNew = toF32(layer.vNew.data.subarray(s * row, (s + 1) * row), 'f16');
    const t0 = performance.now();
    await rt.attend(0, [{ seq, q, kNew, vNew }]);
    if (s >= WARM_STEPS) ms[way].push(performance.now() - t0);
  }
} finally {
  setSelectInAttention(true);
  await rt.close();
}
console.log(`step switch: seed ${SEED}, context ${CONTEXT}, ${STEPS} steps (first ${WARM_STEPS} not timed), each after a dense pass`);
for (const way of ['inside', 'separate'] as const)
  console.log(`select ${way.padEnd(8)}: ${ms[way].length} steps, median ${median(ms[way]).toFixed(3)} mean ${mean(ms[way]).toFixed(3)} ms per layer-step`);
console.log(`inside / separate: median ${(median(ms.inside) / median(ms.separate)).toFixed(3)}, mean ${(mean(ms.inside) / mean(ms.separate)).toFixed(3)}`);
