/**
 * The append stage of the decode step (src/pipeline/step.ts runs the stages): the new token's K / V
 * rows into the open tail and the index extended, on the thread that owns the memory. Also the
 * types the step's stages share — what the append stage hands on, and the traffic and time each
 * entry's step reports — so that the fetch stage (tier-fetch.ts) and the step need not import each
 * other.
 */
import { KvdriveError } from '../errors.js';
import type { KvMemory, LayerKv } from '../runtime/kv-memory.js';
import type { KvTensor } from '../types.js';

/** Traffic and time of one step of one entry. */
export interface EntryStepStats {
  /** Selected chunks (all kv heads) and where they came from. */
  chunks: number;
  hotChunks: number;
  dramChunks: number;
  ssdChunks: number;
  tailChunks: number;
  /** Bytes the device transferred for the SSD reads (the chunks read, page-aligned). */
  ssdReadBytes: number;
  /** Chunks admitted into the hot tier / DRAM tier. */
  hotAdmitted: number;
  dramAdmitted: number;
  selectMs: number;
  fetchMs: number;
  computeMs: number;
}

/** An entry after its append stage: the new token is in the open tail and the index extended. */
export interface AppendedEntry {
  lk: LayerKv;
  /** Context length with the new token. */
  T: number;
  tailK: KvTensor;
  tailV: KvTensor;
  /** The layer index's handle: what the select stage selects on (any thread). */
  handle: number;
  /** Wall time of the index extend, milliseconds. */
  extendMs: number;
}

/**
 * Append stage of entry (seq, layer), on the thread owning the memory (it mutates the tail and the
 * index): waits for a pending seal, appends the new token's kRow / vRow (host dtype, kvHeads x
 * headDim) to the open tail, sinks too while the context is short, and extends the index. Nothing
 * is committed (the token count stays): a failed step retried rewrites the same rows.
 */
export async function appendEntry(
  mem: KvMemory,
  seq: number,
  layer: number,
  kRow: Float32Array | Uint16Array,
  vRow: Float32Array | Uint16Array,
): Promise<AppendedEntry> {
  const lk = mem.layer(seq, layer);
  const { shape, policyOptions: p, maxTokens } = mem.config;
  const row = shape.kvHeads * shape.headDim;
  await mem.settleSeal(seq, layer, lk);
  const at = lk.tokens;
  const T = at + 1;
  if (T > maxTokens) throw new KvdriveError('E_BUDGET', `attend seq ${seq} layer ${layer} context: expected at most maxTokens = ${maxTokens} tokens, got ${T}`);
  const slot = at - lk.sealed;
  if (slot >= mem.tailCapacity) throw new KvdriveError('E_INTERNAL', `step: expected the tail to hold token ${at} (capacity ${mem.tailCapacity} from ${lk.sealed}), got it full`);
  lk.tailK.set(kRow, slot * row);
  lk.tailV.set(vRow, slot * row);
  if (at < p.sinks) {
    lk.sinkK.set(kRow, at * row);
    lk.sinkV.set(vRow, at * row);
  }
  const t0 = performance.now();
  const tailK = mem.tensor(lk.tailK, T - lk.sealed);
  const tailV = mem.tensor(lk.tailV, T - lk.sealed);
  lk.policy!.extend(tailK, T, lk.sealed);
  return { lk, T, tailK, tailV, handle: lk.policy!.handle(), extendMs: performance.now() - t0 };
}
