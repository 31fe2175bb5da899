// native.attendStaged (compute over SSD-staged page-first chunks + DRAM sinks/tail): bit-identical
// to attendSparse over a cache holding the same rows; the staged copy is what is read (DRAM values
// of staged chunks may be NaN); typed errors for bad input.
import { describe, expect, it } from 'vitest';
import { native } from '../src/native.js';
import { attendSparse } from '../src/attention/kernels.js';
import type { Selection } from '../src/index/selection.js';
import type { KvTensor } from '../src/types.js';
import { expectKvdError, randn } from './helpers.js';

const H = 2, D = 8, Q = 4, C = 4, T = 64, MAXC = 6;
const kv = (data: Float32Array): KvTensor => ({ data, dtype: 'f32', tokens: T, heads: H, dim: D });
const sel: Selection = { chunkSize: C, tokens: T, sinkEnd: 4, tailStart: 48, offsets: Int32Array.from([0, 3, 5]), chunkIds: Int32Array.from([2, 5, 11, 1, 13]) };

/** Page-first staging of every selected chunk with id < staged, laid out as the fetch stage does. */
function stage(k: Float32Array, v: Float32Array, staged: number): Uint8Array {
  const out = new Float32Array(H * MAXC * 2 * C * D);
  for (let h = 0; h < H; h++)
    for (let i = sel.offsets[h]!; i < sel.offsets[h + 1]!; i++) {
      const c = sel.chunkIds[i]!;
      if (c >= staged) continue;
      const base = (h * MAXC + (i - sel.offsets[h]!)) * 2 * C * D;
      for (let r = 0; r < C; r++) {
        const src = ((c * C + r) * H + h) * D;
        out.set(k.subarray(src, src + D), base + r * D);
        out.set(v.subarray(src, src + D), base + (C + r) * D);
      }
    }
  return new Uint8Array(out.buffer);
}

describe('attendStaged', () => {
  const k = randn(T * H * D, 1);
  const v = randn(T * H * D, 2);
  const q = randn(Q * D, 3);
  const ref = attendSparse({ q, qHeads: Q, k: kv(k), v: kv(v), selection: sel });

  it('equals attendSparse bit for bit, reading staged chunks (their DRAM values poisoned) and newer chunks from DRAM', async () => {
    const staged = stage(k, v, 12); // chunks 1, 2, 5, 11 staged; 13 stays in DRAM
    const poisoned = v.slice();
    for (const c of [1, 2, 5, 11]) poisoned.fill(NaN, c * C * H * D, (c + 1) * C * H * D);
    const r = native.attendStaged({ q, qHeads: Q, k: kv(k), v: kv(poisoned), selection: sel, staged, stagedChunks: 12, maxChunksPerHead: MAXC }) as { out: Float32Array; lse: Float32Array };
    expect(Buffer.from(r.out.buffer).equals(Buffer.from(ref.out.buffer))).toBe(true);
    expect(Buffer.from(r.lse.buffer).equals(Buffer.from(ref.lse.buffer))).toBe(true);
    // reading those chunks from DRAM instead hits the poison
    await expectKvdError(
      () => native.attendStaged({ q, qHeads: Q, k: kv(k), v: kv(poisoned), selection: sel, staged, stagedChunks: 0, maxChunksPerHead: MAXC }),
      'E_NONFINITE',
      /NaN\/Inf in a value row/,
    );
  });

  it('rejects bad input with typed errors', async () => {
    const staged = stage(k, v, 12);
    const ok = { q, qHeads: Q, k: kv(k), v: kv(v), selection: sel, staged, stagedChunks: 12, maxChunksPerHead: MAXC };
    await expectKvdError(() => native.attendStaged({ ...ok, qHeads: 3 }), 'E_SHAPE', /qHeads: expected a multiple of the kv heads \(2\), got 3/);
    await expectKvdError(() => native.attendStaged({ ...ok, q: new Float32Array(5) }), 'E_SHAPE', /q \(qHeads\*dim\)/);
    await expectKvdError(() => native.attendStaged({ ...ok, maxChunksPerHead: 2 }), 'E_RANGE', /expected at most maxChunksPerHead = 2 chunks for kv head 0, got 3/);
    await expectKvdError(() => native.attendStaged({ ...ok, staged: new Uint8Array(16) }), 'E_SHAPE', /staged: expected at least kvHeads x maxChunksPerHead x chunkBytes/);
    await expectKvdError(() => native.attendStaged({ ...ok, stagedChunks: 17 }), 'E_RANGE', /stagedChunks/);
    await expectKvdError(() => native.attendStaged({ ...ok, selection: { ...sel, chunkIds: Int32Array.from([2, 2, 11, 1, 13]) } }), 'E_RANGE', /expected ascending unique chunk ids/);
    await expectKvdError(() => native.attendStaged({ ...ok, k: { ...kv(k), dtype: 'f16', data: new Uint16Array(T * H * D) } }), 'E_DTYPE', /expected f32 k and v/);
    await expectKvdError(() => native.attendStaged({ ...ok, scale: -1 }), 'E_RANGE', /scale/);
    await expectKvdError(() => native.attendStaged(undefined), 'E_TYPE', /expected an options object/);
  });
});
