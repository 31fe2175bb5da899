// SSD-backed runtime (memory model with a DRAM tier holding about a quarter of the sealed chunks):
// selected chunks not in DRAM are read from the SsdStore segments; outputs are bit-identical to the
// DRAM-only runtime in both modes (a prompt that is not a whole number of chunks, 8 query heads per
// 2 kv heads), and close() deletes the runtime's segments and leaves no file descriptors or threads.
import { cpSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { openRuntime, type Runtime, type RuntimeOptions } from '../src/runtime/runtime.js';
import type { KvTensor } from '../src/types.js';
import { expectKvdError, ioBufferBytes, randn } from './helpers.js';
import type { IoEngineOptions } from '../src/storage/io-engine.js';
import { osThreads } from './threads.js';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';

const shape = { layers: 2, qHeads: 8, kvHeads: 2, headDim: 16 };
const PROMPT = 402; // not a multiple of the chunk size: the last partial chunk stays in DRAM
const STEPS = 4;
const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), 'kvd-rt-ssd-'));
  dirs.push(d);
  return d;
};
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const row = shape.kvHeads * shape.headDim;
const kvt = (data: Float32Array, tokens: number): KvTensor => ({ data, dtype: 'f32', tokens, heads: shape.kvHeads, dim: shape.headDim });
const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');
const fds = () => readdirSync('/proc/self/fd').length;

async function decode(rt: Runtime, seqs: number, seed: number): Promise<Float32Array[]> {
  const handles = Array.from({ length: seqs }, () => rt.createSequence());
  for (const [i, s] of handles.entries())
    for (let l = 0; l < shape.layers; l++)
      await rt.prefill(s, l, kvt(randn(PROMPT * row, seed + 10 * i + l), PROMPT), kvt(randn(PROMPT * row, seed + 500 + 10 * i + l), PROMPT));
  const outs: Float32Array[] = [];
  for (let t = 0; t < STEPS; t++)
    for (let l = 0; l < shape.layers; l++) {
      const batch = handles.map((s, i) => ({
        seq: s,
        q: randn(shape.qHeads * shape.headDim, seed + 7 * t + 1000 * i + 100 * l + 1),
        kNew: randn(row, seed + 7 * t + 1000 * i + 100 * l + 2),
        vNew: randn(row, seed + 7 * t + 1000 * i + 100 * l + 3),
      }));
      outs.push(...(await rt.attend(l, batch)));
    }
  return outs;
}

/**
 * A DRAM budget for `opts` whose DRAM tier is `fraction` of what holds everything: the fixed parts
 * (tails, index reserve, hot tier, fetch buffers, the SSD store's I/O engine buffers for `io`) read
 * from an SSD-backed runtime's own plan, plus that fraction of a DRAM-only runtime's tier.
 */
async function tierBudget(opts: RuntimeOptions, fraction: number, io: IoEngineOptions = {}): Promise<number> {
  const rt = await openRuntime(opts);
  const p = (await rt.stats()).memory.plan;
  await rt.close();
  // Fetch and I/O engine buffers exist only with an SSD: probe that runtime's plan with room to spare.
  const probe = await openRuntime({ ...opts, dramBudget: p.dramBudgetBytes + ioBufferBytes(io, opts.mode) + (64 << 20), ssd: { dir: tmp(), io } });
  const q = (await probe.stats()).memory.plan;
  await probe.close();
  return q.dramBudgetBytes - q.dramTierBytes + Math.floor(fraction * p.dramTierBytes);
}

