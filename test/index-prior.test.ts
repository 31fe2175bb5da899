import { describe, expect, it } from 'vitest';
import type { Selection } from '../src/index.js';
import { createPolicy } from '../src/index/policy.js';
import { offloadedPolicyOptions, type PolicyOptions } from '../src/index/options.js';
import { prefixView } from '../src/eval/replay.js';
import { expectKvdError } from './helpers.js';
import { traceReplay } from './trace-replay.js';

// The selection of the previous decode step as the next one's prior (reuseCandidateFactor).
const T = 8192;
const BUDGET = 128;
const shape = { qHeads: 8, kvHeads: 2, headDim: 64 };
const tr = await traceReplay({ T, steps: 2, budget: BUDGET, shape, seed: 6 });
const { k, qAt } = tr;
const kv = prefixView(k, T);

/** A built offloaded (keyless, sketch re-rank) kvdrive policy with these options. */
async function policy(o: PolicyOptions) {
  const p = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { ...shape, ...o }));
  await p.build(kv, T);
  return p;
}
const idsOf = (s: Selection) => Array.from(s.chunkIds);
/** Every token [0, tokens) as one selection per kv head. */
function everyToken(tokens: number): Selection {
  const ids = Int32Array.from({ length: shape.kvHeads * tokens }, (_, i) => i % tokens);
  const offsets = Int32Array.from({ length: shape.kvHeads + 1 }, (_, h) => h * tokens);
  return { chunkSize: 1, tokens, sinkEnd: 0, tailStart: tokens, offsets, chunkIds: ids };
}

describe('kvdrive prior selection (reuse across decode steps)', () => {
  it('a prior covering every token makes every token a candidate: the selection of taking every cluster', async () => {
    const q = qAt(0);
    const all = await policy({ candidateFactor: 1e6 });
    const want = all.select(q, BUDGET);
    const few = await policy({ candidateFactor: 1, reuseCandidateFactor: 1 });
    const cold = few.select(q, BUDGET);
    few.setPrior(everyToken(T));
    const warm = few.select(q, BUDGET);
    // The same tokens scored (normalisers summed in another order: a near-tie may fall either way).
    const w = new Set(idsOf(want));
    const same = (s: Selection) => idsOf(s).filter((t) => w.has(t)).length / w.size;
    expect(same(warm)).toBeGreaterThanOrEqual(0.99);
    // Without the prior the few clusters miss some of them.
    expect(same(cold)).toBeLessThan(same(warm));
    // setPrior(null) gives back the selection of no prior.
    few.setPrior(null);
    expect(idsOf(few.select(q, BUDGET))).toEqual(idsOf(cold));
  });

  it('the prior is kept and counted only where it is used (reuseCandidateFactor > 0, kvdrive)', async () => {
    const q = qAt(1);
    const on = await policy({ reuseCandidateFactor: 2 });
    const off = await policy({ reuseCandidateFactor: 0 });
    const prior = on.select(qAt(0), BUDGET);
    const before = { on: on.indexBytes(), off: off.indexBytes() };
    const offCold = off.select(q, BUDGET);
    on.setPrior(prior);
    off.setPrior(prior);
    // 4 bytes per prior token and kv head.
    expect(on.indexBytes() - before.on).toBeGreaterThanOrEqual(4 * shape.kvHeads * BUDGET);
    expect(off.indexBytes()).toBe(before.off);
    expect(idsOf(off.select(q, BUDGET))).toEqual(idsOf(offCold));
    // A rebuild drops it.
    await on.build(kv, T);
    expect(on.indexBytes()).toBe(before.on);
    // quest keeps none either.
    const quest = createPolicy('quest', shape);
    await quest.build(kv, T);
    const qb = quest.indexBytes();
    quest.setPrior(quest.select(q, BUDGET));
    expect(quest.indexBytes()).toBe(qb);
  });

  it('a chunk-granular prior is read as the tokens of its chunks', async () => {
    const q = qAt(1);
    const a = await policy({ reuseCandidateFactor: 2 });
    const b = await policy({ reuseCandidateFactor: 2 });
    const sel = a.select(qAt(0), BUDGET);
    // The same tokens as 4-token chunks and as single tokens.
    const chunks = new Set<number>();
    const perHead: number[][] = [];
    for (let h = 0; h < shape.kvHeads; h++) {
      const ids = [...new Set(Array.from(sel.chunkIds.subarray(sel.offsets[h]!, sel.offsets[h + 1]!), (t) => t >> 2))];
      perHead.push(ids);
      for (const c of ids) chunks.add(c);
    }
    const chunkSel: Selection = {
      chunkSize: 4, tokens: sel.tokens, sinkEnd: sel.sinkEnd, tailStart: sel.tailStart,
      offsets: Int32Array.from([0, ...perHead.map((_, h) => perHead.slice(0, h + 1).flat().length)]), chunkIds: Int32Array.from(perHead.flat()),
    };
    const tokenSel: Selection = {
      ...chunkSel, chunkSize: 1,
      offsets: Int32Array.from([0, ...perHead.map((_, h) => perHead.slice(0, h + 1).flat().length * 4)]),
      chunkIds: Int32Array.from(perHead.flat().flatMap((c) => [4 * c, 4 * c + 1, 4 * c + 2, 4 * c + 3])),
    };
    a.setPrior(chunkSel);
    b.setPrior(tokenSel);
    expect(idsOf(a.select(q, BUDGET))).toEqual(idsOf(b.select(q, BUDGET)));
    expect(chunks.size).toBeGreaterThan(0);
  });

  it('rejects a prior of the wrong shape with a typed error and keeps the previous one', async () => {
    const p = await policy({ reuseCandidateFactor: 2 });
    const sel = p.select(qAt(0), BUDGET);
    p.setPrior(sel);
    const bytes = p.indexBytes();
    const next = p.select(qAt(1), BUDGET);
    const bad = (s: unknown) => () => p.setPrior(s as Selection);
    expectKvdError(bad(42), 'E_TYPE', /Selection/);
    expectKvdError(bad({ ...sel, offsets: sel.offsets.subarray(0, 2) }), 'E_SHAPE', /offsets/);
    expectKvdError(bad({ ...sel, tokens: T + 1, tailStart: T + 1 }), 'E_RANGE', /tokens/);
    const ids = Int32Array.from(sel.chunkIds);
    ids[1] = ids[0]!;
    expectKvdError(bad({ ...sel, chunkIds: ids }), 'E_RANGE', /ascending/);
    const far = Int32Array.from(sel.chunkIds);
    far[far.length - 1] = T;
    expectKvdError(bad({ ...sel, chunkIds: far }), 'E_RANGE', /chunk id/);
    expect(p.indexBytes()).toBe(bytes);
    expect(idsOf(p.select(qAt(1), BUDGET))).toEqual(idsOf(next));
    const unbuilt = createPolicy('kvdrive', offloadedPolicyOptions('kvdrive', { ...shape, reuseCandidateFactor: 2 }));
    expectKvdError(() => unbuilt.setPrior(sel), 'E_CONFIG', /build/);
  });

  it('validates reuseCandidateFactor', () => {
    expectKvdError(() => createPolicy('kvdrive', { ...shape, reuseCandidateFactor: -1 }), 'E_CONFIG', /reuseCandidateFactor/);
    expectKvdError(() => createPolicy('quest', { ...shape, reuseCandidateFactor: 2 }), 'E_CONFIG', /kvdrive-only/);
  });
});
