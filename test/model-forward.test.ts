import { describe, expect, it } from 'vitest';
import type { AttentionBackend } from '../src/model/attention-backend.js';
import { createBackend } from '../src/model/backends.js';
import { loadCheckpoint, type Checkpoint } from '../src/model/checkpoint.js';
import { DenseTsAttention } from '../src/model/dense-attention.js';
import { attentionShape, rope, Transformer } from '../src/model/forward.js';
import { expectKvdError, randn } from './helpers.js';
import { checkpointBytes, tinyHeader, tmpDir, writeTmp } from './model-helpers.js';

const ck: Checkpoint = loadCheckpoint(writeTmp(tmpDir(), 'tiny.bin', checkpointBytes(tinyHeader, 11)));
const cfg = ck.config;

const dot = (a: ArrayLike<number>, b: ArrayLike<number>): number => {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i]! * b[i]!;
  return s;
};

/** Independent f64 llama2 forward over a whole token sequence; returns the logits of the last position. */
function naiveForward(c: Checkpoint, tokens: number[]): Float64Array {
  const { dim, hiddenDim, nHeads, nKvHeads, headSize, vocabSize } = c.config;
  const mat = (w: Float32Array, x: ArrayLike<number>, rows: number): Float64Array =>
    Float64Array.from({ length: rows }, (_, i) => dot(w.subarray(i * x.length, (i + 1) * x.length), x));
  const norm = (x: Float64Array, g: Float32Array): Float64Array => {
    const r = 1 / Math.sqrt(dot(x, x) / x.length + 1e-5);
    return x.map((v, i) => v * r * g[i]!);
  };
  const rot = (v: Float64Array, pos: number): Float64Array => {
    const o = v.slice();
    for (let h = 0; h < v.length / headSize; h++)
      for (let i = 0; i < headSize; i += 2) {
        const a = pos / 10000 ** (i / headSize);
        const [x0, x1] = [v[h * headSize + i]!, v[h * headSize + i + 1]!];
        o[h * headSize + i] = x0 * Math.cos(a) - x1 * Math.sin(a);
        o[h * headSize + i + 1] = x0 * Math.sin(a) + x1 * Math.cos(a);
      }
    return o;
  };
  const K: Float64Array[][] = c.layers.map(() => []);
  const V: Float64Array[][] = c.layers.map(() => []);
  let x = new Float64Array(dim);
  tokens.forEach((tok, pos) => {
    x = Float64Array.from(c.tokenEmbedding.subarray(tok * dim, (tok + 1) * dim));
    c.layers.forEach((w, l) => {
      const xb = norm(x, w.rmsAtt);
      const q = rot(mat(w.wq, xb, dim), pos);
      K[l]!.push(rot(mat(w.wk, xb, nKvHeads * headSize), pos));
      V[l]!.push(mat(w.wv, xb, nKvHeads * headSize));
      const att = new Float64Array(dim);
      for (let h = 0; h < nHeads; h++) {
        const kh = Math.floor(h / (nHeads / nKvHeads)) * headSize;
        const qh = q.subarray(h * headSize, (h + 1) * headSize);
        const s = K[l]!.map((k) => dot(qh, k.subarray(kh, kh + headSize)) / Math.sqrt(headSize));
        const m = Math.max(...s);
        const e = s.map((v) => Math.exp(v - m));
        const z = e.reduce((a, b) => a + b, 0);
        V[l]!.forEach((v, t) => {
          for (let i = 0; i < headSize; i++) att[h * headSize + i]! += (e[t]! / z) * v[kh + i]!;
        });
      }
      x = x.map((v, i) => v + mat(w.wo, att, dim)[i]!);
      const xb2 = norm(x, w.rmsFfn);
      const g = mat(w.w1, xb2, hiddenDim);
      const u = mat(w.w3, xb2, hiddenDim);
      const hb = g.map((v, i) => (v / (1 + Math.exp(-v))) * u[i]!);
      const d = mat(w.w2, hb, dim);
      x = x.map((v, i) => v + d[i]!);
    });
  });
  return mat(c.wcls, norm(x, c.rmsFinal), vocabSize);
}

describe('rope', () => {
  it('is the identity at position 0 and preserves each pair norm', () => {
    const v = randn(16, 1);
    const r0 = v.slice();
    rope(r0, 0, 4);
    expect(Array.from(r0)).toEqual(Array.from(v));
    const r = v.slice();
    rope(r, 37, 4);
    for (let i = 0; i < 16; i += 2) expect(Math.hypot(r[i]!, r[i + 1]!)).toBeCloseTo(Math.hypot(v[i]!, v[i + 1]!), 5);
    expect(Array.from(r)).not.toEqual(Array.from(v));
  });

  it('makes q·k depend only on the relative position', () => {
    const q = randn(8, 2);
    const k = randn(8, 3);
    const at = (m: number, n: number): number => {
      const a = q.slice();
      const b = k.slice();
      rope(a, m, 8);
      rope(b, n, 8);
      return dot(a, b);
    };
    expect(at(9, 4)).toBeCloseTo(at(105, 100), 4);
    expect(at(9, 4)).not.toBeCloseTo(at(9, 5), 3);
  });
});

