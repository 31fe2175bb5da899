/// <reference lib="es2024.sharedmemory" />
/**
 * Bounded ring queue of fixed-size Int32 descriptors in a SharedArrayBuffer, for handing
 * micro-batch descriptors between threads (main thread and workers) without postMessage.
 *
 * Algorithm: Vyukov's bounded multi-producer multi-consumer queue. Every slot carries a sequence
 * word; a producer owns slot `pos` once it wins the CAS on `tail` while `seq == pos`, writes the
 * payload with plain stores and publishes with `Atomics.store(seq, pos + 1)`; a consumer owns it once
 * it wins the CAS on `head` while `seq == pos + 1` and releases it with `seq = pos + capacity`. Atomics
 * are sequentially consistent, so the payload written before the publishing store is visible to the
 * consumer that observed it. With one producer and one consumer the CAS never fails, so the same
 * code is the SPSC queue; several workers of one stage may share the queue safely.
 *
 * Counters are 32-bit and wrap; `capacity` is a power of two so `pos & mask` stays consistent across
 * the wrap and differences are taken as `(a - b) | 0`.
 *
 * Waiting (the hand-off latency is what decides whether a pipeline wins, see bench/pipeline.md):
 * spin on `Atomics.load` for at most `spinMicros` µs, then sleep in `Atomics.wait` (workers) or
 * `Atomics.waitAsync` (main thread, which may not block). Sleepers wait on an *epoch* word, not on
 * head/tail: a waiter registers itself (waiter count), reads the epoch, re-checks the queue and only
 * then sleeps on that epoch value; a producer that sees a registered waiter after publishing bumps
 * the epoch and notifies. With sequentially consistent atomics either the waiter sees the new item
 * or the producer sees the waiter, so no wake-up is lost; producers pay no notify syscall while
 * nobody sleeps. `close()` and `abort()` bump both epochs, so they wake every sleeper.
 *
 * Back-pressure: a full queue makes `push` wait for space (same protocol on the space epoch);
 * nothing is ever dropped. `close()` lets consumers drain what was pushed and then report the end;
 * a push racing with close either lands (and is drained) or throws E_CLOSED — never vanishes.
 *
 * Dying endpoints: a thread can die (crash, Worker.terminate, resource limits) at any instruction,
 * including between winning a slot and releasing it. Stage workers therefore pop and push through a
 * {@link HandoffRecord} in shared memory: the descriptor they hold lives in the record, and the
 * record says whether they are popping (position P claimed before the CAS), holding, or pushing
 * (position P). Record holders on one side of a ring take a per-side lock word around the claim,
 * so a claimed position is never ambiguous between two of them (a lock held ~100 ns, uncontended
 * with one worker per stage); the endpoints on one side of a ring are therefore either all record
 * holders or a single thread without one (the main thread feeding the first ring, draining the
 * last). After the thread died, another thread calls {@link RingQueue.salvageConsumer} on the ring
 * it pops from and {@link RingQueue.salvageProducer} on the ring it pushes to: a half-done pop is
 * finished into the record (the slot released, so the ring is not wedged), a half-done push is
 * either recognised as handed on (published) or turned into a tombstone (so consumers do not wait
 * on a reserved slot forever) with the descriptor still held. The record then says exactly whether
 * the dead thread held a descriptor it had not handed on.
 */
import { KvdriveError, fail } from '../errors.js';

// ---- Header layout (Int32 words). Head and tail live on their own 64-byte cache lines. ----
const H_MAGIC = 0;
const H_CAPACITY = 1;
const H_WORDS = 2; // descriptor words per slot (payload only)
const H_STATE = 3; // STATE_OPEN | STATE_CLOSED | STATE_ABORTED
const H_DATA_EPOCH = 4; // bumped to wake consumers
const H_SPACE_EPOCH = 5; // bumped to wake producers
const H_CONSUMERS_WAITING = 6; // consumers registered to sleep
const H_PRODUCERS_WAITING = 7; // producers registered to sleep
const H_POP_LOCK = 8; // record id of the consumer claiming a slot (record holders only), 0 = free
const H_PUSH_LOCK = 9; // same for producers
const H_HEAD = 16; // next position to consume
const H_TAIL = 32; // next position to produce
const HEADER_WORDS = 48;
// Per slot: [seq, kind, payload...]; kind marks a tombstone left by a push that lost the race
// with close() (consumers skip it; the producer got E_CLOSED).
const SLOT_SEQ = 0;
const SLOT_KIND = 1;
const SLOT_META = 2;
const KIND_DATA = 0;
const KIND_TOMBSTONE = 1;

