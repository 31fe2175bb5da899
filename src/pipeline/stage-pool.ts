/**
 * A pipeline stage: a small pool of long-lived worker threads that loop "pop descriptor from the
 * input ring → run the stage function on shared memory → push to the output ring".
 *
 * Why plain worker_threads and not piscina: piscina's unit of work is a task submitted with
 * `run()`, i.e. one postMessage and one promise per task — exactly the per-micro-batch messaging the
 * SFC pipeline must avoid (a postMessage round trip, ~100 µs here, is a tenth of a layer step). A
 * worker that never returns from one "forever" task would defeat piscina's scheduling, idle timeouts
 * and task-level fault handling (it rejects the task, not the micro-batch the worker held). What
 * we need from a pool is small: spawn N workers, replace a dead one, collect stats, shut down; it is
 * below, and the per-batch data path stays on the ring queues.
 *
 * Faults: a stage function that throws rejects that batch (E_WORKER via `onBatchError`) and the
 * worker carries on. A worker that dies (process.exit, uncaught error, crash) is detected by its
 * 'exit' event; the ticket it held (control block CW_BUSY/CW_TICKET) is rejected with E_WORKER and a
 * replacement worker takes its index, so the next batch succeeds. A replacement that fails to
 * initialize is fatal (`onFatal`): no restart loop.
 */
import { Worker } from 'node:worker_threads';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { ErrorCodes, KvdriveError, fail, type ErrorCode } from '../errors.js';
import { RingQueue } from './ring-queue.js';
import {
  CTRL_STOP,
  CW_BUSY,
  CW_POSTED,
  CW_TICKET,
  MAX_STAGE_THREADS,
  controlWords,
  workerRecord,
  type PoolMessage,
  type StageFault,
  type StageWorkerData,
  type StageWorkerStats,
  type WorkerMessage,
} from './stage-contract.js';

/** How one stage is built. */
export interface StageSpec {
  /** Name used in errors and stats, e.g. 'selection'. */
  name: string;
  /**
   * Absolute path or file: URL of a compiled ESM module exporting `createStage(init, ctx)` (see
   * stage-contract.ts). Workers cannot load TypeScript: point at dist/.
   */
  module: string;
  /** Structured-cloneable argument of createStage; SharedArrayBuffers inside are shared. */
  init?: unknown;
  /** Worker threads of this stage, 1..16 (default 1: the targets have 2 cores). */
  threads?: number;
  /**
   * For stages with per-worker state (e.g. the selection indexes): called when a worker died and a
   * replacement is starting; returns control requests that the replacement handles, in order,
   * before it takes any descriptor (so it rebuilds its state first). A failing replay is fatal.
   */
  replay?: () => unknown[];
  /** @internal Fault injection for tests (first-generation workers only); see StageFault. */
  faults?: StageFault[];
}

/** Options of {@link StagePool.start}. */
export interface StagePoolOptions extends StageSpec {
  /** Ring the workers pop from; descriptor word 0 is the batch ticket. */
  input: RingQueue;
  /** Ring the workers push processed descriptors to (same word count as input). */
  output: RingQueue;
  /** Spin budget of the workers' ring endpoints in µs (see WaitOptions); default 50. */
  spinMicros?: number;
  /** A batch failed in this stage (its function threw, or its worker died): reject it. */
  onBatchError: (ticket: number, error: KvdriveError) => void;
  /** The pool cannot continue (a replacement worker failed to start). */
  onFatal?: (error: KvdriveError) => void;
  /** Milliseconds close() waits for workers to leave their loop before terminating them (default 2000). */
  closeTimeoutMs?: number;
  /** @internal Sleep slice of an idle worker in ms (default 1000); control messages and stop wake it earlier. */
  idleSliceMs?: number;
}

/** Aggregated stats of a stage (sums over its workers; times in ms). */
export interface StageStats extends Omit<StageWorkerStats, 'worker'> {
  stage: string;
  threads: number;
  /** Workers that died and were replaced since start. */
  restarts: number;
  workers: StageWorkerStats[];
}

/** Compiled worker entry: beside this file when running from dist/, else under <root>/dist/. */
function stageWorkerPath(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  const sibling = join(here, 'stage-worker.js');
  if (existsSync(sibling)) return sibling;
  let dir = here;
  for (let i = 0; i < 4; i++) {
    dir = dirname(dir);
    const p = join(dir, 'dist', 'src', 'pipeline', 'stage-worker.js');
    if (existsSync(p)) return p;
  }
  throw new KvdriveError('E_NOT_FOUND', `stage worker: expected compiled dist/src/pipeline/stage-worker.js, got none near ${here}; run \`npm run build:ts\``);
}

