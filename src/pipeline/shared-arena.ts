/**
 * SharedArrayBuffer arenas: one buffer split into `slots` equal micro-batch slots, each slot split
 * into named typed regions at fixed, documented offsets. Stages in different threads read and write
 * the same slot by index; only the slot index travels through the ring queues.
 *
 * Layout (all offsets in bytes):
 *   slot s starts at        s * slotBytes
 *   region r of slot s at   s * slotBytes + r.byteOffset,   r.length elements of r.type
 * Every region starts on a 64-byte boundary (no false sharing between regions written by different
 * stages) and slotBytes is a multiple of 64. The layout is plain data ({@link ArenaLayout}), so a
 * worker re-creates identical views from (buffer, layout) with {@link SharedArena.attach}.
 */
import { KvdriveError, fail } from '../errors.js';

/** Element type of a region: f32 → Float32Array, i32 → Int32Array, f64 → Float64Array. */
export type RegionType = 'f32' | 'i32' | 'f64';
export type RegionArray<T extends RegionType> = T extends 'f32' ? Float32Array : T extends 'i32' ? Int32Array : Float64Array;

/** A region request: `length` elements of `type` per slot. */
export interface RegionSpec {
  type: RegionType;
  length: number;
}

/** A placed region: its offset inside a slot and its size. */
export interface PlacedRegion extends RegionSpec {
  /** Byte offset from the start of the slot; a multiple of 64. */
  byteOffset: number;
  byteLength: number;
}

/** Serializable description of an arena (send it to workers with the buffer). */
export interface ArenaLayout<R extends Record<string, RegionSpec> = Record<string, RegionSpec>> {
  slots: number;
  /** Bytes per slot; a multiple of 64. */
  slotBytes: number;
  regions: { [K in keyof R]: PlacedRegion & { type: R[K]['type'] } };
}

const ALIGN = 64;
const BYTES: Record<RegionType, number> = { f32: 4, i32: 4, f64: 8 };
/** Default hard cap on one arena (bytes); the caller may lower or raise it. */
export const DEFAULT_ARENA_MAX_BYTES = 1 << 30;

const alignUp = (n: number) => Math.ceil(n / ALIGN) * ALIGN;

/** Places regions in declaration order. Throws E_CONFIG on bad specs, E_NOMEM over `maxBytes`. */
export function planArena<R extends Record<string, RegionSpec>>(slots: number, regions: R, maxBytes = DEFAULT_ARENA_MAX_BYTES): ArenaLayout<R> {
  if (!Number.isInteger(slots) || slots < 1 || slots > 65_536) fail('E_CONFIG', 'arena slots', 'an integer in [1, 65536]', slots);
  if (regions === null || typeof regions !== 'object' || Object.keys(regions).length === 0)
    fail('E_CONFIG', 'arena regions', 'an object of at least one {type, length}', regions);
  let offset = 0;
  const placed: Record<string, PlacedRegion> = {};
  for (const [name, spec] of Object.entries(regions)) {
    if (spec === null || typeof spec !== 'object' || !(spec.type in BYTES))
      fail('E_CONFIG', `arena region '${name}' type`, "one of 'f32', 'i32', 'f64'", spec?.type);
    if (!Number.isSafeInteger(spec.length) || spec.length < 0)
      fail('E_CONFIG', `arena region '${name}' length`, 'a non-negative integer number of elements', spec.length);
    const byteLength = spec.length * BYTES[spec.type];
    placed[name] = { type: spec.type, length: spec.length, byteOffset: offset, byteLength };
    offset = alignUp(offset + byteLength);
  }
  const slotBytes = Math.max(ALIGN, offset);
  if (slotBytes * slots > maxBytes)
    throw new KvdriveError('E_NOMEM', `shared arena size: expected at most ${maxBytes} bytes, got ${slots} slots x ${slotBytes} bytes = ${slotBytes * slots} bytes`);
  return { slots, slotBytes, regions: placed as ArenaLayout<R>['regions'] };
}

/** Typed views over one SharedArrayBuffer laid out by {@link planArena}. */
export class SharedArena<R extends Record<string, RegionSpec> = Record<string, RegionSpec>> {
  readonly buffer: SharedArrayBuffer;
  readonly layout: ArenaLayout<R>;
  // views[slot][region], built once: view() is on the per-micro-batch path
  private readonly views: Record<string, Float32Array | Int32Array | Float64Array>[];

  private constructor(buffer: SharedArrayBuffer, layout: ArenaLayout<R>) {
    this.buffer = buffer;
    this.layout = layout;
    this.views = [];
    for (let s = 0; s < layout.slots; s++) {
      const row: Record<string, Float32Array | Int32Array | Float64Array> = {};
      for (const [name, r] of Object.entries(layout.regions) as [string, PlacedRegion][]) {
        const at = s * layout.slotBytes + r.byteOffset;
        row[name] = r.type === 'f32' ? new Float32Array(buffer, at, r.length) : r.type === 'i32' ? new Int32Array(buffer, at, r.length) : new Float64Array(buffer, at, r.length);
      }
      this.views.push(row);
    }
  }

  /** Allocates an arena of `slots` slots holding `regions` each (zero-filled). */
  static create<R extends Record<string, RegionSpec>>(slots: number, regions: R, maxBytes?: number): SharedArena<R> {
    const layout = planArena(slots, regions, maxBytes);
    return new SharedArena(new SharedArrayBuffer(layout.slots * layout.slotBytes), layout);
  }

  /** Re-creates the views of an arena made elsewhere (another thread) from its buffer and layout. */
  static attach<R extends Record<string, RegionSpec>>(buffer: SharedArrayBuffer, layout: ArenaLayout<R>): SharedArena<R> {
    if (!(buffer instanceof SharedArrayBuffer)) fail('E_TYPE', 'arena buffer', 'a SharedArrayBuffer', buffer);
    if (layout === null || typeof layout !== 'object' || buffer.byteLength !== layout.slots * layout.slotBytes)
      fail('E_SHAPE', 'arena buffer size', `slots x slotBytes = ${layout?.slots * layout?.slotBytes} bytes`, buffer.byteLength);
    return new SharedArena(buffer, layout);
  }

  /** The view of region `name` in slot `slot` (same object on every call). */
  view<K extends keyof R & string>(slot: number, name: K): RegionArray<R[K]['type']> {
    const row = this.views[slot];
    if (row === undefined) fail('E_RANGE', 'arena slot', `an integer in [0, ${this.layout.slots})`, slot);
    const v = row[name];
    if (v === undefined) fail('E_RANGE', 'arena region', `one of ${Object.keys(this.layout.regions).join(', ')}`, name);
    return v as RegionArray<R[K]['type']>;
  }
}
