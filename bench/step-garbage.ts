/**
 * What an eval's garbage does to the runtime's timed steps (bench/RESULTS.md, "The eval's garbage
 * was collected inside the runtime's timed steps..."). One DRAM-only runtime decodes one layer of
 * the demo's synthetic trace (Llama-3-8B layer shape, f16); before every step, dense attention runs
 * over the whole context (as the demo's table does before its rows), then, by condition:
 *   none    nothing else;
 *   fresh   attentionWeights over the context into a fresh array (qHeads x tokens f32, 16 MiB at
 *           128K): what the eval did before every step's rows until 2026-11-29;
 *   reused  the same probabilities into one array reused step after step: what it does now.
 * Each condition runs in its own child process (garbage left by one would be collected in another's
 * steps), the conditions take turns round by round, and each is reported as the median over rounds
 * of its median attend() wall per step, beside its ratio to `none` of the same round.
 *
 *   npm run build:ts && node dist/bench/step-garbage.js [--context 131072] [--steps 24] [--rounds 2]
 */
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { attendDenseAsync, attentionWeights } from '../src/attention/kernels.js';
import { openRuntime } from '../src/runtime/runtime.js';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { toF32 } from '../src/util/f16.js';
import { arg, median } from './bench-util.js';

const CONDITIONS = ['none', 'fresh', 'reused'] as const;
type Condition = (typeof CONDITIONS)[number];

const context = Number(arg('context', '131072'));
const steps = Number(arg('steps', '24'));
const rounds = Number(arg('rounds', '2'));

/** One condition's run: the median attend() wall and stage times per step (steps after the first two). */
async function child(condition: Condition): Promise<{ wall: number; select: number; fetch: number; compute: number }> {
  const [qHeads, kvHeads, headDim] = [32, 8, 128];
  const trace = generateSyntheticTrace({ layers: 1, promptTokens: context, decodeSteps: steps, qHeads, kvHeads, headDim, dtype: 'f16', seed: 1 });
  const layer = await trace.layer(0);
  const rt = await openRuntime({ shape: { layers: 1, qHeads, kvHeads, headDim }, budget: 2048, mode: 'sequential', dtype: 'f16', maxSequences: 1, maxTokens: context + steps });
  try {
    const seq = rt.createSequence();
    await rt.prefill(seq, 0, layer.k, layer.v);
    const row = kvHeads * headDim;
    const reused = new Float32Array(qHeads * context);
    const walls: number[] = [];
    const parts: number[][] = [[], [], []];
    for (let s = 0; s < steps; s++) {
      const q = layer.q.subarray(s * qHeads * headDim, (s + 1) * qHeads * headDim);
      await attendDenseAsync({ q, qHeads, k: layer.k, v: layer.v, threads: 2 });
      if (condition === 'fresh') attentionWeights({ q, qHeads, k: layer.k });
      if (condition === 'reused') attentionWeights({ q, qHeads, k: layer.k, into: reused });
      const kNew = toF32(layer.kNew.data.subarray(s * row, (s + 1) * row), 'f16');
      const vNew = toF32(layer.vNew.data.subarray(s * row, (s + 1) * row), 'f16');
      const t0 = performance.now();
      await rt.attend(0, [{ seq, q, kNew, vNew }]);
      const wall = performance.now() - t0;
      const st = (await rt.stats()).recentSteps.at(-1)!;
      if (s < 2) continue;
      walls.push(wall);
      parts[0]!.push(st.selectionMs);
      parts[1]!.push(st.fetchMs);
      parts[2]!.push(st.computeMs);
    }
    return { wall: median(walls), select: median(parts[0]!), fetch: median(parts[1]!), compute: median(parts[2]!) };
  } finally {
    await rt.close();
  }
}

if (process.argv.includes('--child')) {
  const condition = arg('child', 'none') as Condition;
  process.stdout.write(JSON.stringify(await child(condition)) + '\n');
} else {
  const self = fileURLToPath(import.meta.url);
  const runs = new Map<Condition, Array<Awaited<ReturnType<typeof child>>>>(CONDITIONS.map((c) => [c, []]));
  for (let r = 0; r < rounds; r++)
    for (let i = 0; i < CONDITIONS.length; i++) {
      const c = CONDITIONS[(i + r) % CONDITIONS.length]!;
      const out = execFileSync(process.execPath, [self, '--child', c, '--context', String(context), '--steps', String(steps)], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
      runs.get(c)!.push(JSON.parse(out.trim().split('\n').pop()!));
    }
  console.log(`context ${context}, budget 2048, ${steps} steps (the first two not counted), ${rounds} rounds; DRAM-only runtime, one layer 32/8 heads x 128, f16, sequential; dense attention before every step`);
  console.log('| between steps | attend() ms per step, median of rounds (each round) | ratio to none (each round) | select / fetch / compute ms |');
  console.log('|---|---|---|---|');
  const none = runs.get('none')!;
  for (const c of CONDITIONS) {
    const rs = runs.get(c)!;
    const f = (x: number) => x.toFixed(2);
    console.log(
      `| ${c} | ${f(median(rs.map((x) => x.wall)))} (${rs.map((x) => f(x.wall)).join(', ')}) | ${rs.map((x, i) => (x.wall / none[i]!.wall).toFixed(3)).join(', ')} | ` +
        `${f(median(rs.map((x) => x.select)))} / ${f(median(rs.map((x) => x.fetch)))} / ${f(median(rs.map((x) => x.compute)))} |`,
    );
  }
}
