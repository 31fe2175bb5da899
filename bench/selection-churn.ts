/**
 * How many chunks a decode step needs that the recent steps did not: the reads no cache in front
 * of the SSD can save, whatever its size or eviction policy, unless it holds those chunks before
 * they are ever selected (the DRAM tier's bytes). Replays the runtime's own selections (kvdrive,
 * `offloadedPolicyOptions`: key-sketch re-rank, single tokens, each step's selection the next one's
 * prior, as step.ts sets it) on one layer of the demo's synthetic trace (Llama-3-8B layer shape),
 * and counts per (kv head, step), in the tiers' unit (chunks of 4 tokens):
 *   - selected: distinct chunks holding the step's selected tokens;
 *   - new vs the last 1 / 3 steps, and never selected before in the replay (first-time chunks);
 *   - misses of a chunk cache of W windows per kv head (W x budget / chunk slots) that keeps every
 *     chunk the step selected and evicts the least recently selected: the hot tier's lookahead
 *     eviction when residents not attended at the latest step all have mass 0, as they do; with the
 *     lookahead pool of the paper (M = 1.25 / 2 x budget, kept until last, worst rank first) too.
 * Steps before `--warm` (default 4) fill the caches and are not counted. Selections only: no
 * attention, no tier, no timing.
 *
 *   npm run build:ts && node dist/bench/selection-churn.js [--context 131072] [--budget 2048]
 *        [--steps 24] [--seeds 3,11] [--windows 3,6,12] [--warm 4]
 */
import { parseArgs } from 'node:util';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { layerKvWithNew } from '../src/trace/trace.js';
import { prefixView } from '../src/eval/replay.js';
import { createPolicy } from '../src/index/policy.js';
import { offloadedPolicyOptions } from '../src/index/options.js';
import type { Selection } from '../src/index/selection.js';

const { values: a } = parseArgs({
  options: {
    context: { type: 'string', default: '131072' },
    budget: { type: 'string', default: '2048' },
    steps: { type: 'string', default: '24' },
    seeds: { type: 'string', default: '3,11' },
    windows: { type: 'string', default: '3,6,12' },
    warm: { type: 'string', default: '4' },
  },
});
const T = Number(a.context);
const B = Number(a.budget);
const S = Number(a.steps);
const WARM = Number(a.warm);
const WINDOWS = a.windows.split(',').map(Number);
const POOLS = [1.25, 2];
const CHUNK = 4; // the tiers' unit (the runtime's chunkSize)
const [H, D, QH] = [8, 128, 32];

/** A chunk cache of one kv head: chunk -> step it was last selected at. */
class ChunkCache {
  readonly last = new Map<number, number>();
  misses = 0;
  constructor(readonly slots: number) {}
  /** Selects `chunks` at step `s` (misses counted when `count`); `pool`: chunk -> rank, kept until last. */
  step(chunks: Set<number>, s: number, count: boolean, pool?: Map<number, number>): void {
    for (const c of chunks) {
      if (!this.last.has(c) && count) this.misses++;
      this.last.set(c, s);
    }
    let over = this.last.size - this.slots;
    if (over <= 0) return;
    // Victims: not selected now; outside the pool least recently selected first, then pool members
    // worst rank first.
    const victims = [...this.last.entries()].filter(([c]) => !chunks.has(c));
    const rank = (c: number) => pool?.get(c) ?? -1;
    victims.sort((x, y) => {
      const [px, py] = [rank(x[0]), rank(y[0])];
      if (px >= 0 !== py >= 0) return px >= 0 ? 1 : -1;
      return px >= 0 ? py - px : x[1] - y[1];
    });
    for (let i = 0; over > 0 && i < victims.length; i++, over--) this.last.delete(victims[i]![0]);
  }
}

function chunksOf(ids: Int32Array, from: number, to: number, limit: number): Set<number> {
  const out = new Set<number>();
  for (let i = from; i < to; i++) if (ids[i]! < limit) out.add(Math.floor(ids[i]! / CHUNK));
  return out;
}

