/**
 * Options of the selection policies, validated with zod at the boundary. Invalid options raise a
 * `KvdriveError('E_CONFIG', ...)` naming the option, what was expected and what was given.
 */
import { z } from 'zod';
import { KvdriveError, describe } from '../errors.js';
import type { PolicyName } from './selection.js';

/** Options of {@link createPolicy}. Every field is optional; defaults depend on the policy. */
export interface PolicyOptions {
  /**
   * Tokens per chunk, the unit of selection. Defaults: kvdrive 4, shadowkv 8, quest 16 (a Quest
   * page). Chunk j covers tokens [j*chunkSize, (j+1)*chunkSize).
   */
  chunkSize?: number;
  /** kvdrive only: average tokens per k-means cluster inside a segment (default 16, i.e. 4 chunks). */
  tokensPerCluster?: number;
  /**
   * kvdrive only: tokens per index segment (default 4096); clusters never span segments, which keeps
   * the index build linear in the context. Must be a multiple of chunkSize.
   */
  segmentTokens?: number;
  /** Attention sinks: tokens [0, sinks) are always attended and never indexed (default 4). */
  sinks?: number;
  /** Local window: the last `local` tokens are always attended; chunks are indexed once they leave it (default 64). */
  local?: number;
  /** kvdrive only: maximum Lloyd iterations per segment k-means (default 8; stops early once stable). */
  kmeansIters?: number;
  /** kvdrive only: k-means seed (integer >= 0, default 0); the same seed and keys give the same index. */
  seed?: number;
  /**
   * kvdrive only: candidate clusters are taken until they hold candidateFactor x budget tokens, then
   * their chunks are re-ranked (default 8; >= 1). Larger = higher recall, more scoring; on the
   * synthetic needle cases recall is flat from 2 up (test/index-recall.test.ts). On the `kvdrive
   * demo` workload at 128K / budget 2048, offloaded select (bench/select-step.ts, tuning seeds 3 and
   * 5, 4 steps; seeds 1, 7 and 11 never looked at) recall / oracle was 0.980 / 0.969 at 6, 0.986 /
   * 0.978 at 8 and 0.989 / 0.983 at 10: 8 is the least that keeps both tuning seeds above 0.97.
   * With the keys it goes with rerankFactor (candidates beyond the re-ranked ones are not selected
   * with the keys), see there.
   */
  candidateFactor?: number;
  /**
   * kvdrive only: once a prior selection is set ({@link SelectionPolicy.setPrior}: the runtime sets
   * each sequence's selection of the previous decode step), clusters are taken until they hold
   * reuseCandidateFactor x budget tokens instead of candidateFactor x budget, and the prior's tokens
   * join the candidates one by one (re-ranked with the rest: a prior token stays only if it
   * still ranks). 0 = a prior is ignored and not kept (>= 0; default 5). Consecutive steps' best
   * tokens overlap by ~3/4 on the synthetic trace, so the prior carries most of a step's selection
   * and half the clusters suffice. Tuned with bench/select-step.ts (128K, budget 2048, 16 steps,
   * offloaded select; tuning seeds 3, 4 and 5, recall / oracle with the default candidateFactor 8
   * 0.9860 / 0.9813 / 0.9779): at 4, 0.9830 / 0.9788 / 0.9709; at 5, 0.9854 / 0.9812 / 0.9754; 5
   * keeps every tuning seed within 0.25 points of no reuse (4 leaves seed 5 at the 0.97 bar). Held-out
   * figures: bench/index.md. Costs 4 bytes per prior token and kv head (counted in the index).
   */
  reuseCandidateFactor?: number;
  /**
   * kvdrive only: how the candidates grow with the budget (a number in [0, 1]; default 0.35).
   * candidateFactor, reuseCandidateFactor and rerankFactor hold where the budget is 1/64 of the
   * context (2048 of 128K, where they were tuned); at budget K over T tokens each is multiplied by
   * (64 K / T)^(candidateExponent - 1), so the candidate tokens grow as K^candidateExponent: 1 =
   * proportional to the budget; 0.5 = twice the budget, 1.41x the candidates. A large budget's extra
   * tokens are the low-mass tail (missing one costs little); at a small budget every miss weighs
   * more. Tuned with bench/select-step.ts (128K, 8 steps, offloaded select, tuning seeds 3, 4 and 5;
   * seeds 1 and 11 never looked at), recall / oracle at 1 -> 0.5: budget 512 0.9755 / 0.9724 /
   * 0.9588 -> 0.9856 / 0.9854 / 0.9769 (+12% bytes scored), 1024 0.9791 / 0.9781 / 0.9671 -> 0.9852
   * / 0.9840 / 0.9746 (+9%), 4096 0.9896 / 0.9864 / 0.9851 -> 0.9838 / 0.9808 / 0.9760 (-14%);
   * 2048 as before. Figures: bench/pareto.md. 0.5 -> 0.35 (2026-11-29, same seeds and bench, the
   * 4-bit keyless select), recall / oracle and select CPU: 512 0.9857 / 0.9850 / 0.9769 -> 0.9880 /
   * 0.9878 / 0.9793 at 0.98-1.03x; 1024 0.9850 / 0.9840 / 0.9745 -> 0.9864 / 0.9851 / 0.9769 at
   * 0.95-1.07x; 4096 0.9837 / 0.9807 / 0.9758 -> 0.9812 / 0.9786 / 0.9729 at 0.87-0.99x (the
   * budget where the select was slower than quest's); 2048 unchanged (the factors hold there).
   */
  candidateExponent?: number;
  /**
   * kvdrive only: weight w of the variance term in centroid and chunk scores (default 3; 0 = plain
   * q·mean). A chunk's attention mass is Σ_t exp(s·q·k_t) ≈ exp(s·q·mean + s²/2·qᵀΣq); with an
   * isotropic Σ = var·I the score becomes q·mean + w·(s/2)·|q|²·var (s = 1/sqrt(headDim)), so chunks
   * and clusters whose few strong keys the mean averages away are not ranked too low. w = 1 is the
   * Gaussian estimate; a key aligned with q is a heavy tail the isotropic variance underrates, and
   * w = 3 was chosen on the synthetic needle cases of test/index-recall.test.ts (re-tune on traces).
   * With the keyed re-rank on the demo workload at 128K (bench/index-tune.ts, seeds 1/2/3),
   * recall / oracle was 0.977/0.963/0.981 at w = 3 (needles 4/2/4 of 4) and 0.973/0.976/0.980 at
   * w = 5 (every needle); 5 is not the default because index-only selection then falls below plain
   * chunk means on needle-free data (test/index-recall.test.ts).
   */
  varianceWeight?: number;
  /**
   * kvdrive only: when select() is given the layer's keys, the best level-2 chunks up to
   * rerankFactor x budget tokens are re-ranked by their exact share of attention mass (q·k of each
   * token, summed over the GQA group; default 10; 0 disables; >= 0). When that covers every
   * candidate (candidateFactor x budget tokens plus the outlier chunks: ~9.9 x budget at 128K /
   * budget 2048 with the defaults), the chunk-mean scores of level 2 are not computed at all. On the demo workload at 128K / budget 2048 with candidateFactor
   * 6 (bench/index-tune.ts, seeds 1/2/3), recall / oracle was 0.976/0.954/0.977 at 6 (needles
   * 4/2/4 of 4, 55.5 MiB scored per layer-step) and 0.977/0.980/0.979 at 8 (every needle, 46.8
   * MiB: every candidate re-ranked exactly, no level 2); at 32K / budget 512, 0.989/0.985/0.986 at
   * 6 and 0.991/0.985/0.986 at 8 (those figures with candidateFactor 6; the default moved to 10 with
   * candidateFactor 8 so that every candidate is still re-ranked). Cost: up to rerankFactor x budget
   * key rows read per kv head and step.
   */
  rerankFactor?: number;
  /**
   * kvdrive only: weight b of the cluster-radius term of centroid scores, score += b·|q|·radius
   * (default 0.1; 0 = off; >= 0; 0.1-0.2 added ~0.01 of recall / oracle on the demo workload at
   * 32K, 0.4 lost it again). radius bounds how far any member token lies from the centroid, so a
   * cluster holding one strong key (a needle) is not averaged away as the variance term would be.
   */
  radiusWeight?: number;
  /**
   * kvdrive only: share of each segment's chunks — those with the highest key variance — that are
   * always level-2 candidates, whatever their cluster's score (default 0.015; in [0, 1]). A strong
   * key among weak, opposed neighbours drags its cluster's centroid away from every query; its
   * chunk's variance gives it away. The outliers are candidates at every select, ~25% of the rows
   * a 128K select re-ranked at 0.03. 0.03 -> 0.015 (2026-11-29; bench/select-step.ts, tuning seeds
   * 3, 4 and 5, the offloaded select with its prior unless said): at 128K / budget 2048 every
   * planted needle still found (4/4 each), recall / oracle 0.9844 / 0.9801 / 0.9741 -> 0.9838 /
   * 0.9791 / 0.9729, select CPU 0.83-0.94x; budgets 512 and 4096 (seeds 4, 5) and 16K / 32K (seeds
   * 3, 5, budget 512) every needle, recall within 0.0017; the keyed select (seeds 4, 5) every needle,
   * -0.001. 0.01 lost needles (2 of 4 on seeds 4 and 5), so 0.015 is near the edge on this workload.
   */
  outlierFraction?: number;
  /**
   * kvdrive only: with the keyed re-rank, select single tokens (the Selection's chunkSize is then 1)
   * — the best tokens of the re-ranked chunks by exact score — rather than whole chunks (default
   * true). Whole chunks cap recall at the best chunk set, which misses the token oracle where
   * strong keys are scattered.
   */
  tokenGranular?: boolean;
  /**
   * kvdrive only: keep a key sketch per kv head (default false): every key as int8 (or, with
   * sketchBits 4, 4-bit) codes with per-channel and per-token scales, headDim + 4 bytes per token
   * and kv head (132 B at head dim 128, about half of f16 keys; 68 B at 4 bits), built at build() /
   * extend(). select() without `keys` then
   * re-ranks its candidates on the sketch (approximate q·k) — the level-3 re-rank where the keys
   * are offloaded — and, with tokenGranular, returns single tokens (chunkSize 1) as the keyed
   * select does. On the demo workload keyless select with the sketch has the keyed select's
   * recall / oracle (bench/pareto.md). Off by default so that keyless callers built on chunk
   * selections keep getting them.
   */
  keySketch?: boolean;
  /**
   * kvdrive only: re-rank with the key sketch even when select() is given the keys (default
   * false; implies keySketch). The sketch is contiguous per head and half the bytes of f16 keys,
   * so the re-rank reads less; its scores are approximate.
   */
  preferSketch?: boolean;
  /**
   * kvdrive only: bits per key-sketch code, 8 or 4 (default 8). 8: headDim + 4 bytes per token and
   * kv head (132 B at head dim 128); 4: two codes per byte, ceil(headDim / 2) + 4 bytes (68 B),
   * coarser scores (each code rounds to 1/14 of the row's largest normalised value instead of
   * 1/254). See `offloadedPolicyOptions` for what the offloaded decode uses and why.
   */
  sketchBits?: 4 | 8;
  /**
   * kvdrive only: once an index segment is full and clustered, drop its f32 chunk means and
   * per-chunk variances (default false). They are 4·headDim + 4 bytes per chunk and kv head —
   * 1032 B per token and layer at 8 kv heads x 128, most of an index without a sketch — and only
   * level 2 of select (q·chunk-mean) reads them once a segment is clustered. With them released
   * level 2 cannot run, so select re-ranks every level-1 candidate (and outlier chunk) on the key
   * sketch or the given keys, whatever rerankFactor says (> 0 required); requires keySketch. The
   * open segment keeps its means (online adds, its k-means when it fills).
   */
  releaseChunkMeans?: boolean;
  /**
   * kvdrive only: tokens a segment that fills during extend() keeps the clusters it grew online
   * (default 256; an integer in [0, 2^20]). Its k-means, ~50 ms per layer at 8 kv heads x 128 and
   * 4096-token segments, then runs on the addon's background thread instead of inside that decode
   * step, and the result replaces the online clusters at the first extend() reaching fill +
   * reclusterDelay tokens (waiting for it there if needed): selections depend on the token count
   * only, never on timing. 0: the k-means runs inside the extend() that fills.
   */
  reclusterDelay?: number;
  /**
   * Worker threads (of the addon's thread pool) that the index build and every select split the
   * kv heads over (1 to 8, default 2; every policy).
   */
  threads?: number;
  /**
   * shadowkv only: static outlier chunks (default 48, the ShadowKV paper's configuration; >= 0):
   * the chunks whose keys have the lowest cosine similarity to their chunk mean (landmark), which
   * a landmark score misjudges. They are selected first whatever the query, within the budget and
   * at most a quarter of its chunks (48 of 256 at budget 2048); landmark scores fill the rest.
   */
  outlierChunks?: number;
  /** Query heads; when given, select() checks q.length === qHeads * headDim. */
  qHeads?: number;
  /** KV heads; when given, build() checks k.heads against it. */
  kvHeads?: number;
  /** Head dimension; when given, build() checks k.dim and select() checks q against it. */
  headDim?: number;
}