interface Slot {
  worker: Worker;
  /** Resolves when the worker reports ready (or rejects on initError / early exit). */
  ready: Promise<void>;
  /** Outstanding stats requests id → resolver. */
  statsWaiters: Map<number, (s: StageWorkerStats | undefined) => void>;
  /** Outstanding control requests id → settle. */
  controlWaiters: Map<number, { resolve: (v: unknown) => void; reject: (e: KvdriveError) => void }>;
  exited: Promise<void>;
  lastError?: Error;
  /** The worker announced a deliberate end of its loop. */
  leaving?: string;
}

export class StagePool {
  readonly name: string;
  readonly threads: number;
  private readonly opts: StagePoolOptions;
  private readonly ctrl: Int32Array;
  private readonly moduleUrl: string;
  private readonly workerPath: string;
  private readonly slots: Slot[] = [];
  private spinMicros: number;
  private closing = false;
  private restarts = 0;
  private nextStatsId = 1;
  /** Every worker ever started, for close() to await. */
  private readonly allExits: Promise<void>[] = [];

  private constructor(opts: StagePoolOptions, threads: number, spinMicros: number) {
    this.opts = opts;
    this.name = opts.name;
    this.threads = threads;
    this.spinMicros = spinMicros;
    this.ctrl = new Int32Array(new SharedArrayBuffer(controlWords(threads) * 4));
    this.moduleUrl = opts.module.startsWith('file:') ? opts.module : pathToFileURL(opts.module).href;
    this.workerPath = stageWorkerPath();
  }

  /** Starts the workers and resolves once every one has initialized its stage function. */
  static async start(opts: StagePoolOptions): Promise<StagePool> {
    if (opts === null || typeof opts !== 'object') fail('E_CONFIG', 'stage pool options', 'an object', opts);
    if (typeof opts.name !== 'string' || opts.name.length === 0) fail('E_CONFIG', 'stage name', 'a non-empty string', opts.name);
    if (typeof opts.module !== 'string' || !(opts.module.startsWith('file:') || opts.module.startsWith('/')))
      fail('E_CONFIG', `stage '${opts.name}' module`, 'an absolute path or file: URL of a compiled .js module', opts.module);
    const threads = opts.threads ?? 1;
    if (!Number.isInteger(threads) || threads < 1 || threads > MAX_STAGE_THREADS)
      fail('E_CONFIG', `stage '${opts.name}' threads`, `an integer in [1, ${MAX_STAGE_THREADS}]`, threads);
    if (!(opts.input instanceof RingQueue) || !(opts.output instanceof RingQueue))
      fail('E_CONFIG', `stage '${opts.name}' input/output`, 'RingQueue instances', opts.input);
    if (opts.input.words !== opts.output.words)
      fail('E_CONFIG', `stage '${opts.name}' output ring words`, `${opts.input.words} (as the input ring)`, opts.output.words);
    if (typeof opts.onBatchError !== 'function') fail('E_CONFIG', `stage '${opts.name}' onBatchError`, 'a function', opts.onBatchError);
    const spin = opts.spinMicros ?? 50;
    if (typeof spin !== 'number' || !(spin >= 0 && spin <= 100_000)) fail('E_CONFIG', `stage '${opts.name}' spinMicros`, 'a number in [0, 100000]', spin);
    const pool = new StagePool(opts, threads, spin);
    for (let i = 0; i < threads; i++) pool.slots.push(pool.spawn(i));
    try {
      await Promise.all(pool.slots.map((s) => s.ready));
    } catch (e) {
      await pool.close();
      throw e;
    }
    return pool;
  }

  /** Workers started since start (including replacements). */
  get spawned(): number {
    return this.allExits.length;
  }

  /** Workers replaced after dying. */
  get restartCount(): number {
    return this.restarts;
  }

