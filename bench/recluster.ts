/**
 * What the background re-clustering (PolicyOptions.reclusterDelay) changes on the decode path: the
 * kvdrive policy as the offloaded runtime selects (key sketch, no keys), replayed over decode steps
 * that cross a segment fill, once with the fill's k-means inside the extend (reclusterDelay 0) and
 * once deferred (the default 256), in the same process. Per run: the extend + select time of the
 * filling step and the worst and median step, and recall / oracle over the steps after the fill
 * (where the deferred run selects on the filled segment's online clusters).
 *
 *   npm run build:ts && node dist/bench/recluster.js [context=131130] [steps=24] [seeds=1,11] [budget=2048]
 *
 * The default context puts the fill (a 4096-token segment's last chunk sealed once 64 tokens old)
 * at decode step 5 at 128K, the Llama-3-8B layer shape of the demo.
 */
import { loadavg } from 'node:os';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { layerKvWithNew } from '../src/trace/trace.js';
import { replayLayer, traceNeedles } from '../src/eval/replay.js';

const CONTEXT = Number(process.argv[2] ?? 131130);
const STEPS = Number(process.argv[3] ?? 24);
const SEEDS = (process.argv[4] ?? '1,11').split(',').map(Number);
const BUDGET = Number(process.argv[5] ?? 2048);
const SEGMENT = 4096;
const LOCAL = 64;
// The first decode step whose extend seals a segment's last chunk: tokens - local crosses a multiple
// of the segment (chunks of 4 tokens; the sinks only shorten the first segment).
const fillStep = Array.from({ length: STEPS }, (_, s) => s).find((s) => {
  const before = Math.floor((CONTEXT + s - LOCAL) / 4);
  const after = Math.floor((CONTEXT + s + 1 - LOCAL) / 4);
  return Math.floor(after / (SEGMENT / 4)) > Math.floor(before / (SEGMENT / 4));
});
if (fillStep === undefined) throw new Error(`no segment fills in ${STEPS} steps after ${CONTEXT} tokens: pick another context`);

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
console.log(`| seed | reclusterDelay | fill step (extend + select) ms | worst other step: ms (step) | median step ms | mean step ms | recall / oracle, steps after the fill | all steps |`);
console.log(`|---|---:|---:|---:|---:|---:|---:|---:|`);
for (const seed of SEEDS) {
  const trace = generateSyntheticTrace({ layers: 1, promptTokens: CONTEXT, decodeSteps: STEPS, qHeads: 32, kvHeads: 8, headDim: 128, dtype: 'f16', seed });
  const t = await trace.layer(0);
  const { k, v } = layerKvWithNew(t);
  const layer = { layer: 0, promptTokens: CONTEXT, decodeSteps: STEPS, qHeads: 32, k, v, q: t.q };
  const needles = await traceNeedles(trace);
  // Alternated order over two rounds so neither setting always runs on a warmer machine.
  for (const delays of [[0, 256], [256, 0]])
    for (const reclusterDelay of delays) {
      const r = await replayLayer(layer, { policies: ['kvdrive'], budget: BUDGET, offloaded: true, denseThreads: 2, needles, policyOptions: { reclusterDelay, segmentTokens: SEGMENT, local: LOCAL } });
      const steps = r.byPolicy.get('kvdrive')!.steps;
      const ms = steps.map((s) => s.selectMs);
      const ratio = (xs: typeof steps) => xs.reduce((a, s) => a + s.recall, 0) / xs.reduce((a, s) => a + s.oracleRecall, 0);
      const others = ms.map((x, i) => [x, i] as const).filter(([, i]) => i !== fillStep);
      const [worst, at] = others.reduce((a, b) => (b[0] > a[0] ? b : a));
      const mean = ms.reduce((a, b) => a + b, 0) / ms.length;
      console.log(`| ${seed} | ${reclusterDelay} | ${ms[fillStep]!.toFixed(2)} | ${worst.toFixed(2)} (${at}) | ${median(ms).toFixed(2)} | ${mean.toFixed(2)} | ` +
        `${ratio(steps.slice(fillStep)).toFixed(4)} | ${ratio(steps).toFixed(4)} |`);
    }
}
console.log(`\ncontext ${CONTEXT}, ${STEPS} steps (fill at step ${fillStep}), budget ${BUDGET}; load average after: ${loadavg().map((x) => x.toFixed(1)).join(' ')}`);
