/**
 * DRAM tier: chunks of sealed segments held in host memory, page-first (a chunk's K rows then its
 * V rows, exactly the SSD extent layout, so a chunk moves between tiers with one memcpy), under a
 * hard byte budget, evicting the least important chunk first. Importance scores come from the
 * caller (warm-up attention mass from the observation window, decode attention mass later).
 *
 * Eviction is GreedyDual: a chunk's priority is L + its latest score, where L is the priority of the
 * last chunk evicted to make room (0 until the tier is full). A chunk that is not attended again
 * keeps its old priority while L rises past it, so it ages out, however high its score once was;
 * one attended step after step keeps rising with L. Without the aging, chunks scored high by the
 * prefill's observation window held their slots for good, and a DRAM tier that is a small share of
 * the KV turned away the decode's working set: at 2 x 128K under 330 MiB, without a hot tier, 2.1-2.2x
 * the SSD reads (bench/runtime-memory.md, "GreedyDual"). Scores and priorities are f32: L is
 * rebased to 0 (every priority lowered by it, the order kept) once it reaches {@link rebaseAt}.
 *
 * Memory (all allocated once at construction, never grown):
 *  - arena: capacity x chunkBytes in blocks of at most `blockBytes` (1 GiB by default; each block
 *    one typed array, a SharedArrayBuffer by default so pipeline workers can read resident chunks).
 *    Slot s lives in block floor(s / slotsPerBlock) at byte (s % slotsPerBlock) x chunkBytes: a
 *    slot never straddles blocks, so a chunk is addressed by (block, byte offset). Blocks lift the
 *    one-typed-array limit (buffer.constants.MAX_LENGTH, 4 GiB on Node 20) off the tier's size;
 *  - per-slot metadata: {@link DramStore.metadataBytesPerSlot} bytes (owner segment, key, heap);
 *  capacity = floor(budgetBytes / (chunkBytes + metadataBytesPerSlot)), so arena + metadata never
 *  exceed budgetBytes. Outside the budget, stated: a slot map of 4 bytes per (layer, kv head, chunk)
 *  of each registered segment ({@link DramStore.indexBytes}; 0.2% of the KV it indexes at 2 KiB
 *  chunks), a few hundred bytes of JS objects per registered segment, and while {@link warm} runs
 *  its staging buffer (4 MiB of pages and ~0.2 MiB of row offsets at 2 KiB chunks) and a sorted
 *  copy of the scores (4 bytes per chunk), freed after.
 */
import { constants as bufferConstants } from 'node:buffer';
import { z } from 'zod';
import { fail, KvdriveError } from '../errors.js';
import { native } from '../native.js';
import type { SegmentData, StoreShape } from './ssd-store.js';
import { chunkBytesOf, storeShapeSchema } from './ssd-store.js';
import { parseOptions } from './io-engine.js';
import { SlotHeap } from './slot-heap.js';
import { placedArray } from '../util/kv-array.js';

/** Bytes of the staging buffer {@link DramStore.warm} packs chunks in (a batch of pages per native gather). */
const WARM_STAGING_BYTES = 4 * 2 ** 20;

/** Options of a {@link DramStore}. */
export interface DramStoreOptions {
  /** Hard budget for resident chunk data plus per-slot metadata, bytes (>= one chunk). */
  budgetBytes: number;
  /** KV geometry (the SSD store's shape). */
  shape: StoreShape;
  /** Back the arena with a SharedArrayBuffer (default true) so worker threads can read it. */
  shared?: boolean;
  /**
   * Bytes per arena block (default 1 GiB; at least one chunk, at most {@link DramStore.maxBlockBytes});
   * rounded down to whole chunks. At most {@link DramStore.maxBlocks} blocks.
   */
  blockBytes?: number;
  /**
   * GreedyDual aging of priorities (default true; see the class header): evict by L + latest score.
   * False: by the latest score alone, so a chunk scored high once keeps its slot until a newcomer
   * scores higher.
   */
  aging?: boolean;
}

const dramOptionsSchema = z
  .object({
    budgetBytes: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER),
    shape: storeShapeSchema,
    shared: z.boolean().optional(),
    blockBytes: z.number().int().min(1).max(bufferConstants.MAX_LENGTH).optional(),
    aging: z.boolean().optional(),
  })
  .strict();

