/**
 * The span-attention kernel takes one pass with an online softmax: each 16-row tile's exponentials
 * are taken against the running max, and earlier tiles' sums and outputs are rescaled when a later
 * tile raises it. These tests build logits that rise steeply across tiles (every tile rescales the
 * ones before, early tiles end up with ~e-30 of the mass), then peak and fall, and check outputs,
 * lse and per-chunk masses against the float64 reference at every SIMD level.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { attendDense, attendSparse, cpuFeatures, setSimdLevel } from '../src/index.js';
import { type SimdLevel } from '../src/native.js';
import { encode, referenceAttention, relErr, selectedTokens, selectionOf, type TestKv } from './attention-reference.js';
import { randn } from './helpers.js';

const levels = cpuFeatures().levels as SimdLevel[];
afterAll(() => {
  setSimdLevel('best');
});

const kvHeads = 2;
const group = 4;
const qHeads = kvHeads * group;
const dim = 32;
const tokens = 230; // 14 full tiles of 16 and a partial one

/** Keys whose logits against q follow `shape(t)` (plus small noise), f16-encoded. */
function rampKeys(q: Float32Array, shape: (t: number) => number): TestKv {
  const noise = randn(tokens * kvHeads * dim, 41);
  const raw = new Float32Array(tokens * kvHeads * dim);
  for (let t = 0; t < tokens; t++)
    for (let h = 0; h < kvHeads; h++) {
      // Direction: the group's mean query, so every query head of the group sees the ramp.
      const dir = new Float64Array(dim);
      for (let j = 0; j < group; j++) for (let d = 0; d < dim; d++) dir[d]! += q[((h * group + j) * dim) + d]! / group;
      const norm = Math.sqrt(dir.reduce((s, x) => s + x * x, 0));
      for (let d = 0; d < dim; d++) raw[(t * kvHeads + h) * dim + d] = (shape(t) * dir[d]!) / norm + 0.05 * noise[(t * kvHeads + h) * dim + d]!;
    }
  const { data, exact } = encode(raw, 'f16');
  return { tensor: { data, dtype: 'f16', tokens, heads: kvHeads, dim }, values: exact };
}

function values(): TestKv {
  const { data, exact } = encode(randn(tokens * kvHeads * dim, 43), 'f16');
  return { tensor: { data, dtype: 'f16', tokens, heads: kvHeads, dim }, values: exact };
}

describe('online softmax across tiles', () => {
  const q = randn(qHeads * dim, 40);
  const v = values();
  // Logit scale is ~ shape(t) * |q| / sqrt(dim): a rise of ~40 over the context, a peak at 180.
  const shapes: [string, (t: number) => number][] = [
    ['rising', (t) => t / 6],
    ['rising then falling', (t) => (t < 180 ? t / 6 : (360 - t) / 6)],
  ];
  for (const level of levels)
    for (const [name, shape] of shapes)
      it(`${name} logits: out, lse and chunk masses match the reference (${level})`, () => {
        setSimdLevel(level);
        const k = rampKeys(q, shape);
        const dense = attendDense({ q, qHeads, k: k.tensor, v: v.tensor });
        const ref = referenceAttention(q, qHeads, k, v, () => Array.from({ length: tokens }, (_, t) => t));
        expect(relErr(dense.out, ref.out)).toBeLessThan(1e-5);
        expect(relErr(dense.lse, ref.lse)).toBeLessThan(1e-5);

        // Chunks of 4 tokens spread over the ramp: masses range from ~1e-30 to most of the total.
        const perHead = [
          [0, 3, 10, 20, 30, 40, 44, 45, 46, 50],
          [2, 7, 15, 33, 41, 43, 47, 52],
        ];
        const sel = selectionOf(perHead, tokens, 4, 4, tokens - 16);
        const res = attendSparse({ q, qHeads, k: k.tensor, v: v.tensor, selection: sel });
        const sref = referenceAttention(q, qHeads, k, v, (h) => selectedTokens(sel, h));
        expect(relErr(res.out, sref.out)).toBeLessThan(1e-5);
        expect(relErr(res.lse, sref.lse)).toBeLessThan(1e-5);
        let total = 0;
        for (let h = 0; h < kvHeads; h++)
          for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) {
            const c = sel.chunkIds[i]!;
            let mass = 0;
            for (let j = 0; j < group; j++) {
              const p = sref.probs[h * group + j]!;
              for (let t = Math.max(c * 4, sel.sinkEnd); t < Math.min(c * 4 + 4, sel.tailStart); t++) mass += p.get(t)!;
            }
            mass /= group;
            total += mass;
            expect(Math.abs(res.chunkMass[i]! - mass)).toBeLessThanOrEqual(1e-6 * Math.max(mass, 1e-3));
          }
        expect(total).toBeGreaterThan(0.05); // the selection holds real mass, not only the tails
      });
});
