/**
 * The window profile: what `kvdrive profile` measures and `kvdrive solve-windows` consumes
 * (kvdrive.txt §5.2). For every (layer, kv head) pair and every candidate window ×N it records
 *  - the mean bytes fetched into the hot tier per decode step (misses: K and V rows copied in), and
 *  - the bytes the pair's hot-tier arena holds at that window (slots × chunk bytes).
 * Benefit of a window = fetched(smallest window) − fetched(window); cost = resident bytes.
 */
import { z } from 'zod';
import { KvdriveError } from '../errors.js';

/** One (layer, kv head) pair's measurements, indexed like {@link WindowProfile.windows}. */
export interface PairProfile {
  layer: number;
  head: number;
  /** Mean bytes admitted (fetched) per decode step, one entry per window. */
  fetchedBytesPerStep: number[];
  /** Hot-tier bytes this pair occupies at each window (its cost). */
  residentBytes: number[];
  /** Hit rate (hits / selected chunks) at each window, for reports. */
  hitRate?: number[];
}

/** A profile file (JSON), version 1. */
export interface WindowProfile {
  version: 1;
  /** Shape of the traced model; a profile only applies to the same shape. */
  shape: { layers: number; kvHeads: number; qHeads?: number; headDim?: number };
  /** Candidate windows ×N, ascending and unique (window 0 = nothing retained between steps). */
  windows: number[];
  /** Where the numbers came from (trace path, policy, budget, eviction, steps): informational. */
  source?: Record<string, unknown>;
  /** layers × kvHeads entries, every pair exactly once. */
  pairs: PairProfile[];
}

const nonNeg = z.number().finite().nonnegative();

/** zod schema of {@link WindowProfile}; structure only, cross-field checks are in {@link parseProfile}. */
export const WindowProfileSchema = z.object({
  version: z.literal(1),
  shape: z.object({
    layers: z.number().int().positive(),
    kvHeads: z.number().int().positive(),
    qHeads: z.number().int().positive().optional(),
    headDim: z.number().int().positive().optional(),
  }),
  windows: z.array(z.number().int().nonnegative()).min(1),
  source: z.record(z.string(), z.unknown()).optional(),
  pairs: z.array(
    z.object({
      layer: z.number().int().nonnegative(),
      head: z.number().int().nonnegative(),
      fetchedBytesPerStep: z.array(nonNeg),
      residentBytes: z.array(nonNeg),
      hitRate: z.array(z.number().min(0).max(1)).optional(),
    }),
  ),
});

/**
 * Validates an already-parsed JSON value as a {@link WindowProfile}: schema, ascending unique
 * windows, one entry per window in every pair, every (layer, head) of the shape exactly once.
 * Throws E_CONFIG (with the offending path) on anything else.
 */
export function parseProfile(value: unknown, what = 'profile'): WindowProfile {
  const r = WindowProfileSchema.safeParse(value);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    throw new KvdriveError(
      'E_CONFIG',
      `${what}.${issue.path.join('.') || '(root)'}: ${issue.message} (expected a kvdrive window profile, version 1)`,
    );
  }
  const p = r.data as WindowProfile;
  for (let i = 1; i < p.windows.length; i++)
    if (p.windows[i]! <= p.windows[i - 1]!)
      throw new KvdriveError('E_CONFIG', `${what}.windows: expected ascending unique window sizes, got [${p.windows.join(', ')}]`);
  const { layers, kvHeads } = p.shape;
  if (p.pairs.length !== layers * kvHeads)
    throw new KvdriveError(
      'E_SHAPE',
      `${what}.pairs: expected ${layers * kvHeads} entries (layers ${layers} × kvHeads ${kvHeads}), got ${p.pairs.length}`,
    );
  const seen = new Uint8Array(layers * kvHeads);
  for (const [i, pair] of p.pairs.entries()) {
    if (pair.layer >= layers || pair.head >= kvHeads)
      throw new KvdriveError(
        'E_SHAPE',
        `${what}.pairs.${i}: expected layer < ${layers} and head < ${kvHeads}, got layer ${pair.layer} head ${pair.head}`,
      );
    const k = pair.layer * kvHeads + pair.head;
    if (seen[k]) throw new KvdriveError('E_CONFIG', `${what}.pairs.${i}: (layer ${pair.layer}, head ${pair.head}) appears twice`);
    seen[k] = 1;
    for (const key of ['fetchedBytesPerStep', 'residentBytes', 'hitRate'] as const) {
      const arr = pair[key];
      if (arr !== undefined && arr.length !== p.windows.length)
        throw new KvdriveError(
          'E_SHAPE',
          `${what}.pairs.${i}.${key}: expected ${p.windows.length} entries (one per window), got ${arr.length}`,
        );
    }
  }
  // Sort pairs layer-major so index = layer * kvHeads + head everywhere downstream.
  p.pairs.sort((a, b) => a.layer * kvHeads + a.head - (b.layer * kvHeads + b.head));
  return p;
}