/** Options after validation and defaults. */
export interface ResolvedPolicyOptions {
  chunkSize: number;
  tokensPerCluster: number;
  segmentTokens: number;
  sinks: number;
  local: number;
  kmeansIters: number;
  seed: number;
  candidateFactor: number;
  reuseCandidateFactor: number;
  candidateExponent: number;
  varianceWeight: number;
  rerankFactor: number;
  radiusWeight: number;
  outlierFraction: number;
  tokenGranular: boolean;
  keySketch: boolean;
  preferSketch: boolean;
  sketchBits: 4 | 8;
  releaseChunkMeans: boolean;
  reclusterDelay: number;
  outlierChunks: number;
  threads: number;
  qHeads?: number;
  kvHeads?: number;
  headDim?: number;
}

const DEFAULT_CHUNK: Record<PolicyName, number> = { kvdrive: 4, shadowkv: 8, quest: 16 };
const KVDRIVE_ONLY = ['tokensPerCluster', 'segmentTokens', 'kmeansIters', 'seed', 'candidateFactor', 'reuseCandidateFactor', 'candidateExponent', 'varianceWeight', 'rerankFactor', 'radiusWeight', 'outlierFraction', 'tokenGranular', 'keySketch', 'preferSketch', 'sketchBits', 'releaseChunkMeans', 'reclusterDelay'] as const;