/** Counters of a DRAM store. */
export interface DramStats {
  budgetBytes: number;
  capacityChunks: number;
  residentChunks: number;
  /** Resident chunk bytes. */
  usedBytes: number;
  /** Arena + slot metadata (<= budgetBytes). */
  reservedBytes: number;
  /** Slot maps of registered segments (stated overhead outside the budget). */
  indexBytes: number;
  admitted: number;
  evicted: number;
  /** Admissions refused because every resident chunk was at least as important. */
  rejected: number;
}

/**
 * A chain of segments as {@link DramStore.locate} reads it: global chunk g is chunk g - segStart[s]
 * of the segment s with segStart[s] <= g < segStart[s + 1], whose slot map (from
 * {@link DramStore.slotMap}) is maps[s]; segStart has one entry per segment plus the total.
 */
export interface DramChain {
  segStart: Int32Array;
  maps: Int32Array[];
}

interface SegmentEntry {
  ordinal: number;
  chunks: number;
  /** (layer * kvHeads + head) * chunks + chunk -> slot, -1 when not resident. */
  slots: Int32Array;
}

export class DramStore {
  /**
   * Per-slot metadata: owner ordinal, key and free-list entry (12 bytes), the pin count (2 bytes)
   * and the importance heap ({@link SlotHeap.bytesPerSlot}: 20 bytes).
   */
  static readonly metadataBytesPerSlot = 14 + SlotHeap.bytesPerSlot;

  readonly shape: StoreShape;
  readonly chunkBytes: number;
  readonly budgetBytes: number;
  readonly capacityChunks: number;
  /**
   * Resident chunk data, in blocks: slot s occupies bytes [o, o + chunkBytes) of
   * arenas[{@link blockOf}(s)], o = {@link offsetOf}(s).
   */
  readonly arenas: readonly Uint8Array[];
  /** Slots per arena block (every block but the last holds exactly this many). */
  readonly slotsPerBlock: number;

  private readonly slotOwner: Int32Array; // segment ordinal, -1 when free
  private readonly slotKey: Int32Array;
  private readonly heap: SlotHeap;
  /** Resident slots allocate took out of the heap while pinned (see there); restoreAside puts them back. */
  private readonly aside: number[] = [];
  private readonly free: Int32Array; // stack of free slots, freeTop entries
  /** Readers attending a slot in place (off the JS thread); a pinned slot is never evicted. */
  private readonly pins: Uint16Array;
  private freeTop = 0;
  /** GreedyDual's L: the priority of the last chunk evicted to make room (see the header); stays 0 without aging. */
  private inflation = 0;
  private readonly aging: boolean;
  /** What the last rebase subtracted (put lowers a newcomer's priority taken before it). */
  private rebased = 0;
  /**
   * L at which every priority is lowered by L (an O(capacity) pass): while L stays below 1, f32
   * priorities keep attention masses down to ~1e-7 apart.
   */
  static readonly rebaseAt = 1;
  private readonly segs = new Map<string, SegmentEntry>();
  private readonly byOrdinal = new Map<number, SegmentEntry>();
  private nextOrdinal = 0;
  private counters = { admitted: 0, evicted: 0, rejected: 0 };

  /** Largest arena block in bytes (one typed array: Node's buffer.constants.MAX_LENGTH, 4 GiB on Node 20). */
  static readonly maxBlockBytes: number = bufferConstants.MAX_LENGTH;
  /** Default arena block size: 1 GiB. */
  static readonly defaultBlockBytes = 2 ** 30;
  /**
   * Most arena blocks: a fetch hands attention its pages in up to 256 buffers addressed by a
   * Uint8Array index (native/attention/tiered_attention.cc), one of them the SSD read buffer.
   */
  static readonly maxBlocks = 255;

  /** Most chunks of `chunkBytes` a DRAM tier can hold with blocks of `blockBytes` (the default 1 GiB). */
  static maxChunks(chunkBytes: number, blockBytes: number = DramStore.defaultBlockBytes): number {
    return DramStore.maxBlocks * Math.floor(blockBytes / chunkBytes);
  }

