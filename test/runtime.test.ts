// Runtime (the memory model; without dramBudget everything declared is held in DRAM): sequential
// and pipelined modes give bit-identical outputs, a budget covering the whole context reproduces
// dense attention, stats, and typed errors.
import { describe, expect, it } from 'vitest';
import { openRuntime, type Runtime, type RuntimeOptions } from '../src/runtime/runtime.js';
import { attendDense } from '../src/attention/kernels.js';
import type { KvTensor } from '../src/types.js';
import { expectKvdError, randn } from './helpers.js';
import { osThreads } from './threads.js';
import { resolvePolicyOptions } from '../src/index/options.js';

const shape = { layers: 2, qHeads: 4, kvHeads: 2, headDim: 16 };
const PROMPT = 300;
const SEQS = 3;
const STEPS = 5;

const kvt = (data: Float32Array, tokens: number): KvTensor => ({ data, dtype: 'f32', tokens, heads: shape.kvHeads, dim: shape.headDim });

/** Prompt K/V per (seq, layer) and per-step q/kNew/vNew, deterministic. */
function makeCase(seed: number) {
  const row = shape.kvHeads * shape.headDim;
  const prompt = (s: number, l: number, kind: number) => randn(PROMPT * row, seed + 1000 * s + 100 * l + kind);
  const step = (s: number, l: number, t: number, what: number, n: number) => randn(n, seed + 7919 * (1 + s) + 131 * l + 17 * t + what * 3);
  return { prompt, step, row };
}

/** Runs STEPS decode steps over all layers for `n` sequences; returns every output in order. */
async function decode(rt: Runtime, seed: number, n = SEQS): Promise<Float32Array[]> {
  const c = makeCase(seed);
  const seqs = Array.from({ length: n }, () => rt.createSequence());
  for (const [i, s] of seqs.entries())
    for (let l = 0; l < shape.layers; l++) await rt.prefill(s, l, kvt(c.prompt(i, l, 0), PROMPT), kvt(c.prompt(i, l, 1), PROMPT));
  const outs: Float32Array[] = [];
  for (let t = 0; t < STEPS; t++)
    for (let l = 0; l < shape.layers; l++) {
      const batch = seqs.map((s, i) => ({
        seq: s,
        q: c.step(i, l, t, 0, shape.qHeads * shape.headDim),
        kNew: c.step(i, l, t, 1, c.row),
        vNew: c.step(i, l, t, 2, c.row),
      }));
      outs.push(...(await rt.attend(l, batch)));
    }
  return outs;
}

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');

