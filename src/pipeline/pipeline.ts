/**
 * A chain of stage pools joined by ring queues:
 *
 *   main ─ring 0─▶ [stage 0 pool] ─ring 1─▶ [stage 1 pool] ─ … ─ring N─▶ main
 *
 * `submit(desc)` stamps a ticket into descriptor word 0, pushes it into ring 0 (waiting while it is
 * full) and returns a promise that resolves with the descriptor as the last stage left it. The main
 * thread collects completions from ring N with spin-then-`Atomics.waitAsync`, only while batches
 * are outstanding. A batch that fails in any stage is rejected with E_WORKER and does not reach
 * later stages; the other batches carry on.
 */
import { availableParallelism } from 'node:os';
import { KvdriveError, fail } from '../errors.js';
import { RingQueue } from './ring-queue.js';
import { StagePool, type StageSpec, type StageStats } from './stage-pool.js';
import type { StageFault } from './stage-contract.js';

/** Options of {@link Pipeline.start}. */
export interface PipelineOptions {
  /** Stages in order, at least one. */
  stages: StageSpec[];
  /** Int32 words of a user descriptor (the pipeline adds one word for its ticket), 1..1023. */
  words: number;
  /** Slots per ring (power of two, default 16): how many micro-batches may wait between stages. */
  capacity?: number;
  /**
   * Spin budget (µs) of every ring endpoint before sleeping; 0 = pure wait. Default 'auto': 50 µs
   * when every pipeline thread (all stage workers + the main thread) can have a core of its own
   * (os.availableParallelism()), else 0 — on an oversubscribed machine a spinning thread takes the
   * core the thread it waits for needs, and hand-offs get 5–10x slower than sleeping
   * (bench/pipeline.md).
   */
  spinMicros?: number | 'auto';
}

export interface PipelineStats {
  stages: StageStats[];
  /** Batches completed / rejected since start. */
  completed: number;
  failed: number;
}

/** Spin budget that 'auto' picks for `threads` busy threads on this machine. */
export function resolveSpinMicros(spin: number | 'auto', threads: number): number {
  if (spin === 'auto') return threads <= availableParallelism() ? 50 : 0;
  if (typeof spin !== 'number' || !(spin >= 0 && spin <= 100_000)) fail('E_CONFIG', 'pipeline spinMicros', "'auto' or a number of µs in [0, 100000]", spin);
  return spin;
}

interface Pending {
  resolve: (d: Int32Array) => void;
  reject: (e: unknown) => void;
}

export class Pipeline {
  private readonly rings: RingQueue[];
  private readonly pools: StagePool[] = [];
  private readonly pending = new Map<number, Pending>();
  private readonly words: number;
  private nextTicket = 1;
  private collecting = false;
  private closed = false;
  private fatal: KvdriveError | undefined;
  private completed = 0;
  private failed = 0;
  private readonly scratch: Int32Array;

  private constructor(rings: RingQueue[], words: number) {
    this.rings = rings;
    this.words = words;
    this.scratch = new Int32Array(words + 1);
  }

  /** Creates the rings and starts every stage's workers. */
  static async start(opts: PipelineOptions): Promise<Pipeline> {
    if (opts === null || typeof opts !== 'object') fail('E_CONFIG', 'pipeline options', 'an object', opts);
    if (!Array.isArray(opts.stages) || opts.stages.length === 0) fail('E_CONFIG', 'pipeline stages', 'a non-empty array of stage specs', opts.stages);
    if (!Number.isInteger(opts.words) || opts.words < 1 || opts.words > 1023) fail('E_CONFIG', 'pipeline words', 'an integer in [1, 1023]', opts.words);
    const capacity = opts.capacity ?? 16;
    const threads = opts.stages.reduce((n, s) => n + (s?.threads ?? 1), 1);
    const spinMicros = resolveSpinMicros(opts.spinMicros ?? 'auto', threads);
    const rings: RingQueue[] = [];
    for (let i = 0; i <= opts.stages.length; i++) rings.push(RingQueue.create({ capacity, words: opts.words + 1, spinMicros }));
    const p = new Pipeline(rings, opts.words);
    try {
      for (let i = 0; i < opts.stages.length; i++) {
        const spec = opts.stages[i]!;
        p.pools.push(
          await StagePool.start({
            ...spec,
            input: rings[i]!,
            output: rings[i + 1]!,
            spinMicros,
            onBatchError: (ticket, err) => p.rejectBatch(ticket, err),
            onFatal: (err) => p.fail(err),
          }),
        );
      }
    } catch (e) {
      await p.close();
      throw e;
    }
    return p;
  }

  /** Batches submitted and not yet resolved or rejected. */
  get inFlight(): number {
    return this.pending.size;
  }