  constructor(options: DramStoreOptions) {
    const o = parseOptions(dramOptionsSchema, options, 'DramStore options');
    this.shape = o.shape;
    this.chunkBytes = chunkBytesOf(o.shape);
    this.budgetBytes = o.budgetBytes;
    const cap = Math.floor(o.budgetBytes / (this.chunkBytes + DramStore.metadataBytesPerSlot));
    if (cap < 1)
      fail('E_BUDGET', 'DramStore options.budgetBytes', `at least one chunk plus metadata (${this.chunkBytes + DramStore.metadataBytesPerSlot} bytes)`, o.budgetBytes);
    if (cap > Math.min(0x7fffffff, SlotHeap.maxSlots)) fail('E_BUDGET', 'DramStore options.budgetBytes', `at most ${Math.min(0x7fffffff, SlotHeap.maxSlots)} chunks`, o.budgetBytes);
    const blockBytes = o.blockBytes ?? DramStore.defaultBlockBytes;
    const perBlock = Math.floor(blockBytes / this.chunkBytes);
    if (perBlock < 1) fail('E_CONFIG', 'DramStore options.blockBytes', `at least one chunk (${this.chunkBytes} bytes)`, blockBytes);
    const nBlocks = Math.ceil(cap / perBlock);
    // Checked before anything is allocated.
    if (nBlocks > DramStore.maxBlocks)
      fail('E_BUDGET', 'DramStore options.budgetBytes', `a DRAM tier of at most ${DramStore.maxBlocks} arena blocks of ${perBlock * this.chunkBytes} bytes (${DramStore.maxBlocks * perBlock} chunks)`, `${o.budgetBytes} (${cap} chunks, ${nBlocks} blocks)`);
    this.capacityChunks = cap;
    this.slotsPerBlock = perBlock;
    this.aging = o.aging ?? true;
    const arenas: Uint8Array[] = [];
    for (let b = 0; b < nBlocks; b++) {
      const bytes = Math.min(perBlock, cap - b * perBlock) * this.chunkBytes;
      // Page-aligned and advised for huge pages before any write: attention reads these rows at
      // random, each row then on whole cache lines and far fewer of those reads missing the TLB
      // (src/util/kv-array.ts). The arena's bytes are in the budget in full, so pages that come in
      // 2 MiB at a time never take the process past it; the alignment slack is never written.
      arenas.push(placedArray(Uint8Array, bytes, o.shared !== false));
    }
    this.arenas = arenas;
    this.slotOwner = new Int32Array(cap).fill(-1);
    this.slotKey = new Int32Array(cap);
    this.heap = new SlotHeap(cap);
    this.free = new Int32Array(cap);
    this.pins = new Uint16Array(cap);
    for (let s = cap - 1; s >= 0; s--) this.free[this.freeTop++] = s;
  }

  /** Registers a sealed segment of `tokens` tokens so its chunks can become resident. */
  addSegment(id: string, tokens: number): void {
    if (this.segs.has(id)) fail('E_CONFIG', `DramStore segment '${id}'`, 'an id not registered yet', id);
    if (!Number.isInteger(tokens) || tokens < this.shape.chunkSize || tokens % this.shape.chunkSize !== 0)
      fail('E_SHAPE', `DramStore segment '${id}' tokens`, `a positive multiple of chunkSize ${this.shape.chunkSize}`, tokens);
    const chunks = tokens / this.shape.chunkSize;
    const e: SegmentEntry = { ordinal: this.nextOrdinal++, chunks, slots: new Int32Array(this.shape.layers * this.shape.kvHeads * chunks).fill(-1) };
    this.segs.set(id, e);
    this.byOrdinal.set(e.ordinal, e);
  }

  /** Drops a segment and frees its resident chunks (none may be pinned: E_INTERNAL). */
  removeSegment(id: string): void {
    const e = this.entry(id);
    for (let k = 0; k < e.slots.length; k++)
      if (e.slots[k]! >= 0 && this.pins[e.slots[k]!] !== 0) fail('E_INTERNAL', `DramStore.removeSegment('${id}')`, 'no chunk of it attended in place (pinned)', `slot ${e.slots[k]} pinned`);
    for (let k = 0; k < e.slots.length; k++) if (e.slots[k]! >= 0) this.release(e.slots[k]!);
    this.segs.delete(id);
    this.byOrdinal.delete(e.ordinal);
  }