// ---- Hand-off record: [state, position, id, descriptor words...] (Int32, shared memory). ----
const R_STATE = 0;
const R_POS = 1;
const R_ID = 2;
/** Words of a {@link HandoffRecord} before its descriptor. */
export const HANDOFF_HEADER_WORDS = 3;
/** Record states. */
export const HANDOFF_IDLE = 0; // holds nothing
export const HANDOFF_POPPING = 1; // claiming input position R_POS (may or may not have taken it)
export const HANDOFF_HELD = 2; // the descriptor words hold a descriptor taken from input position R_POS
export const HANDOFF_PUSHING = 3; // handing the held descriptor to output position R_POS

const MAGIC = 0x6b767271; // 'kvrq'
const STATE_OPEN = 0;
const STATE_CLOSED = 1;
const STATE_ABORTED = 2;

/** Largest accepted capacity (keeps 32-bit sequence arithmetic unambiguous). */
export const MAX_RING_CAPACITY = 1 << 24;
/** Largest accepted descriptor size in Int32 words. */
export const MAX_DESCRIPTOR_WORDS = 1024;

/** Wait strategy of one queue endpoint. */
export interface WaitOptions {
  /**
   * Microseconds to busy-poll with `Atomics.load` before sleeping in `Atomics.wait`/`waitAsync`.
   * 0 = sleep at once (pure wait). Default 50 µs: a sleeping thread takes ~40 µs to wake on a VM,
   * a poll sees a change in ~0.5 µs. Bounded at 100 000 µs.
   */
  spinMicros?: number;
}

/** Options of {@link RingQueue.create}. */
export interface RingQueueOptions extends WaitOptions {
  /** Number of slots; a power of two in [2, 2^24]. */
  capacity: number;
  /** Int32 words per descriptor, in [1, 1024]. */
  words: number;
}

/** Outcome of one bounded wait round of {@link RingQueue.popWait}. */
export type PopStatus = 'item' | 'closed' | 'idle';

/**
 * One endpoint's hand-off state in shared memory, readable by other threads after the endpoint's
 * thread died (see the class comment of {@link RingQueue}). Layout at `words[at]`: state, position,
 * id (> 0, unique among the record holders of one ring side), then `descWords` descriptor words.
 * A thread pops into and pushes from `desc`; its record moves IDLE → POPPING → HELD → PUSHING → IDLE.
 */
export class HandoffRecord {
  readonly words: Int32Array;
  readonly at: number;
  /** The descriptor the endpoint holds (a view into `words`). */
  readonly desc: Int32Array;

  constructor(words: Int32Array, at: number, descWords: number) {
    if (!(words instanceof Int32Array) || !(words.buffer instanceof SharedArrayBuffer)) fail('E_TYPE', 'hand-off record words', 'an Int32Array over a SharedArrayBuffer', words);
    if (!Number.isInteger(at) || at < 0 || !Number.isInteger(descWords) || descWords < 1 || at + HANDOFF_HEADER_WORDS + descWords > words.length)
      fail('E_RANGE', 'hand-off record', `${HANDOFF_HEADER_WORDS} + descWords words inside ${words.length}`, `at ${at}, descWords ${descWords}`);
    this.words = words;
    this.at = at;
    this.desc = words.subarray(at + HANDOFF_HEADER_WORDS, at + HANDOFF_HEADER_WORDS + descWords);
  }