describe('Runtime', () => {
  it('pipelined outputs are bit-identical to sequential ones (kvdrive policy, micro-batches of 2)', async () => {
    const before = await osThreads();
    const opts: RuntimeOptions = { shape, budget: 32, policy: 'kvdrive', microBatch: 2, maxSequences: SEQS, maxTokens: 512 };
    const seq = await openRuntime({ ...opts, mode: 'sequential' });
    const a = await decode(seq, 11);
    const pip = await openRuntime({ ...opts, mode: 'pipelined' });
    const b = await decode(pip, 11);
    expect(b.length).toBe(a.length);
    for (let i = 0; i < a.length; i++) expect(bits(b[i]!)).toBe(bits(a[i]!));
    // real, distinct outputs (not zeros or one repeated vector)
    expect(new Set(a.map(bits)).size).toBe(a.length);
    expect(a.every((o) => o.some((x) => x !== 0))).toBe(true);

    const ss = await seq.stats();
    expect(ss.mode).toBe('sequential');
    expect(ss.attendCalls).toBe(STEPS * shape.layers);
    expect(ss.entries).toBe(STEPS * shape.layers * SEQS);
    expect(ss.microBatches).toBe(STEPS * shape.layers * 2); // 3 entries in micro-batches of 2 → 2 per call
    expect(ss.selectionMs).toBeGreaterThan(0);
    expect(ss.computeMs).toBeGreaterThan(0);
    // The DRAM tier holds every sealed chunk (no SSD, no hot tier): attention reads them where they
    // lie, looked up as it lists its spans, so there is no fetch stage; the traffic is still counted.
    expect(ss.fetchMs).toBe(0);
    expect(ss.memory.traffic.dramChunks).toBeGreaterThan(0);
    expect(ss.memory.traffic.chunks).toBe(ss.memory.traffic.dramChunks + ss.memory.traffic.tailChunks);
    expect(ss.maxInFlight).toBe(1);
    const ps = await pip.stats();
    expect(ps.microBatches).toBe(ss.microBatches);
    expect(ps.maxInFlight).toBe(2);
    expect(ps.memory.traffic).toEqual(ss.memory.traffic); // the same step, the same tiers
    expect(ps.stallMs).toBeGreaterThanOrEqual(0);
    // Without dramBudget the budget is what holds everything declared, itemised.
    const p = ss.memory.plan;
    expect(p.residentBytes + p.indexBytes + p.hotTierBytes + p.fetchBytes + p.selectArenaBytes + p.ioBufferBytes + p.dramTierBytes).toBe(p.dramBudgetBytes);
    expect(p.selectArenaBytes).toBe(0); // sequential: no select stage
    // Pipelined: the select stage's shared arena (4 slots of queries and selections) is budgeted too.
    const pp = ps.memory.plan;
    expect(pp.selectArenaBytes).toBeGreaterThan(0);
    expect(pp.residentBytes + pp.indexBytes + pp.hotTierBytes + pp.fetchBytes + pp.selectArenaBytes + pp.ioBufferBytes + pp.dramTierBytes).toBe(pp.dramBudgetBytes);
    const cs = resolvePolicyOptions('kvdrive', { qHeads: 4, kvHeads: 2, headDim: 16 }).chunkSize;
    expect(ss.memory.dram.capacityChunks).toBe(SEQS * shape.layers * shape.kvHeads * Math.ceil(512 / cs));
    await seq.close();
    await pip.close();
    expect(await osThreads()).toBe(before);
  });

  it('more micro-batches than run at once (7 x 1, 4 at a time): still bit-identical, quest policy', async () => {
    const opts: RuntimeOptions = { shape, budget: 48, policy: 'quest', microBatch: 1, maxSequences: 7, maxTokens: 400 };
    const seq = await openRuntime({ ...opts, mode: 'sequential' });
    const pip = await openRuntime({ ...opts, mode: 'pipelined' });
    const a = await decode(seq, 21, 7);
    const b = await decode(pip, 21, 7);
    expect(b.map(bits)).toEqual(a.map(bits));
    expect((await pip.stats()).microBatches).toBe(STEPS * shape.layers * 7);
    await seq.close();
    await pip.close();
  });

  it.each(['sequential', 'pipelined'] as const)('%s: a budget covering the context reproduces dense attention exactly', async (mode) => {
    const rt = await openRuntime({ shape, budget: 4096, policy: 'quest', mode, maxSequences: 1, maxTokens: 512 });
    const c = makeCase(5);
    const s = rt.createSequence();
    const K = c.prompt(0, 1, 0);
    const V = c.prompt(0, 1, 1);
    await rt.prefill(s, 1, kvt(K, PROMPT), kvt(V, PROMPT));
    const q = c.step(0, 1, 0, 0, shape.qHeads * shape.headDim);
    const kNew = c.step(0, 1, 0, 1, c.row);
    const vNew = c.step(0, 1, 0, 2, c.row);
    const [out] = await rt.attend(1, [{ seq: s, q, kNew, vNew }]);
    const Kall = new Float32Array([...K, ...kNew]);
    const Vall = new Float32Array([...V, ...vNew]);
    const dense = attendDense({ q, qHeads: shape.qHeads, k: kvt(Kall, PROMPT + 1), v: kvt(Vall, PROMPT + 1) });
    expect(bits(out!)).toBe(bits(dense.out));
    await rt.close();
  });

  it('prefill accepts the htd layout (same result as thd)', async () => {
    const rt = await openRuntime({ shape, budget: 16, maxSequences: 2, maxTokens: 400 });
    const c = makeCase(8);
    const K = c.prompt(0, 0, 0);
    const V = c.prompt(0, 0, 1);
    const toHtd = (x: Float32Array) => {
      const o = new Float32Array(x.length);
      for (let t = 0; t < PROMPT; t++)
        for (let h = 0; h < shape.kvHeads; h++) o.set(x.subarray((t * shape.kvHeads + h) * 16, (t * shape.kvHeads + h + 1) * 16), (h * PROMPT + t) * 16);
      return o;
    };
    const a = rt.createSequence();
    const b = rt.createSequence();
    await rt.prefill(a, 0, kvt(K, PROMPT), kvt(V, PROMPT));
    await rt.prefill(b, 0, { ...kvt(toHtd(K), PROMPT), layout: 'htd' }, { ...kvt(toHtd(V), PROMPT), layout: 'htd' });
    const q = c.step(0, 0, 0, 0, 64);
    const kNew = c.step(0, 0, 0, 1, 32);
    const [oa, ob] = await rt.attend(0, [
      { seq: a, q, kNew, vNew: kNew },
      { seq: b, q, kNew, vNew: kNew },
    ]);
    expect(bits(ob!)).toBe(bits(oa!));
    await rt.close();
  });
});

