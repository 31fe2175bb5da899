/**
 * A pipeline stage: a piscina pool of worker threads, each running ONE long-lived task that loops
 * "pop descriptor from the input ring → run the stage function on shared memory → push to the
 * output ring" until it is stopped. The pipelined runtime runs its select stage on one
 * (select-stage.ts; memory-runtime.ts submits micro-batches through a Pipeline).
 *
 * Why piscina fits although its unit of work is a task (one postMessage and one promise each):
 * here a task is a worker's whole life, not a micro-batch, so piscina costs one message per worker
 * lifetime and the per-micro-batch path stays on the SharedArrayBuffer ring queues. What piscina
 * gives is the lifecycle: starting the threads, replacing a thread that died (it keeps minThreads
 * alive), resource limits (`resourceLimits`, enforced by V8 per worker), and terminating and
 * joining every thread on shutdown. Its scheduling is not used (one task per thread, never queued
 * behind another). The control plane (stats, configuration, control requests, stop) is comlink
 * over a MessageChannel per worker lifetime; the worker reports ready and failed batches over a
 * second one.
 *
 * Faults: a stage function that throws rejects that batch (E_WORKER via `onBatchError`) and the
 * worker carries on. A worker that dies (process.exit, uncaught error, resource limit, terminate)
 * rejects its piscina task; the pool then settles its hand-off record (ring-queue.ts salvage*:
 * a descriptor popped and not yet handed on is rejected with E_WORKER, one already handed on is
 * left to the next stage, a half-done pop or push is finished or undone so no ring is wedged) and
 * submits a new task for that index, which piscina runs on the replacement thread. A replacement
 * that fails to initialize is fatal (`onFatal`): no restart loop.
 */