  /** Resets the record for a (new) endpoint with id `id` > 0. */
  reset(id: number): void {
    if (!Number.isInteger(id) || id <= 0) fail('E_RANGE', 'hand-off record id', 'a positive integer', id);
    Atomics.store(this.words, this.at + R_ID, id);
    Atomics.store(this.words, this.at + R_POS, 0);
    Atomics.store(this.words, this.at + R_STATE, HANDOFF_IDLE);
  }

  get state(): number {
    return Atomics.load(this.words, this.at + R_STATE);
  }

  get id(): number {
    return Atomics.load(this.words, this.at + R_ID);
  }

  /** @internal */
  claim(state: number, pos: number): void {
    Atomics.store(this.words, this.at + R_POS, pos);
    Atomics.store(this.words, this.at + R_STATE, state);
  }

  /** @internal */
  set(state: number): void {
    Atomics.store(this.words, this.at + R_STATE, state);
  }

  /** @internal */
  get position(): number {
    return Atomics.load(this.words, this.at + R_POS);
  }
}

/** Options of one {@link RingQueue.popWait} round. */
export interface PopWaitOptions {
  /**
   * Checked after the sleeper registered and read the wake-up epoch, right before it sleeps: true
   * returns 'idle' at once. A condition set by another thread before it calls
   * {@link RingQueue.wakeConsumers} is therefore never missed (it is either seen here or the epoch
   * changed and the wait returns at once).
   */
  wakeIf?: () => boolean;
  /** Pop through this record (`out` must be `record.desc`); see {@link HandoffRecord}. */
  record?: HandoffRecord;
}

const DEFAULT_SPIN_MICROS = 50;

function checkSpin(spinMicros: unknown): number {
  if (spinMicros === undefined) return DEFAULT_SPIN_MICROS;
  if (typeof spinMicros !== 'number' || !Number.isFinite(spinMicros) || spinMicros < 0 || spinMicros > 100_000)
    fail('E_CONFIG', 'ring queue spinMicros', 'a number of microseconds in [0, 100000]', spinMicros);
  return spinMicros;
}

function isPowerOfTwo(n: number): boolean {
  return Number.isInteger(n) && n > 0 && (n & (n - 1)) === 0;
}

/** Nanosecond-ish monotonic clock in µs. */
const nowMicros = (): number => performance.now() * 1000;

/**
 * One endpoint (any thread) of a shared ring queue. Create it once with {@link RingQueue.create},
 * send `buffer` to other threads (workerData or a message) and {@link RingQueue.attach} there.
 */
export class RingQueue {
  /** The shared memory; pass it to other threads to attach. */
  readonly buffer: SharedArrayBuffer;
  /** Slots in the queue. */
  readonly capacity: number;
  /** Int32 words per descriptor. */
  readonly words: number;
  /** This endpoint's spin budget in µs (see {@link WaitOptions}). */
  spinMicros: number;

  private readonly i32: Int32Array;
  private readonly mask: number;
  private readonly slotWords: number;
  // Bound once: spin predicates are on the hand-off path and should not allocate.
  private readonly spaceReady = () => this.hasSpace();
  private readonly itemReady = () => this.hasItemOrEnd();

  private constructor(buffer: SharedArrayBuffer, spinMicros: number) {
    this.buffer = buffer;
    this.i32 = new Int32Array(buffer);
    this.capacity = this.i32[H_CAPACITY]!;
    this.words = this.i32[H_WORDS]!;
    this.mask = this.capacity - 1;
    this.slotWords = this.words + SLOT_META;
    this.spinMicros = spinMicros;
  }