  hasSegment(id: string): boolean {
    return this.segs.has(id);
  }

  private entry(id: string): SegmentEntry {
    const e = this.segs.get(id);
    if (!e) throw new KvdriveError('E_NOT_FOUND', `DramStore segment ${JSON.stringify(id)}: expected a registered segment (addSegment), got an unknown id`);
    return e;
  }

  private key(e: SegmentEntry, id: string, layer: number, head: number, chunk: number): number {
    const s = this.shape;
    if (!Number.isInteger(layer) || layer < 0 || layer >= s.layers || !Number.isInteger(head) || head < 0 || head >= s.kvHeads)
      fail('E_RANGE', `DramStore segment '${id}'`, `layer in [0, ${s.layers}) and kv head in [0, ${s.kvHeads})`, `layer ${layer}, kv head ${head}`);
    if (!Number.isInteger(chunk) || chunk < 0 || chunk >= e.chunks) fail('E_RANGE', `DramStore segment '${id}' chunk id`, `an integer in [0, ${e.chunks})`, chunk);
    return (layer * s.kvHeads + head) * e.chunks + chunk;
  }

  /**
   * The slot map of a segment for hot loops: index (layer * kvHeads + head) * chunks + chunk gives
   * the slot (its bytes: {@link chunk}, or {@link blockOf} / {@link offsetOf} in {@link arenas}) or -1. Read-only for callers.
   */
  slotMap(id: string): { slots: Int32Array; chunks: number } {
    const e = this.entry(id);
    return { slots: e.slots, chunks: e.chunks };
  }

  /** Slot of a resident chunk, or -1. */
  lookup(id: string, layer: number, head: number, chunk: number): number {
    const e = this.entry(id);
    return e.slots[this.key(e, id, layer, head, chunk)]!;
  }

  /** Arena block of a slot (index into {@link arenas}). */
  blockOf(slot: number): number {
    return Math.floor(slot / this.slotsPerBlock);
  }

  /** Byte offset of a slot inside its arena block. */
  offsetOf(slot: number): number {
    return (slot % this.slotsPerBlock) * this.chunkBytes;
  }

  /**
   * The slot whose bytes start at `byte` of arena block `block` (the inverse of {@link blockOf} /
   * {@link offsetOf}), or -1 when no slot starts there.
   */
  slotAt(block: number, byte: number): number {
    const slot = block * this.slotsPerBlock + byte / this.chunkBytes;
    return Number.isInteger(block) && block >= 0 && byte >= 0 && byte < this.slotsPerBlock * this.chunkBytes && Number.isInteger(slot) && slot < this.capacityChunks ? slot : -1;
  }

  /** View of a resident chunk's page-first bytes (valid until it is evicted). */
  chunk(slot: number): Uint8Array {
    const at = this.offsetOf(slot);
    return this.arenas[this.blockOf(slot)]!.subarray(at, at + this.chunkBytes);
  }

  /**
   * Copies chunks between `buf` (at byte offsets `bufAt`) and slots, block by block (one native
   * memcpy loop per block touched): into the slots when `into`, else out of them.
   */
  private moveChunks(into: boolean, slots: ArrayLike<number>, buf: Uint8Array, bufAt: ArrayLike<number>): void {
    const n = slots.length;
    if (!n) return;
    const blocks = this.arenas.length;
    const count = new Int32Array(blocks + 1);
    for (let i = 0; i < n; i++) count[this.blockOf(slots[i]!) + 1]!++;
    for (let b = 0; b < blocks; b++) count[b + 1]! += count[b]!;
    const slotAt = new Float64Array(n);
    const other = new Float64Array(n);
    const fill = count.slice(0, blocks);
    for (let i = 0; i < n; i++) {
      const b = this.blockOf(slots[i]!);
      const k = fill[b]!++;
      slotAt[k] = this.offsetOf(slots[i]!);
      other[k] = bufAt[i]!;
    }
    for (let b = 0; b < blocks; b++) {
      const a = count[b]!;
      const e = count[b + 1]!;
      if (a === e) continue;
      if (into) native.copyChunks(buf, other.subarray(a, e), this.arenas[b]!, slotAt.subarray(a, e), this.chunkBytes);
      else native.copyChunks(this.arenas[b]!, slotAt.subarray(a, e), buf, other.subarray(a, e), this.chunkBytes);
    }
  }