const int = (min: number, max: number) => z.number().int().min(min).max(max);

const schema = z
  .object({
    chunkSize: int(1, 65536).optional(),
    tokensPerCluster: int(1, 1 << 20).optional(),
    segmentTokens: int(1, 1 << 30).optional(),
    sinks: int(0, 1 << 20).optional(),
    local: int(0, 1 << 24).optional(),
    kmeansIters: int(0, 1000).optional(),
    seed: int(0, Number.MAX_SAFE_INTEGER).optional(),
    candidateFactor: z.number().min(1).max(1e6).optional(),
    reuseCandidateFactor: z.number().min(0).max(1e6).optional(),
    candidateExponent: z.number().min(0).max(1).optional(),
    varianceWeight: z.number().min(0).max(1000).optional(),
    rerankFactor: z.number().min(0).max(1e6).optional(),
    radiusWeight: z.number().min(0).max(1000).optional(),
    outlierFraction: z.number().min(0).max(1).optional(),
    tokenGranular: z.boolean().optional(),
    keySketch: z.boolean().optional(),
    preferSketch: z.boolean().optional(),
    sketchBits: z.union([z.literal(4), z.literal(8)]).optional(),
    releaseChunkMeans: z.boolean().optional(),
    reclusterDelay: int(0, 1 << 20).optional(),
    outlierChunks: int(0, 1 << 20).optional(),
    threads: int(1, 8).optional(),
    qHeads: int(1, 4096).optional(),
    kvHeads: int(1, 4096).optional(),
    headDim: int(1, 65536).optional(),
  })
  .strict();

