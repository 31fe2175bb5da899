// The DRAM-only step's two ways to select (src/pipeline/step.ts, setSelectInAttention): inside the
// attention call (attendFetched's `select`, the default) or selectIndex, then attendFetched with
// that selection. Two runtimes decode the same inputs, one each way: every step's selection and
// output are the same bits, and only the second calls selectIndex.
import { afterEach, describe, expect, it, vi } from 'vitest';
import { native } from '../src/native.js';
import { setSelectInAttention } from '../src/pipeline/step.js';
import { openRuntime } from '../src/runtime/runtime.js';
import type { KvTensor } from '../src/types.js';
import { randn } from './helpers.js';

const shape = { layers: 2, qHeads: 8, kvHeads: 2, headDim: 16 };
const row = shape.kvHeads * shape.headDim;
const PROMPT = 700;
const STEPS = 24;
const bits = (a: Float32Array | Int32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');
const kvt = (data: Float32Array, tokens: number): KvTensor => ({ data, dtype: 'f32', tokens, heads: shape.kvHeads, dim: shape.headDim });

afterEach(() => {
  setSelectInAttention(true);
  vi.restoreAllMocks();
});

describe('select inside the attention call', () => {
  it('gives the selections and outputs of selectIndex then attendFetched, bit for bit, every step and layer', async () => {
    const opts = { shape, budget: 64, mode: 'sequential' as const, maxSequences: 1, maxTokens: PROMPT + STEPS };
    const rts = [await openRuntime(opts), await openRuntime(opts)];
    const seqs = rts.map((rt) => rt.createSequence());
    for (const [r, rt] of rts.entries())
      for (let l = 0; l < shape.layers; l++) await rt.prefill(seqs[r]!, l, kvt(randn(PROMPT * row, 10 + l), PROMPT), kvt(randn(PROMPT * row, 20 + l), PROMPT));
    const selects = vi.spyOn(native, 'selectIndex');
    const calls = [0, 0];
    try {
      for (let t = 0; t < STEPS; t++)
        for (let l = 0; l < shape.layers; l++) {
          const entry = { q: randn(shape.qHeads * shape.headDim, 1000 + 10 * t + l), kNew: randn(row, 2000 + 10 * t + l), vNew: randn(row, 3000 + 10 * t + l) };
          const got = [];
          for (const [r, rt] of rts.entries()) {
            setSelectInAttention(r === 0);
            const before = selects.mock.calls.length;
            got.push((await rt.attendTraced(l, [{ seq: seqs[r]!, ...entry }]))[0]!);
            calls[r]! += selects.mock.calls.length - before;
          }
          expect(bits(got[0]!.out)).toBe(bits(got[1]!.out));
          expect(bits(got[0]!.selection.offsets)).toBe(bits(got[1]!.selection.offsets));
          expect(bits(got[0]!.selection.chunkIds)).toBe(bits(got[1]!.selection.chunkIds));
          expect(got[0]!.bytesScored).toBe(got[1]!.bytesScored);
        }
      expect(calls).toEqual([0, STEPS * shape.layers]);
    } finally {
      for (const rt of rts) await rt.close();
    }
  });
});