  /**
   * Makes chunks resident: chunk ids[i] of (layer, head) with importance scores[i], bytes at
   * src[srcOffsets[i]]. A chunk already resident gets its score updated. When full, the chunk of
   * lowest priority is evicted if it is below the newcomer's (L + score, see the header); otherwise
   * the newcomer is rejected. Returns how many were admitted.
   */
  put(id: string, layer: number, head: number, ids: ArrayLike<number>, scores: ArrayLike<number>, src: Uint8Array, srcOffsets: ArrayLike<number>): number {
    const e = this.entry(id);
    this.restoreAside();
    if (scores.length !== ids.length || srcOffsets.length !== ids.length)
      fail('E_SHAPE', 'DramStore.put scores/srcOffsets', `${ids.length} entries (one per chunk id)`, `${scores.length}/${srcOffsets.length}`);
    // Validate everything before changing any state.
    for (let i = 0; i < ids.length; i++) {
      this.key(e, id, layer, head, ids[i]!);
      if (!Number.isFinite(scores[i]!)) fail('E_NONFINITE', `DramStore.put score of chunk ${ids[i]}`, 'a finite number', scores[i]);
      const o = srcOffsets[i]!;
      if (!Number.isInteger(o) || o < 0 || o + this.chunkBytes > src.length)
        fail('E_RANGE', `DramStore.put srcOffsets[${i}]`, `an offset with offset + ${this.chunkBytes} <= src.length ${src.length}`, o);
    }
    const from: number[] = [];
    const to: number[] = []; // slots
    for (let i = 0; i < ids.length; i++) {
      const k = this.key(e, id, layer, head, ids[i]!);
      const score = this.inflation + scores[i]!;
      const existing = e.slots[k]!;
      if (existing >= 0) {
        this.heap.update(existing, score);
        continue;
      }
      const slot = this.allocate(score);
      if (slot < 0) {
        this.counters.rejected++;
        continue;
      }
      this.slotOwner[slot] = e.ordinal;
      this.slotKey[slot] = k;
      e.slots[k] = slot;
      // A rebase during that eviction lowered every priority by L: the newcomer's too.
      this.heap.insert(slot, score - this.rebased);
      this.rebased = 0;
      from.push(srcOffsets[i]!);
      to.push(slot);
      this.counters.admitted++;
    }
    this.moveChunks(true, to, src, from);
    return from.length;
  }

  /**
   * Pins resident slots so that their bytes stay put while a reader attends them in place (the
   * runtime's step reads DRAM-tier chunks straight from the arena, possibly off the JS thread, while
   * other steps admit chunks). Every pin must be matched by {@link unpin}. One native pass
   * (native/cache/dram_tier.cc): every slot is checked before any pin changes.
   */
  pin(slots: Int32Array): void {
    native.dramPins({ owner: this.slotOwner, pins: this.pins, slots, delta: 1 });
  }

  /** Releases pins taken by {@link pin} or {@link locate} (E_INTERNAL for a slot not pinned). */
  unpin(slots: Int32Array): void {
    native.dramPins({ owner: this.slotOwner, pins: this.pins, slots, delta: -1 });
  }