  /** Allocates a new queue. Throws E_CONFIG on a bad capacity/words/spinMicros. */
  static create(opts: RingQueueOptions): RingQueue {
    if (opts === null || typeof opts !== 'object') fail('E_CONFIG', 'ring queue options', 'an object', opts);
    const { capacity, words } = opts;
    if (!isPowerOfTwo(capacity) || capacity < 2 || capacity > MAX_RING_CAPACITY)
      fail('E_CONFIG', 'ring queue capacity', `a power of two in [2, ${MAX_RING_CAPACITY}]`, capacity);
    if (!Number.isInteger(words) || words < 1 || words > MAX_DESCRIPTOR_WORDS)
      fail('E_CONFIG', 'ring queue words', `an integer in [1, ${MAX_DESCRIPTOR_WORDS}]`, words);
    const spin = checkSpin(opts.spinMicros);
    const slotWords = words + SLOT_META;
    const buffer = new SharedArrayBuffer((HEADER_WORDS + capacity * slotWords) * 4);
    const i32 = new Int32Array(buffer);
    i32[H_MAGIC] = MAGIC;
    i32[H_CAPACITY] = capacity;
    i32[H_WORDS] = words;
    // Positions start at 0; tests start them near the 32-bit wrap to exercise it.
    const start = (opts as { startPosition?: number }).startPosition ?? 0;
    if (!Number.isInteger(start)) fail('E_CONFIG', 'ring queue startPosition', 'an integer', start);
    i32[H_HEAD] = start | 0;
    i32[H_TAIL] = start | 0;
    for (let p = 0; p < capacity; p++) i32[HEADER_WORDS + ((start + p) & (capacity - 1)) * slotWords + SLOT_SEQ] = (start + p) | 0;
    return new RingQueue(buffer, spin);
  }

  /** Attaches to a queue created elsewhere (e.g. in another thread). */
  static attach(buffer: SharedArrayBuffer, opts: WaitOptions = {}): RingQueue {
    if (!(buffer instanceof SharedArrayBuffer)) fail('E_TYPE', 'ring queue buffer', 'a SharedArrayBuffer', buffer);
    if (buffer.byteLength < HEADER_WORDS * 4 || new Int32Array(buffer, 0, 1)[0] !== MAGIC)
      fail('E_CONFIG', 'ring queue buffer', 'a buffer made by RingQueue.create', `${buffer.byteLength} bytes without the ring header`);
    return new RingQueue(buffer, checkSpin(opts.spinMicros));
  }

  /** Descriptors currently queued (a snapshot; includes slots being written or read). */
  get size(): number {
    return Math.max(0, Math.min(this.capacity, (Atomics.load(this.i32, H_TAIL) - Atomics.load(this.i32, H_HEAD)) | 0));
  }

  /** True once close() or abort() was called. */
  get closed(): boolean {
    return Atomics.load(this.i32, H_STATE) !== STATE_OPEN;
  }

  /** True once abort() was called. */
  get aborted(): boolean {
    return Atomics.load(this.i32, H_STATE) === STATE_ABORTED;
  }

  // ---------------------------------------------------------------- producer side

  /**
   * Pushes without waiting. Returns false when the queue is full. Throws E_CLOSED after close/abort,
   * E_SHAPE when `desc` does not hold exactly `words` values.
   */
  tryPush(desc: ArrayLike<number>): boolean {
    this.checkDesc(desc);
    return this.pushOnce(desc);
  }

  /**
   * Pushes, waiting for space while the queue is full (back-pressure: never drops). Blocks the
   * thread: use it in workers only (the main thread must use {@link pushAsync}).
   */
  push(desc: ArrayLike<number>, record?: HandoffRecord): void {
    this.checkDesc(desc);
    if (record !== undefined) this.checkRecord(desc, record);
    if (this.pushOnce(desc, record)) return;
    const i32 = this.i32;
    for (;;) {
      if (this.spinUntil(this.spaceReady) && this.pushOnce(desc, record)) return;
      Atomics.add(i32, H_PRODUCERS_WAITING, 1);
      const epoch = Atomics.load(i32, H_SPACE_EPOCH);
      let pushed = false;
      try {
        pushed = this.pushOnce(desc, record);
        if (!pushed) Atomics.wait(i32, H_SPACE_EPOCH, epoch);
      } finally {
        Atomics.sub(i32, H_PRODUCERS_WAITING, 1);
      }
      if (pushed) return;
    }
  }

