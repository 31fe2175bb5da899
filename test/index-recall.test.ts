import { describe, expect, it } from 'vitest';
import { createPolicy, type PolicyName, type Selection } from '../src/index.js';
import { chunkOracleMass, denseGroupProbs, oracleMass, structuredCase } from './index-data.js';

// 8192 tokens, GQA 8/2, head dim 32: keys in topic runs, 4 planted 12-token needles per kv head.
const CASE = structuredCase({ tokens: 8192, kvHeads: 2, qHeads: 8, dim: 32, seed: 4 });
const BUDGET = 256;

/** Attention mass (group-averaged probability) of the selected chunks of kv head h. */
function selectedMass(sel: Selection, h: number, p: Float64Array): number {
  let s = 0;
  for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) {
    const j = sel.chunkIds[i]!;
    for (let t = Math.max(j * sel.chunkSize, sel.sinkEnd); t < Math.min((j + 1) * sel.chunkSize, sel.tailStart); t++) s += p[t]!;
  }
  return s;
}

async function evaluate(name: PolicyName, options = {}) {
  const c = CASE;
  const policy = createPolicy(name, options);
  await policy.build({ data: c.keys, dtype: 'f32', tokens: c.tokens, heads: c.kvHeads, dim: c.dim }, c.tokens);
  let got = 0;
  let tokenOracle = 0;
  let chunkOracle = 0;
  let needleChunks = 0;
  let needleChunksFound = 0;
  let vectors = 0;
  for (const q of c.queries) {
    const sel = policy.select(q, BUDGET);
    vectors += policy.lastSelectStats().vectorsScored;
    const probs = denseGroupProbs(c, q);
    for (let h = 0; h < c.kvHeads; h++) {
      got += selectedMass(sel, h, probs[h]!);
      tokenOracle += oracleMass(probs[h]!, sel.sinkEnd, sel.tailStart, BUDGET);
      chunkOracle += chunkOracleMass(probs[h]!, sel.sinkEnd, sel.tailStart, sel.chunkSize, BUDGET);
      const ids = new Set(sel.chunkIds.subarray(sel.offsets[h]!, sel.offsets[h + 1]!));
      // A needle is retrieved when every chunk lying wholly inside it is selected.
      for (const [a, b] of c.needles[h]!) {
        for (let j = Math.ceil(a / sel.chunkSize); (j + 1) * sel.chunkSize <= b; j++) {
          needleChunks++;
          if (ids.has(j)) needleChunksFound++;
        }
      }
    }
  }
  return {
    recall: got / tokenOracle,
    recallOfChunkOracle: got / chunkOracle,
    needleChunks,
    needleChunksFound,
    vectorsPerStep: vectors / c.queries.length,
  };
}

describe('selection recall on structured keys with planted needles (8192 tokens, budget 256)', () => {
  it('kvdrive retrieves every needle and matches scoring all chunk means at a fraction of the vectors', async () => {
    const r = await evaluate('kvdrive');
    const all = await evaluate('shadowkv', { chunkSize: 4 }); // every chunk mean scored, same chunks
    const quest = await evaluate('quest');
    const shadow = await evaluate('shadowkv');
    console.log(
      `recall vs token oracle (vs best chunk set): kvdrive ${r.recall.toFixed(4)} (${r.recallOfChunkOracle.toFixed(4)}), ` +
        `${r.vectorsPerStep} vectors/step; all c=4 chunk means ${all.recall.toFixed(4)}, ${all.vectorsPerStep}; ` +
        `shadowkv c=8 ${shadow.recall.toFixed(4)}, ${shadow.vectorsPerStep}; quest ${quest.recall.toFixed(4)}, ${quest.vectorsPerStep}`,
    );
    expect(r.needleChunks).toBeGreaterThan(0);
    expect(r.needleChunksFound).toBe(r.needleChunks);
    // The hierarchy (centroids, then the candidates' chunk means) loses < 1% against scoring every
    // chunk mean, while scoring under half as many vectors.
    expect(r.recall).toBeGreaterThanOrEqual(0.99 * all.recall);
    expect(r.vectorsPerStep).toBeLessThan(0.5 * all.vectorsPerStep);
    // Against the best chunk set at the same budget and against exact top-K tokens. Measured 0.955
    // and 0.946 here: BELOW the 0.97 target. The hierarchy is not the cause (it equals scoring every
    // chunk mean); ranking by q·mean is: a chunk straddling a needle edge has its one or two strong
    // keys averaged away. These bounds guard against regressions; raising them needs a better
    // level-2 score than the chunk mean.
    expect(r.recallOfChunkOracle).toBeGreaterThanOrEqual(0.95);
    expect(r.recall).toBeGreaterThanOrEqual(0.94);
    expect(r.recall).toBeGreaterThan(quest.recall);
  });

  it('cluster-only ranking (candidateFactor 1) does not beat the chunk re-rank', async () => {
    const coarse = await evaluate('kvdrive', { candidateFactor: 1 });
    const fine = await evaluate('kvdrive');
    console.log(`kvdrive recall: candidateFactor 1 ${coarse.recall.toFixed(4)}, default ${fine.recall.toFixed(4)}`);
    expect(fine.recall).toBeGreaterThanOrEqual(coarse.recall);
    expect(fine.vectorsPerStep).toBeGreaterThan(coarse.vectorsPerStep);
  });
});
