import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { generateSyntheticTrace, NEEDLES_TENSOR, type SyntheticTrace } from '../src/trace/synthetic.js';
import { layerKvWithNew, openTrace, type TraceLayer } from '../src/trace/trace.js';
import { f32ArrayToF16, toF32 } from '../src/util/f16.js';
import { expectKvdError, recordHugePageAdvice } from './helpers.js';

/** The bytes a view covers (KV arrays start inside their buffer: src/util/kv-array.ts). */
const bytesOf = (a: ArrayBufferView): Buffer => Buffer.from(a.buffer, a.byteOffset, a.byteLength);

const dir = mkdtempSync(join(tmpdir(), 'kvd-synth-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Dense attention of query `q` (head dim D) against kv head h over tokens [0, n): softmax, scale 1/√D. */
function attend(tr: SyntheticTrace, kAll: Float32Array, q: Float32Array, h: number, n: number): Float64Array {
  const { kvHeads: H, headDim: D } = tr.meta;
  const p = new Float64Array(n);
  let m = -Infinity;
  for (let t = 0; t < n; t++) {
    let d = 0;
    const off = (t * H + h) * D;
    for (let i = 0; i < D; i++) d += q[i]! * kAll[off + i]!;
    p[t] = d / Math.sqrt(D);
    if (p[t]! > m) m = p[t]!;
  }
  let z = 0;
  for (let t = 0; t < n; t++) z += p[t] = Math.exp(p[t]! - m);
  for (let t = 0; t < n; t++) p[t]! /= z;
  return p;
}

/** Dense attention of query head hq at decode step s: softmax over tokens [0, T+s+1), scale 1/√D. */
function attention(tr: SyntheticTrace, layer: TraceLayer, kAll: Float32Array, hq: number, s: number): Float64Array {
  const { qHeads: Hq, kvHeads: H, headDim: D, promptTokens: T } = tr.meta;
  return attend(tr, kAll, layer.q.subarray((s * Hq + hq) * D, (s * Hq + hq + 1) * D), Math.floor(hq / (Hq / H)), T + s + 1);
}

function topK(p: Float64Array, k: number): Set<number> {
  return new Set(Array.from(p.keys()).sort((a, b) => p[b]! - p[a]!).slice(0, k));
}

async function denseLayer(tr: SyntheticTrace, l: number) {
  const layer = await tr.layer(l);
  const { k } = layerKvWithNew(layer);
  return { layer, kAll: toF32(k.data, k.dtype) };
}

describe('synthetic traces', () => {
  it('asks for huge pages on its KV before writing it, and layerKvWithNew on the joined KV (attention reads their rows at random)', async () => {
    const tr = generateSyntheticTrace({ layers: 1, promptTokens: 64, decodeSteps: 2, qHeads: 4, kvHeads: 2, headDim: 16, dtype: 'f16', seed: 3 });
    let d: ReturnType<typeof tr.layerData> | undefined;
    let joined: ReturnType<typeof layerKvWithNew> | undefined;
    const advised = await recordHugePageAdvice(async () => {
      d = tr.layerData(0);
      joined = layerKvWithNew(await tr.layer(0));
    });
    for (const a of [d!.k, d!.v, d!.kNew, d!.vNew, joined!.k.data, joined!.v.data]) expect(advised).toContain(a);
  });

  it('is deterministic by seed and different across seeds', () => {
    const a = generateSyntheticTrace({ seed: 7, promptTokens: 256, layers: 1 });
    const b = generateSyntheticTrace({ seed: 7, promptTokens: 256, layers: 1 });
    const c = generateSyntheticTrace({ seed: 8, promptTokens: 256, layers: 1 });
    const [da, db, dc] = [a.layerData(0), b.layerData(0), c.layerData(0)];
    for (const key of ['k', 'v', 'q', 'kNew', 'vNew'] as const) {
      expect(Buffer.compare(bytesOf(da[key]), bytesOf(db[key]))).toBe(0);
      expect(Buffer.compare(bytesOf(da[key]), bytesOf(dc[key]))).not.toBe(0);
    }
    expect(a.needles).toEqual(b.needles);
    // Generating a layer twice (lazily, in any order) gives the same bits.
    expect(Buffer.compare(bytesOf(a.layerData(0).k), bytesOf(da.k))).toBe(0);
  });

  it('fills f16 and bf16 storage with the rounded f32 trace', () => {
    const opts = { seed: 3, promptTokens: 128, layers: 1 } as const;
    const f32 = generateSyntheticTrace({ ...opts, dtype: 'f32' }).layerData(0);
    const f16 = generateSyntheticTrace({ ...opts, dtype: 'f16' }).layerData(0);
    expect(Array.from(f16.k)).toEqual(Array.from(f32ArrayToF16(f32.k as Float32Array)));
    expect(Array.from(f16.v)).toEqual(Array.from(f32ArrayToF16(f32.v as Float32Array)));
    expect(Array.from(f16.q)).toEqual(Array.from(f32ArrayToF16(f32.q as Float32Array)));
  });

  it('records needles on retrieval heads, in the result and in the written file', async () => {
    const tr = generateSyntheticTrace({ seed: 5, layers: 2, promptTokens: 512, needlesPerLayer: 3 });
    const g = tr.meta.qHeads / tr.meta.kvHeads;
    expect(tr.needles.length).toBe(6);
    for (const n of tr.needles) {
      expect(tr.headRoles[n.layer]![n.qHead]).toBe('retrieval');
      expect(n.kvHead).toBe(Math.floor(n.qHead / g));
      expect(n.token).toBeGreaterThanOrEqual(tr.options.sinkTokens);
      expect(n.token).toBeLessThan(tr.meta.promptTokens * tr.options.needleDepth + tr.options.sinkTokens);
      expect(n.lastStep - n.firstStep + 1).toBe(tr.options.needleSteps);
    }
    const p = join(dir, 'synth.safetensors');
    await tr.write(p);
    const r = await openTrace(p);
    expect(r.meta).toEqual(tr.meta);
    const t = await r.extra(NEEDLES_TENSOR);
    expect(t!.dtype).toBe('I32');
    expect(t!.shape).toEqual([6, 5]);
    expect(Array.from(t!.data as Int32Array)).toEqual(tr.needles.flatMap((n) => [n.layer, n.kvHead, n.token, n.firstStep, n.lastStep]));
    // The file holds exactly what the in-memory trace serves.
    const [fromFile, inMemory] = [await r.layer(1), await tr.layer(1)];
    expect(Array.from(fromFile.k.data)).toEqual(Array.from(inMemory.k.data));
    expect(Array.from(fromFile.q)).toEqual(Array.from(inMemory.q));
    expect(Array.from(fromFile.vNew.data)).toEqual(Array.from(inMemory.vNew.data));
    await r.close();
  });

  it('needles are attended strongly by their retrieval head at their steps only', async () => {
    for (const seed of [1, 2]) {
      const tr = generateSyntheticTrace({ seed });
      const T = tr.meta.promptTokens;
      for (let l = 0; l < tr.meta.layers; l++) {
        const { layer, kAll } = await denseLayer(tr, l);
        for (const n of tr.needles.filter((x) => x.layer === l)) {
          let outside = 0;
          for (let s = 0; s < tr.meta.decodeSteps; s++) {
            const mass = attention(tr, layer, kAll, n.qHead, s)[n.token]!;
            if (s >= n.firstStep && s <= n.lastStep) {
              // Uniform attention would give 1/(T+s+1); the needle must get far more.
              expect(mass * (T + s + 1), `needle ${JSON.stringify(n)} at step ${s}`).toBeGreaterThan(50);
            } else {
              outside = Math.max(outside, mass);
            }
          }
          expect(outside * T, `needle ${JSON.stringify(n)} outside its steps`).toBeLessThan(10);
        }
      }
    }
  });

  it("consecutive steps' top-K sets overlap 70–90% (dense softmax)", async () => {
    const tr = generateSyntheticTrace({ seed: 11 });
    const K = 64; // ~3% of 2048 tokens
    let sum = 0;
    let count = 0;
    for (let l = 0; l < tr.meta.layers; l++) {
      const { layer, kAll } = await denseLayer(tr, l);
      for (let hq = 0; hq < tr.meta.qHeads; hq++) {
        let prev: Set<number> | undefined;
        for (let s = 0; s < tr.meta.decodeSteps; s++) {
          const top = topK(attention(tr, layer, kAll, hq, s), K);
          if (prev) {
            let both = 0;
            for (const t of prev) if (top.has(t)) both++;
            sum += both / K;
            count++;
          }
          prev = top;
        }
      }
    }
    const overlap = sum / count;
    expect(overlap).toBeGreaterThanOrEqual(0.7);
    expect(overlap).toBeLessThanOrEqual(0.9);
    // Without drift and noise the queries only move by RoPE, so overlap must rise; with fully
    // renewed noise it must fall: the knob really controls the overlap.
    const frozen = generateSyntheticTrace({ seed: 11, layers: 1, queryDrift: 0 });
    const wild = generateSyntheticTrace({ seed: 11, layers: 1, queryDrift: 1, queryNoise: 3 });
    const meanOverlap = async (t: SyntheticTrace) => {
      const { layer, kAll } = await denseLayer(t, 0);
      let acc = 0;
      let c = 0;
      for (let hq = 0; hq < t.meta.qHeads; hq++) {
        const a = topK(attention(t, layer, kAll, hq, 2), K);
        const b = topK(attention(t, layer, kAll, hq, 3), K);
        for (const x of a) if (b.has(x)) acc++;
        c += K;
      }
      return acc / c;
    };
    expect(await meanOverlap(frozen)).toBeGreaterThan(await meanOverlap(wild));
  });

  it("observation queries: the prompt's last positions, leading into the decode steps' top-K, the rest of the trace unchanged", async () => {
    const tr = generateSyntheticTrace({ seed: 12 });
    const { qHeads: Hq, kvHeads: H, headDim: D, promptTokens: T } = tr.meta;
    const before = tr.layerData(0);
    const W = 8;
    const obs = tr.observationQueries(0, W);
    expect(obs).toBeInstanceOf(Float32Array);
    expect(obs.length).toBe(W * Hq * D);
    expect(Array.from(tr.observationQueries(0, W))).toEqual(Array.from(obs));
    // Generated backwards from step 0: a shorter window is the end of a longer one.
    expect(Array.from(tr.observationQueries(0, 3))).toEqual(Array.from(obs.subarray((W - 3) * Hq * D)));
    // Its own stream: every other tensor is what it was.
    const after = tr.layerData(0);
    for (const key of ['k', 'v', 'q', 'kNew', 'vNew'] as const) expect(Buffer.compare(bytesOf(after[key]), bytesOf(before[key]))).toBe(0);
    // Position T-1's query attends the prompt much as decode step 0 does (same heads, one step of
    // drift apart); another layer's last query, with other directions, does not.
    const K = 64;
    const { layer, kAll } = await denseLayer(tr, 0);
    const other = tr.observationQueries(1, 1);
    let same = 0;
    let unrelated = 0;
    for (let hq = 0; hq < Hq; hq++) {
      const h = Math.floor(hq / (Hq / H));
      const step0 = topK(attention(tr, layer, kAll, hq, 0).subarray(0, T), K);
      const overlap = (q: Float32Array) => [...topK(attend(tr, kAll, q, h, T), K)].filter((t) => step0.has(t)).length / K;
      same += overlap(obs.subarray(((W - 1) * Hq + hq) * D, ((W - 1) * Hq + hq + 1) * D));
      unrelated += overlap(other.subarray(hq * D, (hq + 1) * D));
    }
    expect(same / Hq).toBeGreaterThan(0.6);
    expect(unrelated / Hq).toBeLessThan(same / Hq - 0.2);
    await expectKvdError(() => tr.observationQueries(0, 0), 'E_RANGE', /observation window: expected an integer in \[1, 2048\]/);
    await expectKvdError(() => tr.observationQueries(0, T + 1), 'E_RANGE', /observation window/);
    await expectKvdError(() => tr.observationQueries(2, 4), 'E_RANGE', /layer: expected an integer in \[0, 2\)/);
  });

  it('has sinks every head attends and local heads focused on the recent window', async () => {
    const tr = generateSyntheticTrace({ seed: 4, layers: 1 });
    const { layer, kAll } = await denseLayer(tr, 0);
    const T = tr.meta.promptTokens;
    const mass: Record<string, { sink: number; recent: number; n: number }> = {};
    for (let hq = 0; hq < tr.meta.qHeads; hq++) {
      const p = attention(tr, layer, kAll, hq, 0);
      const role = tr.headRoles[0]![hq]!;
      const m = (mass[role] ??= { sink: 0, recent: 0, n: 0 });
      for (let t = 0; t < tr.options.sinkTokens; t++) m.sink += p[t]!;
      for (let t = T - 63; t <= T; t++) m.recent += p[t]!;
      m.n++;
      // Every head gives each sink token far more than a typical token.
      const median = Array.from(p.subarray(tr.options.sinkTokens)).sort((x, y) => x - y)[(p.length - tr.options.sinkTokens) >> 1]!;
      for (let t = 0; t < tr.options.sinkTokens; t++) expect(p[t]! / median, `sink ${t} of head ${hq} (${role})`).toBeGreaterThan(100);
    }
    // On average the 4 sinks (0.2% of the tokens) hold a large share of the attention.
    const sinkShare = Object.values(mass).reduce((a, m) => a + m.sink, 0) / tr.meta.qHeads;
    expect(sinkShare).toBeGreaterThan(0.1);
    expect(mass.local!.recent / mass.local!.n).toBeGreaterThan(0.15); // uniform: 3%
    // Local heads: the last 64 tokens get far more than an equal window 1000 tokens back.
    for (let hq = 0; hq < tr.meta.qHeads; hq++) {
      if (tr.headRoles[0]![hq] !== 'local') continue;
      const p = attention(tr, layer, kAll, hq, 0);
      let recent = 0;
      let older = 0;
      for (let t = T - 63; t <= T; t++) recent += p[t]!;
      for (let t = T - 1063; t <= T - 1000; t++) older += p[t]!;
      expect(recent, `local head ${hq}`).toBeGreaterThan(5 * older);
    }
  });

  it('applies RoPE: pair norms equal the unrotated keys, angles advance by position × θ', () => {
    const opts = { seed: 9, layers: 1, promptTokens: 300, dtype: 'f32', needlesPerLayer: 0 } as const;
    const rot = generateSyntheticTrace({ ...opts, ropeStyle: 'half' });
    const raw = generateSyntheticTrace({ ...opts, ropeStyle: 'none' });
    const kr = rot.layerData(0).k as Float32Array;
    const k0 = raw.layerData(0).k as Float32Array;
    expect(Buffer.compare(bytesOf(kr), bytesOf(k0))).not.toBe(0);
    const { kvHeads: H, headDim: D } = rot.meta;
    const P = D / 2;
    let checkedAngles = 0;
    for (const t of [0, 1, 17, 150, 299]) {
      for (let h = 0; h < H; h++) {
        for (let p = 0; p < P; p++) {
          const o = (t * H + h) * D;
          const [x0, y0, x1, y1] = [k0[o + p]!, k0[o + p + P]!, kr[o + p]!, kr[o + p + P]!];
          const n0 = Math.hypot(x0, y0);
          expect(Math.abs(Math.hypot(x1, y1) - n0)).toBeLessThanOrEqual(1e-5 * (1 + n0));
          if (n0 > 0.5) {
            const theta = Math.pow(500000, (-2 * p) / D);
            let diff = Math.atan2(y1, x1) - Math.atan2(y0, x0) - t * theta;
            diff = Math.atan2(Math.sin(diff), Math.cos(diff)); // wrap to (-π, π]
            expect(Math.abs(diff)).toBeLessThan(1e-4);
            checkedAngles++;
          }
        }
      }
    }
    expect(checkedAngles).toBeGreaterThan(100);
  });

  it('keeps topic clusters: keys of one topic segment are closer than keys of different topics', () => {
    const tr = generateSyntheticTrace({ seed: 2, layers: 1, dtype: 'f32' });
    const k = tr.layerData(0).k as Float32Array;
    const { kvHeads: H, headDim: D, promptTokens: T } = tr.meta;
    const cos = (a: number, b: number) => {
      let d = 0, na = 0, nb = 0;
      for (let i = 0; i < D; i++) {
        const x = k[a * H * D + i]!, y = k[b * H * D + i]!;
        d += x * y; na += x * x; nb += y * y;
      }
      return d / Math.sqrt(na * nb);
    };
    let same = 0, diff = 0, ns = 0, nd = 0;
    for (let t = 10; t < T - 8; t += 7) {
      const u = t + 8;
      if (tr.topicOf[t] === tr.topicOf[u]) { same += cos(t, u); ns++; }
      const w = (t * 7919) % (T - 10) + 10;
      if (tr.topicOf[t] !== tr.topicOf[w]) { diff += cos(t, w); nd++; }
    }
    expect(same / ns).toBeGreaterThan(diff / nd + 0.1);
  });

  it('has outlier channels of large magnitude in every kv head', () => {
    const tr = generateSyntheticTrace({ seed: 6, layers: 1, dtype: 'f32', ropeStyle: 'none', promptTokens: 256 });
    const k = tr.layerData(0).k as Float32Array;
    const { kvHeads: H, headDim: D, promptTokens: T } = tr.meta;
    for (let h = 0; h < H; h++) {
      let best = 0;
      for (let i = 0; i < D; i++) {
        let m = 0;
        for (let t = tr.options.sinkTokens; t < T; t++) m += k[(t * H + h) * D + i]!;
        best = Math.max(best, Math.abs(m / (T - tr.options.sinkTokens)));
      }
      expect(best).toBeGreaterThan(0.8 * tr.options.outlierScale);
    }
  });

  it('validates options with E_CONFIG naming the field', async () => {
    await expectKvdError(() => generateSyntheticTrace({ qHeads: 6, kvHeads: 4 }), 'E_CONFIG', /qHeads: qHeads must be a multiple of kvHeads/);
    await expectKvdError(() => generateSyntheticTrace({ headDim: 33 }), 'E_CONFIG', /headDim must be even/);
    await expectKvdError(() => generateSyntheticTrace({ promptTokens: -5 }), 'E_CONFIG', /promptTokens/);
    await expectKvdError(() => generateSyntheticTrace({ dtype: 'f8' as never }), 'E_CONFIG', /dtype/);
    await expectKvdError(() => generateSyntheticTrace({ queryDrift: 1.5 }), 'E_CONFIG', /queryDrift/);
    await expectKvdError(() => generateSyntheticTrace({ promtTokens: 5 } as never), 'E_CONFIG', /promtTokens/);
    await expectKvdError(() => generateSyntheticTrace({ localHeads: 0.7, retrievalHeads: 0.5 }), 'E_CONFIG', /at most 1/);
    await expectKvdError(() => generateSyntheticTrace({ promptTokens: 16, needlesPerLayer: 10 }), 'E_CONFIG', /needlesPerLayer/);
    const tr = generateSyntheticTrace({ promptTokens: 64, layers: 1 });
    await expectKvdError(() => tr.layer(1), 'E_RANGE', /\[0, 1\)/);
    expect(() => tr.layerData(-1)).toThrow(/\[0, 1\)/);
  });
});