  private spawn(index: number): Slot {
    const rec = workerRecord(index);
    Atomics.store(this.ctrl, rec + CW_POSTED, 0);
    Atomics.store(this.ctrl, rec + CW_BUSY, 0);
    const data: StageWorkerData = {
      stage: this.name,
      index,
      moduleUrl: this.moduleUrl,
      init: this.opts.init,
      input: this.opts.input.buffer,
      output: this.opts.output.buffer,
      control: this.ctrl.buffer as SharedArrayBuffer,
      spinMicros: this.spinMicros,
      idleSliceMs: this.opts.idleSliceMs ?? 1000,
      faults: this.allExits.length < this.threads ? (this.opts.faults ?? []) : [],
    };
    const worker = new Worker(this.workerPath, { workerData: data });
    let readyResolve!: () => void;
    let readyReject!: (e: KvdriveError) => void;
    const ready = new Promise<void>((res, rej) => {
      readyResolve = res;
      readyReject = rej;
    });
    ready.catch(() => {}); // observed by start() or the respawn path
    let isReady = false;
    const slot: Slot = { worker, ready, statsWaiters: new Map(), controlWaiters: new Map(), exited: undefined as unknown as Promise<void> };
    worker.on('message', (m: WorkerMessage) => {
      switch (m.type) {
        case 'ready':
          isReady = true;
          readyResolve();
          break;
        case 'leaving':
          slot.leaving = m.reason;
          break;
        case 'initError':
          readyReject(new KvdriveError('E_WORKER', `stage '${this.name}' worker ${index}: expected createStage to succeed, got ${m.code}: ${m.message}`));
          break;
        case 'batchError':
          this.opts.onBatchError(
            m.ticket,
            new KvdriveError('E_WORKER', `stage '${this.name}' worker ${index}: expected the stage function to process batch ${m.ticket}, got ${m.code}: ${m.message}`),
          );
          break;
        case 'stats': {
          const w = slot.statsWaiters.get(m.id);
          slot.statsWaiters.delete(m.id);
          w?.(m.stats);
          break;
        }
        case 'controlResult': {
          const w = slot.controlWaiters.get(m.id);
          slot.controlWaiters.delete(m.id);
          if (!w) break;
          if (m.ok) w.resolve(m.value);
          else {
            // keep the handler's own error code (e.g. E_SHAPE from an index build)
            const code = (ErrorCodes as readonly string[]).includes(m.code!) ? (m.code as ErrorCode) : 'E_WORKER';
            w.reject(new KvdriveError(code, code === 'E_WORKER' ? `stage '${this.name}' worker ${index} control: ${m.code}: ${m.message}` : m.message!));
          }
          break;
        }
      }
    });
    worker.on('error', (e) => (slot.lastError = e));
    slot.exited = new Promise<void>((resolve) => {
      worker.on('exit', (code) => {
        for (const w of slot.statsWaiters.values()) w(undefined);
        slot.statsWaiters.clear();
        for (const w of slot.controlWaiters.values())
          w.reject(new KvdriveError('E_WORKER', `stage '${this.name}' worker ${index}: expected a control reply, got the worker exiting (code ${code})`));
        slot.controlWaiters.clear();
        if (!isReady) readyReject(new KvdriveError('E_WORKER', `stage '${this.name}' worker ${index}: expected it to start, got exit code ${code}${slot.lastError ? ` (${slot.lastError.message})` : ''}`));
        // Only a worker that had started is replaced: one dying during start-up would die again
        // (its start failure is reported through `ready`: start() rejects, or onFatal).
        if (isReady && slot.leaving === undefined && !this.closing && this.slots[index] === slot) this.onDeath(index, slot, code);
        resolve();
      });
    });
    this.allExits.push(slot.exited);
    return slot;
  }

  /** An unrequested exit: reject the batch the worker held and put a new worker in its place. */
  private onDeath(index: number, slot: Slot, code: number): void {
    const rec = workerRecord(index);
    const why = slot.lastError ? `uncaught ${slot.lastError.name}: ${slot.lastError.message}` : `exit code ${code}`;
    if (Atomics.load(this.ctrl, rec + CW_BUSY) === 1) {
      const ticket = Atomics.load(this.ctrl, rec + CW_TICKET);
      Atomics.store(this.ctrl, rec + CW_BUSY, 0);
      this.opts.onBatchError(ticket, new KvdriveError('E_WORKER', `stage '${this.name}' worker ${index}: expected it to finish batch ${ticket}, got the worker dying (${why})`));
    }
    this.restarts++;
    const fresh = this.spawn(index);
    this.slots[index] = fresh;
    const fatal = (e: KvdriveError) => {
      if (this.closing) return;
      this.opts.onFatal?.(new KvdriveError('E_WORKER', `stage '${this.name}': expected a replacement worker after a death (${why}), got: ${e.message}`));
    };
    fresh.ready.catch(fatal);
    // Posted now, before the replacement runs its loop: its loop handles every announced control
    // message before it pops a descriptor.
    for (const request of this.opts.replay?.() ?? []) this.controlOne(index, request).catch(fatal);
  }