  /** Like {@link push} but never blocks the thread: sleeps in `Atomics.waitAsync`. */
  async pushAsync(desc: ArrayLike<number>): Promise<void> {
    this.checkDesc(desc);
    if (this.pushOnce(desc)) return;
    const i32 = this.i32;
    for (;;) {
      if (this.spinUntil(this.spaceReady) && this.pushOnce(desc)) return;
      Atomics.add(i32, H_PRODUCERS_WAITING, 1);
      let pushed = false;
      try {
        const epoch = Atomics.load(i32, H_SPACE_EPOCH);
        pushed = this.pushOnce(desc);
        if (!pushed) {
          const w = Atomics.waitAsync(i32, H_SPACE_EPOCH, epoch);
          if (w.async) await w.value;
        }
      } finally {
        Atomics.sub(i32, H_PRODUCERS_WAITING, 1);
      }
      if (pushed) return;
    }
  }

  // ---------------------------------------------------------------- consumer side

  /**
   * Pops without waiting into `out` (length >= words). Returns 'item', 'closed' (closed and fully
   * drained) or 'idle' (nothing now). Throws E_CLOSED after abort.
   */
  tryPop(out: Int32Array): PopStatus {
    this.checkOut(out);
    return this.popOnce(out);
  }

  /**
   * Pops one descriptor, waiting as long as needed. Returns true with `out` filled, or false once the
   * queue is closed and drained. Blocks the thread: workers only (main thread: {@link popAsync}).
   */
  pop(out: Int32Array): boolean {
    for (;;) {
      const s = this.popWait(out, Infinity);
      if (s === 'item') return true;
      if (s === 'closed') return false;
    }
  }

  /**
   * One bounded wait round: spin, then sleep at most `timeoutMs` (or until woken by a push, close,
   * abort or {@link wakeConsumers}). Returns 'idle' when woken or timed out without an item, which
   * lets a worker loop look at its control plane between rounds. Workers only.
   */
  popWait(out: Int32Array, timeoutMs: number, opts?: PopWaitOptions): PopStatus {
    this.checkOut(out);
    const record = opts?.record;
    if (record !== undefined) this.checkRecord(out, record);
    const i32 = this.i32;
    let s = this.popOnce(out, record);
    if (s !== 'idle') return s;
    if (this.spinUntil(this.itemReady)) {
      s = this.popOnce(out, record);
      if (s !== 'idle') return s;
    }
    Atomics.add(i32, H_CONSUMERS_WAITING, 1);
    try {
      const epoch = Atomics.load(i32, H_DATA_EPOCH);
      s = this.popOnce(out, record);
      if (s !== 'idle') return s;
      if (opts?.wakeIf?.()) return 'idle';
      Atomics.wait(i32, H_DATA_EPOCH, epoch, timeoutMs);
    } finally {
      Atomics.sub(i32, H_CONSUMERS_WAITING, 1);
    }
    return this.popOnce(out, record);
  }

  /** Like {@link pop} without blocking the thread (spin, then `Atomics.waitAsync`). */
  async popAsync(out: Int32Array): Promise<boolean> {
    this.checkOut(out);
    const i32 = this.i32;
    for (;;) {
      let s = this.popOnce(out);
      if (s === 'idle' && this.spinUntil(this.itemReady)) s = this.popOnce(out);
      if (s !== 'idle') return s === 'item';
      Atomics.add(i32, H_CONSUMERS_WAITING, 1);
      try {
        const epoch = Atomics.load(i32, H_DATA_EPOCH);
        s = this.popOnce(out);
        if (s === 'idle') {
          const w = Atomics.waitAsync(i32, H_DATA_EPOCH, epoch);
          if (w.async) await w.value;
        }
      } finally {
        Atomics.sub(i32, H_CONSUMERS_WAITING, 1);
      }
      if (s !== 'idle') return s === 'item';
    }
  }

  // ---------------------------------------------------------------- lifecycle

