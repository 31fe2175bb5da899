/**
 * Dense attention in plain TypeScript, the reference every other backend is compared against
 * (llama2.c's multi-head attention loop): for each query head, softmax(q·k / sqrt(headSize)) over
 * positions [0, pos] of its kv head, then the weighted sum of the values.
 */
import { fail } from '../errors.js';
import { checkAttentionShape, type AttentionBackend, type AttentionShape } from './attention-backend.js';

export class DenseTsAttention implements AttentionBackend {
  /** Scratch for one head's scores over positions [0, pos]. */
  private readonly scores: Float32Array;
  /** Output buffer, reused: valid until the next call to attend(). */
  private readonly out: Float32Array;
  private readonly group: number;
  private readonly kvDim: number;

  constructor(readonly shape: AttentionShape) {
    checkAttentionShape(shape);
    const { nHeads, nKvHeads, headSize, seqLen } = shape;
    this.scores = new Float32Array(seqLen);
    this.out = new Float32Array(nHeads * headSize);
    this.group = nHeads / nKvHeads;
    this.kvDim = nKvHeads * headSize;
  }

  attend(layer: number, pos: number, q: Float32Array, kCache: Float32Array, vCache: Float32Array): Float32Array {
    const { nHeads, headSize, seqLen, nLayers } = this.shape;
    if (!Number.isInteger(layer) || layer < 0 || layer >= nLayers) fail('E_RANGE', 'attention layer', `an integer in [0, ${nLayers})`, layer);
    if (!Number.isInteger(pos) || pos < 0 || pos >= seqLen) fail('E_RANGE', 'attention pos', `an integer in [0, ${seqLen})`, pos);
    if (q.length !== nHeads * headSize) fail('E_SHAPE', 'attention q', `length ${nHeads * headSize} (nHeads*headSize)`, q.length);
    if (kCache.length !== seqLen * this.kvDim) fail('E_SHAPE', 'attention kCache', `length ${seqLen * this.kvDim}`, kCache.length);
    if (vCache.length !== seqLen * this.kvDim) fail('E_SHAPE', 'attention vCache', `length ${seqLen * this.kvDim}`, vCache.length);

    const { scores, out, group, kvDim } = this;
    const scale = 1 / Math.sqrt(headSize);
    out.fill(0);
    for (let h = 0; h < nHeads; h++) {
      const qo = h * headSize;
      const kvo = Math.floor(h / group) * headSize;
      let max = -Infinity;
      for (let t = 0; t <= pos; t++) {
        const ko = t * kvDim + kvo;
        let s = 0;
        for (let i = 0; i < headSize; i++) s += q[qo + i]! * kCache[ko + i]!;
        s *= scale;
        scores[t] = s;
        if (s > max) max = s;
      }
      let sum = 0;
      for (let t = 0; t <= pos; t++) {
        const e = Math.exp(scores[t]! - max);
        scores[t] = e;
        sum += e;
      }
      const inv = 1 / sum;
      for (let t = 0; t <= pos; t++) {
        const a = scores[t]! * inv;
        const vo = t * kvDim + kvo;
        for (let i = 0; i < headSize; i++) out[qo + i] += a * vCache[vo + i]!;
      }
    }
    return out;
  }
}
