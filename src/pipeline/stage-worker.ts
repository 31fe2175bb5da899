/**
 * The piscina task of a stage worker thread (loaded from dist/ by {@link StagePool}): one call per
 * worker lifetime, which loops until it is told to stop.
 *
 * The loop: pop a descriptor from the input ring into this worker's hand-off record (spin, then
 * Atomics.wait), run the stage function on shared memory, push the descriptor to the output ring
 * (waiting while it is full). Nothing per micro-batch goes over a MessagePort. The control plane
 * (stats, configuration, control requests, stop) is a comlink API on the task's `api` port; the
 * only worker → pool event is a failed batch. Because Atomics.wait blocks this thread's event loop,
 * the pool announces every control call by incrementing this worker's CW_POSTED word and waking the
 * input ring; the loop then yields to the event loop until the call has been handled. The wait
 * re-checks CW_POSTED after reading the ring's wake-up epoch (PopWaitOptions.wakeIf), so an
 * announcement landing between the loop's check and the wait cannot be slept through.
 */
import { threadId } from 'node:worker_threads';
import { pathToFileURL } from 'node:url';
import { expose, wrap } from 'comlink';
import { portEndpoint } from './comlink-port.js';
import { HANDOFF_HELD, HANDOFF_IDLE, HandoffRecord, RingQueue } from './ring-queue.js';
import { KvdriveError, isKvdriveError } from '../errors.js';
import {
  CW_HANDOFF,
  CW_POSTED,
  workerRecord,
  type ControlFn,
  type ControlReply,
  type CreateStage,
  type StageFault,
  type StageFn,
  type StagePoolEvents,
  type StageTask,
  type StageTaskEnd,
  type StageWorkerApi,
  type StageWorkerStats,
} from './stage-contract.js';

function errorInfo(e: unknown): { code: string; message: string } {
  if (isKvdriveError(e)) return { code: e.code, message: e.message };
  if (e instanceof Error) return { code: e.name, message: e.message }; // rendered "TypeError: ..."
  return { code: 'Error', message: String(e) };
}