  /**
   * Graceful end: later pushes throw E_CLOSED; consumers drain what is queued and then see the end
   * (pop → false). Wakes every sleeper. Idempotent; does not undo an abort.
   */
  close(): void {
    Atomics.compareExchange(this.i32, H_STATE, STATE_OPEN, STATE_CLOSED);
    this.wakeAll();
  }

  /**
   * Error end: every current and later operation on any endpoint throws E_CLOSED (queued
   * descriptors are abandoned — the owner aborts because the batches they belong to are rejected).
   * Wakes every sleeper.
   */
  abort(): void {
    Atomics.store(this.i32, H_STATE, STATE_ABORTED);
    this.wakeAll();
  }

  /** Wakes sleeping consumers without pushing (they return 'idle' from popWait). */
  wakeConsumers(): void {
    Atomics.add(this.i32, H_DATA_EPOCH, 1);
    Atomics.notify(this.i32, H_DATA_EPOCH);
  }

  private wakeAll(): void {
    this.wakeConsumers();
    Atomics.add(this.i32, H_SPACE_EPOCH, 1);
    Atomics.notify(this.i32, H_SPACE_EPOCH);
  }

  // ---------------------------------------------------------------- dead endpoints

  /**
   * Consumer side of a dead record holder (call it on the ring the record pops from, after the
   * thread died and before a replacement reuses the record). A pop interrupted after it took its
   * slot is finished into `record.desc` (HELD; IDLE for a tombstone) and the slot released, as is a
   * slot a HELD record had not released yet; a pop that had not taken its slot is undone (IDLE).
   * Releases the pop lock if the dead thread held it. Works on aborted rings too.
   */
  salvageConsumer(record: HandoffRecord): void {
    const i32 = this.i32;
    const id = record.id;
    const state = record.state;
    const pos = record.position;
    const base = HEADER_WORDS + (pos & this.mask) * this.slotWords;
    // A POPPING record is only ever seen with its holder inside the pop lock (it moves to HELD or
    // IDLE before unlocking), so nobody else moved head since its claim.
    const taken = state === HANDOFF_HELD || (state === HANDOFF_POPPING && Atomics.load(i32, H_HEAD) !== pos);
    if (taken && Atomics.load(i32, base + SLOT_SEQ) === ((pos + 1) | 0)) {
      if (state === HANDOFF_POPPING) {
        const data = i32[base + SLOT_KIND] === KIND_DATA;
        if (data) for (let w = 0; w < this.words; w++) record.desc[w] = i32[base + SLOT_META + w]!;
        record.set(data ? HANDOFF_HELD : HANDOFF_IDLE);
      }
      Atomics.store(i32, base + SLOT_SEQ, (pos + this.capacity) | 0);
      Atomics.add(i32, H_SPACE_EPOCH, 1);
      Atomics.notify(i32, H_SPACE_EPOCH);
    } else if (state === HANDOFF_POPPING) record.set(HANDOFF_IDLE);
    Atomics.compareExchange(i32, H_POP_LOCK, id, 0);
  }

  /**
   * Producer side of a dead record holder (call it on the ring the record pushes to). A push that
   * had not reserved its slot leaves the descriptor HELD; one that reserved but did not publish
   * publishes a tombstone instead (consumers skip it rather than wait on the slot forever) and the
   * descriptor stays HELD; one that published was handed on (IDLE). Releases the push lock if the
   * dead thread held it. Afterwards `record.state === HANDOFF_HELD` iff the record holds a
   * descriptor that was never handed on.
   */
  salvageProducer(record: HandoffRecord): void {
    const i32 = this.i32;
    const id = record.id;
    if (record.state === HANDOFF_PUSHING) {
      const pos = record.position;
      const base = HEADER_WORDS + (pos & this.mask) * this.slotWords;
      // PUSHING is only seen inside the push lock (published → IDLE before unlocking): the dead
      // thread still holds it, so nobody else moved tail since its claim.
      if (Atomics.load(i32, H_TAIL) === pos) record.set(HANDOFF_HELD); // slot never reserved
      else if (Atomics.load(i32, base + SLOT_SEQ) === pos) {
        i32[base + SLOT_KIND] = KIND_TOMBSTONE;
        Atomics.store(i32, base + SLOT_SEQ, (pos + 1) | 0);
        this.wakeConsumers();
        record.set(HANDOFF_HELD);
      } else record.set(HANDOFF_IDLE); // published: the next stage has it
    }
    Atomics.compareExchange(i32, H_PUSH_LOCK, id, 0);
  }

