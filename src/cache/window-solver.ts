/**
 * 2D window scaling (kvdrive.txt §5.2): choose one hot-tier window ×N per (layer, kv head) so the
 * total resident bytes fit a budget and the total bytes fetched per decode step is minimal — a
 * multiple-choice knapsack (MCKP).
 *
 *  - exact: dynamic programming over the budget in units of the greatest common divisor of all
 *    costs (resident bytes are multiples of one chunk's K+V bytes, so this quantum is exact); when
 *    the table would exceed `maxDpCells`, costs are rounded UP to a coarser quantum (the result is
 *    still within budget, optimal for the rounded costs; reported as `quantised: true`).
 *  - greedy: start every pair at its cheapest window, then repeatedly apply the upgrade with the
 *    best benefit-to-cost ratio that still fits (the paper's offline heuristic).
 *  - auto: exact when the unquantised table fits, greedy otherwise.
 */
import { KvdriveError, fail } from '../errors.js';
import { z } from 'zod';
import type { WindowProfile } from './profile-types.js';

export type SolveMethod = 'exact' | 'greedy' | 'auto';

/** Options of {@link solveWindows}. */
export interface SolveWindowsOptions {
  /** Total hot-tier bytes over all (layer, kv head) pairs; a hard limit. */
  budgetBytes: number;
  /** Solver; default 'auto'. */
  method?: SolveMethod;
  /** Largest DP table (pairs × budget units) the exact method builds; default 2^25. */
  maxDpCells?: number;
}

/** A window allocation, as written to windows.json and accepted by the hot tier. */
export interface WindowAllocation {
  version: 1;
  shape: { layers: number; kvHeads: number };
  /** windows[layer][head] = ×N. */
  windows: number[][];
  budgetBytes: number;
  method: 'exact' | 'greedy';
  /** True when exact DP had to round costs up to a coarser quantum. */
  quantised: boolean;
  /** Sum of the chosen windows' resident bytes (≤ budgetBytes). */
  totalCostBytes: number;
  /** Predicted bytes fetched per decode step over all pairs with these windows. */
  predictedFetchedBytesPerStep: number;
  /** Cheapest possible allocation (every pair at its cheapest window). */
  minimumBytes: number;
  /** Best uniform window that fits the same budget, for comparison (null if none fits). */
  uniform: { window: number; costBytes: number; fetchedBytesPerStep: number } | null;
  /** Solver wall time in milliseconds (informational). */
  solveMs: number;
}

const OptionsSchema = z.object({
  budgetBytes: z.number().finite().nonnegative(),
  method: z.enum(['exact', 'greedy', 'auto']).optional(),
  maxDpCells: z.number().int().positive().optional(),
});

function gcd(a: number, b: number): number {
  while (b) [a, b] = [b, a % b];
  return a;
}

interface Problem {
  cost: Float64Array[]; // per pair, per choice
  fetched: Float64Array[];
}

/** Cheapest choice of one pair (ties: fewer bytes fetched). */
function cheapest(cost: Float64Array, fetched: Float64Array): number {
  let best = 0;
  for (let j = 1; j < cost.length; j++)
    if (cost[j]! < cost[best]! || (cost[j] === cost[best] && fetched[j]! < fetched[best]!)) best = j;
  return best;
}

/** Exact MCKP by DP; `unit` bytes per budget cell, costs rounded up to whole units. */
function solveDp(p: Problem, budget: number, unit: number): Int32Array {
  const n = p.cost.length;
  const units = Math.floor(budget / unit + 1e-9);
  const width = units + 1;
  const cu = p.cost.map((c) => Int32Array.from(c, (x) => Math.ceil(x / unit - 1e-9)));
  // dp[b] = least total fetched for the pairs so far with total cost units ≤ b.
  let dp = new Float64Array(width);
  let next = new Float64Array(width);
  const choice = new Uint8Array(n * width);
  for (let i = 0; i < n; i++) {
    const f = p.fetched[i]!;
    const c = cu[i]!;
    const row = i * width;
    for (let b = 0; b < width; b++) {
      let best = Infinity;
      let arg = 255;
      for (let j = 0; j < c.length; j++) {
        const cj = c[j]!;
        if (cj > b) continue;
        const v = dp[b - cj]! + f[j]!;
        if (v < best || (v === best && cj < c[arg]!)) {
          best = v;
          arg = j;
        }
      }
      next[b] = best;
      choice[row + b] = arg;
    }
    [dp, next] = [next, dp];
  }
  if (!Number.isFinite(dp[units]!)) throw new KvdriveError('E_INTERNAL', 'window solver: DP found no feasible allocation although the minimum fits');
  const pick = new Int32Array(n);
  let b = units;
  for (let i = n - 1; i >= 0; i--) {
    const j = choice[i * width + b]!;
    pick[i] = j;
    b -= cu[i]![j]!;
  }
  return pick;
}