const EXPECTED: Record<string, string> = {
  chunkSize: 'an integer in [1, 65536]',
  tokensPerCluster: 'an integer in [1, 1048576]',
  segmentTokens: 'an integer in [1, 2^30]',
  sinks: 'an integer in [0, 1048576]',
  local: 'an integer in [0, 2^24]',
  kmeansIters: 'an integer in [0, 1000]',
  seed: 'a safe integer >= 0',
  candidateFactor: 'a number in [1, 1e6]',
  reuseCandidateFactor: 'a number in [0, 1e6]',
  candidateExponent: 'a number in [0, 1]',
  varianceWeight: 'a number in [0, 1000]',
  rerankFactor: 'a number in [0, 1e6]',
  radiusWeight: 'a number in [0, 1000]',
  outlierFraction: 'a number in [0, 1]',
  tokenGranular: 'a boolean',
  keySketch: 'a boolean',
  preferSketch: 'a boolean',
  sketchBits: '4 or 8',
  releaseChunkMeans: 'a boolean',
  reclusterDelay: 'an integer in [0, 2^20]',
  outlierChunks: 'an integer in [0, 2^20]',
  threads: 'an integer in [1, 8]',
  qHeads: 'an integer in [1, 4096]',
  kvHeads: 'an integer in [1, 4096]',
  headDim: 'an integer in [1, 65536]',
};