  /** Takes a side's lock for record `id` (held for one claim: a few hundred ns). */
  private lock(word: number, id: number): void {
    const i32 = this.i32;
    for (let spins = 0; ; spins++) {
      const holder = Atomics.compareExchange(i32, word, 0, id);
      if (holder === 0) return;
      // The holder was descheduled, or died (salvage releases its lock): stop burning the core.
      if (spins >= 256) {
        this.throwIfAborted();
        Atomics.wait(i32, word, holder, 0.1);
      }
    }
  }

  private checkRecord(desc: ArrayLike<number>, record: HandoffRecord): void {
    if (!(record instanceof HandoffRecord)) fail('E_TYPE', 'ring queue record', 'a HandoffRecord', record);
    if (desc !== record.desc) fail('E_CONFIG', 'ring queue descriptor', 'record.desc when popping or pushing through a record', 'another array');
    if (record.id <= 0) fail('E_RANGE', 'ring queue record id', 'a positive integer (HandoffRecord.reset)', record.id);
  }

  // ---------------------------------------------------------------- internals

  private checkDesc(desc: ArrayLike<number>): void {
    if (desc === null || typeof desc !== 'object' || typeof desc.length !== 'number')
      fail('E_TYPE', 'ring queue descriptor', `an array of ${this.words} int32 values`, desc);
    if (desc.length !== this.words) fail('E_SHAPE', 'ring queue descriptor length', `${this.words} words`, desc.length);
  }

  private checkOut(out: Int32Array): void {
    if (!(out instanceof Int32Array)) fail('E_TYPE', 'ring queue pop target', 'an Int32Array', out);
    if (out.length < this.words) fail('E_SHAPE', 'ring queue pop target length', `at least ${this.words} words`, out.length);
  }

  private throwIfAborted(): void {
    if (Atomics.load(this.i32, H_STATE) === STATE_ABORTED)
      throw new KvdriveError('E_CLOSED', 'ring queue: expected an open queue, got one that was aborted');
  }

  private hasSpace(): boolean {
    if (Atomics.load(this.i32, H_STATE) !== STATE_OPEN) return true; // let pushOnce throw
    const pos = Atomics.load(this.i32, H_TAIL);
    const seq = Atomics.load(this.i32, HEADER_WORDS + (pos & this.mask) * this.slotWords + SLOT_SEQ);
    return seq === pos;
  }

  private hasItemOrEnd(): boolean {
    if (Atomics.load(this.i32, H_STATE) !== STATE_OPEN) return true;
    const pos = Atomics.load(this.i32, H_HEAD);
    const seq = Atomics.load(this.i32, HEADER_WORDS + (pos & this.mask) * this.slotWords + SLOT_SEQ);
    return seq === ((pos + 1) | 0);
  }

  /** Busy-polls `ready` for at most spinMicros; true when it became ready. */
  private spinUntil(ready: () => boolean): boolean {
    if (this.spinMicros <= 0) return false;
    const deadline = nowMicros() + this.spinMicros;
    for (;;) {
      // Check the clock every 32 polls: a poll is ~ns, performance.now() ~tens of ns.
      for (let i = 0; i < 32; i++) if (ready()) return true;
      if (nowMicros() >= deadline) return false;
    }
  }