console.log(`context ${T}, budget ${B} tokens per kv head, ${S} steps (first ${WARM} not counted), chunks of ${CHUNK} tokens; per (kv head, step):`);
for (const seed of a.seeds.split(',').map(Number)) {
  const trace = generateSyntheticTrace({ layers: 1, promptTokens: T, decodeSteps: S, qHeads: QH, kvHeads: H, headDim: D, dtype: 'f16', seed });
  const layer = await trace.layer(0);
  const { k } = layerKvWithNew(layer);
  const policy = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { qHeads: QH, kvHeads: H, headDim: D }));
  await policy.build(prefixView(k, T), T);
  const window = Math.ceil(B / CHUNK);
  const caches = WINDOWS.map((w) => ({ w, pool: 0, heads: Array.from({ length: H }, () => new ChunkCache(w * window)) }));
  for (const pool of POOLS) caches.push({ w: WINDOWS[0]!, pool, heads: Array.from({ length: H }, () => new ChunkCache(WINDOWS[0]! * window)) });
  const history: Set<number>[][] = Array.from({ length: H }, () => []);
  const ever = Array.from({ length: H }, () => new Set<number>());
  const sum = { selected: 0, new1: 0, new3: 0, first: 0, n: 0 };
  let prior: Selection | null = null;
  for (let s = 0; s < S; s++) {
    const tokens = T + s + 1;
    policy.extend(prefixView(k, tokens), tokens);
    policy.setPrior(prior);
    const sel = policy.select(layer.q.subarray(s * QH * D, (s + 1) * QH * D), B, { pool: Math.round(B * Math.max(...POOLS)) });
    prior = { ...sel, poolOffsets: undefined, poolIds: undefined, poolScores: undefined };
    const count = s >= WARM;
    for (let h = 0; h < H; h++) {
      // Sealed prompt chunks only (the open tail is always attended from DRAM).
      const cur = chunksOf(sel.chunkIds, sel.offsets[h]!, sel.offsets[h + 1]!, T);
      const hist = history[h]!;
      if (count) {
        const fresh = (w: number) => [...cur].filter((c) => !hist.slice(-w).some((p) => p.has(c))).length;
        sum.selected += cur.size;
        sum.new1 += fresh(1);
        sum.new3 += fresh(3);
        sum.first += [...cur].filter((c) => !ever[h]!.has(c)).length;
        sum.n++;
      }
      for (const c of cur) ever[h]!.add(c);
      hist.push(cur);
      for (const cache of caches) {
        let pool: Map<number, number> | undefined;
        if (cache.pool) {
          pool = new Map();
          const [p0, p1] = [sel.poolOffsets![h]!, Math.min(sel.poolOffsets![h + 1]!, sel.poolOffsets![h]! + Math.round(B * cache.pool))];
          for (let i = p0; i < p1; i++) {
            const c = Math.floor(sel.poolIds![i]! / CHUNK);
            if (sel.poolIds![i]! < T && !pool.has(c)) pool.set(c, i - p0);
          }
        }
        cache.heads[h]!.step(cur, s, count, pool);
      }
    }
  }
  const per = (x: number) => (x / sum.n).toFixed(1);
  console.log(
    `seed ${seed}: selected ${per(sum.selected)} chunks; new vs the last step ${per(sum.new1)}, vs the last 3 ${per(sum.new3)}, never selected before ${per(sum.first)}`,
  );
  for (const c of caches) {
    const misses = c.heads.reduce((t, x) => t + x.misses, 0);
    console.log(`  cache of ${c.w} windows (${c.w * window} chunks)${c.pool ? `, lookahead pool ${c.pool} x budget kept` : ''}: ${per(misses)} misses (${((misses / sum.selected) * 100).toFixed(1)}% of selected)`);
  }
}
