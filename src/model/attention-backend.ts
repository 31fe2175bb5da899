/**
 * The seam between the reference host (forward.ts) and attention. The host owns the projections,
 * RoPE and the KV cache; a backend computes attention for one layer at one position. The dense TS
 * reference ({@link DenseTsAttention}) and the runtime backend (src/model/runtime-attention.ts) implement the same interface.
 */
/**
 * Attention for one layer at one position. The host writes k/v of `pos` into its cache first.
 * A backend that owns the KV itself (the runtime backend, src/model/runtime-attention.ts) reads only
 * row `pos` of kCache / vCache — the new token — and may answer asynchronously: hosts call it through
 * `Transformer.forwardAsync` (generate() does).
 */
export interface AttentionBackend {
  /** q: Float32Array(nHeads*headSize); kCache/vCache: Float32Array(seqLen*nKvHeads*headSize),
   *  token-major (position, kv head, dim); attends positions [0, pos]. Returns out (nHeads*headSize). */
  attend(layer: number, pos: number, q: Float32Array, kCache: Float32Array, vCache: Float32Array): Float32Array | Promise<Float32Array>;
  /** Forget all per-sequence state (called when the host starts a new sequence). Optional. */
  reset?(): void;
  /** Release resources (native memory, workers, files). Optional. */
  close?(): void | Promise<void>;
}

/** What a backend needs to know about the model. Query head h reads kv head floor(h / (nHeads / nKvHeads)). */
export interface AttentionShape {
  nLayers: number;
  nHeads: number;
  nKvHeads: number;
  headSize: number;
  /** Positions the host's KV cache holds (the cache arrays are seqLen × nKvHeads × headSize). */
  seqLen: number;
}

/** Limits of an {@link AttentionShape} (those of a llama2.c checkpoint header, model/checkpoint.ts). */
const SHAPE_LIMITS = { nLayers: 1 << 12, nHeads: 1 << 16, nKvHeads: 1 << 16, headSize: 1 << 16, seqLen: 1 << 22 } as const;

/** Checks a backend's shape: positive integers within SHAPE_LIMITS, nHeads a multiple of nKvHeads. */
export function checkAttentionShape(shape: AttentionShape): void {
  if (shape === null || typeof shape !== 'object') fail('E_CONFIG', 'attention shape', 'an object { nLayers, nHeads, nKvHeads, headSize, seqLen }', shape);
  for (const [k, max] of Object.entries(SHAPE_LIMITS)) {
    const v = (shape as unknown as Record<string, unknown>)[k];
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > max) fail('E_CONFIG', `attention shape ${k}`, `an integer in [1, ${max}]`, v);
  }
  if (shape.nHeads * shape.headSize > 1 << 24) fail('E_CONFIG', 'attention shape nHeads*headSize', `at most ${1 << 24}`, shape.nHeads * shape.headSize);
  if (shape.nHeads % shape.nKvHeads !== 0) fail('E_CONFIG', 'attention shape', 'nHeads divisible by nKvHeads', `${shape.nHeads}/${shape.nKvHeads}`);
}

import { fail } from '../errors.js';
import type { PolicyOptions } from '../index/options.js';
import type { PolicyName } from '../index/selection.js';

/** Options every backend factory accepts (the dense backend ignores the sparse ones). */
export interface BackendOptions {
  /**
   * Tokens attended per (layer, kv head) per step beside the always-kept sinks and local window
   * (DESIGN.md §2). Applies to the sparse (runtime) backend; the dense backend attends every position.
   */
  budget?: number;
  /** Sparse backend: selection policy (default 'kvdrive'). */
  policy?: PolicyName;
  /** Sparse backend: options of the selection policy (see PolicyOptions). */
  policyOptions?: PolicyOptions;
  /** runtime backend: 'sequential' (default) or 'pipelined' (see RuntimeOptions.mode). */
  mode?: 'sequential' | 'pipelined';
  /** runtime backend: SSD store directory for sealed segments (see RuntimeOptions.ssd). */
  storage?: string;
  /** runtime backend: the memory model's DRAM budget in bytes (see RuntimeOptions.dramBudget; default 256 MiB). */
  dramBudget?: number;
  /** runtime backend: tokens per segment sealed while decoding (see RuntimeOptions.sealTokens; default 1024). */
  sealTokens?: number;
}

/** Creates a backend for a model shape. */
export type BackendFactory = (shape: AttentionShape, options: BackendOptions) => AttentionBackend;