  /**
   * The DRAM-tier lookups of one fetch in one native pass (native/cache/dram_tier.cc), for a
   * segment chain (a TieredKv's): for every entry of `req` not marked in `skip`, its slot in
   * `store` when resident (the k-th hit: `out.slots[k]`, entry `out.entries[k]`, in entry order),
   * else its entry index in `out.misses` (every such entry without a store). `pin`: the hits are
   * pinned (release with {@link unpin} of `out.slots.subarray(0, hits)`). `out.source` / `out.at`
   * (optional, one per entry): the placement of a reader in place (hit: source 1 + arena block, at
   * its byte offset there; every other entry: source 0, at = chunkBytes x its rank among the
   * non-hits). `out` arrays hold at least one element per entry; `chain.maps` are `store`'s slot maps.
   */
  static locate(
    store: DramStore | undefined,
    req: { layer: number; offsets: Int32Array; chunkIds: Int32Array },
    chain: DramChain,
    out: { slots: Int32Array; entries: Int32Array; misses: Int32Array; source?: Uint8Array; at?: Float64Array },
    opts: { kvHeads: number; chunkBytes: number; skip?: Uint8Array; pin: boolean },
  ): { hits: number; misses: number; inDest: number } {
    return native.dramLocate({
      offsets: req.offsets,
      chunkIds: req.chunkIds,
      kvHeads: opts.kvHeads,
      layer: req.layer,
      segStart: chain.segStart,
      chunkBytes: opts.chunkBytes,
      ...(opts.skip ? { skip: opts.skip } : {}),
      ...(store ? { maps: chain.maps, owner: store.slotOwner, slotsPerBlock: store.slotsPerBlock, ...(opts.pin ? { pins: store.pins } : {}) } : {}),
      out,
    }) as { hits: number; misses: number; inDest: number };
  }

  /**
   * A free slot, evicting the least important chunk when that scores below `score`; -1 if none.
   * While the least important chunk is pinned (being attended in place) the newcomer is rejected.
   */
  private allocate(score: number): number {
    if (this.freeTop > 0) return this.free[--this.freeTop]!;
    let victim = this.heap.peek();
    // A pinned chunk at the top (one a step attends in place, e.g. another entry's while a deferred
    // admission runs) would refuse every admission: set it aside, out of the heap, until a later
    // put finds it unpinned (restoreAside).
    while (victim >= 0 && this.pins[victim] !== 0 && this.heap.scoreOf(victim) < score) {
      this.heap.remove(victim);
      this.aside.push(victim);
      victim = this.heap.peek();
    }
    if (victim < 0 || this.heap.scoreOf(victim) >= score || this.pins[victim] !== 0) return -1;
    // GreedyDual: L rises to the evicted priority (the least of all, so never above another's).
    if (this.aging) this.inflation = Math.max(this.inflation, this.heap.scoreOf(victim));
    this.release(victim);
    this.counters.evicted++;
    if (this.inflation >= DramStore.rebaseAt) this.rebase();
    return this.free[--this.freeTop]!;
  }

  /**
   * Lowers every priority by L and L to 0. The caller's newcomer priority (put's `score`, taken
   * before the eviction) is then L too high, by the same amount as everyone's: put re-reads it.
   */
  private rebase(): void {
    const L = this.inflation;
    this.heap.shift(L);
    this.inflation = 0;
    this.rebased = L;
  }

  /** Puts the slots allocate set aside back into the heap once unpinned (with their current score). */
  private restoreAside(): void {
    let k = 0;
    for (const slot of this.aside) {
      // Released since (and maybe reused: then it is in the heap again): nothing to restore.
      if (this.slotOwner[slot] === -1 || this.heap.has(slot)) continue;
      if (this.pins[slot] !== 0) this.aside[k++] = slot;
      else this.heap.insert(slot, this.heap.scoreOf(slot));
    }
    this.aside.length = k;
  }

  private release(slot: number): void {
    const owner = this.byOrdinal.get(this.slotOwner[slot]!);
    if (owner) owner.slots[this.slotKey[slot]!] = -1;
    this.slotOwner[slot] = -1;
    this.heap.remove(slot);
    this.free[this.freeTop++] = slot;
  }

  /** Sets importance scores of resident chunks (non-resident ids are ignored). */
  setScores(id: string, layer: number, head: number, ids: ArrayLike<number>, scores: ArrayLike<number>): void {
    const e = this.entry(id);
    if (scores.length !== ids.length) fail('E_SHAPE', 'DramStore.setScores scores', `${ids.length} entries`, scores.length);
    for (let i = 0; i < ids.length; i++) {
      const slot = e.slots[this.key(e, id, layer, head, ids[i]!)]!;
      if (!Number.isFinite(scores[i]!)) fail('E_NONFINITE', `DramStore.setScores score of chunk ${ids[i]}`, 'a finite number', scores[i]);
      if (slot >= 0) this.heap.update(slot, this.inflation + scores[i]!);
    }
  }

