/**
 * Window profiler (kvdrive.txt §5.2, Fig. 8): replays a trace through a selection policy and, for
 * every (layer, kv head) and candidate window ×N, a real {@link HotTier} — recording the bytes
 * fetched per decode step (misses copied in or streamed) and the bytes the window keeps resident.
 * The result is the input of the window solver (benefit = fetched(smallest window) − fetched(w),
 * cost = resident bytes).
 *
 * Per layer: the policy indexes the prompt; each decode step selects once (with a lookahead pool of
 * poolFactor × budget tokens) and every window's tier fetches the same selection; attention is
 * computed once (attendSparse) and its chunk masses are recorded into every tier (the slot-read
 * attention is bit-identical, so this is what each tier would have measured itself).
 */
import { z } from 'zod';
import { KvdriveError } from '../errors.js';
import { attendSparse } from '../attention/kernels.js';
import { createPolicy } from '../index/policy.js';
import type { PolicyOptions } from '../index/options.js';
import type { PolicyName } from '../index/selection.js';
import { layerKvWithNew, type TraceReader } from '../trace/trace.js';
import type { KvTensor } from '../types.js';
import { EvictionPolicies, HotTier, resolveWindows, type EvictionPolicy } from './hot-tier.js';
import { parseProfile, type PairProfile, type WindowProfile } from './profile-types.js';
import { warmUp } from './warmup.js';

/** Options of {@link profileTrace}. */
export interface ProfileOptions {
  /** Candidate windows ×N (ascending unique integers ≥ 0), default [0, 1, 2, 3, 4]. */
  windows?: number[];
  /** Sparsity budget K in tokens per (layer, kv head), default 256. */
  budget?: number;
  /** Selection policy, default 'kvdrive'. */
  policy?: PolicyName;
  /** Extra options of the selection policy (chunkSize, sinks, local, ...). */
  policyOptions?: Partial<PolicyOptions>;
  /** Hot-tier eviction policy, default 'lookahead'. */
  eviction?: EvictionPolicy;
  /** Lookahead pool M as a multiple of the budget (M > K), default 1.25 (the paper's 2560 / 2048). */
  poolFactor?: number;
  /** Importance-guided warm-up before the first step, default true. */
  warmup?: boolean;
  /** Replay only the first `steps` decode steps (default all). */
  steps?: number;
  /** Progress callback after each (layer, step). */
  onStep?: (layer: number, step: number) => void;
}

const OptionsSchema = z.object({
  windows: z.array(z.number().int().min(0).max(1024)).min(1).optional(),
  budget: z.number().int().min(1).optional(),
  policy: z.enum(['kvdrive', 'quest', 'shadowkv']).optional(),
  policyOptions: z.record(z.string(), z.unknown()).optional(),
  eviction: z.enum(EvictionPolicies).optional(),
  poolFactor: z.number().min(1).max(64).optional(),
  warmup: z.boolean().optional(),
  steps: z.number().int().min(1).optional(),
  onStep: z.unknown().optional(),
});

/** A view of the first `tokens` tokens of a token-major KV tensor, without copying. */
function prefix(kv: KvTensor, tokens: number): KvTensor {
  const row = kv.heads * kv.dim;
  return { ...kv, tokens, data: kv.data.subarray(0, tokens * row) };
}

interface Resolved {
  windows: number[];
  budget: number;
  policyName: PolicyName;
  eviction: EvictionPolicy;
  poolTokens: number;
  warm: boolean;
  steps: number;
}

function resolve(trace: TraceReader, options: ProfileOptions): Resolved {
  const r = OptionsSchema.safeParse(options);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    throw new KvdriveError('E_CONFIG', `profile options.${issue.path.join('.')}: ${issue.message}`);
  }
  const windows = options.windows ?? [0, 1, 2, 3, 4];
  for (let i = 1; i < windows.length; i++)
    if (windows[i]! <= windows[i - 1]!)
      throw new KvdriveError('E_CONFIG', `profile options.windows: expected ascending unique windows, got [${windows.join(', ')}]`);
  const budget = options.budget ?? 256;
  return {
    windows,
    budget,
    policyName: options.policy ?? 'kvdrive',
    eviction: options.eviction ?? 'lookahead',
    poolTokens: Math.max(budget + 1, Math.round(budget * (options.poolFactor ?? 1.25))),
    warm: options.warmup ?? true,
    steps: Math.min(trace.meta.decodeSteps, options.steps ?? trace.meta.decodeSteps),
  };
}

/**
 * Replays layer l with one hot tier per entry of `tierWindows` (each: a window per kv head), all fed
 * the same selections and attention masses. Returns each tier's accumulated per-head stats.
 */
