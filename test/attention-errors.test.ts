import { describe, expect, it } from 'vitest';
import { type KvTensor } from '../src/index.js';
import { attendDense, attendSparse, mergeAttention, attendDenseAsync, attendSparseAsync, attentionWeights, memoryRead, memoryGather, computePeak } from '../src/attention/kernels.js';
import { expectKvdError, randn } from './helpers.js';
import { allChunks, randomKv, selectionOf } from './attention-reference.js';

const kvHeads = 2;
const qHeads = 4;
const dim = 8;
const tokens = 40;
const k = randomKv(tokens, kvHeads, dim, 'f16', 1).tensor;
const v = randomKv(tokens, kvHeads, dim, 'f16', 2).tensor;
const q = randn(qHeads * dim, 3);
const sel = allChunks(tokens, kvHeads, 4, 4, tokens - 8);

function withBadValue(kv: KvTensor, token: number, head: number, bits: number): KvTensor {
  const data = (kv.data as Uint16Array).slice();
  data[(token * kv.heads + head) * kv.dim + 3] = bits;
  return { ...kv, data };
}

describe('attention input validation', () => {
  it('rejects a q of the wrong length', async () => {
    await expectKvdError(() => attendDense({ q: q.subarray(1), qHeads, k, v }), 'E_SHAPE', /q \(qHeads\*dim\): expected 32 elements, got 31/);
    await expectKvdError(() => attendSparse({ q: q.subarray(1), qHeads, k, v, selection: sel }), 'E_SHAPE', /expected 32 elements/);
  });

  it('rejects the wrong TypedArray types', async () => {
    await expectKvdError(() => attendDense({ q: new Float64Array(32) as never, qHeads, k, v }), 'E_DTYPE', /q: expected a Float32Array, got a Float64Array/);
    await expectKvdError(() => attendDense({ q: Array.from(q) as never, qHeads, k, v }), 'E_TYPE', /q: expected a Float32Array, got a plain Array/);
    await expectKvdError(
      () => attendDense({ q, qHeads, k: { ...k, data: new Float32Array(k.data.length) }, v }),
      'E_DTYPE',
      /k\.data \(f16 bits\): expected a Uint16Array, got a Float32Array/,
    );
    await expectKvdError(() => attendDense({ q, qHeads, k, v: { ...v, dtype: 'bf16' } }), 'E_DTYPE', /v\.dtype: expected the dtype of k \('f16'\), got 'bf16'/);
    await expectKvdError(() => attendDense({ q, qHeads, k: { ...k, dtype: 'f8' as never }, v }), 'E_DTYPE', /expected dtype 'f32', 'f16' or 'bf16', got 'f8'/);
    await expectKvdError(() => attendDense(q as never), 'E_TYPE', /expected an options object/);
    await expectKvdError(() => attendDense({ q, qHeads, k: undefined as never, v }), 'E_TYPE', /k: expected a KV tensor object/);
    await expectKvdError(() => attendDense({ q, qHeads, k: { ...k, layout: 'dht' as never }, v }), 'E_CONFIG', /k\.layout: expected 'thd' or 'htd', got 'dht'/);
    await expectKvdError(() => attendSparse({ q, qHeads, k, v, selection: undefined as never }), 'E_TYPE', /selection: expected a Selection object/);
  });

  it('rejects NaN in q naming the head', async () => {
    const bad = q.slice();
    bad[2 * dim + 5] = NaN;
    await expectKvdError(() => attendDense({ q: bad, qHeads, k, v }), 'E_NONFINITE', /query head 2 holds NaN\/Inf \(at element 5\)/);
    await expectKvdError(() => attentionWeights({ q: bad, qHeads, k }), 'E_NONFINITE', /query head 2/);
  });

  it('rejects Inf/NaN in attended k and v rows naming kv head and token', async () => {
    const kInf = withBadValue(k, 17, 1, 0x7c00); // f16 +Inf
    await expectKvdError(() => attendDense({ q, qHeads, k: kInf, v }), 'E_NONFINITE', /k: kv head 1, token 17: NaN\/Inf in the key row/);
    await expectKvdError(() => attendSparse({ q, qHeads, k: kInf, v, selection: sel }), 'E_NONFINITE', /kv head 1, token 17/);
    await expectKvdError(() => attendDenseAsync({ q, qHeads, k: kInf, v, threads: 2 }), 'E_NONFINITE', /kv head 1, token 17/);
    await expectKvdError(() => attentionWeights({ q, qHeads, k: kInf }), 'E_NONFINITE', /kv head 1, token 17/);
    const vNan = withBadValue(v, 30, 0, 0x7e00); // f16 NaN
    await expectKvdError(() => attendDense({ q, qHeads, k, v: vNan }), 'E_NONFINITE', /v: kv head 0, token 30: NaN\/Inf in the value row/);
    // A bad row the selection does not attend is never read, so it is no error.
    const notAttended = selectionOf([[], []], tokens, 4, 4, tokens - 8);
    attendSparse({ q, qHeads, k: withBadValue(k, 17, 1, 0x7c00), v: vNan, selection: notAttended });
  });

  it('rejects a head count that does not divide and mismatched k/v shapes', async () => {
    await expectKvdError(() => attendDense({ q: randn(3 * dim, 1), qHeads: 3, k, v }), 'E_SHAPE', /qHeads: expected a multiple of the kv heads \(2\), got 3/);
    const vShort = randomKv(tokens - 1, kvHeads, dim, 'f16', 2).tensor;
    await expectKvdError(() => attendDense({ q, qHeads, k, v: vShort }), 'E_SHAPE', /v: expected the shape of k/);
    await expectKvdError(() => attendDense({ q, qHeads, k: { ...k, tokens: tokens + 1 }, v }), 'E_SHAPE', /tokens\*heads\*dim/);
  });

  it('rejects tokens beyond k.tokens and bad options', async () => {
    await expectKvdError(() => attendDense({ q, qHeads, k, v, tokens: tokens + 1 }), 'E_RANGE', /tokens: expected an integer in \[0, 40\], got 41/);
    await expectKvdError(() => attentionWeights({ q, qHeads, k, tokens: 41 }), 'E_RANGE', /tokens/);
    await expectKvdError(() => attendDense({ q, qHeads, k, v, threads: 9 }), 'E_RANGE', /threads: expected an integer in \[1, 8\], got 9/);
    await expectKvdError(() => attendDense({ q, qHeads, k, v, scale: -1 }), 'E_RANGE', /scale: expected a finite number > 0, got -1/);
    await expectKvdError(() => attendDense({ q, qHeads, k, v, thread: 2 } as never), 'E_CONFIG', /unknown option "thread"/);
  });

  it('rejects selections out of range', async () => {
    const base = { q, qHeads, k, v };
    await expectKvdError(() => attendSparse({ ...base, selection: { ...sel, tokens: tokens + 1 } }), 'E_RANGE', /selection\.tokens: expected an integer in \[0, 40\], got 41/);
    await expectKvdError(() => attendSparse({ ...base, selection: { ...sel, tailStart: tokens + 1 } }), 'E_RANGE', /tailStart/);
    await expectKvdError(() => attendSparse({ ...base, selection: { ...sel, sinkEnd: 10, tailStart: 8 } }), 'E_RANGE', /tailStart: expected an integer in \[10, 40\], got 8/);
    await expectKvdError(() => attendSparse({ ...base, selection: { ...sel, offsets: new Int32Array([0, 10]) } }), 'E_SHAPE', /offsets \(kvHeads\+1\): expected 3 elements, got 2/);
    await expectKvdError(() => attendSparse({ ...base, selection: { ...sel, offsets: new Int32Array([0, 12, 10]) } }), 'E_RANGE', /non-decreasing/);
    await expectKvdError(() => attendSparse({ ...base, selection: { ...sel, offsets: new Int32Array([0, 10, 19]) } }), 'E_SHAPE', /chunkIds\.length \(20\), got 19/);
    await expectKvdError(() => attendSparse({ ...base, selection: selectionOf([[3, 10], []], tokens, 4, 4, 32) }), 'E_RANGE', /chunkIds\[1\] \(kv head 0\): expected a chunk id in \[0, 10\).*got 10/);
    await expectKvdError(() => attendSparse({ ...base, selection: selectionOf([[], [-1]], tokens, 4, 4, 32) }), 'E_RANGE', /kv head 1.*got -1/);
    await expectKvdError(() => attendSparse({ ...base, selection: selectionOf([[5, 5], []], tokens, 4, 4, 32) }), 'E_RANGE', /ascending unique chunk ids, got 5 after 5/);
    await expectKvdError(() => attendSparse({ ...base, selection: { ...sel, chunkIds: new Float32Array(20) as never } }), 'E_DTYPE', /chunkIds: expected an Int32Array/);
    await expectKvdError(() => attendSparse({ ...base, selection: { ...sel, chunkSize: 0 } }), 'E_RANGE', /chunkSize/);
    await expectKvdError(() => attendSparseAsync({ ...base, selection: { ...sel, tokens: 99 } }), 'E_RANGE', /selection\.tokens/);
  });

  it('rejects bad mergeAttention arguments', async () => {
    const out = new Float32Array(qHeads * dim);
    const lse = new Float32Array(qHeads);
    await expectKvdError(() => mergeAttention(out, lse, out.subarray(1), lse, qHeads, dim), 'E_SHAPE', /outB \(heads\*dim\): expected 32 elements, got 31/);
    await expectKvdError(() => mergeAttention(out, lse, out, new Float32Array([0, NaN, 0, 0]), qHeads, dim), 'E_NONFINITE', /lseB\[1\]/);
    await expectKvdError(() => mergeAttention(out, lse, out, lse, 0, dim), 'E_RANGE', /heads/);
    await expectKvdError(() => mergeAttention(out, new Uint16Array(4) as never, out, lse, qHeads, dim), 'E_DTYPE', /lseA/);
  });

  it('rejects bad memoryRead arguments', async () => {
    await expectKvdError(() => memoryRead(new Float64Array(4) as never), 'E_DTYPE', /got a Float64Array/);
    await expectKvdError(() => memoryRead([1, 2] as never), 'E_TYPE', /non-TypedArray/);
    await expectKvdError(() => memoryRead(new Uint8Array(4), 0), 'E_RANGE', /threads/);
  });

  it('rejects bad memoryGather arguments before reading a row', async () => {
    const buf = new Uint8Array(1024);
    const rows = Int32Array.from([0, 3]);
    await expectKvdError(() => memoryGather(new Float64Array(4) as never, 16, rows), 'E_DTYPE', /buffer: .*got a Float64Array/);
    await expectKvdError(() => memoryGather([1, 2] as never, 16, rows), 'E_TYPE', /non-TypedArray/);
    await expectKvdError(() => memoryGather(buf, 0, rows), 'E_RANGE', /rowBytes: expected an integer in \[1, 1048576\], got 0/);
    await expectKvdError(() => memoryGather(buf, 1.5, rows), 'E_RANGE', /rowBytes/);
    await expectKvdError(() => memoryGather(buf, '16' as never, rows), 'E_TYPE', /rowBytes/);
    await expectKvdError(() => memoryGather(buf, 16, [0, 1] as never), 'E_TYPE', /rows/);
    await expectKvdError(() => (memoryGather as (...a: unknown[]) => number)(buf, 16), 'E_TYPE', /rows: expected an? Int32Array/);
    await expectKvdError(() => (memoryGather as (...a: unknown[]) => number)(buf), 'E_TYPE', /rowBytes/);
    // 1024 bytes hold rows 0..63 of 16 bytes.
    await expectKvdError(() => memoryGather(buf, 16, Int32Array.from([0, 64])), 'E_RANGE', /rows\[1\]: expected a row index in \[0, 64\) .* got 64/);
    await expectKvdError(() => memoryGather(buf, 16, Int32Array.from([-1])), 'E_RANGE', /rows\[0\]/);
    await expectKvdError(() => memoryGather(buf, 16, rows, 9), 'E_RANGE', /threads/);
  });

  it('memoryGather sums the rows it is given, on any thread count', () => {
    const buf = new Uint8Array(4096);
    for (let i = 0; i < buf.length; i++) buf[i] = (i * 131 + 7) & 255;
    // The reference: each row's little-endian 32-bit words, then its tail bytes, wrapped to 32 bits.
    const expected = (rowBytes: number, rows: Int32Array): number => {
      const dv = new DataView(buf.buffer);
      let s = 0;
      for (const r of rows) {
        const at = r * rowBytes;
        let i = 0;
        for (; i + 4 <= rowBytes; i += 4) s = (s + dv.getUint32(at + i, true)) >>> 0;
        for (; i < rowBytes; i++) s = (s + buf[at + i]!) >>> 0;
      }
      return s;
    };
    for (const rowBytes of [7, 16, 256]) {
      const n = Math.floor(buf.length / rowBytes);
      const rows = Int32Array.from({ length: 37 }, (_, i) => (i * 29 + 3) % n);
      for (const threads of [1, 2, 3]) expect(memoryGather(buf, rowBytes, rows, threads)).toBe(expected(rowBytes, rows));
    }
    expect(memoryGather(buf, 16, new Int32Array(0))).toBe(0);
  });

  it('rejects bad computePeak arguments', async () => {
    await expectKvdError(() => computePeak(0), 'E_RANGE', /iterations: expected an integer in \[1, 1e8\], got 0/);
    await expectKvdError(() => computePeak(1.5), 'E_RANGE', /iterations/);
    await expectKvdError(() => computePeak(2e8), 'E_RANGE', /iterations/);
    await expectKvdError(() => computePeak('10' as never), 'E_TYPE', /iterations/);
    await expectKvdError(() => computePeak(10, 9), 'E_RANGE', /threads: expected an integer in \[1, 8\], got 9/);
    await expectKvdError(() => computePeak(10, '2' as never), 'E_TYPE', /threads/);
  });
});
