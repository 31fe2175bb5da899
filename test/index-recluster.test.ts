// kvdrive's background re-clustering (PolicyOptions.reclusterDelay, native/index/layer_index.cc): a
// segment that fills during extend() keeps its online clusters while its k-means runs on the addon's
// background thread, and the result replaces them at fill + reclusterDelay tokens. From then on the
// index must be exactly the one whose k-means ran inside the extend that filled (reclusterDelay 0):
// same clusters, same selections, same bytes. Meanwhile select still works, the extra memory stays
// within reserveBytes(), and a rebuild while a re-clustering is pending gives a fresh index's result.
import { execFileSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { createPolicy, type SelectionPolicy } from '../src/index/policy.js';
import type { PolicyOptions } from '../src/index.js';
import { expectKvdError } from './helpers.js';

const shape = { qHeads: 4, kvHeads: 2, headDim: 32 };
// Segments of 256 tokens = 64 chunks; chunks seal once 16 tokens old, so segment s fills at the
// extend reaching 16 + 256 (s + 1) tokens: 272 and 528 (segment 0 starts after the sinks' chunk).
const geometry: PolicyOptions = { segmentTokens: 256, local: 16, sinks: 4, chunkSize: 4, tokensPerCluster: 16, ...shape };
const fills = [272, 528];
const DELAY = 32;
const T = 640;

function keys(tokens: number, seed: number) {
  const data = new Float32Array(tokens * shape.kvHeads * shape.headDim);
  let x = seed;
  for (let i = 0; i < data.length; i++) {
    x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + 0x6b43a9b5) >>> 0;
    data[i] = x / 2 ** 31 - 1;
  }
  return { data, dtype: 'f32' as const, tokens, heads: shape.kvHeads, dim: shape.headDim };
}

function query(t: number): Float32Array {
  const q = new Float32Array(shape.qHeads * shape.headDim);
  for (let i = 0; i < q.length; i++) q[i] = Math.sin(0.37 * i + 1.3 * t);
  return q;
}

const pending = (t: number) => fills.some((f) => t >= f && t < f + DELAY);
const segments = (p: SelectionPolicy, h: number) => (p as unknown as { clusters(h: number): Array<{ full: boolean }> }).clusters(h);

describe.each([
  ['chunk means kept', { keySketch: false }],
  ['offloaded index (4-bit sketch, chunk means released)', { keySketch: true, sketchBits: 4, releaseChunkMeans: true }],
] as const)('reclusterDelay: %s', (_name, extra) => {
  it('after fill + reclusterDelay the index equals the one clustered inside the filling extend: clusters, selections and bytes', () => {
    const k = keys(T, 7);
    const deferred = createPolicy('kvdrive', { ...geometry, ...extra, reclusterDelay: DELAY });
    const inline = createPolicy('kvdrive', { ...geometry, ...extra, reclusterDelay: 0 });
    deferred.buildSync(k, 200);
    inline.buildSync(k, 200);
    const reserve = deferred.reserveBytes();
    expect(reserve).toBeGreaterThan(0);
    expect(inline.reserveBytes()).toBe(0);
    // The chunk means a segment holds: what the inline index releases at its fill (releaseChunkMeans)
    // and the deferred one at the install; the memory plan counts them as the open segment's rows.
    const segmentRows = extra.releaseChunkMeans ? 64 * (shape.headDim * 4 + 4) * shape.kvHeads : 0;
    let differed = 0;
    for (let t = 201; t <= T; t++) {
      deferred.extend(k, t);
      inline.extend(k, t);
      const a = deferred.select(query(t), 48);
      const b = inline.select(query(t), 48);
      if (pending(t)) {
        // The filled segment still has its online clusters; select reads them.
        const s = fills.filter((f) => t >= f).length - 1;
        expect(segments(deferred, 0)[s]!.full, `t ${t}`).toBe(false);
        expect(segments(inline, 0)[s]!.full, `t ${t}`).toBe(true);
        expect(a.tokens).toBe(t);
        const extraBytes = deferred.indexBytes() - inline.indexBytes();
        expect(extraBytes, `t ${t}`).toBeLessThanOrEqual(reserve + segmentRows);
        if (Array.from(a.chunkIds).join() !== Array.from(b.chunkIds).join()) differed++;
        continue;
      }
      for (let h = 0; h < shape.kvHeads; h++)
        expect(JSON.stringify(segments(deferred, h)), `t ${t} head ${h}`).toBe(JSON.stringify(segments(inline, h)));
      expect(Array.from(a.offsets), `t ${t}`).toEqual(Array.from(b.offsets));
      expect(Array.from(a.chunkIds), `t ${t}`).toEqual(Array.from(b.chunkIds));
      expect(deferred.indexBytes(), `t ${t}`).toBe(inline.indexBytes());
    }
    // The online clusters are not the k-means ones: the window is really served by something else.
    expect(differed).toBeGreaterThan(0);
  });
});

