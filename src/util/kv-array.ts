/**
 * KV-sized typed arrays advised for transparent huge pages before their first write
 * (native/common/huge_pages.cc). Attention reads a sparse selection's rows at random from such an
 * array — one 256-byte row per token and kv head, 2 KiB apart in a token-major layout — and over
 * 4 KiB pages nearly every row is a TLB miss (a two-level page walk under virtualisation). The
 * same advice serves the runtime's DRAM-tier arenas, the GGUF host's dense cache and synthetic
 * traces (what the Pareto bench, `kvdrive eval` and the demo's policy rows attend over). Advice
 * only: where the kernel has no huge page to give, the array is an ordinary one.
 */
import { native } from '../native.js';
import type { Dtype } from '../types.js';

/** A zeroed array of `length` elements of `dtype` (f16 / bf16 as their bits): small KV buffers. */
export function dtypeArray(dtype: Dtype, length: number): Float32Array | Uint16Array {
  return dtype === 'f32' ? new Float32Array(length) : new Uint16Array(length);
}

/** {@link dtypeArray} with huge pages advised: KV read at random, MiBs and more. */
export function kvArray(dtype: Dtype, length: number): Float32Array | Uint16Array {
  return adviseHuge(dtypeArray(dtype, length));
}

/** `a` (fresh, not yet written; any typed array, shared or not) advised for huge pages; returned for chaining. */
export function adviseHuge<T extends Float32Array | Uint16Array | Uint8Array>(a: T): T {
  native.adviseHugePages(a);
  return a;
}
