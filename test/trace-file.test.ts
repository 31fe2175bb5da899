import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { Dtype } from '../src/types.js';
import { writeSafetensors, type TensorData } from '../src/trace/safetensors.js';
import { layerKvWithNew, memoryTrace, openTrace, writeTrace, type TraceLayerData, type TraceMeta } from '../src/trace/trace.js';
import { f16ArrayToF32, f32ArrayToBf16, f32ArrayToF16, bf16ArrayToF32, fromF32 } from '../src/util/f16.js';
import { expectKvdError, randn } from './helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'kvd-trace-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;
const tmp = () => join(dir, `t-${n++}.safetensors`);

const meta: TraceMeta = { version: 1, layers: 2, qHeads: 4, kvHeads: 2, headDim: 8, promptTokens: 10, decodeSteps: 3 };
const T = meta.promptTokens, S = meta.decodeSteps, H = meta.kvHeads, Hq = meta.qHeads, D = meta.headDim;

/** f32 source values per layer, plus their storage in `dtype`. */
function layerF32(l: number) {
  return {
    k: randn(T * H * D, 100 + l),
    v: randn(T * H * D, 200 + l),
    q: randn(S * Hq * D, 300 + l),
    kNew: randn(S * H * D, 400 + l),
    vNew: randn(S * H * D, 500 + l),
  };
}
function stored(src: ReturnType<typeof layerF32>, dtype: Dtype): TraceLayerData {
  return { k: fromF32(src.k, dtype), v: fromF32(src.v, dtype), q: src.q, kNew: fromF32(src.kNew, dtype), vNew: fromF32(src.vNew, dtype) };
}
const toF32 = (a: Float32Array | Uint16Array, dtype: Dtype) =>
  dtype === 'f32' ? (a as Float32Array) : dtype === 'f16' ? f16ArrayToF32(a as Uint16Array) : bf16ArrayToF32(a as Uint16Array);