describe('Runtime with a hot tier', () => {
  it('outputs are bit-identical to no tier, sequentially and pipelined; hits counted', async () => {
    const before = await osThreads();
    const opts: RuntimeOptions = { shape, budget: 32, policy: 'kvdrive', microBatch: 2, maxSequences: SEQS, maxTokens: 512 };
    const hotTier = { windows: 2, maxBytes: 1 << 22 };
    const plain = await openRuntime({ ...opts, mode: 'sequential' });
    const seqTier = await openRuntime({ ...opts, mode: 'sequential', hotTier });
    const pipTier = await openRuntime({ ...opts, mode: 'pipelined', hotTier });
    const a = await decode(plain, 17);
    const b = await decode(seqTier, 17);
    const c = await decode(pipTier, 17);
    expect(b.map(bits)).toEqual(a.map(bits));
    expect(c.map(bits)).toEqual(a.map(bits));
    const sb = await seqTier.stats();
    const sc = await pipTier.stats();
    expect(sb.hits).toBeGreaterThan(0); // consecutive queries of one sequence reuse chunks
    expect(sb.hits + sb.misses).toBeGreaterThan(0);
    expect([sc.hits, sc.misses]).toEqual([sb.hits, sb.misses]); // same residency decisions
    expect(sb.fetchMs).toBeGreaterThan(0);
    expect((await plain.stats()).hits).toBe(0);
    await Promise.all([plain.close(), seqTier.close(), pipTier.close()]);
    expect(await osThreads()).toBe(before);
  });

  it('prefill with an observation window warms the tier; outputs stay bit-identical across modes', async () => {
    const opts: RuntimeOptions = { shape, budget: 32, microBatch: 2, maxSequences: 2, maxTokens: 400, hotTier: { windows: 2, maxBytes: 1 << 22 } };
    const run = async (mode: 'sequential' | 'pipelined', warm: boolean) => {
      const rt = await openRuntime({ ...opts, mode });
      const c = makeCase(31);
      const s = rt.createSequence();
      const obsQ = warm ? randn(8 * shape.qHeads * shape.headDim, 77) : undefined;
      await rt.prefill(s, 0, kvt(c.prompt(0, 0, 0), PROMPT), kvt(c.prompt(0, 0, 1), PROMPT), obsQ);
      const outs: Float32Array[] = [];
      for (let t = 0; t < 3; t++)
        outs.push(...(await rt.attend(0, [{ seq: s, q: c.step(0, 0, t, 0, 64), kNew: c.step(0, 0, t, 1, 32), vNew: c.step(0, 0, t, 2, 32) }])));
      const st = await rt.stats();
      await rt.close();
      return { outs: outs.map(bits), st };
    };
    const cold = await run('sequential', false);
    const seqWarm = await run('sequential', true);
    const pipWarm = await run('pipelined', true);
    expect(cold.st.warmedChunks).toBe(0);
    expect(seqWarm.st.warmedChunks).toBeGreaterThan(0);
    expect(pipWarm.st.warmedChunks).toBe(seqWarm.st.warmedChunks);
    expect(seqWarm.outs).toEqual(cold.outs); // residency never changes the numbers
    expect(pipWarm.outs).toEqual(cold.outs);
    expect(seqWarm.st.hits).toBeGreaterThan(cold.st.hits); // warmed chunks are hit on the first step
  });

  it('prefill obsQ and re-prefill errors', async () => {
    const c = makeCase(2);
    const K = kvt(c.prompt(0, 0, 0), PROMPT);
    const rt = await openRuntime({ shape, budget: 8, maxSequences: 1, maxTokens: 400, hotTier: { windows: 1, maxBytes: 1 << 20 } });
    const s = rt.createSequence();
    await expectKvdError(() => rt.prefill(s, 0, K, K, new Float32Array(65)), 'E_SHAPE', /obsQ length: expected W x qHeads x headDim/);
    const nan = new Float32Array(64);
    nan[1] = Infinity;
    await expectKvdError(() => rt.prefill(s, 0, K, K, nan), 'E_NONFINITE', /obsQ/);
    await rt.prefill(s, 0, K, K, new Float32Array(64).fill(0.5));
    await expectKvdError(() => rt.prefill(s, 0, K, K), 'E_CONFIG', /one prefill per layer/);
    await rt.close();
  });

  it('reuses a closed sequence handle: its tier arenas are emptied, outputs equal a fresh runtime', async () => {
    const tier = { windows: 1, maxBytes: 1 << 20 };
    const rt = await openRuntime({ shape, budget: 8, maxSequences: 1, maxTokens: 400, hotTier: tier });
    const first = await decode(rt, 21, 1); // fills the tier with sequence 0's chunks
    const before = (await rt.stats()).misses;
    await rt.closeSequence(0);
    const again = await decode(rt, 22, 1); // same handle, other data
    const fresh = await openRuntime({ shape, budget: 8, maxSequences: 1, maxTokens: 400, hotTier: tier });
    const ref = await decode(fresh, 22, 1);
    expect(again.map(bits)).toEqual(ref.map(bits));
    expect(again.map(bits)).not.toEqual(first.map(bits));
    // the reused handle starts cold: it misses exactly as often as the fresh runtime
    expect((await rt.stats()).misses - before).toBe((await fresh.stats()).misses);
    await fresh.close();
    await expectKvdError(() => rt.createSequence(), 'E_NOMEM', /fewer than maxSequences = 1 open sequences/);
    await rt.close();
    await expectKvdError(() => openRuntime({ shape, budget: 8, hotTier: { windows: 1, maxBytes: 64 } }), 'E_BUDGET');
    await expectKvdError(() => openRuntime({ shape, budget: 8, hotTier: { windows: 1, maxBytes: 1 << 20, eviction: 'fifo' } }), 'E_POLICY', /eviction/);
    await expectKvdError(() => openRuntime({ shape, budget: 8, hotTier: { windows: 1 } as never }), 'E_CONFIG', /hotTier/);
  });
});