  /** One non-blocking push attempt: true when pushed, false when full. */
  private pushOnce(desc: ArrayLike<number>, record?: HandoffRecord): boolean {
    const i32 = this.i32;
    if (Atomics.load(i32, H_STATE) !== STATE_OPEN) this.throwClosedPush();
    if (record !== undefined) this.lock(H_PUSH_LOCK, record.id);
    try {
      for (;;) {
        const pos = Atomics.load(i32, H_TAIL);
        const base = HEADER_WORDS + (pos & this.mask) * this.slotWords;
        const dif = (Atomics.load(i32, base + SLOT_SEQ) - pos) | 0;
        if (dif < 0) {
          record?.set(HANDOFF_HELD); // (a lost CAS below left a stale claim)
          return false; // slot still holds an unconsumed item from the previous lap: full
        }
        if (dif > 0) continue; // another producer took pos; reload tail
        record?.claim(HANDOFF_PUSHING, pos);
        if (Atomics.compareExchange(i32, H_TAIL, pos, (pos + 1) | 0) !== pos) continue;
        // Slot `pos` is ours. If close() happened meanwhile, a consumer may already have decided the
        // queue is drained: publish a tombstone instead and report E_CLOSED (see class comment).
        const open = Atomics.load(i32, H_STATE) === STATE_OPEN;
        if (open) {
          for (let w = 0; w < this.words; w++) i32[base + SLOT_META + w] = desc[w]! | 0;
        }
        i32[base + SLOT_KIND] = open ? KIND_DATA : KIND_TOMBSTONE;
        Atomics.store(i32, base + SLOT_SEQ, (pos + 1) | 0);
        record?.set(open ? HANDOFF_IDLE : HANDOFF_HELD); // a tombstone handed nothing on
        if (Atomics.load(i32, H_CONSUMERS_WAITING) > 0) this.wakeConsumers();
        if (!open) this.throwClosedPush();
        return true;
      }
    } finally {
      if (record !== undefined) Atomics.store(i32, H_PUSH_LOCK, 0);
    }
  }

  private throwClosedPush(): never {
    this.throwIfAborted();
    throw new KvdriveError('E_CLOSED', 'ring queue push: expected an open queue, got one that was closed');
  }

  /** One non-blocking pop attempt. */
  private popOnce(out: Int32Array, record?: HandoffRecord): PopStatus {
    if (record === undefined) return this.popClaim(out, undefined);
    this.lock(H_POP_LOCK, record.id);
    try {
      return this.popClaim(out, record);
    } finally {
      Atomics.store(this.i32, H_POP_LOCK, 0);
    }
  }

  private popClaim(out: Int32Array, record: HandoffRecord | undefined): PopStatus {
    const i32 = this.i32;
    for (;;) {
      this.throwIfAborted();
      const state = Atomics.load(i32, H_STATE);
      const pos = Atomics.load(i32, H_HEAD);
      const base = HEADER_WORDS + (pos & this.mask) * this.slotWords;
      const dif = (Atomics.load(i32, base + SLOT_SEQ) - ((pos + 1) | 0)) | 0;
      if (dif < 0) {
        record?.set(HANDOFF_IDLE); // (a lost CAS below left a stale claim)
        // Not published yet. The end is reached only when closed and no slot is reserved.
        if (state !== STATE_OPEN && Atomics.load(i32, H_TAIL) === pos) return 'closed';
        return 'idle';
      }
      if (dif > 0) continue; // another consumer took pos
      record?.claim(HANDOFF_POPPING, pos);
      if (Atomics.compareExchange(i32, H_HEAD, pos, (pos + 1) | 0) !== pos) continue;
      const kind = i32[base + SLOT_KIND];
      if (kind === KIND_DATA) for (let w = 0; w < this.words; w++) out[w] = i32[base + SLOT_META + w]!;
      record?.set(kind === KIND_DATA ? HANDOFF_HELD : HANDOFF_IDLE); // before the slot is released
      Atomics.store(i32, base + SLOT_SEQ, (pos + this.capacity) | 0);
      if (Atomics.load(i32, H_PRODUCERS_WAITING) > 0) {
        Atomics.add(i32, H_SPACE_EPOCH, 1);
        Atomics.notify(i32, H_SPACE_EPOCH, 1);
      }
      if (kind === KIND_DATA) return 'item';
      // tombstone: skip it and look again
    }
  }
}