describe('trace round trip', () => {
  for (const dtype of ['f32', 'f16', 'bf16'] as Dtype[]) {
    it(`writes and reads ${dtype} (values within dtype rounding, identical bits for 16-bit input)`, async () => {
      const p = tmp();
      const srcs = [layerF32(0), layerF32(1)];
      async function* gen() {
        for (const s of srcs) yield stored(s, dtype);
      }
      await writeTrace(p, meta, dtype, gen());
      const r = await openTrace(p);
      expect(r.meta).toEqual(meta);
      expect(r.dtype).toBe(dtype);
      const tol = dtype === 'f32' ? 0 : dtype === 'f16' ? 2 ** -10 : 2 ** -7;
      for (let l = 0; l < 2; l++) {
        const got = await r.layer(l);
        const want = stored(srcs[l]!, dtype);
        expect(got.k).toMatchObject({ dtype, tokens: T, heads: H, dim: D, layout: 'thd' });
        expect(got.kNew).toMatchObject({ dtype, tokens: S, heads: H, dim: D });
        for (const key of ['k', 'v', 'kNew', 'vNew'] as const) {
          expect(Array.from(got[key].data)).toEqual(Array.from(want[key])); // exact storage bits
          const vals = toF32(got[key].data, dtype);
          const src = srcs[l]![key];
          for (let i = 0; i < src.length; i++) expect(Math.abs(vals[i]! - src[i]!)).toBeLessThanOrEqual(Math.abs(src[i]!) * tol + 1e-7);
        }
        expect(got.q).toBeInstanceOf(Float32Array);
        expect(got.q.length).toBe(S * Hq * D);
        const q = srcs[l]!.q;
        for (let i = 0; i < q.length; i++) expect(Math.abs(got.q[i]! - q[i]!)).toBeLessThanOrEqual(Math.abs(q[i]!) * tol + 1e-7);
      }
      await expectKvdError(() => r.layer(2), 'E_RANGE', /expected an integer in \[0, 2\), got 2/);
      await expectKvdError(() => r.layer(-1), 'E_RANGE');
      await r.close();
    });
  }

  it('accepts q already in 16-bit storage and keeps its bits', async () => {
    const p = tmp();
    const s = [layerF32(0), layerF32(1)];
    const layers = s.map((x) => ({ ...stored(x, 'f16'), q: f32ArrayToF16(x.q) }));
    await writeTrace(p, meta, 'f16', layers);
    const r = await openTrace(p);
    expect(Array.from(f32ArrayToF16((await r.layer(1)).q))).toEqual(Array.from(layers[1]!.q));
    await r.close();
  });

  it('stores and returns extra tensors; readers ignore unknown tensors', async () => {
    const p = tmp();
    const needles = new Int32Array([0, 1, 5, 0, 2]);
    await writeTrace(p, meta, 'bf16', [stored(layerF32(0), 'bf16'), stored(layerF32(1), 'bf16')], [
      { name: 'synthetic.needles', dtype: 'I32', shape: [1, 5], data: needles },
    ]);
    const r = await openTrace(p);
    const e = await r.extra('synthetic.needles');
    expect(Array.from(e!.data as Int32Array)).toEqual([0, 1, 5, 0, 2]);
    expect(await r.extra('nothing')).toBeUndefined();
    await r.close();
  });

  it('rejects bad writer input with typed errors and leaves no file behind', async () => {
    const p = tmp();
    await expectKvdError(() => writeTrace(p, { ...meta, qHeads: 3 }, 'f16', []), 'E_CONFIG', /qHeads must be a multiple of kvHeads/);
    await expectKvdError(() => writeTrace(p, { ...meta, version: 2 as 1 }, 'f16', []), 'E_CONFIG', /version/);
    await expectKvdError(() => writeTrace(p, meta, 'f8' as Dtype, []), 'E_DTYPE', /f32, f16 or bf16/);
    await expectKvdError(() => writeTrace(p, meta, 'f16', [stored(layerF32(0), 'f16')]), 'E_RANGE', /exactly 2, got 1/);
    await expectKvdError(() => writeTrace(p, meta, 'f16', [stored(layerF32(0), 'f32')]), 'E_DTYPE', /layer 0 k.*Uint16Array/);
    const short = { ...stored(layerF32(0), 'f16'), v: new Uint16Array(5) };
    await expectKvdError(() => writeTrace(p, meta, 'f16', [short]), 'E_SHAPE', /layer 0 v length: expected 160 elements \(10 × 2 × 8\), got 5/);
    await expectKvdError(() => writeTrace(p, meta, 'f16', [{ ...stored(layerF32(0), 'f16'), q: new Float32Array(3) }]), 'E_SHAPE', /q length/);
    expect(readdirSync(dir).filter((x) => x.startsWith(p.split('/').pop()!))).toEqual([]);
  });
});

