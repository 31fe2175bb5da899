/**
 * What a stage module looks like, and the shared control block between a {@link StagePool} and
 * its workers. Shared by stage-pool.ts (main thread) and stage-worker.ts (worker threads).
 *
 * A stage module is a compiled ESM file exporting
 *   `createStage(init, ctx): StageFn | Promise<StageFn>`
 * called once per worker with the pool's structured-cloned `init` (SharedArrayBuffers inside it are
 * shared, not copied). The returned {@link StageFn} runs once per micro-batch descriptor.
 */
import type { MessagePort } from 'node:worker_threads';
import { HANDOFF_HEADER_WORDS } from './ring-queue.js';

/** Where a stage function runs. */
export interface StageContext {
  /** Stage name (for messages). */
  stage: string;
  /** Worker index in its pool, 0-based; a replacement worker keeps the index of the one it replaces. */
  worker: number;
}

/**
 * Processes one micro-batch in place: reads what `desc` points at (arena slots, handles), writes its
 * results into shared memory and may rewrite `desc` (the user words of the descriptor; the ticket
 * word is not visible) before it is handed to the next stage. A thrown error rejects this batch
 * only (E_WORKER); may return a promise for asynchronous work (I/O).
 */
export type StageFn = (desc: Int32Array) => void | Promise<void>;

/**
 * Handles a control-plane request sent with `StagePool.control()` (e.g. "build the index of this
 * sequence"). Runs on the worker's event loop between micro-batches: the worker takes no descriptor
 * until the returned promise settles, so a handler never races the stage function.
 */
export type ControlFn = (request: unknown) => unknown;

/** A stage with a control handler. */
export interface StageHandlers {
  run: StageFn;
  control?: ControlFn;
}

export type CreateStage = (init: unknown, ctx: StageContext) => StageFn | StageHandlers | Promise<StageFn | StageHandlers>;

/** Per-worker counters reported over the control plane. Times in milliseconds. */
export interface StageWorkerStats {
  worker: number;
  /** Micro-batches processed successfully. */
  items: number;
  /** Micro-batches whose stage function threw. */
  errors: number;
  /** Time inside the stage function. */
  busyMs: number;
  /** Time waiting for input (spinning or sleeping): idle or starved by the previous stage. */
  waitInputMs: number;
  /** Time waiting to hand over to the next stage (back-pressure: the next stage is the bottleneck). */
  waitOutputMs: number;
}

// ---- Control block (Int32 words in a SharedArrayBuffer), one record per worker index. ----
/** Words before the first worker record. */
export const CTRL_WORKER_BASE = 16;
/**
 * Within a worker record: control-plane calls announced to the worker (the pool increments it
 * before each call; the worker yields to its event loop until it has handled as many).
 */
export const CW_POSTED = 0;
/**
 * Within a worker record: the worker's HandoffRecord (ring-queue.ts): state, position, id, then
 * the descriptor it holds (ticket word first). Lives here so that the pool can tell, after the
 * worker died, whether it held a batch it had not handed on.
 */
export const CW_HANDOFF = 4;
/** Largest number of threads one pool may run (2-core targets: 1 is the default). */
export const MAX_STAGE_THREADS = 16;

/** Words per worker record for descriptors of `descWords` words (a multiple of 16: 64-byte lines). */
export const workerRecordWords = (descWords: number) => Math.ceil((CW_HANDOFF + HANDOFF_HEADER_WORDS + descWords) / 16) * 16;
export const controlWords = (threads: number, descWords: number) => CTRL_WORKER_BASE + threads * workerRecordWords(descWords);
export const workerRecord = (index: number, descWords: number) => CTRL_WORKER_BASE + index * workerRecordWords(descWords);

/**
 * @internal Fault injection for tests: at the `nth` (default 1) time worker `worker` (default 0)
 * reaches `point` of its loop, it exits (`'exit'`, code 7), or (`'gate'`) sets word 0 of `gate` to
 * 1 and blocks until word 1 of `gate` is non-zero. Given at start, faults apply to the first
 * generation of workers only; armed later (StagePool.arm), to the worker running then.
 *   popped:     a descriptor was just taken from the input ring
 *   pushed:     a descriptor was just handed to the output ring
 *   beforeWait: the control plane was found caught up; the loop is about to wait on the input ring
 */
export interface StageFault {
  point: 'popped' | 'pushed' | 'beforeWait';
  action: 'exit' | 'gate';
  worker?: number;
  nth?: number;
  gate?: SharedArrayBuffer;
}

/**
 * The one long-lived piscina task a stage worker runs (StagePool submits it once per worker
 * lifetime; it returns when the worker leaves its loop). Structured-cloned: the SharedArrayBuffers
 * are shared, the two MessagePorts are transferred.
 */
export interface StageTask {
  stage: string;
  index: number;
  moduleUrl: string;
  init: unknown;
  input: SharedArrayBuffer;
  output: SharedArrayBuffer;
  control: SharedArrayBuffer;
  spinMicros: number;
  /** Sleep slice of an idle worker in ms. */
  idleSliceMs: number;
  faults: StageFault[];
  /** Control plane, pool → worker: the worker exposes {@link StageWorkerApi} on it (comlink). */
  api: MessagePort;
  /** Events, worker → pool: the pool exposes {@link StagePoolEvents} on it (comlink). */
  events: MessagePort;
}

/** How a stage task ended without its thread dying (a death rejects the task instead). */
export type StageTaskEnd =
  /** createStage failed: the worker never took a descriptor. */
  | { end: 'initError'; code: string; message: string }
  /** The loop ended on purpose: stop requested, or a ring closed / aborted by its owner. */
  | { end: 'left'; reason: string };

/** Reply of a control request: handler errors travel as data so that their codes survive. */
export type ControlReply = { ok: true; value: unknown } | { ok: false; code: string; message: string };

/**
 * Control plane of one stage worker (comlink, over StageTask.api). Every call is announced through
 * CW_POSTED and handled on the worker's event loop between micro-batches, strictly one after
 * another; the worker takes no descriptor while one is pending.
 */
export interface StageWorkerApi {
  stats(): Promise<StageWorkerStats>;
  configure(spinMicros: number): Promise<void>;
  control(request: unknown): Promise<ControlReply>;
  /** Leave the loop (the task then returns { end: 'left', reason: 'stop' }). */
  stop(): Promise<void>;
  /** @internal Arms a fault (tests). */
  arm(fault: StageFault): Promise<void>;
}

/** Events a stage worker reports (comlink, over StageTask.events). */
export interface StagePoolEvents {
  /** createStage finished; the worker is about to take descriptors. */
  ready(threadId: number): void;
  /** The stage function threw on batch `ticket`: reject that batch only. */
  batchError(ticket: number, code: string, message: string): void;
}
