/**
 * Hot-tier kernel costs (a few seconds in all).
 *
 * 1. attend: sparse attention of one layer reading the selected chunks from hot-tier slots
 *    (HotTier.attend, every chunk resident) against attendSparse over the contiguous KV (the
 *    baseline, bit-identical output), interleaved; reported as the median paired baseline / ours.
 * 2. fetch: one decode step's hit/miss evaluation + lookahead eviction + admission with ~20% of the
 *    selected chunks new (the measured steady-state miss rate at window ×2), as time per step and
 *    relative to the attention of the same step (what the F stage adds to C).
 *
 * Shape: 16384 tokens, 8 kv heads, 32 query heads, head dim 128, f16, budget 2048 tokens per kv
 * head (chunk 4), window ×2.
 *
 * Run: npm run build:ts && node dist/bench/hot-tier-attend.js
 */
import { attendSparse } from '../src/attention/kernels.js';
import { HotTier } from '../src/cache/hot-tier.js';
import type { Selection } from '../src/index/selection.js';
import type { KvTensor } from '../src/types.js';
import { f32ArrayToF16 } from '../src/util/f16.js';
import { median } from './bench-util.js';

const T = 16384, H = 8, Hq = 32, D = 128, c = 4, K = 2048;

function lcg(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (Math.imul(a, 1664525) + 1013904223) >>> 0;
    return a / 2 ** 32;
  };
}
const r = lcg(1);
function kv(): KvTensor {
  const f = Float32Array.from({ length: T * H * D }, () => r() * 2 - 1);
  return { data: f32ArrayToF16(f), dtype: 'f16', tokens: T, heads: H, dim: D };
}
const k = kv();
const v = kv();
const q = Float32Array.from({ length: Hq * D }, () => r() * 2 - 1);

/** Per kv head: K/c chunks from a working set that shifts by `fresh` of its chunks each call. */
const nChunks = T / c;
const per = K / c;
const working: number[][] = Array.from({ length: H }, () => {
  const s = new Set<number>();
  while (s.size < per) s.add(1 + Math.floor(r() * (nChunks - 20)));
  return [...s];
});
function nextSelection(fresh: number): Selection {
  const ids: number[] = [];
  const offsets = new Int32Array(H + 1);
  for (let h = 0; h < H; h++) {
    const w = working[h]!;
    const set = new Set(w);
    for (let i = 0; i < Math.round(per * fresh); i++) {
      const at = Math.floor(r() * w.length);
      let id: number;
      do id = 1 + Math.floor(r() * (nChunks - 20));
      while (set.has(id));
      set.delete(w[at]!);
      set.add(id);
      w[at] = id;
    }
    ids.push(...[...set].sort((a, b) => a - b));
    offsets[h + 1] = ids.length;
  }
  return { chunkSize: c, tokens: T, sinkEnd: 4, tailStart: T - 64, offsets, chunkIds: Int32Array.from(ids) };
}

const tier = new HotTier({ layers: 1, kvHeads: H, headDim: D, dtype: 'f16', chunkSize: c, budget: K, windows: 2, maxBytes: 1 << 30 });
const sel = nextSelection(0);
tier.fetch({ layer: 0, k, v, selection: sel });

// The machine is shared and its load swings within seconds, so the tasks are interleaved (A, B, A,
// B, ...) rather than run one after the other, and medians of the per-iteration times and of the
// paired ratios are reported.
function time(fn: () => void): number {
  const t0 = performance.now();
  fn();
  return performance.now() - t0;
}
const min = (xs: number[]) => Math.min(...xs);
const steps = Array.from({ length: 64 }, () => nextSelection(0.2));
const base: number[] = [];
const ours: number[] = [];
const fetch: number[] = [];
const ratio: number[] = [];
for (let it = 0; it < 80; it++) {
  const a = time(() => attendSparse({ q, qHeads: Hq, k, v, selection: sel }));
  const b = time(() => tier.attend({ layer: 0, k, v, q, qHeads: Hq, selection: sel }));
  if (it < 5) continue; // warm-up
  base.push(a);
  ours.push(b);
  ratio.push(a / b);
}
// fetch on a second tier so the attention tier keeps every chunk of `sel` resident.
const tier2 = new HotTier({ layers: 1, kvHeads: H, headDim: D, dtype: 'f16', chunkSize: c, budget: K, windows: 2, maxBytes: 1 << 30 });
tier2.fetch({ layer: 0, k, v, selection: sel });
for (let it = 0; it < steps.length; it++) {
  const f = time(() => tier2.fetch({ layer: 0, k, v, selection: steps[it]! }));
  if (it >= 4) fetch.push(f);
}
console.log(`attendSparse (contiguous KV, baseline)               median ${median(base).toFixed(3)} ms/step (min ${min(base).toFixed(3)})`);
console.log(`HotTier.attend (chunks from slots)                   median ${median(ours).toFixed(3)} ms/step (min ${min(ours).toFixed(3)})`);
console.log(`HotTier.fetch (20% new chunks, lookahead eviction)   median ${median(fetch).toFixed(3)} ms/step`);
console.log(`slot-read attention vs contiguous: median paired ratio ${median(ratio).toFixed(2)}× (baseline time / ours; >1 = slots faster)`);
console.log(`fetch cost relative to one slot-read attention: ${(median(fetch) / median(ours)).toFixed(2)}×`);
console.log(`check: ${tier.check() || tier2.check() || 'slot maps consistent'}`);
tier.destroy();
tier2.destroy();