  /**
   * Runs one descriptor (exactly `words` int32 values) through every stage. Resolves with the final
   * descriptor (a fresh Int32Array); rejects with E_WORKER when a stage fails on it, E_CLOSED after
   * close(). Waits (asynchronously) while the first ring is full.
   */
  async submit(desc: ArrayLike<number>): Promise<Int32Array> {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'pipeline submit: expected an open pipeline, got one that was closed');
    if (this.fatal) throw this.fatal;
    if (desc === null || typeof desc !== 'object' || desc.length !== this.words)
      fail('E_SHAPE', 'pipeline descriptor', `${this.words} int32 words`, desc);
    const ticket = this.nextTicket;
    this.nextTicket = (this.nextTicket + 1) | 0 || 1;
    const full = new Int32Array(this.words + 1);
    full[0] = ticket;
    for (let i = 0; i < this.words; i++) full[i + 1] = desc[i]! | 0;
    const done = new Promise<Int32Array>((resolve, reject) => this.pending.set(ticket, { resolve, reject }));
    // The batch may be rejected (close, stage failure) while we still wait for ring space below,
    // before the caller can attach a handler; the caller still gets the rejection via `return done`.
    done.catch(() => {});
    if (!this.collecting) void this.collect();
    try {
      await this.rings[0]!.pushAsync(full);
    } catch (e) {
      this.rejectBatch(ticket, e);
    }
    return done;
  }

  /** The error that stopped the pipeline for good (a worker that could not be replaced), or undefined while it runs. */
  failure(): KvdriveError | undefined {
    return this.fatal;
  }

  /** Workers of stage `stage` (index) replaced after dying since start; read locally, works after a fatal error too. */
  restarts(stage: number): number {
    const pool = this.pools[stage];
    if (!pool) fail('E_RANGE', 'pipeline restarts stage', `an index in [0, ${this.pools.length})`, stage);
    return pool.restartCount;
  }

  /** Per-stage counters over the control plane. */
  async stats(): Promise<PipelineStats> {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'pipeline stats: expected an open pipeline, got one that was closed');
    return { stages: await Promise.all(this.pools.map((p) => p.stats())), completed: this.completed, failed: this.failed };
  }

  /** Sends a control request to every worker of stage `stage` (index); see StagePool.control. */
  async control(stage: number, request: unknown): Promise<unknown[]> {
    if (this.closed) throw new KvdriveError('E_CLOSED', 'pipeline control: expected an open pipeline, got one that was closed');
    const pool = this.pools[stage];
    if (!pool) fail('E_RANGE', 'pipeline control stage', `an index in [0, ${this.pools.length})`, stage);
    return pool.control(request);
  }

  /** @internal Kills worker `worker` of stage `stage` like a crash (see StagePool.killWorker). */
  killWorker(stage: number, worker = 0): Promise<void> {
    const pool = this.pools[stage];
    if (!pool) fail('E_RANGE', 'pipeline killWorker stage', `an index in [0, ${this.pools.length})`, stage);
    return pool.killWorker(worker);
  }

  /** @internal Arms a fault in worker `worker` of stage `stage` (see StagePool.arm). */
  arm(stage: number, worker: number, fault: StageFault): Promise<void> {
    const pool = this.pools[stage];
    if (!pool) fail('E_RANGE', 'pipeline arm stage', `an index in [0, ${this.pools.length})`, stage);
    return pool.arm(worker, fault);
  }

  /** Changes the spin budget of every worker endpoint (µs). */
  configure(opts: { spinMicros: number }): void {
    for (const p of this.pools) p.configure(opts);
    for (const r of this.rings) r.spinMicros = opts.spinMicros;
  }

  /**
   * Stops everything: outstanding batches are rejected with E_CLOSED, rings are aborted (waking
   * every waiter), and the promise resolves once every worker thread has exited. Idempotent.
   */
  async close(): Promise<void> {
    this.closed = true;
    for (const r of this.rings) r.abort();
    for (const t of [...this.pending.keys()])
      this.rejectBatch(t, new KvdriveError('E_CLOSED', `pipeline batch ${t}: expected it to complete, got the pipeline closed first`));
    await Promise.all(this.pools.map((p) => p.close()));
  }

  private rejectBatch(ticket: number, err: unknown): void {
    const p = this.pending.get(ticket);
    if (!p) return;
    this.pending.delete(ticket);
    this.failed++;
    p.reject(err);
  }

  private fail(err: KvdriveError): void {
    this.fatal = err;
    for (const r of this.rings) r.abort();
    for (const t of [...this.pending.keys()]) this.rejectBatch(t, err);
    // Stop the remaining workers now; close() later just awaits them.
    for (const p of this.pools) void p.close();
  }

  /** Completion loop on the main thread; runs while batches are outstanding. */
  private async collect(): Promise<void> {
    this.collecting = true;
    const last = this.rings[this.rings.length - 1]!;
    const out = this.scratch;
    try {
      while (this.pending.size > 0) {
        if (!(await last.popAsync(out))) break;
        const p = this.pending.get(out[0]!);
        if (!p) continue; // already rejected (e.g. by close)
        this.pending.delete(out[0]!);
        this.completed++;
        p.resolve(out.slice(1));
      }
    } catch {
      // aborted ring: close() or fail() rejected every outstanding batch
    } finally {
      this.collecting = false;
    }
  }
}