/** Validates user options for `policy` and fills in defaults. Throws E_CONFIG. */
export function resolvePolicyOptions(policy: PolicyName, options: unknown): ResolvedPolicyOptions {
  const what = `createPolicy('${policy}') options`;
  if (options === undefined) options = {};
  if (options === null || typeof options !== 'object' || Array.isArray(options))
    throw new KvdriveError('E_CONFIG', `${what}: expected an options object, got ${describe(options)}`);
  const parsed = schema.safeParse(options);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    if (issue.code === 'unrecognized_keys')
      throw new KvdriveError('E_CONFIG', `${what}: expected only known options (${Object.keys(EXPECTED).join(', ')}), got unknown ${issue.keys.map((k) => `'${k}'`).join(', ')}`);
    const key = String(issue.path[0]);
    const given = (options as Record<string, unknown>)[key];
    throw new KvdriveError('E_CONFIG', `${what}.${key}: expected ${EXPECTED[key] ?? 'a valid value'}, got ${describe(given)}`);
  }
  const o = parsed.data;
  if (policy !== 'kvdrive') {
    const stray = KVDRIVE_ONLY.filter((k) => o[k] !== undefined);
    if (stray.length > 0)
      throw new KvdriveError('E_CONFIG', `${what}: expected no kvdrive-only options (${KVDRIVE_ONLY.join(', ')}) for policy '${policy}', got ${stray.join(', ')}`);
  }
  if (policy !== 'shadowkv' && o.outlierChunks !== undefined)
    throw new KvdriveError('E_CONFIG', `${what}: expected no shadowkv-only options (outlierChunks) for policy '${policy}', got outlierChunks`);
  if (o.preferSketch === true && o.keySketch === false)
    throw new KvdriveError('E_CONFIG', `${what}.preferSketch: expected keySketch not false (preferSketch re-ranks on the sketch), got keySketch false`);
  const keySketch = o.keySketch ?? o.preferSketch ?? false;
  const rerankFactor = o.rerankFactor ?? 10;
  if (o.releaseChunkMeans === true && (!keySketch || rerankFactor === 0))
    throw new KvdriveError('E_CONFIG', `${what}.releaseChunkMeans: expected keySketch true and rerankFactor > 0 (select then re-ranks every candidate on the sketch or keys), got ${!keySketch ? 'keySketch false' : 'rerankFactor 0'}`);
  const chunkSize = o.chunkSize ?? DEFAULT_CHUNK[policy];
  const segmentTokens = o.segmentTokens ?? 4096;
  if (policy === 'kvdrive' && segmentTokens % chunkSize !== 0)
    throw new KvdriveError('E_CONFIG', `${what}.segmentTokens: expected a multiple of chunkSize ${chunkSize}, got ${segmentTokens}`);
  if (o.qHeads !== undefined && o.kvHeads !== undefined && o.qHeads % o.kvHeads !== 0)
    throw new KvdriveError('E_CONFIG', `${what}.qHeads: expected a multiple of kvHeads ${o.kvHeads}, got ${o.qHeads}`);
  return {
    chunkSize,
    tokensPerCluster: o.tokensPerCluster ?? 16,
    segmentTokens,
    sinks: o.sinks ?? 4,
    local: o.local ?? 64,
    kmeansIters: o.kmeansIters ?? 8,
    seed: o.seed ?? 0,
    candidateFactor: o.candidateFactor ?? 8,
    reuseCandidateFactor: o.reuseCandidateFactor ?? (policy === 'kvdrive' ? 5 : 0),
    candidateExponent: o.candidateExponent ?? 0.35,
    varianceWeight: o.varianceWeight ?? 3,
    rerankFactor,
    radiusWeight: o.radiusWeight ?? 0.1,
    outlierFraction: o.outlierFraction ?? 0.015,
    tokenGranular: o.tokenGranular ?? true,
    keySketch,
    preferSketch: o.preferSketch ?? false,
    sketchBits: o.sketchBits ?? 8,
    releaseChunkMeans: o.releaseChunkMeans ?? false,
    reclusterDelay: o.reclusterDelay ?? 256,
    outlierChunks: o.outlierChunks ?? 48,
    threads: o.threads ?? 2,
    qHeads: o.qHeads,
    kvHeads: o.kvHeads,
    headDim: o.headDim,
  };
}