/** Greedy benefit-to-cost enlargement from the cheapest windows. */
function solveGreedy(p: Problem, budget: number): Int32Array {
  const n = p.cost.length;
  const pick = Int32Array.from(p.cost, (c, i) => cheapest(c, p.fetched[i]!));
  let used = 0;
  for (let i = 0; i < n; i++) used += p.cost[i]![pick[i]!]!;
  for (;;) {
    let bestRatio = -1;
    let bi = -1;
    let bj = -1;
    for (let i = 0; i < n; i++) {
      const c = p.cost[i]!;
      const f = p.fetched[i]!;
      const cur = pick[i]!;
      for (let j = 0; j < c.length; j++) {
        const gain = f[cur]! - f[j]!;
        if (gain <= 0) continue;
        const extra = c[j]! - c[cur]!;
        if (used + extra > budget) continue;
        const ratio = extra <= 0 ? Infinity : gain / extra;
        if (ratio > bestRatio) {
          bestRatio = ratio;
          bi = i;
          bj = j;
        }
      }
    }
    if (bi < 0) break;
    used += p.cost[bi]![bj]! - p.cost[bi]![pick[bi]!]!;
    pick[bi] = bj;
  }
  return pick;
}

/**
 * Solves 2D window scaling for a profile under a byte budget. Throws E_BUDGET (naming the minimum)
 * when even the cheapest window everywhere does not fit, E_CONFIG for invalid options.
 */
export function solveWindows(profile: WindowProfile, options: SolveWindowsOptions): WindowAllocation {
  const o = OptionsSchema.safeParse(options);
  if (!o.success) {
    const issue = o.error.issues[0]!;
    throw new KvdriveError('E_CONFIG', `solveWindows options.${issue.path.join('.')}: ${issue.message}`);
  }
  const { budgetBytes } = o.data;
  const method = o.data.method ?? 'auto';
  const maxDpCells = o.data.maxDpCells ?? 1 << 25;
  const t0 = performance.now();
  const { layers, kvHeads } = profile.shape;
  const prob: Problem = {
    cost: profile.pairs.map((pp) => Float64Array.from(pp.residentBytes)),
    fetched: profile.pairs.map((pp) => Float64Array.from(pp.fetchedBytesPerStep)),
  };
  const n = prob.cost.length;
  if (n !== layers * kvHeads)
    throw new KvdriveError('E_SHAPE', `profile.pairs: expected ${layers * kvHeads} entries, got ${n} (use parseProfile to validate)`);
  if (profile.windows.length > 255)
    throw new KvdriveError('E_CONFIG', `profile.windows: expected at most 255 candidate windows, got ${profile.windows.length}`);

  let minimumBytes = 0;
  for (let i = 0; i < n; i++) minimumBytes += prob.cost[i]![cheapest(prob.cost[i]!, prob.fetched[i]!)]!;
  if (budgetBytes < minimumBytes)
    throw new KvdriveError(
      'E_BUDGET',
      `solve-windows budget: expected at least ${minimumBytes} bytes (the minimum feasible allocation: every pair at its smallest window), got ${budgetBytes}`,
    );

  let pick: Int32Array;
  let used: 'exact' | 'greedy';
  let quantised = false;
  // Exact quantum: gcd of all integer costs (costs are multiples of one chunk's bytes).
  let g = 0;
  let integral = true;
  for (const c of prob.cost)
    for (const x of c) {
      if (!Number.isInteger(x)) integral = false;
      else if (x > 0) g = gcd(g, x);
    }
  if (g === 0) g = 1;
  const exactFits = integral && n * (Math.floor(budgetBytes / g) + 1) <= maxDpCells;
  if (method === 'greedy' || (method === 'auto' && !exactFits)) {
    pick = solveGreedy(prob, budgetBytes);
    used = 'greedy';
  } else {
    let unit = g;
    if (!exactFits) {
      const units = Math.max(1, Math.floor(maxDpCells / n) - 1);
      unit = Math.max(g, budgetBytes / units);
      quantised = true;
      // Rounding costs up may make the minimum allocation infeasible at this quantum.
      let minUnits = 0;
      for (let i = 0; i < n; i++) minUnits += Math.ceil(prob.cost[i]![cheapest(prob.cost[i]!, prob.fetched[i]!)]! / unit - 1e-9);
      if (minUnits > Math.floor(budgetBytes / unit + 1e-9))
        throw new KvdriveError(
          'E_BUDGET',
          `solve-windows --method exact: the budget ${budgetBytes} is too close to the minimum ${minimumBytes} for a DP quantum of ${unit.toFixed(0)} bytes; use --method greedy or a larger maxDpCells`,
        );
    }
    pick = solveDp(prob, budgetBytes, unit);
    used = 'exact';
  }

  const windows: number[][] = [];
  let totalCostBytes = 0;
  let predicted = 0;
  for (let l = 0; l < layers; l++) {
    const row: number[] = [];
    for (let h = 0; h < kvHeads; h++) {
      const i = l * kvHeads + h;
      const j = pick[i]!;
      row.push(profile.windows[j]!);
      totalCostBytes += prob.cost[i]![j]!;
      predicted += prob.fetched[i]![j]!;
    }
    windows.push(row);
  }
  if (totalCostBytes > budgetBytes + 1e-6)
    throw new KvdriveError('E_INTERNAL', `window solver exceeded the budget: ${totalCostBytes} > ${budgetBytes}`);

  let uniform: WindowAllocation['uniform'] = null;
  for (let j = 0; j < profile.windows.length; j++) {
    let c = 0;
    let f = 0;
    for (let i = 0; i < n; i++) {
      c += prob.cost[i]![j]!;
      f += prob.fetched[i]![j]!;
    }
    if (c <= budgetBytes && (uniform === null || f < uniform.fetchedBytesPerStep))
      uniform = { window: profile.windows[j]!, costBytes: c, fetchedBytesPerStep: f };
  }
  return {
    version: 1,
    shape: { layers, kvHeads },
    windows,
    budgetBytes,
    method: used,
    quantised,
    totalCostBytes,
    predictedFetchedBytesPerStep: predicted,
    minimumBytes,
    uniform,
    solveMs: performance.now() - t0,
  };
}