describe('DenseTsAttention', () => {
  const shape = { nLayers: 1, nHeads: 4, nKvHeads: 2, headSize: 4, seqLen: 8 };
  it('computes softmax attention per query head over its GQA kv head, positions [0, pos]', () => {
    const att = new DenseTsAttention(shape);
    const q = randn(16, 4);
    const k = randn(8 * 8, 5);
    const v = randn(8 * 8, 6);
    // Garbage beyond pos must not be read.
    k.fill(1e6, 4 * 8);
    v.fill(1e6, 4 * 8);
    const out = att.attend(0, 3, q, k, v);
    for (let h = 0; h < 4; h++) {
      const kh = Math.floor(h / 2) * 4;
      const s = [0, 1, 2, 3].map((t) => dot(q.subarray(h * 4, h * 4 + 4), k.subarray(t * 8 + kh, t * 8 + kh + 4)) / 2);
      const e = s.map((x) => Math.exp(x - Math.max(...s)));
      const z = e.reduce((a, b) => a + b);
      for (let i = 0; i < 4; i++) {
        const want = [0, 1, 2, 3].reduce((acc, t) => acc + (e[t]! / z) * v[t * 8 + kh + i]!, 0);
        expect(out[h * 4 + i]).toBeCloseTo(want, 5);
      }
    }
  });

  it('rejects bad arguments with typed errors', async () => {
    const att = new DenseTsAttention(shape);
    const kv = new Float32Array(64);
    await expectKvdError(() => att.attend(0, 0, new Float32Array(15), kv, kv), 'E_SHAPE', /attention q: expected length 16/);
    await expectKvdError(() => att.attend(0, 8, new Float32Array(16), kv, kv), 'E_RANGE', /attention pos: expected an integer in \[0, 8\), got 8/);
    await expectKvdError(() => att.attend(1, 0, new Float32Array(16), kv, kv), 'E_RANGE', /attention layer/);
    await expectKvdError(() => att.attend(0, 0, new Float32Array(16), new Float32Array(63), kv), 'E_SHAPE', /kCache: expected length 64/);
    await expectKvdError(() => new DenseTsAttention({ ...shape, nKvHeads: 3 }), 'E_CONFIG', /nHeads divisible by nKvHeads/);
  });

  it('is reachable by name from the backend registry; unknown names and bad budgets are rejected', async () => {
    expect(createBackend('dense', attentionShape(cfg))).toBeInstanceOf(DenseTsAttention);
    await expectKvdError(() => createBackend('nope', attentionShape(cfg)), 'E_CONFIG', /attention backend: expected one of dense/);
    await expectKvdError(() => createBackend('dense', attentionShape(cfg), { budget: 0 }), 'E_BUDGET', /expected an integer ≥ 1, got 0/);
  });
});

describe('Transformer.forward', () => {
  it('matches an independent f64 forward pass at several positions', () => {
    const tokens = [1, 40, 7, 299, 3, 40];
    const t = new Transformer(ck, new DenseTsAttention(attentionShape(cfg)));
    tokens.forEach((tok, pos) => {
      const got = t.forward(tok, pos);
      const want = naiveForward(ck, tokens.slice(0, pos + 1));
      let maxErr = 0;
      for (let i = 0; i < want.length; i++) maxErr = Math.max(maxErr, Math.abs(got[i]! - want[i]!));
      expect(maxErr).toBeLessThan(1e-3);
    });
  });

  it('delegates attention: one call per layer and position, after writing k/v of pos', () => {
    const dense = new DenseTsAttention(attentionShape(cfg));
    const calls: [number, number][] = [];
    let resets = 0;
    const spy: AttentionBackend = {
      attend(layer, pos, q, kCache, vCache) {
        const row = kCache.subarray(pos * cfg.kvDim, (pos + 1) * cfg.kvDim);
        expect(row.some((x) => x !== 0)).toBe(true);
        expect(vCache.length).toBe(cfg.seqLen * cfg.kvDim);
        calls.push([layer, pos]);
        return dense.attend(layer, pos, q, kCache, vCache);
      },
      reset: () => void resets++,
    };
    const viaSpy = new Transformer(ck, spy);
    const direct = new Transformer(ck, new DenseTsAttention(attentionShape(cfg)));
    viaSpy.reset();
    for (let pos = 0; pos < 3; pos++) expect(Array.from(viaSpy.forward(5 + pos, pos))).toEqual(Array.from(direct.forward(5 + pos, pos)));
    expect(resets).toBe(1);
    expect(calls).toEqual([0, 1, 2].flatMap((p) => [[0, p], [1, p]]));
  });

  it('rejects a backend output of the wrong size, and bad tokens/positions', async () => {
    const bad = new Transformer(ck, { attend: () => new Float32Array(3) });
    await expectKvdError(() => bad.forward(1, 0), 'E_SHAPE', /attention backend output \(layer 0, pos 0\): expected Float32Array\(16\), got Float32Array\(3\)/);
    const t = new Transformer(ck, new DenseTsAttention(attentionShape(cfg)));
    await expectKvdError(() => t.forward(300, 0), 'E_RANGE', /forward token: expected an integer in \[0, 300\), got 300/);
    await expectKvdError(() => t.forward(1, 32), 'E_RANGE', /forward pos: expected an integer in \[0, 32\) \(seq_len\), got 32/);
    await expectKvdError(() => new Transformer(ck, {} as AttentionBackend), 'E_CONFIG', /Transformer backend: expected an AttentionBackend/);
    await expectKvdError(() => new Transformer({} as Checkpoint, new DenseTsAttention(attentionShape(cfg))), 'E_CONFIG', /Transformer checkpoint/);
  });
});