/**
 * Bits per key-sketch code of an offloaded decode (see {@link offloadedPolicyOptions}); chosen by
 * the recall measured in bench/runtime-memory.md.
 */
export const OFFLOADED_SKETCH_BITS: 4 | 8 = 4;

/**
 * The policy options of an offloaded decode (the runtime's memory model, and `eval --offloaded`
 * measuring it): the full keys are sealed away, so kvdrive keeps its key sketch
 * ({@link OFFLOADED_SKETCH_BITS} bits) and re-ranks every candidate on it, releasing the chunk means
 * of full segments (releaseChunkMeans: the index is then mostly the sketch). Its selection stays
 * token-granular (the default): the tiers fetch the whole chunks holding the selected tokens, but
 * only those tokens are attended (src/pipeline/step.ts), so the budget counts tokens attended and the
 * eval's figure is the runtime's. Options the caller set explicitly win (keySketch false or
 * rerankFactor 0 keep the chunk means).
 */
export function offloadedPolicyOptions<T extends PolicyOptions>(policy: PolicyName, options: T): T {
  if (policy !== 'kvdrive') return options;
  const keySketch = options.keySketch ?? true;
  const canRelease = (keySketch || options.preferSketch === true) && options.rerankFactor !== 0;
  return {
    ...options,
    keySketch,
    sketchBits: options.sketchBits ?? OFFLOADED_SKETCH_BITS,
    releaseChunkMeans: options.releaseChunkMeans ?? canRelease,
  };
}