import { MessageChannel, type MessagePort, type ResourceLimits } from 'node:worker_threads';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Piscina } from 'piscina';
import { expose, wrap, type Remote } from 'comlink';
import { ErrorCodes, KvdriveError, fail, type ErrorCode } from '../errors.js';
import { HANDOFF_HELD, HANDOFF_IDLE, HandoffRecord, RingQueue } from './ring-queue.js';
import { portEndpoint } from './comlink-port.js';
import {
  CW_HANDOFF,
  CW_POSTED,
  MAX_STAGE_THREADS,
  controlWords,
  workerRecord,
  type ControlReply,
  type StageFault,
  type StagePoolEvents,
  type StageTask,
  type StageTaskEnd,
  type StageWorkerApi,
  type StageWorkerStats,
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
  /**
   * V8 heap limits of each worker (node:worker_threads ResourceLimits, in MB). A worker exceeding
   * them dies like a crash: its batch is rejected with E_WORKER and it is replaced.
   */
  resourceLimits?: ResourceLimits;
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
  /** A batch failed in this stage (its function threw, or its worker died holding it): reject it. */
  onBatchError: (ticket: number, error: KvdriveError) => void;
  /** The pool cannot continue (a replacement worker failed to start). */
  onFatal?: (error: KvdriveError) => void;
  /** Milliseconds close() waits for workers to leave their loop before terminating them (default 2000). */
  closeTimeoutMs?: number;
  /** @internal Sleep slice of an idle worker in ms (default 1000); control calls and stop wake it earlier. */
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

/**
 * Path of a compiled module of src/pipeline/ (e.g. 'stage-worker.js', the worker entry, or a stage
 * module): beside this file when running from dist/, else under <root>/dist/ (tests run the
 * TypeScript sources; workers can only load compiled JavaScript).
 */
export function compiledPipelineModule(file: string): string {
  const here = dirname(fileURLToPath(import.meta.url));
  const sibling = join(here, file);
  if (existsSync(sibling)) return sibling;
  let dir = here;
  for (let i = 0; i < 4; i++) {
    dir = dirname(dir);
    const p = join(dir, 'dist', 'src', 'pipeline', file);
    if (existsSync(p)) return p;
  }
  throw new KvdriveError('E_NOT_FOUND', `stage module: expected compiled dist/src/pipeline/${file}, got none near ${here}; run \`npm run build:ts\``);
}

function checkResourceLimits(name: string, r: unknown): void {
  if (r === undefined) return;
  const keys = ['maxOldGenerationSizeMb', 'maxYoungGenerationSizeMb', 'codeRangeSizeMb', 'stackSizeMb'];
  const ok =
    r !== null && typeof r === 'object' && Object.entries(r).every(([k, v]) => keys.includes(k) && typeof v === 'number' && Number.isFinite(v) && v > 0);
  if (!ok) fail('E_CONFIG', `stage '${name}' resourceLimits`, `an object of positive numbers (MB) among ${keys.join(', ')}`, r);
}

/** One worker lifetime: its piscina task and its two comlink channels. */
interface Slot {
  index: number;
  remote: Remote<StageWorkerApi>;
  ports: MessagePort[];
  /** Resolves when the worker reported ready; rejects when it failed to start. */
  ready: Promise<void>;
  /** Rejects (E_WORKER) once the task ended or the thread died: control calls race it. */
  gone: Promise<never>;
  /** Settles after the end of the task has been handled (death included). */
  done: Promise<void>;
  threadId?: number;
  ended: boolean;
}

export class StagePool {
  readonly name: string;
  readonly threads: number;
  private readonly opts: StagePoolOptions;
  private readonly ctrl: Int32Array;
  private readonly records: HandoffRecord[] = [];
  private readonly moduleUrl: string;
  private readonly piscina: Piscina<StageTask, StageTaskEnd>;
  private readonly slots: Slot[] = [];
  private spinMicros: number;
  private closing: Promise<void> | undefined;
  private restarts = 0;
  /** Every worker lifetime ever started (replacements included), for close() to await. */
  private readonly lifetimes: Promise<void>[] = [];

  private constructor(opts: StagePoolOptions, threads: number, spinMicros: number) {
    this.opts = opts;
    this.name = opts.name;
    this.threads = threads;
    this.spinMicros = spinMicros;
    const words = opts.input.words;
    this.ctrl = new Int32Array(new SharedArrayBuffer(controlWords(threads, words) * 4));
    for (let i = 0; i < threads; i++) this.records.push(new HandoffRecord(this.ctrl, workerRecord(i, words) + CW_HANDOFF, words));
    this.moduleUrl = opts.module.startsWith('file:') ? opts.module : pathToFileURL(opts.module).href;
    this.piscina = new Piscina<StageTask, StageTaskEnd>({
      filename: compiledPipelineModule('stage-worker.js'),
      name: 'default',
      minThreads: threads,
      maxThreads: threads,
      idleTimeout: Infinity,
      concurrentTasksPerWorker: 1,
      // Piscina's own Atomics wait between tasks would block the event loop our control plane
      // runs on; a worker runs one task for its whole life anyway.
      atomics: 'disabled',
      resourceLimits: opts.resourceLimits,
    });
    // Piscina reports a worker error it cannot attach to a task (none here: deaths reject tasks)
    // as an 'error' event; without a listener that would throw.
    this.piscina.on('error', () => {});
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
    checkResourceLimits(opts.name, opts.resourceLimits);
    const pool = new StagePool(opts, threads, spin);
    for (let i = 0; i < threads; i++) pool.slots.push(pool.spawn(i, opts.faults ?? []));
    try {
      await Promise.all(pool.slots.map((s) => s.ready));
    } catch (e) {
      await pool.close();
      throw e;
    }
    return pool;
  }

  /** Worker lifetimes started since start (including replacements). */
  get spawned(): number {
    return this.lifetimes.length;
  }

  /** Workers replaced after dying. */
  get restartCount(): number {
    return this.restarts;
  }

  /** Starts the lifetime of worker `index`: its record reset, channels made, its task submitted. */
  private spawn(index: number, faults: StageFault[]): Slot {
    const words = this.opts.input.words;
    const rec = workerRecord(index, words);
    Atomics.store(this.ctrl, rec + CW_POSTED, 0);
    this.records[index]!.reset(index + 1);
    const api = new MessageChannel();
    const events = new MessageChannel();
    let readyResolve!: () => void;
    let readyReject!: (e: KvdriveError) => void;
    let goneReject!: (e: KvdriveError) => void;
    const ready = new Promise<void>((res, rej) => ((readyResolve = res), (readyReject = rej)));
    const gone = new Promise<never>((_, rej) => (goneReject = rej));
    ready.catch(() => {}); // observed by start() or the respawn path
    gone.catch(() => {}); // observed by racing control calls
    const slot: Slot = { index, remote: wrap<StageWorkerApi>(portEndpoint(api.port1)), ports: [api.port1, events.port1], ready, gone, done: Promise.resolve(), ended: false };
    let isReady = false;
    const poolEvents: StagePoolEvents = {
      ready: (threadId) => {
        slot.threadId = threadId;
        isReady = true;
        readyResolve();
      },
      batchError: (ticket, code, message) =>
        this.opts.onBatchError(
          ticket,
          new KvdriveError('E_WORKER', `stage '${this.name}' worker ${index}: expected the stage function to process batch ${ticket}, got ${code}: ${message}`),
        ),
    };
    expose(poolEvents, portEndpoint(events.port1));
    const task: StageTask = {
      stage: this.name,
      index,
      moduleUrl: this.moduleUrl,
      init: this.opts.init,
      input: this.opts.input.buffer,
      output: this.opts.output.buffer,
      control: this.ctrl.buffer as SharedArrayBuffer,
      spinMicros: this.spinMicros,
      idleSliceMs: this.opts.idleSliceMs ?? 1000,
      faults,
      api: api.port2,
      events: events.port2,
    };
    const end = (why: string) => {
      slot.ended = true;
      goneReject(new KvdriveError('E_WORKER', `stage '${this.name}' worker ${index}: expected a control reply, got ${why}`));
      for (const p of slot.ports) p.close();
    };
    slot.done = this.piscina.run(task, { transferList: [api.port2, events.port2] }).then(
      (r) => {
        if (r.end === 'initError') readyReject(new KvdriveError('E_WORKER', `stage '${this.name}' worker ${index}: expected createStage to succeed, got ${r.code}: ${r.message}`));
        else if (!isReady) readyReject(new KvdriveError('E_WORKER', `stage '${this.name}' worker ${index}: expected it to start, got it leaving (${r.reason})`));
        end(r.end === 'left' ? `the worker leaving (${r.reason})` : 'a failed start');
      },
      (e: unknown) => {
        const why = deathReason(e);
        end(`the worker dying (${why})`);
        if (!isReady) readyReject(new KvdriveError('E_WORKER', `stage '${this.name}' worker ${index}: expected it to start, got ${why}`));
        // Only a worker that had started is replaced: one dying during start-up would die again
        // (its start failure is reported through `ready`: start() rejects, or onFatal).
        else if (this.closing === undefined && this.slots[index] === slot) this.onDeath(index, why);
      },
    );
    this.lifetimes.push(slot.done);
    return slot;
  }

  /** An unrequested death: settle what the worker held, then start a new lifetime in its place. */
  private onDeath(index: number, why: string): void {
    const record = this.records[index]!;
    this.opts.input.salvageConsumer(record);
    this.opts.output.salvageProducer(record);
    if (record.state === HANDOFF_HELD) {
      const ticket = record.desc[0]!;
      record.set(HANDOFF_IDLE);
      this.opts.onBatchError(ticket, new KvdriveError('E_WORKER', `stage '${this.name}' worker ${index}: expected it to finish batch ${ticket}, got the worker dying (${why})`));
    }
    this.restarts++;
    const fresh = this.spawn(index, []);
    this.slots[index] = fresh;
    const fatal = (e: KvdriveError) => {
      if (this.closing !== undefined) return;
      this.opts.onFatal?.(new KvdriveError('E_WORKER', `stage '${this.name}': expected a replacement worker after a death (${why}), got: ${e.message}`));
    };
    fresh.ready.catch(fatal);
    // Sent now; the replacement handles them (after createStage) before it takes a descriptor.
    for (const request of this.opts.replay?.() ?? []) this.controlOne(index, request).catch(fatal);
  }

  /**
   * A control-plane call to worker `index`: sent over comlink, announced in CW_POSTED and the input
   * ring woken so that a worker asleep in its ring wait turns to its event loop. Rejects with
   * E_WORKER when the worker ends first.
   */
  private call<R>(index: number, f: (api: Remote<StageWorkerApi>) => Promise<R>): Promise<R> {
    const slot = this.slots[index]!;
    if (slot.ended) return slot.gone;
    const reply = f(slot.remote);
    Atomics.add(this.ctrl, workerRecord(index, this.opts.input.words) + CW_POSTED, 1);
    this.opts.input.wakeConsumers();
    return Promise.race([reply, slot.gone]);
  }

  /** Changes the workers' spin budget (µs) over the control plane. */
  configure(opts: { spinMicros: number }): void {
    const s = opts?.spinMicros;
    if (typeof s !== 'number' || !(s >= 0 && s <= 100_000)) fail('E_CONFIG', `stage '${this.name}' spinMicros`, 'a number in [0, 100000]', s);
    this.spinMicros = s;
    for (let i = 0; i < this.slots.length; i++) this.call(i, (w) => w.configure(s)).catch(() => {}); // a dead worker's replacement starts with this.spinMicros
  }

  /**
   * Sends `request` to every worker's control handler (see ControlFn) and resolves with their
   * replies in worker order. A handler error rejects with its own error code (or E_WORKER).
   */
  async control(request: unknown): Promise<unknown[]> {
    if (this.closing) throw new KvdriveError('E_CLOSED', `stage '${this.name}' control: expected an open pool, got one that was closed`);
    return Promise.all(this.slots.map((_, i) => this.controlOne(i, request)));
  }

  private async controlOne(index: number, request: unknown): Promise<unknown> {
    const reply: ControlReply = await this.call(index, (w) => w.control(request) as Promise<ControlReply>);
    if (reply.ok) return reply.value;
    // keep the handler's own error code (e.g. E_SHAPE from an index build)
    const code = (ErrorCodes as readonly string[]).includes(reply.code) ? (reply.code as ErrorCode) : 'E_WORKER';
    throw new KvdriveError(code, code === 'E_WORKER' ? `stage '${this.name}' worker ${index} control: ${reply.code}: ${reply.message}` : reply.message);
  }

  /**
   * @internal Fault injection for tests: kills worker `index` abruptly (its thread terminated, no
   * chance to leave its loop), exactly like a crash — the pool settles what it held and starts a
   * replacement. Resolves once the death has been handled.
   */
  async killWorker(index: number): Promise<void> {
    const slot = this.slots[index];
    if (!slot) fail('E_RANGE', `stage '${this.name}' worker`, `an index in [0, ${this.slots.length})`, index);
    await slot.ready;
    const thread = this.piscina.threads.find((t) => t.threadId === slot.threadId);
    if (!thread) throw new KvdriveError('E_INTERNAL', `stage '${this.name}' worker ${index}: expected its thread ${slot.threadId} among the pool's threads, got none`);
    await thread.terminate();
    await slot.done;
  }

  /** @internal Arms a fault in the running worker `index` (tests); see StageFault. */
  async arm(index: number, fault: StageFault): Promise<void> {
    if (!this.slots[index]) fail('E_RANGE', `stage '${this.name}' worker`, `an index in [0, ${this.slots.length})`, index);
    await this.call(index, (w) => w.arm(fault));
  }

  /** Collects the workers' counters over the control plane. */
  async stats(): Promise<StageStats> {
    if (this.closing) throw new KvdriveError('E_CLOSED', `stage '${this.name}' stats: expected an open pool, got one that was closed`);
    const parts = await Promise.all(this.slots.map((_, i) => this.call(i, (w) => w.stats()).catch(() => undefined)));
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
   * are told to stop over the control plane and leave their loop at the next round; one stuck in
   * a stage function or in a ring the owner did not abort is terminated after closeTimeoutMs (the
   * piscina pool is destroyed, which joins every thread). Idempotent.
   */
  close(): Promise<void> {
    this.closing ??= this.shutdown();
    return this.closing;
  }

  private async shutdown(): Promise<void> {
    for (let i = 0; i < this.slots.length; i++) this.call(i, (w) => w.stop()).catch(() => {});
    const all = Promise.all(this.lifetimes);
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([all, new Promise<void>((r) => (timer = setTimeout(r, this.opts.closeTimeoutMs ?? 2000)))]);
    clearTimeout(timer);
    await this.piscina.destroy();
    for (const s of this.slots) for (const p of s.ports) p.close();
  }
}

/** How a piscina task failure reads: "exit code N" for an exit, else the uncaught error. */
function deathReason(e: unknown): string {
  const m = e instanceof Error ? /^worker exited with code: (-?\d+)$/.exec(e.message) : null;
  if (m) return `exit code ${m[1]}`;
  if (e instanceof Error) return `uncaught ${e.name}: ${e.message}`;
  return `uncaught ${String(e)}`;
}