describe('reclusterDelay: pending work and options', () => {
  it('a budget covering the context selects every token while a re-clustering is pending', () => {
    const k = keys(300, 3);
    const p = createPolicy('kvdrive', { ...geometry, reclusterDelay: DELAY });
    p.buildSync(k, 260);
    for (let t = 261; t <= 280; t++) p.extend(k, t);
    expect(segments(p, 1)[0]!.full).toBe(false);
    const sel = p.select(query(280), 280);
    // Every token is attended: sinks, the selected ones and the tail.
    let selected = 0;
    for (let h = 0; h < shape.kvHeads; h++) selected += (sel.offsets[h + 1]! - sel.offsets[h]!) * sel.chunkSize;
    expect(selected / shape.kvHeads + sel.sinkEnd + (sel.tokens - sel.tailStart)).toBe(280);
  });

  it('a rebuild while a re-clustering is pending equals a fresh build', () => {
    const k = keys(500, 5);
    const p = createPolicy('kvdrive', { ...geometry, reclusterDelay: DELAY });
    p.buildSync(k, 260);
    for (let t = 261; t <= 275; t++) p.extend(k, t);
    p.buildSync(k, 500);
    const fresh = createPolicy('kvdrive', { ...geometry, reclusterDelay: DELAY });
    fresh.buildSync(k, 500);
    expect(Array.from(p.select(query(1), 40).chunkIds)).toEqual(Array.from(fresh.select(query(1), 40).chunkIds));
    expect(p.indexBytes()).toBe(fresh.indexBytes());
  });

  it('an extend that fills two segments at once clusters both inside it, and equals the inline index', () => {
    const k = keys(T, 9);
    const a = createPolicy('kvdrive', { ...geometry, reclusterDelay: DELAY });
    const b = createPolicy('kvdrive', { ...geometry, reclusterDelay: 0 });
    a.buildSync(k, 100);
    b.buildSync(k, 100);
    a.extend(k, 600);
    b.extend(k, 600);
    expect(segments(a, 1).map((s) => s.full)).toEqual([true, true, false]);
    expect(Array.from(a.select(query(2), 40).chunkIds)).toEqual(Array.from(b.select(query(2), 40).chunkIds));
  });

  it('indexes collected while their re-clustering is queued or running free nothing the task still reads', () => {
    // A child process with --expose-gc: 40 indexes each fill a 4096-token segment (8 kv heads x 128:
    // ~100 ms of k-means each, so most are still queued when collected) and are dropped at once.
    const policyJs = new URL('../dist/src/index/policy.js', import.meta.url).href;
    const script = `import(${JSON.stringify(policyJs)}).then(({ createPolicy }) => {
      const heads = 8, dim = 128, T = 4200;
      const data = new Float32Array(T * heads * dim).map((_, i) => Math.sin(i * 0.731) + Math.cos(i * 0.017));
      const k = { data, dtype: 'f32', tokens: T, heads, dim };
      let policies = [];
      for (let i = 0; i < 40; i++) {
        const p = createPolicy('kvdrive', { segmentTokens: 4096, local: 64, reclusterDelay: 256, seed: i });
        p.buildSync(k, 4150);
        p.extend(k, 4160);
        policies.push(p);
      }
      policies = null;
      globalThis.gc();
      setTimeout(() => { globalThis.gc(); console.log('alive'); }, 200);
    });`;
    const out = execFileSync(process.execPath, ['--expose-gc', '--input-type=module', '-e', script], { encoding: 'utf8' });
    expect(out.trim()).toBe('alive');
  });

  it('reclusterDelay is validated and kvdrive-only', async () => {
    await expectKvdError(() => createPolicy('kvdrive', { reclusterDelay: -1 }), 'E_CONFIG', /reclusterDelay: expected an integer in \[0, 2\^20\], got -1/);
    await expectKvdError(() => createPolicy('kvdrive', { reclusterDelay: 1.5 }), 'E_CONFIG', /reclusterDelay: expected an integer/);
    await expectKvdError(() => createPolicy('quest', { reclusterDelay: 8 }), 'E_CONFIG', /kvdrive-only options .* got reclusterDelay/);
    const quest = createPolicy('quest', shape);
    quest.buildSync(keys(100, 1), 100);
    expect(quest.reserveBytes()).toBe(0);
  });
});