describe('Runtime errors', () => {
  it('pipelined close rejects queued calls with E_CLOSED and leaves no threads', async () => {
    const before = await osThreads();
    const rt = await openRuntime({ shape, budget: 8, mode: 'pipelined', maxSequences: 1, maxTokens: 400 });
    const c = makeCase(4);
    const s = rt.createSequence();
    await rt.prefill(s, 0, kvt(c.prompt(0, 0, 0), PROMPT), kvt(c.prompt(0, 0, 1), PROMPT));
    const entry = { seq: s, q: c.step(0, 0, 0, 0, 64), kNew: c.step(0, 0, 0, 1, 32), vNew: c.step(0, 0, 0, 2, 32) };
    const settle = (x: Promise<unknown>) => x.then(() => undefined, (e: unknown) => e);
    const queued = [settle(rt.attend(0, [entry])), settle(rt.attend(0, [entry]))];
    await rt.close();
    for (const q of queued) await expectKvdError(async () => { throw await q; }, 'E_CLOSED', /closed/);
    await expectKvdError(() => rt.prefill(s, 0, kvt(c.prompt(0, 0, 0), PROMPT), kvt(c.prompt(0, 0, 1), PROMPT)), 'E_CLOSED');
    expect(() => rt.createSequence()).toThrow(/closed/);
    expect(await osThreads()).toBe(before);
  });

  it('rejects bad options', async () => {
    await expectKvdError(() => openRuntime({ shape, budget: 0 }), 'E_CONFIG', /options.budget: expected an integer >= 1, got 0/);
    await expectKvdError(() => openRuntime({ shape: { ...shape, qHeads: 3 }, budget: 8 }), 'E_CONFIG', /options.shape: expected .* multiple of kvHeads/);
    await expectKvdError(() => openRuntime({ shape, budget: 8, mode: 'parallel' as never }), 'E_CONFIG', /options.mode/);
    await expectKvdError(() => openRuntime({ shape, budget: 8, turbo: true } as never), 'E_CONFIG', /unknown turbo/);
    await expectKvdError(() => openRuntime({ shape, budget: 8, policyOptions: { chunkSize: 0 } }), 'E_CONFIG', /chunkSize/);
    await expectKvdError(() => openRuntime({ shape, budget: 8, policyOptions: { headDim: 16 } as never }), 'E_CONFIG', /policyOptions.headDim/);
    await expectKvdError(() => openRuntime({ shape, budget: 8, kvMemoryBytes: 1000 } as never), 'E_CONFIG', /unknown kvMemoryBytes/);
    await expectKvdError(() => openRuntime({ shape, budget: 8, ssd: { dir: '/tmp' } }), 'E_CONFIG', /options.dramBudget: expected a DRAM budget in bytes with ssd/);
    await expectKvdError(() => openRuntime({ shape, budget: 8, maxSequences: 2, maxTokens: 1000, dramBudget: 1000 }), 'E_BUDGET', /dramBudget \(no SSD store: DRAM holds every chunk\): expected at least \d+ bytes/);
  });

  it('rejects bad sequences, prefill and attend input with typed errors, before changing anything', async () => {
    const rt = await openRuntime({ shape, budget: 8, maxSequences: 1, maxTokens: 301 });
    const s = rt.createSequence();
    expect(() => rt.createSequence()).toThrow(/maxSequences = 1/);
    await expectKvdError(() => rt.createSequence(), 'E_NOMEM');
    const c = makeCase(3);
    const K = kvt(c.prompt(0, 0, 0), PROMPT);
    const q = new Float32Array(64);
    const kNew = new Float32Array(32);
    await expectKvdError(() => rt.attend(0, [{ seq: s, q, kNew, vNew: kNew }]), 'E_RANGE', /prefilled first/);
    await expectKvdError(() => rt.prefill(s, 2, K, K), 'E_RANGE', /layer: expected an integer in \[0, 2\), got 2/);
    await expectKvdError(() => rt.prefill(7, 0, K, K), 'E_RANGE', /seq: expected a handle of an open sequence/);
    await expectKvdError(() => rt.prefill(s, 0, { ...K, dtype: 'f16' }, K), 'E_DTYPE', /dtype 'f32'/);
    await expectKvdError(() => rt.prefill(s, 0, { ...K, heads: 1 }, K), 'E_SHAPE', /2 x 16, got "1 x 16"/);
    await expectKvdError(() => rt.prefill(s, 0, K, kvt(c.prompt(0, 0, 1).subarray(0, 32), 1)), 'E_SHAPE', /v.tokens/);
    await rt.prefill(s, 0, K, K);
    await expectKvdError(() => rt.attend(0, []), 'E_SHAPE', /non-empty array/);
    await expectKvdError(() => rt.attend(0, [{ seq: s, q: new Float32Array(5), kNew, vNew: kNew }]), 'E_SHAPE', /q: expected 64 elements, got 5/);
    await expectKvdError(() => rt.attend(0, [{ seq: s, q: [1] as never, kNew, vNew: kNew }]), 'E_TYPE', /Float32Array\(64\)/);
    const bad = new Float32Array(32);
    bad[3] = NaN;
    await expectKvdError(() => rt.attend(0, [{ seq: s, q, kNew: bad, vNew: kNew }]), 'E_NONFINITE', /kNew: expected finite values, got NaN at element 3/);
    await expectKvdError(() => rt.attend(0, [{ seq: s, q, kNew, vNew: kNew }, { seq: s, q, kNew, vNew: kNew }]), 'E_CONFIG', /at most once per batch/);
    // none of the rejected calls appended a token: the one free position is still there
    await rt.attend(0, [{ seq: s, q, kNew, vNew: kNew }]);
    await expectKvdError(() => rt.attend(0, [{ seq: s, q, kNew, vNew: kNew }]), 'E_BUDGET', /at most maxTokens = 301 tokens, got 302/);
    await rt.closeSequence(s);
    await expectKvdError(() => rt.attend(0, [{ seq: s, q, kNew, vNew: kNew }]), 'E_RANGE', /open sequence/);
    expect(rt.createSequence()).toBe(s);
    await rt.close();
    await expectKvdError(() => rt.attend(0, [{ seq: s, q, kNew, vNew: kNew }]), 'E_CLOSED');
    await expectKvdError(() => rt.stats(), 'E_CLOSED');
  });
});
