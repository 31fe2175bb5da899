/**
 * KV-sized typed arrays placed for random row reads: they start on a 4 KiB page boundary and are
 * advised for transparent huge pages before their first write (native/common/huge_pages.cc).
 *
 * Attention reads a sparse selection's rows at random from such an array — one 256-byte row per
 * token and kv head, 2 KiB apart in a token-major layout:
 * - over 4 KiB pages nearly every row is a TLB miss (a two-level page walk under virtualisation),
 *   so the array asks for 2 MiB pages (advice only: where the kernel has none to give, the array is
 *   an ordinary one);
 * - V8 places a large buffer 16 bytes past a page (glibc serves it from mmap behind a 16-byte
 *   header), so at the buffer's start every 256-byte row would straddle five cache lines instead of
 *   four, and a row prefetched line by line from its first byte would still miss its last line.
 *   The array therefore starts at the buffer's first page boundary; the slack before it (at most
 *   4 KiB - 16 bytes) and after it is never written, so it takes address space, not memory.
 *
 * The same placement serves the runtime's DRAM-tier arenas, the GGUF host's dense cache and
 * synthetic traces (what the Pareto bench, `kvdrive eval` and the demo's policy rows attend over).
 */
import { constants as bufferConstants } from 'node:buffer';
import { native } from '../native.js';
import type { Dtype } from '../types.js';

/** Where the arrays below start in their buffer: a multiple of this many bytes (one page). */
export const KV_ALIGNMENT = 4096;

/** A zeroed array of `length` elements of `dtype` (f16 / bf16 as their bits): small KV buffers. */
export function dtypeArray(dtype: Dtype, length: number): Float32Array | Uint16Array {
  return dtype === 'f32' ? new Float32Array(length) : new Uint16Array(length);
}

type KvArrayCtor<T> = new (buffer: ArrayBufferLike, byteOffset: number, length: number) => T;

/**
 * A zeroed, page-aligned, huge-page-advised array of `length` elements (`shared`: over a
 * SharedArrayBuffer, e.g. the DRAM tier's arenas that stage workers read). Falls back to the
 * buffer's start (no alignment) when the slack would take the buffer past Node's largest.
 */
export function placedArray<T extends Float32Array | Uint16Array | Uint8Array>(ctor: KvArrayCtor<T> & { BYTES_PER_ELEMENT: number }, length: number, shared = false): T {
  const bytes = length * ctor.BYTES_PER_ELEMENT;
  const slack = bytes + KV_ALIGNMENT <= bufferConstants.MAX_LENGTH ? KV_ALIGNMENT : 0;
  const buffer = shared ? new SharedArrayBuffer(bytes + slack) : new ArrayBuffer(bytes + slack);
  // The gap is a multiple of the element size: buffers start at least 16-byte aligned.
  const gap = slack ? (native.alignmentGap(new Uint8Array(buffer, 0, Math.min(1, buffer.byteLength)), KV_ALIGNMENT) as number) : 0;
  return adviseHuge(new ctor(buffer, gap, length));
}

/** {@link dtypeArray} placed for random row reads ({@link placedArray}): KV read at random, MiBs and more. */
export function kvArray(dtype: Dtype, length: number): Float32Array | Uint16Array {
  return dtype === 'f32' ? placedArray(Float32Array, length) : placedArray(Uint16Array, length);
}

/** `a` (fresh, not yet written; any typed array, shared or not) advised for huge pages; returned for chaining. */
export function adviseHuge<T extends Float32Array | Uint16Array | Uint8Array>(a: T): T {
  native.adviseHugePages(a);
  return a;
}
