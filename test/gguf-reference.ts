/**
 * An independent f32 reference of the GGUF Llama/Qwen2 forward pass for tests: every tensor is
 * decoded by the TypeScript dequantizers (src/model/gguf/quant.ts) and the math is written out
 * plainly (RMSNorm, bias, RoPE on adjacent or half-split pairs, GQA softmax attention, SwiGLU).
 */
import { readFileSync } from 'node:fs';
import { dequantize } from '../src/model/gguf/quant.js';
import { llamaConfig, ropeFrequencies } from '../src/model/gguf/llama-config.js';
import { readGguf } from '../src/model/gguf/reader.js';
import { f16ToF32, f32ToF16 } from '../src/util/f16.js';

/** x rounded through Q8_0 blocks the way native QuantizeQ8 does (f16 scale, round half to even). */
function q8RoundTrip(x: Float32Array): Float32Array {
  const out = new Float32Array(x.length);
  for (let b = 0; b < x.length; b += 32) {
    let amax = 0;
    for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[b + j]!));
    const d = f16ToF32(f32ToF16(Math.fround(amax / 127)));
    const id = d > 0 ? Math.fround(1 / d) : 0;
    for (let j = 0; j < 32; j++) {
      const v = Math.fround(x[b + j]! * id);
      let q = Math.round(v);
      if (Math.abs(v % 1) === 0.5) q = 2 * Math.round(v / 2);
      out[b + j] = Math.max(-127, Math.min(127, q)) * d;
    }
  }
  return out;
}

/**
 * Logits after each of `tokens`, run one position at a time. `q8Activations` says which products
 * with Q8_0 / Q4_0 weights see activations rounded through Q8_0 blocks: 'all' as the native decode
 * path (one position per call), 'output' as its chunked prefill (f32 activations in the layers; the
 * output head always runs on one position), 'none' for plain f32.
 */
export function referenceLogits(path: string, tokens: number[], q8Activations: 'none' | 'all' | 'output' = 'none'): Float32Array[] {
  const file = readGguf(path);
  const c = llamaConfig(file);
  const bytes = readFileSync(path);
  const t = (name: string): Float32Array => {
    const i = file.tensorByName.get(name)!;
    const v = dequantize(bytes.subarray(i.offset, i.offset + i.bytes), i.type, i.elements);
    types.set(v, i.type);
    return v;
  };
  const has = (name: string): boolean => file.tensorByName.has(name);
  const inv = ropeFrequencies(file, c);
  const types = new Map<Float32Array, string>();
  const matvec = (w: Float32Array, x0: Float32Array, cols: number, output = false): Float32Array => {
    const q8 = q8Activations === 'all' || (q8Activations === 'output' && output);
    const x = q8 && ['Q8_0', 'Q4_0'].includes(types.get(w) ?? '') ? q8RoundTrip(x0) : x0;
    const rows = w.length / cols;
    const y = new Float32Array(rows);
    for (let r = 0; r < rows; r++) {
      let s = 0;
      for (let j = 0; j < cols; j++) s += w[r * cols + j]! * x[j]!;
      y[r] = s;
    }
    return y;
  };
  const rms = (x: Float32Array, g: Float32Array): Float32Array => {
    let ss = 0;
    for (const v of x) ss += v * v;
    const s = 1 / Math.sqrt(ss / x.length + c.rmsEps);
    return x.map((v, i) => v * s * g[i]!);
  };
  const rope = (v: Float32Array, pos: number): void => {
    const half = c.ropeDim / 2;
    for (let h = 0; h < v.length / c.headSize; h++)
      for (let i = 0; i < half; i++) {
        const a = h * c.headSize + (c.ropeNeox ? i : 2 * i);
        const b = h * c.headSize + (c.ropeNeox ? i + half : 2 * i + 1);
        const th = pos * inv[i]!;
        const [x0, x1] = [v[a]!, v[b]!];
        v[a] = x0 * Math.cos(th) - x1 * Math.sin(th);
        v[b] = x0 * Math.sin(th) + x1 * Math.cos(th);
      }
  };
  const emb = t('token_embd.weight');
  const out = has('output.weight') ? t('output.weight') : emb;
  const K: Float32Array[][] = Array.from({ length: c.nLayers }, () => []);
  const V: Float32Array[][] = Array.from({ length: c.nLayers }, () => []);
  const result: Float32Array[] = [];
  tokens.forEach((tok, pos) => {
    let x = emb.slice(tok * c.dim, (tok + 1) * c.dim);
    for (let l = 0; l < c.nLayers; l++) {
      const p = `blk.${l}.`;
      const xb = rms(x, t(`${p}attn_norm.weight`));
      const q = matvec(t(`${p}attn_q.weight`), xb, c.dim);
      const k = matvec(t(`${p}attn_k.weight`), xb, c.dim);
      const v = matvec(t(`${p}attn_v.weight`), xb, c.dim);
      if (has(`${p}attn_q.bias`)) {
        t(`${p}attn_q.bias`).forEach((b, i) => (q[i] += b));
        t(`${p}attn_k.bias`).forEach((b, i) => (k[i] += b));
        t(`${p}attn_v.bias`).forEach((b, i) => (v[i] += b));
      }
      rope(q, pos);
      rope(k, pos);
      K[l]!.push(k);
      V[l]!.push(v);
      const att = new Float32Array(c.nHeads * c.headSize);
      const g = c.nHeads / c.nKvHeads;
      for (let h = 0; h < c.nHeads; h++) {
        const kv = Math.floor(h / g) * c.headSize;
        const s = K[l]!.map((kk) => {
          let d = 0;
          for (let i = 0; i < c.headSize; i++) d += q[h * c.headSize + i]! * kk[kv + i]!;
          return d / Math.sqrt(c.headSize);
        });
        const m = Math.max(...s);
        const e = s.map((z) => Math.exp(z - m));
        const sum = e.reduce((a, b) => a + b, 0);
        e.forEach((w, j) => {
          for (let i = 0; i < c.headSize; i++) att[h * c.headSize + i] += (w / sum) * V[l]![j]![kv + i]!;
        });
      }
      const o = matvec(t(`${p}attn_output.weight`), att, c.nHeads * c.headSize);
      x = x.map((xv, i) => xv + o[i]!);
      const xf = rms(x, t(`${p}ffn_norm.weight`));
      const gate = matvec(t(`${p}ffn_gate.weight`), xf, c.dim);
      const up = matvec(t(`${p}ffn_up.weight`), xf, c.dim);
      const hsw = gate.map((gv, i) => (gv / (1 + Math.exp(-gv))) * up[i]!);
      const down = matvec(t(`${p}ffn_down.weight`), hsw, c.hiddenDim);
      x = x.map((xv, i) => xv + down[i]!);
    }
    result.push(matvec(out, rms(x, t('output_norm.weight')), c.dim, true));
  });
  return result;
}