  /**
   * Sets the importance of resident slots: slots[k] gets scores[entries[k]] (the hits of a
   * {@link locate}: their slots and entry indices into a request's scores), in order. The DRAM
   * admission after each decode step refreshes every resident chunk it attended this way (~3,000 a
   * layer-step): no per-slot residency read (locate took the slots from the slot maps; an update of
   * a free slot only writes its score), slots range-checked, scores checked finite.
   */
  refreshScores(slots: Int32Array, entries: Int32Array, scores: Float32Array): void {
    if (entries.length !== slots.length) fail('E_SHAPE', 'DramStore.refreshScores entries', `${slots.length} entries (one per slot)`, entries.length);
    // Every slot and score is checked (natively) before any score changes; priorities are L + score,
    // the sum made there.
    this.heap.refresh(slots, entries, scores, this.inflation);
  }

  /** Sets the importance of a resident slot (hot path of the tiered fetch). */
  setSlotScore(slot: number, score: number): void {
    if (!(slot >= 0 && slot < this.capacityChunks) || this.slotOwner[slot] === -1) fail('E_RANGE', 'DramStore.setSlotScore slot', 'a resident slot', slot);
    if (!Number.isFinite(score)) fail('E_NONFINITE', 'DramStore.setSlotScore score', 'a finite number', score);
    this.heap.update(slot, this.inflation + score);
  }

  /** Priority of a resident chunk's slot: L + its latest score (GreedyDual, see the header); its score until the tier first evicts. */
  scoreOf(slot: number): number {
    return this.heap.scoreOf(slot);
  }

  /** Evicts one chunk if resident and not pinned; returns whether it was evicted. */
  evict(id: string, layer: number, head: number, chunk: number): boolean {
    const e = this.entry(id);
    const slot = e.slots[this.key(e, id, layer, head, chunk)]!;
    if (slot < 0 || this.pins[slot] !== 0) return false;
    this.release(slot);
    this.counters.evicted++;
    return true;
  }

