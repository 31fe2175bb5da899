/**
 * What a stage module looks like, and the shared control block between a {@link StagePool} and
 * its workers. Shared by stage-pool.ts (main thread) and stage-worker.ts (worker threads).
 *
 * A stage module is a compiled ESM file exporting
 *   `createStage(init, ctx): StageFn | Promise<StageFn>`
 * called once per worker with the pool's structured-cloned `init` (SharedArrayBuffers inside it are
 * shared, not copied). The returned {@link StageFn} runs once per micro-batch descriptor.
 */

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

// ---- Control block (Int32 words in a SharedArrayBuffer). ----
/** Non-zero: workers leave their loop at the next round. */
export const CTRL_STOP = 0;
/** Words per worker record; records start at CTRL_WORKER_BASE. */
export const CTRL_WORKER_BASE = 16;
export const CTRL_WORKER_WORDS = 16;
/** Within a worker record: control messages posted to the worker (the worker yields until it has handled as many). */
export const CW_POSTED = 0;
/** Within a worker record: 1 while the worker holds a descriptor (popped, not yet handed on). */
export const CW_BUSY = 1;
/** Within a worker record: the ticket of the descriptor it holds. */
export const CW_TICKET = 2;
/** Largest number of threads one pool may run (2-core targets: 1 is the default). */
export const MAX_STAGE_THREADS = 16;

export const controlWords = (threads: number) => CTRL_WORKER_BASE + threads * CTRL_WORKER_WORDS;
export const workerRecord = (index: number) => CTRL_WORKER_BASE + index * CTRL_WORKER_WORDS;

/**
 * @internal Fault injection for tests: at the `nth` (default 1) time worker `worker` (default 0) of
 * the first generation reaches `point` of its loop, it exits (`'exit'`, code 7), or (`'gate'`) sets
 * word 0 of `gate` to 1 and blocks until word 1 of `gate` is non-zero.
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

/** workerData of a stage worker. */
export interface StageWorkerData {
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
}

/** Messages worker → pool. */
export type WorkerMessage =
  | { type: 'ready' }
  /** The loop ended on purpose (stop flag, closed or aborted ring): the exit that follows is not a death. */
  | { type: 'leaving'; reason: string }
  | { type: 'initError'; code: string; message: string }
  | { type: 'batchError'; ticket: number; code: string; message: string }
  | { type: 'stats'; id: number; stats: StageWorkerStats }
  | { type: 'controlResult'; id: number; ok: boolean; value?: unknown; code?: string; message?: string };

/** Messages pool → worker (each one is announced by incrementing CW_POSTED). */
export type PoolMessage =
  | { type: 'stats'; id: number }
  | { type: 'config'; spinMicros: number }
  | { type: 'control'; id: number; request: unknown };