describe('SSD-backed runtime', () => {
  it('reads selected prompt chunks from SSD; bit-identical to DRAM-only, sequential and pipelined', async () => {
    const base: RuntimeOptions = { shape, budget: 48, microBatch: 2, maxSequences: 3, maxTokens: 512 };
    const ref = await openRuntime({ ...base, mode: 'sequential' });
    const expected = await decode(ref, 3, 5);
    await ref.close();
    for (const mode of ['sequential', 'pipelined'] as const) {
      const dir = tmp();
      const fd0 = fds();
      const threads0 = await osThreads();
      const io = { kind: 'pread', threads: 2 } as const;
      const dramBudget = await tierBudget({ ...base, mode }, 0.25, io);
      const rt = await openRuntime({ ...base, mode, dramBudget, ssd: { dir, io } });
      const got = await decode(rt, 3, 5);
      expect(got.map(bits)).toEqual(expected.map(bits));
      const st = await rt.stats();
      expect(st.ssdChunks).toBeGreaterThan(0);
      expect(st.memory.traffic.dramChunks).toBeGreaterThan(0);
      // whole extents (the index's clusters) are read: at least the payload
      expect(st.ssdReadBytes).toBeGreaterThanOrEqual(st.ssdBytes);
      expect(st.fetchMs).toBeGreaterThan(0);
      expect(st.recentSteps.length).toBe(STEPS * shape.layers);
      expect(readdirSync(dir).filter((f) => f.endsWith('.kvseg')).length).toBe(3 * shape.layers);
      await rt.close();
      expect(readdirSync(dir).filter((f) => f.endsWith('.kvseg'))).toEqual([]);
      expect(fds()).toBe(fd0);
      expect(await osThreads()).toBe(threads0); // the engine's pread threads are joined
    }
  });

  it('pipelined, one sequence per micro-batch with several in flight: every step waits on its own reads inside one attention call; bit-identical to DRAM-only', async () => {
    // 6 micro-batches, 4 at once (entriesInFlight): each issues its SSD read, then an attention
    // call that waits on that read's flags, all on the same libuv and addon pools.
    const base: RuntimeOptions = { shape, budget: 48, microBatch: 1, maxSequences: 6, maxTokens: 512 };
    const expected = await decode(await openRuntime({ ...base, mode: 'sequential' }), 6, 9);
    const hotTier = { windows: 2, maxBytes: 1 << 22 };
    const rt = await openRuntime({ ...base, mode: 'pipelined', hotTier, dramBudget: await tierBudget({ ...base, mode: 'pipelined', hotTier }, 0.1), ssd: { dir: tmp() } });
    expect((await decode(rt, 6, 9)).map(bits)).toEqual(expected.map(bits));
    const st = await rt.stats();
    expect(st.ssdChunks).toBeGreaterThan(0);
    expect(st.maxInFlight).toBeGreaterThan(1);
    await rt.close();
  });

  it('with a hot tier: only non-resident chunks are fetched; bit-identical to DRAM-only, both modes', async () => {
    const base: RuntimeOptions = { shape, budget: 48, microBatch: 2, maxSequences: 3, maxTokens: 512 };
    const expected = await decode(await openRuntime({ ...base, mode: 'sequential' }), 3, 5);
    const plain = await openRuntime({ ...base, dramBudget: await tierBudget(base, 0.25), ssd: { dir: tmp() } });
    await decode(plain, 3, 5);
    const { traffic: t0 } = (await plain.stats()).memory;
    await plain.close();
    for (const mode of ['sequential', 'pipelined'] as const) {
      const hotTier = { windows: 2, maxBytes: 1 << 22 };
      const rt = await openRuntime({ ...base, mode, dramBudget: await tierBudget({ ...base, mode, hotTier }, 0.25), ssd: { dir: tmp() }, hotTier });
      expect((await decode(rt, 3, 5)).map(bits)).toEqual(expected.map(bits));
      const st = await rt.stats();
      expect(st.hits).toBeGreaterThan(0);
      expect(st.ssdChunks).toBeGreaterThan(0);
      // hits are not fetched again (from the DRAM tier or SSD)
      const t = st.memory.traffic;
      expect(t.dramChunks + t.ssdChunks).toBeLessThan(t0.dramChunks + t0.ssdChunks);
      expect(t.ssdChunks).toBeLessThanOrEqual(t0.ssdChunks);
      await rt.close();
    }
  });

  it('prefill warm-up (obsQ) with a hot tier and SSD: warmed chunks are hits, outputs equal the DRAM-only tier', async () => {
    const run = async (ssd: boolean) => {
      const opts: RuntimeOptions = { shape, budget: 32, maxSequences: 1, maxTokens: 512, hotTier: { windows: 2, maxBytes: 1 << 22 } };
      const rt = await openRuntime(ssd ? { ...opts, dramBudget: await tierBudget(opts, 0.25), ssd: { dir: tmp() } } : opts);
      const s = rt.createSequence();
      await rt.prefill(s, 0, kvt(randn(PROMPT * row, 1), PROMPT), kvt(randn(PROMPT * row, 2), PROMPT), randn(8 * shape.qHeads * shape.headDim, 3));
      const out = await rt.attend(0, [{ seq: s, q: randn(shape.qHeads * shape.headDim, 4), kNew: randn(row, 5), vNew: randn(row, 6) }]);
      const st = await rt.stats();
      await rt.close();
      return { out: out.map(bits), st };
    };
    const dram = await run(false);
    const ssd = await run(true);
    expect(ssd.out).toEqual(dram.out);
    expect(ssd.st.warmedChunks).toBe(dram.st.warmedChunks);
    expect(ssd.st.warmedChunks).toBeGreaterThan(0);
    expect(ssd.st.hits).toBe(dram.st.hits);
    expect(ssd.st.ssdChunks).toBeGreaterThan(0);
    expect(ssd.st.ssdChunks).toBeLessThanOrEqual(ssd.st.misses); // only misses are read from SSD
  });

  it("a prefill's observation window ranks what the DRAM tier keeps: fewer SSD reads, the same outputs", async () => {
    // A synthetic trace's own prompt-end queries (what a host's prefill computes) against none: the
    // DRAM tier (a third of the sealed chunks) then fills in chunk order.
    // 4 kv heads: steps where some heads wait for reads and an odd number do not (the early call
    // then holds one back, step.ts) are among these.
    const trace = generateSyntheticTrace({ layers: 1, promptTokens: 4096, decodeSteps: 8, qHeads: 8, kvHeads: 4, headDim: 32, dtype: 'f32', seed: 21 });
    const { promptTokens: T, decodeSteps: S, qHeads, kvHeads, headDim } = trace.meta;
    const d = trace.layerData(0);
    const opts: RuntimeOptions = { shape: { layers: 1, qHeads, kvHeads, headDim }, budget: 64, maxSequences: 1, maxTokens: T + S };
    const dramBudget = await tierBudget(opts, 1 / 3);
    const run = async (obs: boolean, ssd = true) => {
      const rt = await openRuntime(ssd ? { ...opts, dramBudget, ssd: { dir: tmp() } } : opts);
      const s = rt.createSequence();
      const t = (data: Float32Array | Uint16Array): KvTensor => ({ data, dtype: 'f32', tokens: T, heads: kvHeads, dim: headDim });
      await rt.prefill(s, 0, t(d.k), t(d.v), obs ? trace.observationQueries(0, 16) : undefined);
      const outs: string[] = [];
      const r = kvHeads * headDim;
      for (let i = 0; i < S; i++) {
        const [o] = await rt.attend(0, [{ seq: s, q: (d.q as Float32Array).slice(i * qHeads * headDim, (i + 1) * qHeads * headDim), kNew: (d.kNew as Float32Array).slice(i * r, (i + 1) * r), vNew: (d.vNew as Float32Array).slice(i * r, (i + 1) * r) }]);
        outs.push(bits(o!));
      }
      const st = await rt.stats();
      await rt.close();
      return { outs, ssd: st.ssdChunks };
    };
    const cold = await run(false);
    const ranked = await run(true);
    expect(ranked.outs).toEqual(cold.outs);
    expect(ranked.outs).toEqual((await run(true, false)).outs);
    expect(cold.ssd).toBeGreaterThan(0);
    expect(ranked.ssd).toBeLessThan(cold.ssd / 2);
  });

  it('closing a sequence deletes its segments and the handle is reused', async () => {
    const dir = tmp();
    const opts: RuntimeOptions = { shape, budget: 16, maxSequences: 1, maxTokens: 512 };
    const rt = await openRuntime({ ...opts, dramBudget: await tierBudget(opts, 0.25), ssd: { dir } });
    await decode(rt, 1, 9);
    await rt.closeSequence(0);
    expect(readdirSync(dir).filter((f) => f.endsWith('.kvseg'))).toEqual([]);
    const again = await decode(rt, 1, 9);
    const ref = await openRuntime({ shape, budget: 16, maxSequences: 1, maxTokens: 512 });
    expect(again.map(bits)).toEqual((await decode(ref, 1, 9)).map(bits));
    await ref.close();
    await rt.close();
  });

  it('one runtime per directory (E_BUSY until it closes); the segments of a runtime that never closed are deleted at the next open', async () => {
    const dir = tmp();
    const opts: RuntimeOptions = { shape, budget: 16, maxSequences: 1, maxTokens: 512 };
    const dramBudget = await tierBudget(opts, 0.25);
    const rt = await openRuntime({ ...opts, dramBudget, ssd: { dir } });
    await expectKvdError(() => openRuntime({ ...opts, dramBudget, ssd: { dir } }), 'E_BUSY', /close that runtime first/);
    const first = await decode(rt, 1, 9);
    // What a runtime whose process died leaves: a manifest listing its segments, and their files.
    const dead = tmp();
    for (const f of readdirSync(dir)) if (f !== 'LOCK') cpSync(join(dir, f), join(dead, f));
    expect(readdirSync(dead).filter((f) => f.endsWith('.kvseg')).length).toBeGreaterThan(0);
    await rt.close();
    const reopened = await openRuntime({ ...opts, dramBudget, ssd: { dir } });
    await reopened.close();
    // The same segment ids are free again: the decode seals them anew and gives the same outputs.
    const next = await openRuntime({ ...opts, dramBudget, ssd: { dir: dead } });
    expect(readdirSync(dead).filter((f) => f.endsWith('.kvseg'))).toEqual([]);
    expect((await decode(next, 1, 9)).map(bits)).toEqual(first.map(bits));
    await next.close();
    // A runtime of another shape (f16 KV instead of f32) takes the directory over as well.
    const f16 = await openRuntime({ ...opts, dtype: 'f16', dramBudget, ssd: { dir: dead } });
    expect((await decode(f16, 1, 9)).length).toBe(first.length);
    await f16.close();
  });

  it('rejects bad ssd options', async () => {
    await expectKvdError(() => openRuntime({ shape, budget: 8, ssd: { dir: '' } }), 'E_CONFIG', /options.ssd: expected \{ dir/);
    await expectKvdError(() => openRuntime({ shape, budget: 8, ssd: { dir: tmp(), io: { kind: 'floppy' } } as never }), 'E_CONFIG', /options.ssd/);
    await expectKvdError(() => openRuntime({ shape, budget: 8, ssd: { dir: tmp(), layout: 'pages' } as never }), 'E_CONFIG', /options.ssd/);
    await expectKvdError(() => openRuntime({ shape, budget: 8, ssd: { dir: tmp() } }), 'E_CONFIG', /dramBudget/);
    await expectKvdError(() => openRuntime({ shape, budget: 8, dramBudget: 1 << 20, ssd: { dir: tmp(), streamHeads: 0 } }), 'E_CONFIG', /options.ssd: expected .*streamHeads/);
    await expectKvdError(() => openRuntime({ shape, budget: 8, dramBudget: 1 << 20, ssd: { dir: tmp(), streamHeads: shape.kvHeads + 1 } }), 'E_CONFIG', /ssd.streamHeads: expected kv heads per streamed group in \[1, /);
  });
});