const AllocationSchema = z.object({
  version: z.literal(1),
  shape: z.object({ layers: z.number().int().positive(), kvHeads: z.number().int().positive() }),
  windows: z.array(z.array(z.number().int().nonnegative().max(1 << 16))),
});

/**
 * Validates a windows.json value against the runtime's shape and returns windows[layer][head].
 * E_CONFIG for malformed content, E_SHAPE when it was solved for another shape.
 */
export function parseWindowAllocation(value: unknown, shape: { layers: number; kvHeads: number }, what = 'windows.json'): number[][] {
  const r = AllocationSchema.safeParse(value);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    throw new KvdriveError('E_CONFIG', `${what}.${issue.path.join('.') || '(root)'}: ${issue.message} (expected a kvdrive window allocation, version 1)`);
  }
  const a = r.data;
  if (a.shape.layers !== shape.layers || a.shape.kvHeads !== shape.kvHeads)
    throw new KvdriveError(
      'E_SHAPE',
      `${what}: expected windows for ${shape.layers} layers × ${shape.kvHeads} kv heads, got a file for ${a.shape.layers} × ${a.shape.kvHeads}`,
    );
  if (a.windows.length !== shape.layers || a.windows.some((row) => row.length !== shape.kvHeads))
    throw new KvdriveError('E_SHAPE', `${what}.windows: expected ${shape.layers} rows of ${shape.kvHeads} windows`);
  return a.windows;
}

/** Parses a byte count: an integer, optionally with K/M/G (×1000) or KiB/MiB/GiB (×1024) suffix. */
export function parseBytes(text: string, what = 'budget'): number {
  if (typeof text !== 'string') fail('E_CONFIG', String(what), 'a byte count like 65536, 64KiB or 1.5MB (a string)', text);
  const m = /^\s*(\d+(?:\.\d+)?)\s*(|k|kb|m|mb|g|gb|t|tb|kib|mib|gib|tib)\s*$/i.exec(text);
  if (!m) throw new KvdriveError('E_CONFIG', `${what}: expected a byte count like 65536, 64KiB or 1.5MB, got ${JSON.stringify(text)}`);
  const mult: Record<string, number> = { '': 1, k: 1e3, kb: 1e3, m: 1e6, mb: 1e6, g: 1e9, gb: 1e9, t: 1e12, tb: 1e12, kib: 1024, mib: 2 ** 20, gib: 2 ** 30, tib: 2 ** 40 };
  const v = Math.floor(Number(m[1]) * mult[m[2]!.toLowerCase()]!);
  // Past 2^53 bytes (8 PiB) a count is no longer exact in a double: refused here, not passed on as a
  // "positive integer" that a later check could only call wrong without saying why.
  if (!Number.isSafeInteger(v))
    throw new KvdriveError('E_CONFIG', `${what}: expected a byte count of at most ${Number.MAX_SAFE_INTEGER} (8 PiB), got ${JSON.stringify(text)}`);
  return v;
}