describe('malformed traces', () => {
  const base = (dtype: 'F32' | 'F16' = 'F32') => {
    const tensors: { name: string; dtype: 'F32' | 'F16'; shape: number[]; data: TensorData }[] = [];
    for (let l = 0; l < meta.layers; l++) {
      for (const [nm, shape] of [['k', [T, H, D]], ['v', [T, H, D]], ['q', [S, Hq, D]], ['k_new', [S, H, D]], ['v_new', [S, H, D]]] as const) {
        const len = shape[0] * shape[1] * shape[2];
        tensors.push({ name: `layers.${l}.${nm}`, dtype, shape: [...shape], data: dtype === 'F32' ? new Float32Array(len) : new Uint16Array(len) });
      }
    }
    return tensors;
  };
  const md = (m: unknown) => ({ kvdrive: JSON.stringify(m) });

  it('a valid hand-built file opens (control)', async () => {
    const p = tmp();
    await writeSafetensors(p, [...base(), { name: 'something.else', dtype: 'F32', shape: [1], data: new Float32Array(1) }], md(meta));
    const r = await openTrace(p);
    expect(r.dtype).toBe('f32');
    await r.close();
  });

  it('missing file → E_NOT_FOUND', async () => {
    await expectKvdError(() => openTrace(join(dir, 'nope.safetensors')), 'E_NOT_FOUND');
  });

  it('metadata missing', async () => {
    const p = tmp();
    await writeSafetensors(p, base());
    await expectKvdError(() => openTrace(p), 'E_TRACE_FORMAT', /__metadata__.kvdrive: expected the trace metadata JSON string, got no metadata/);
    const p2 = tmp();
    await writeSafetensors(p2, base(), { other: 'x' });
    await expectKvdError(() => openTrace(p2), 'E_TRACE_FORMAT', /got only keys other/);
  });

  it('metadata unparsable, invalid or another version', async () => {
    const p = tmp();
    await writeSafetensors(p, base(), { kvdrive: '{not json' });
    await expectKvdError(() => openTrace(p), 'E_TRACE_FORMAT', /expected a JSON object, got unparsable/);
    const p2 = tmp();
    await writeSafetensors(p2, base(), md({ ...meta, kvHeads: 3 }));
    await expectKvdError(() => openTrace(p2), 'E_TRACE_FORMAT', /qHeads must be a multiple of kvHeads/);
    const p3 = tmp();
    await writeSafetensors(p3, base(), md({ ...meta, headDim: undefined }));
    await expectKvdError(() => openTrace(p3), 'E_TRACE_FORMAT', /headDim/);
    const p4 = tmp();
    await writeSafetensors(p4, base(), md({ ...meta, version: 7 }));
    await expectKvdError(() => openTrace(p4), 'E_VERSION', /expected 1, got 7/);
  });

  it('a layer tensor missing', async () => {
    const p = tmp();
    await writeSafetensors(p, base().filter((t) => t.name !== 'layers.1.v_new'), md(meta));
    await expectKvdError(() => openTrace(p), 'E_TRACE_FORMAT', /tensor "layers.1.v_new": expected present \(metadata says 2 layers\), got missing/);
  });

  it('a layer tensor of the wrong shape', async () => {
    const p = tmp();
    const t = base();
    t[2] = { name: 'layers.0.q', dtype: 'F32', shape: [S, H, D], data: new Float32Array(S * H * D) };
    await writeSafetensors(p, t, md(meta));
    await expectKvdError(() => openTrace(p), 'E_TRACE_FORMAT', /tensor "layers.0.q" shape: expected \[3, 4, 8\], got \[3, 2, 8\]/);
  });

  it('mixed or non-float dtypes', async () => {
    const p = tmp();
    const t = base();
    t[6] = { ...t[6]!, dtype: 'F16', data: new Uint16Array(t[6]!.data.length) };
    await writeSafetensors(p, t, md(meta));
    await expectKvdError(() => openTrace(p), 'E_TRACE_FORMAT', /tensor "layers.1.v" dtype: expected F32 \(as "layers.0.k"\), got F16/);
    const p2 = tmp();
    const t2 = base();
    t2[0] = { name: 'layers.0.k', dtype: 'I32' as 'F32', shape: [T, H, D], data: new Int32Array(T * H * D) };
    await writeSafetensors(p2, t2, md(meta));
    await expectKvdError(() => openTrace(p2), 'E_TRACE_FORMAT', /tensor "layers.0.k" dtype: expected F32, F16 or BF16, got I32/);
  });
});

describe('memoryTrace and layerKvWithNew', () => {
  it('serves produced layers, validates them, and joins prompt + new tokens', async () => {
    const srcs = [layerF32(0), layerF32(1)];
    const r = memoryTrace(meta, 'bf16', (l) => stored(srcs[l]!, 'bf16'));
    const layer = await r.layer(1);
    expect(Array.from(layer.k.data)).toEqual(Array.from(f32ArrayToBf16(srcs[1]!.k)));
    const { k, v } = layerKvWithNew(layer);
    expect(k.tokens).toBe(T + S);
    expect(k.data.length).toBe((T + S) * H * D);
    // token T (the first decoded one) is kNew's token 0; token T-1 is the last prompt token.
    expect(Array.from(k.data.subarray(T * H * D, (T + 1) * H * D))).toEqual(Array.from(layer.kNew.data.subarray(0, H * D)));
    expect(Array.from(v.data.subarray((T - 1) * H * D, T * H * D))).toEqual(Array.from(layer.v.data.subarray((T - 1) * H * D)));
    await expectKvdError(() => r.layer(5), 'E_RANGE');
    const bad = memoryTrace(meta, 'bf16', () => ({ ...stored(srcs[0]!, 'bf16'), k: new Uint16Array(1) }));
    await expectKvdError(() => bad.layer(0), 'E_SHAPE', /layer 0 k length/);
  });
});