async function replayLayer(trace: TraceReader, l: number, o: Resolved, options: ProfileOptions, tierWindows: number[][]) {
  const { kvHeads, qHeads, headDim, promptTokens: T } = trace.meta;
  const layer = await trace.layer(l);
  const { k, v } = layerKvWithNew(layer);
  const policy = createPolicy(o.policyName, { ...options.policyOptions, qHeads, kvHeads, headDim });
  const chunkSize = policy.chunkSize;
  await policy.build(prefix(k, T), T);
  const perStep = Math.ceil(o.budget / chunkSize);
  const chunkBytes = 2 * chunkSize * headDim * (trace.dtype === 'f32' ? 4 : 2);
  const tiers: HotTier[] = [];
  try {
    for (const ws of tierWindows)
      tiers.push(
        new HotTier({
          layers: 1, kvHeads, headDim, dtype: trace.dtype, chunkSize, budget: o.budget, eviction: o.eviction, windows: [ws],
          // Slots plus generous metadata headroom: the profiler measures, it does not enforce a budget.
          maxBytes: ws.reduce((a, w) => a + w * perStep * (chunkBytes + 128), 0) + (1 << 20),
        }),
      );
    for (let s = 0; s < o.steps; s++) {
      const tokens = T + s + 1;
      const kv = prefix(k, tokens);
      const vv = prefix(v, tokens);
      const q = layer.q.subarray(s * qHeads * headDim, (s + 1) * qHeads * headDim);
      policy.extend(kv, tokens);
      const selection = policy.select(q, o.budget, { pool: o.poolTokens });
      if (s === 0 && o.warm) {
        // The trace holds no prompt queries: the first decode query (position T) is the
        // observation window.
        for (const t of tiers)
          warmUp(t, { layer: 0, k: prefix(k, T), v: prefix(v, T), q, qHeads, positions: Int32Array.of(T), sinkEnd: selection.sinkEnd, tailStart: Math.min(selection.tailStart, T) });
      }
      const att = attendSparse({ q, qHeads, k: kv, v: vv, selection });
      for (const t of tiers) {
        t.fetch({ layer: 0, k: kv, v: vv, selection });
        t.recordMass({ layer: 0, selection, chunkMass: att.chunkMass });
      }
      options.onStep?.(l, s);
    }
    return { stats: tiers.map((t) => t.stats().pairs), chunkSize, perStep, chunkBytes };
  } finally {
    for (const t of tiers) t.destroy();
  }
}

/**
 * Profiles a trace; see the module comment. Throws E_CONFIG for invalid options (naming the field).
 */
export async function profileTrace(trace: TraceReader, options: ProfileOptions = {}): Promise<WindowProfile> {
  const o = resolve(trace, options);
  const { layers, kvHeads, qHeads, headDim, promptTokens: T } = trace.meta;
  const pairs: PairProfile[] = [];
  let chunkSize = 0;
  for (let l = 0; l < layers; l++) {
    const r = await replayLayer(trace, l, o, options, o.windows.map((w) => new Array<number>(kvHeads).fill(w)));
    chunkSize = r.chunkSize;
    for (let h = 0; h < kvHeads; h++) {
      pairs.push({
        layer: l,
        head: h,
        fetchedBytesPerStep: r.stats.map((st) => (st[h]!.bytesAdmitted + st[h]!.bytesStreamed) / o.steps),
        residentBytes: o.windows.map((w) => w * r.perStep * r.chunkBytes),
        hitRate: r.stats.map((st) => (st[h]!.hits + st[h]!.misses > 0 ? st[h]!.hits / (st[h]!.hits + st[h]!.misses) : 0)),
      });
    }
  }
  return {
    version: 1,
    shape: { layers, kvHeads, qHeads, headDim },
    windows: o.windows,
    source: {
      policy: o.policyName,
      budget: o.budget,
      chunkSize,
      eviction: o.eviction,
      poolTokens: o.poolTokens,
      steps: o.steps,
      promptTokens: T,
      dtype: trace.dtype,
      warmup: o.warm ? 'importance of the first decode query (the trace holds no prompt queries)' : 'off',
      cost: 'K/V slot bytes of the window (slot metadata not included)',
    },
    pairs,
  };
}

/**
 * Replays a trace with a hot tier configured with `windows[layer][head]` (e.g. a solved
 * windows.json) and measures the bytes fetched per step (all pairs), the K/V slot bytes resident
 * and the hit rate — the check of a solver's prediction on the real tier.
 */
export async function measureWindows(
  trace: TraceReader,
  windows: number[][],
  options: Omit<ProfileOptions, 'windows'> = {},
): Promise<{ fetchedBytesPerStep: number; residentBytes: number; hitRate: number }> {
  const o = resolve(trace, options);
  const { layers, kvHeads } = trace.meta;
  resolveWindows(windows, layers, kvHeads);
  let fetched = 0;
  let resident = 0;
  let hits = 0;
  let selected = 0;
  for (let l = 0; l < layers; l++) {
    const r = await replayLayer(trace, l, o, options, [windows[l]!]);
    for (let h = 0; h < kvHeads; h++) {
      const st = r.stats[0]![h]!;
      fetched += (st.bytesAdmitted + st.bytesStreamed) / o.steps;
      resident += windows[l]![h]! * r.perStep * r.chunkBytes;
      hits += st.hits;
      selected += st.hits + st.misses;
    }
  }
  return { fetchedBytesPerStep: fetched, residentBytes: resident, hitRate: selected ? hits / selected : 0 };
}

/** Totals of a profile per window: fetched bytes per step (all pairs) and mean hit rate. */
export function profileTotals(p: WindowProfile): { window: number; fetchedBytesPerStep: number; residentBytes: number; hitRate: number }[] {
  p = parseProfile(p, 'profileTotals profile');
  return p.windows.map((w, j) => {
    let f = 0;
    let c = 0;
    let hr = 0;
    for (const pair of p.pairs) {
      f += pair.fetchedBytesPerStep[j]!;
      c += pair.residentBytes[j]!;
      hr += pair.hitRate?.[j] ?? 0;
    }
    return { window: w, fetchedBytesPerStep: f, residentBytes: c, hitRate: hr / p.pairs.length };
  });
}