/** Piscina entry: runs one stage worker until it leaves its loop. */
export default async function stageTask(task: StageTask): Promise<StageTaskEnd> {
  const ctrl = new Int32Array(task.control);
  const input = RingQueue.attach(task.input, { spinMicros: task.spinMicros });
  const output = RingQueue.attach(task.output, { spinMicros: task.spinMicros });
  const rec = workerRecord(task.index, input.words);
  const posted = rec + CW_POSTED;
  // The pool reset it (id = index + 1) before submitting this task.
  const record = new HandoffRecord(ctrl, rec + CW_HANDOFF, input.words);
  const stats: StageWorkerStats = { worker: task.index, items: 0, errors: 0, busyMs: 0, waitInputMs: 0, waitOutputMs: 0 };
  const events = wrap<StagePoolEvents>(portEndpoint(task.events));
  const faults: StageFault[] = task.faults.filter((f) => (f.worker ?? 0) === task.index);
  const passes = new Map<string, number>();
  let control: ControlFn | undefined;
  let stopRequested = false;
  let handled = 0;
  // Announced calls run strictly one after another (an async handler finishes before the next
  // starts) and `handled` counts finished ones. Calls can arrive before createStage has finished
  // (a replacement's replayed requests are sent at once): the chain starts behind initialization.
  let initDone!: () => void;
  const initialized = new Promise<void>((r) => (initDone = r));
  let chain: Promise<unknown> = initialized;
  let caughtUp: (() => void) | undefined;
  /** Wraps a control-plane handler: queued behind the previous call, counted in `handled` once settled. */
  const announced =
    <A extends unknown[], R>(fn: (...a: A) => R | Promise<R>) =>
    (...args: A): Promise<R> => {
      const run = chain.then(() => fn(...args));
      const settled = () => {
        handled++;
        caughtUp?.();
      };
      chain = run.then(settled, settled);
      return run;
    };

  const api: StageWorkerApi = {
    stats: announced(() => ({ ...stats })),
    configure: announced((spin: number) => {
      input.spinMicros = spin;
      output.spinMicros = spin;
    }),
    control: announced(async (request: unknown): Promise<ControlReply> => {
      try {
        if (!control) throw new KvdriveError('E_CONFIG', `stage '${task.stage}' control: expected a stage with a control handler, got one without`);
        return { ok: true, value: await control(request) };
      } catch (e) {
        return { ok: false, ...errorInfo(e) };
      }
    }),
    stop: announced(() => {
      stopRequested = true;
    }),
    arm: announced((f: StageFault) => {
      faults.push(f);
    }),
  };
  expose(api, portEndpoint(task.api));

  function faultPoint(point: StageFault['point']): void {
    if (faults.length === 0) return;
    const n = (passes.get(point) ?? 0) + 1;
    passes.set(point, n);
    for (const f of faults) {
      if (f.point !== point || n !== (f.nth ?? 1)) continue;
      if (f.action === 'exit') process.exit(7);
      const g = new Int32Array(f.gate!);
      Atomics.store(g, 0, 1);
      Atomics.notify(g, 0);
      while (Atomics.load(g, 1) === 0) Atomics.wait(g, 1, 0, 100);
    }
  }

  /** Lets pending microtasks (comlink replies) and I/O callbacks run. */
  const yieldToEventLoop = () => new Promise<void>((r) => setImmediate(r));
  const behind = () => Atomics.load(ctrl, posted) !== handled;
  const wait = { wakeIf: behind, record };

  /** The worker loop; returns why it ended (any other end is a thrown error: a death). */
  async function run(fn: StageFn): Promise<string> {
    const desc = record.desc;
    const user = desc.subarray(1); // word 0 is the pipeline's ticket
    for (;;) {
      if (behind()) {
        // Behind on the control plane: wait (on the event loop, so messages arrive) for a call to
        // finish; a short timer covers a call announced but not yet delivered.
        await Promise.race([new Promise<void>((r) => (caughtUp = r)), new Promise<void>((r) => setTimeout(r, 1))]);
        if (!behind()) await yieldToEventLoop(); // flush the replies before the next blocking wait
        continue;
      }
      if (stopRequested) return 'stop';
      faultPoint('beforeWait');
      let t = performance.now();
      let status;
      try {
        status = input.popWait(desc, task.idleSliceMs, wait);
      } catch (e) {
        if (isKvdriveError(e, 'E_CLOSED')) return 'input aborted'; // by the owner
        throw e;
      }
      let t2 = performance.now();
      stats.waitInputMs += t2 - t;
      if (status === 'closed') return 'input closed';
      if (status === 'idle') continue;
      faultPoint('popped');
      try {
        const r = fn(user);
        if (r !== undefined && typeof (r as Promise<void>).then === 'function') await r;
      } catch (e) {
        stats.errors++;
        const { code, message } = errorInfo(e);
        void events.batchError(desc[0]!, code, message);
        record.set(HANDOFF_IDLE); // after reporting: a death in between rejects it again, harmlessly
        continue;
      }
      t = performance.now();
      stats.busyMs += t - t2;
      try {
        output.push(desc, record);
      } catch (e) {
        if (isKvdriveError(e, 'E_CLOSED')) return 'output closed'; // the owner rejects what is in flight
        throw e;
      }
      faultPoint('pushed');
      t2 = performance.now();
      stats.waitOutputMs += t2 - t;
      stats.items++;
    }
  }

  let fn: StageFn;
  try {
    const mod = (await import(task.moduleUrl.startsWith('file:') ? task.moduleUrl : pathToFileURL(task.moduleUrl).href)) as { createStage?: CreateStage };
    if (typeof mod.createStage !== 'function') throw new Error(`${task.moduleUrl} does not export a function createStage(init, ctx)`);
    const made = await mod.createStage(task.init, { stage: task.stage, worker: task.index });
    if (typeof made === 'function') fn = made;
    else if (made !== null && typeof made === 'object' && typeof made.run === 'function') {
      fn = made.run;
      control = made.control;
    } else throw new Error(`createStage of ${task.moduleUrl} returned ${typeof made}, not a function or { run, control? }`);
  } catch (e) {
    task.api.close();
    task.events.close();
    return { end: 'initError', ...errorInfo(e) };
  }
  initDone();
  void events.ready(threadId);
  try {
    const reason = await run(fn);
    if (record.state === HANDOFF_HELD) record.set(HANDOFF_IDLE); // the owner rejects what is in flight
    return { end: 'left', reason };
  } finally {
    await yieldToEventLoop(); // let the reply to stop() go out
    task.api.close();
    task.events.close();
  }
}