  /** Sends a control message to worker `index` and wakes it so its loop yields to its event loop. */
  private post(index: number, m: PoolMessage): void {
    this.slots[index]!.worker.postMessage(m);
    Atomics.add(this.ctrl, workerRecord(index) + CW_POSTED, 1);
    this.opts.input.wakeConsumers();
  }

  /** Changes the workers' spin budget (µs) over the control plane. */
  configure(opts: { spinMicros: number }): void {
    const s = opts?.spinMicros;
    if (typeof s !== 'number' || !(s >= 0 && s <= 100_000)) fail('E_CONFIG', `stage '${this.name}' spinMicros`, 'a number in [0, 100000]', s);
    this.spinMicros = s;
    for (let i = 0; i < this.slots.length; i++) this.post(i, { type: 'config', spinMicros: s });
  }

  /**
   * Sends `request` to every worker's control handler (see ControlFn) and resolves with their
   * replies in worker order. A handler error rejects with its own error code (or E_WORKER).
   */
  async control(request: unknown): Promise<unknown[]> {
    if (this.closing) throw new KvdriveError('E_CLOSED', `stage '${this.name}' control: expected an open pool, got one that was closed`);
    return Promise.all(this.slots.map((_, i) => this.controlOne(i, request)));
  }

  private controlOne(index: number, request: unknown): Promise<unknown> {
    const slot = this.slots[index]!;
    return new Promise<unknown>((resolve, reject) => {
      const id = this.nextStatsId++;
      slot.controlWaiters.set(id, { resolve, reject });
      this.post(index, { type: 'control', id, request });
    });
  }

  /**
   * @internal Fault injection for tests: kills worker `index` abruptly (Worker.terminate, no
   * 'leaving' message), exactly like a crash — the pool rejects the batch it held with E_WORKER and
   * starts a replacement. Resolves once the thread is gone.
   */
  async killWorker(index: number): Promise<void> {
    const slot = this.slots[index];
    if (!slot) fail('E_RANGE', `stage '${this.name}' worker`, `an index in [0, ${this.slots.length})`, index);
    await slot.worker.terminate();
  }

  /** Collects the workers' counters over the control plane. */
  async stats(): Promise<StageStats> {
    if (this.closing) throw new KvdriveError('E_CLOSED', `stage '${this.name}' stats: expected an open pool, got one that was closed`);
    const parts = await Promise.all(
      this.slots.map(
        (slot, i) =>
          new Promise<StageWorkerStats | undefined>((resolve) => {
            const id = this.nextStatsId++;
            slot.statsWaiters.set(id, resolve);
            this.post(i, { type: 'stats', id });
          }),
      ),
    );
    const workers = parts.filter((p): p is StageWorkerStats => p !== undefined);
    const sum = (k: 'items' | 'errors' | 'busyMs' | 'waitInputMs' | 'waitOutputMs') => workers.reduce((a, w) => a + w[k], 0);
    return {
      stage: this.name,
      threads: this.threads,
      restarts: this.restarts,
      items: sum('items'),
      errors: sum('errors'),
      busyMs: sum('busyMs'),
      waitInputMs: sum('waitInputMs'),
      waitOutputMs: sum('waitOutputMs'),
      workers,
    };
  }

  /**
   * Stops every worker and resolves once all threads (replacements included) have exited. Workers
   * leave their loop at the next round; one stuck in a stage function or in a ring the owner did not
   * abort is terminated after closeTimeoutMs. Idempotent.
   */
  async close(): Promise<void> {
    this.closing = true;
    Atomics.store(this.ctrl, CTRL_STOP, 1);
    this.opts.input.wakeConsumers();
    const all = Promise.all(this.allExits);
    let timer: NodeJS.Timeout | undefined;
    const timedOut = await Promise.race([
      all.then(() => false),
      new Promise<boolean>((r) => (timer = setTimeout(() => r(true), this.opts.closeTimeoutMs ?? 2000))),
    ]);
    clearTimeout(timer);
    if (timedOut) await Promise.all(this.slots.map((s) => s.worker.terminate()));
    await all;
  }
}
