/**
 * Replays the decode steps of a small synthetic trace through a kvdrive policy (keyed or keyless)
 * as a decode does (each step's selection the next one's prior), and scores every step against
 * dense attention: recall / oracle, planted needles found. Shared by
 * the re-rank and key-sketch tests.
 */
import { type PolicyOptions, type Selection } from '../src/index.js';
import { createPolicy } from '../src/index/policy.js';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { layerKvWithNew } from '../src/trace/trace.js';
import { prefixView, traceNeedles } from '../src/eval/replay.js';
import { attendedMask, massRecall, oracleMask } from '../src/eval/metrics.js';
import { attentionWeights } from '../src/attention/kernels.js';
import type { KvTensor } from '../src/types.js';

export interface TraceReplay {
  k: KvTensor;
  qAt: (step: number) => Float32Array;
  replay: (options: PolicyOptions, keyed: boolean) => Promise<{ ratio: number; found: number; total: number; sels: Selection[]; stats: ReturnType<ReturnType<typeof createPolicy>['lastSelectStats']>; bytes: number }>;
}

export async function traceReplay(o: { T: number; steps: number; budget: number; shape: { qHeads: number; kvHeads: number; headDim: number }; seed: number }): Promise<TraceReplay> {
  const { T, steps, budget, shape } = o;
  const trace = generateSyntheticTrace({ layers: 1, promptTokens: T, decodeSteps: steps, ...shape, dtype: 'f16', seed: o.seed });
  const layer = await trace.layer(0);
  const { k } = layerKvWithNew(layer);
  const needles = await traceNeedles(trace);
  const qAt = (s: number) => layer.q.subarray(s * shape.qHeads * shape.headDim, (s + 1) * shape.qHeads * shape.headDim);
  const replay: TraceReplay['replay'] = async (options, keyed) => {
    const p = createPolicy('kvdrive', { ...options, ...shape });
    await p.build(prefixView(k, T), T);
    let recall = 0;
    let oracle = 0;
    let found = 0;
    let total = 0;
    const sels: Selection[] = [];
    for (let s = 0; s < steps; s++) {
      const tokens = T + s + 1;
      const kv = prefixView(k, tokens);
      p.extend(kv, tokens);
      const sel = p.select(qAt(s), budget, keyed ? { keys: kv } : undefined);
      sels.push(sel);
      p.setPrior(sel); // the next step starts from this selection, as a decode's does
      const w = attentionWeights({ q: qAt(s), qHeads: shape.qHeads, k: kv });
      const mask = attendedMask(sel, shape.kvHeads);
      recall += massRecall(w, mask, shape.qHeads, shape.kvHeads, tokens);
      oracle += massRecall(w, oracleMask(w, shape.qHeads, shape.kvHeads, tokens, sel.sinkEnd, sel.tailStart, budget), shape.qHeads, shape.kvHeads, tokens);
      for (const n of needles) {
        if (s < n.firstStep || s > n.lastStep) continue;
        total++;
        if (mask[n.kvHead * tokens + n.token]) found++;
      }
    }
    return { ratio: recall / oracle, found, total, sels, stats: p.lastSelectStats(), bytes: p.indexBytes() };
  };
  return { k, qAt, replay };
}