  /**
   * Importance-guided warm-up from a segment's KV in memory (end of prefill): admits chunks of
   * every (layer, head) in descending score order until the budget is full. `scores[(layer *
   * kvHeads + head) * chunks + chunk]` is the chunk's importance. Returns how many were admitted.
   */
  warm(id: string, data: SegmentData, scores: Float32Array): number {
    const e = this.entry(id);
    const s = this.shape;
    if (scores.length !== e.slots.length) fail('E_SHAPE', 'DramStore.warm scores', `${e.slots.length} entries (layers*kvHeads*chunks)`, scores.length);
    const tokens = e.chunks * s.chunkSize;
    const bytesOf = (t: SegmentData['layers'][number]['k']) => new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    const layers = Array.from({ length: s.layers }, (_, layer) => {
      const lay = data.layers[layer];
      if (!lay) fail('E_SHAPE', 'DramStore.warm data.layers', `${s.layers} layers`, data.layers.length);
      for (const t of [lay.k, lay.v])
        if (t.dtype !== s.dtype || t.heads !== s.kvHeads || t.dim !== s.headDim || t.tokens !== tokens || t.data.length < tokens * s.kvHeads * s.headDim)
          fail('E_SHAPE', `DramStore.warm data.layers[${layer}]`, `${tokens} x ${s.kvHeads} x ${s.headDim} ${s.dtype}`, `${t.tokens} x ${t.heads} x ${t.dim} ${t.dtype}`);
      return { k: bytesOf(lay.k), v: bytesOf(lay.v) };
    });
    for (let k = 0; k < scores.length; k++) if (!Number.isFinite(scores[k]!)) fail('E_NONFINITE', `DramStore.warm score of entry ${k}`, 'a finite number', scores[k]);
    // The best-scored chunks (ties: lower entry first), admitted in (layer, head, chunk) order:
    // which are admitted is the same in any order (each admission evicts the least important
    // resident below it), and slots taken in chunk order keep a head's chunks in ascending slots, as
    // a whole-segment fill lays them out. The cut is found on a sorted copy of the scores (no sort
    // of 10^5-10^6 entries by comparator): every entry above it, and the first ties at it.
    const cap = Math.min(scores.length, this.capacityChunks);
    if (cap === 0) return 0;
    const cut = Float32Array.from(scores).sort()[scores.length - cap]!;
    let ties = cap;
    for (let k = 0; k < scores.length; k++) if (scores[k]! > cut) ties--;
    const rowBytes = s.headDim * (s.dtype === 'f32' ? 4 : 2);
    const cs = s.chunkSize;
    // Chunks are packed page-first into a staging buffer a batch at a time (two native row gathers,
    // K and V), then admitted by one put per batch of one (layer, head).
    const batch = Math.max(1, Math.min(cap, Math.floor(WARM_STAGING_BYTES / this.chunkBytes)));
    const staging = new Uint8Array(batch * this.chunkBytes);
    // Row offsets in the token-major K and V tensors (the same for both), and in the staging pages.
    const rows = new Float64Array(batch * cs);
    const dstK = new Float64Array(batch * cs);
    const dstV = new Float64Array(batch * cs);
    const ids = new Int32Array(batch);
    const taken = new Float32Array(batch);
    const at = new Float64Array(batch);
    for (let i = 0; i < batch; i++) {
      at[i] = i * this.chunkBytes;
      for (let r = 0; r < cs; r++) {
        dstK[i * cs + r] = i * this.chunkBytes + r * rowBytes;
        dstV[i * cs + r] = i * this.chunkBytes + (cs + r) * rowBytes;
      }
    }
    let admitted = 0;
    let n = 0;
    let region = -1;
    const flush = () => {
      if (n === 0) return;
      const layer = Math.floor(region / s.kvHeads);
      const src = layers[layer]!;
      native.copyChunks(src.k, rows.subarray(0, n * cs), staging, dstK.subarray(0, n * cs), rowBytes);
      native.copyChunks(src.v, rows.subarray(0, n * cs), staging, dstV.subarray(0, n * cs), rowBytes);
      admitted += this.put(id, layer, region % s.kvHeads, ids.subarray(0, n), taken.subarray(0, n), staging, at.subarray(0, n));
      n = 0;
    };
    for (let k = 0; k < scores.length; k++) {
      const score = scores[k]!;
      if (score < cut || (score === cut && ties-- <= 0)) continue;
      const chunk = k % e.chunks;
      const r = (k - chunk) / e.chunks;
      if (r !== region || n === batch) {
        flush();
        region = r;
      }
      const head = r % s.kvHeads;
      // Token-major rows: token (chunk * cs + t), kv head `head`.
      for (let t = 0; t < cs; t++) rows[n * cs + t] = ((chunk * cs + t) * s.kvHeads + head) * rowBytes;
      ids[n] = chunk;
      taken[n] = score;
      n++;
    }
    flush();
    return admitted;
  }

  /** Gathers resident chunks by slot into `dest` at byte offsets (one native memcpy loop). */
  copyOut(slots: Int32Array, dest: Uint8Array, destOffsets: Float64Array): void {
    if (destOffsets.length !== slots.length) fail('E_SHAPE', 'DramStore.copyOut destOffsets', `${slots.length} entries`, destOffsets.length);
    for (let i = 0; i < slots.length; i++) {
      const s = slots[i]!;
      if (s < 0 || s >= this.capacityChunks || this.slotOwner[s] === -1) fail('E_RANGE', `DramStore.copyOut slot`, 'a resident slot', s);
    }
    this.moveChunks(false, slots, dest, destOffsets);
  }

  stats(): DramStats {
    let indexBytes = 0;
    for (const e of this.segs.values()) indexBytes += e.slots.byteLength;
    const resident = this.capacityChunks - this.freeTop;
    return {
      budgetBytes: this.budgetBytes,
      capacityChunks: this.capacityChunks,
      residentChunks: resident,
      usedBytes: resident * this.chunkBytes,
      reservedBytes: this.capacityChunks * (this.chunkBytes + DramStore.metadataBytesPerSlot),
      indexBytes,
      ...this.counters,
    };
  }
}
