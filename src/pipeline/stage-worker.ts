/**
 * Entry point of a stage worker thread (loaded from dist/ by {@link StagePool}).
 *
 * The loop: pop a descriptor from the input ring (spin, then Atomics.wait), mark it as held in the
 * control block, run the stage function on shared memory, push the descriptor to the output ring
 * (waiting while it is full), unmark. Nothing per micro-batch goes over postMessage; messages are
 * only the control plane. Because Atomics.wait blocks this thread's event loop, the pool announces
 * every control message by incrementing this worker's CW_POSTED word and waking the input ring;
 * the loop then yields to the event loop until the message handler has caught up.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { pathToFileURL } from 'node:url';
import { RingQueue } from './ring-queue.js';
import { KvdriveError, isKvdriveError } from '../errors.js';
import {
  CTRL_STOP,
  CW_BUSY,
  CW_POSTED,
  CW_TICKET,
  workerRecord,
  type ControlFn,
  type CreateStage,
  type PoolMessage,
  type StageFn,
  type StageWorkerData,
  type StageWorkerStats,
  type WorkerMessage,
} from './stage-contract.js';

const data = workerData as StageWorkerData;
// Sleep slice of an idle worker; control messages and stop wake it earlier through the ring.
const IDLE_SLICE_MS = data.idleSliceMs;
const passes = new Map<string, number>();
function faultPoint(point: string): void {
  for (const f of data.faults) {
    if (f.point !== point || (f.worker ?? 0) !== data.index) continue;
    const n = (passes.get(point) ?? 0) + 1;
    passes.set(point, n);
    if (n !== (f.nth ?? 1)) continue;
    if (f.action === 'exit') process.exit(7);
    const g = new Int32Array(f.gate!);
    Atomics.store(g, 0, 1);
    Atomics.notify(g, 0);
    while (Atomics.load(g, 1) === 0) Atomics.wait(g, 1, 0, 100);
  }
}
const port = parentPort!;
const ctrl = new Int32Array(data.control);
const rec = workerRecord(data.index);
const input = RingQueue.attach(data.input, { spinMicros: data.spinMicros });
const output = RingQueue.attach(data.output, { spinMicros: data.spinMicros });
const stats: StageWorkerStats = { worker: data.index, items: 0, errors: 0, busyMs: 0, waitInputMs: 0, waitOutputMs: 0 };
let handled = 0;
let control: ControlFn | undefined;
// Control messages are handled strictly one after another (an async handler finishes before the
// next starts) and `handled` counts finished ones; the loop takes no descriptor while behind.
// Messages can arrive before createStage has finished (a replacement's replay is posted at spawn):
// the chain starts behind initialization.
let initDone!: () => void;
let controlChain: Promise<void> = new Promise<void>((r) => (initDone = r));
let caughtUp: (() => void) | undefined;

const send = (m: WorkerMessage) => port.postMessage(m);

async function handle(m: PoolMessage): Promise<void> {
  if (m.type === 'stats') send({ type: 'stats', id: m.id, stats: { ...stats } });
  else if (m.type === 'config') {
    input.spinMicros = m.spinMicros;
    output.spinMicros = m.spinMicros;
  } else if (m.type === 'control') {
    try {
      if (!control) throw new KvdriveError('E_CONFIG', `stage '${data.stage}' control: expected a stage with a control handler, got one without`);
      send({ type: 'controlResult', id: m.id, ok: true, value: await control(m.request) });
    } catch (e) {
      send({ type: 'controlResult', id: m.id, ok: false, ...errorInfo(e) });
    }
  }
}

port.on('message', (m: PoolMessage) => {
  controlChain = controlChain.then(() => handle(m)).then(() => {
    handled++;
    caughtUp?.();
  });
});

/** Resolves once some control message finished (the loop then re-checks the count). */
const controlProgress = () => new Promise<void>((r) => (caughtUp = r));

function errorInfo(e: unknown): { code: string; message: string } {
  if (isKvdriveError(e)) return { code: e.code, message: e.message };
  if (e instanceof Error) return { code: e.name, message: e.message }; // rendered "TypeError: ..."
  return { code: 'Error', message: String(e) };
}

/** The worker loop; returns why it ended (any other end is a thrown error: a death). */
async function run(fn: StageFn): Promise<string> {
  const desc = new Int32Array(input.words);
  const user = desc.subarray(1); // word 0 is the pipeline's ticket
  for (;;) {
    if (Atomics.load(ctrl, CTRL_STOP) !== 0) return 'stop';
    if (Atomics.load(ctrl, rec + CW_POSTED) !== handled) {
      // Behind on the control plane: wait (on the event loop, so messages arrive) for a message to
      // finish; a short timer covers a message posted but not yet delivered.
      await Promise.race([controlProgress(), new Promise<void>((r) => setTimeout(r, 1))]);
      continue;
    }
    faultPoint('beforeWait');
    let t = performance.now();
    let status;
    try {
      status = input.popWait(desc, IDLE_SLICE_MS);
    } catch (e) {
      if (isKvdriveError(e, 'E_CLOSED')) return 'input aborted'; // by the owner
      throw e;
    }
    let t2 = performance.now();
    stats.waitInputMs += t2 - t;
    if (status === 'closed') return 'input closed';
    if (status === 'idle') continue;
    faultPoint('popped');

    Atomics.store(ctrl, rec + CW_TICKET, desc[0]!);
    Atomics.store(ctrl, rec + CW_BUSY, 1);
    try {
      const r = fn(user);
      if (r !== undefined && typeof (r as Promise<void>).then === 'function') await r;
    } catch (e) {
      stats.errors++;
      send({ type: 'batchError', ticket: desc[0]!, ...errorInfo(e) });
      Atomics.store(ctrl, rec + CW_BUSY, 0);
      continue;
    }
    t = performance.now();
    stats.busyMs += t - t2;
    try {
      output.push(desc);
    } catch (e) {
      if (isKvdriveError(e, 'E_CLOSED')) return 'output closed'; // the owner rejects what is in flight
      throw e;
    }
    faultPoint('pushed');
    t2 = performance.now();
    stats.waitOutputMs += t2 - t;
    stats.items++;
    Atomics.store(ctrl, rec + CW_BUSY, 0);
  }
}

async function main(): Promise<void> {
  let fn: StageFn;
  try {
    const mod = (await import(data.moduleUrl.startsWith('file:') ? data.moduleUrl : pathToFileURL(data.moduleUrl).href)) as {
      createStage?: CreateStage;
    };
    if (typeof mod.createStage !== 'function') throw new Error(`${data.moduleUrl} does not export a function createStage(init, ctx)`);
    const made = await mod.createStage(data.init, { stage: data.stage, worker: data.index });
    if (typeof made === 'function') fn = made;
    else if (made !== null && typeof made === 'object' && typeof made.run === 'function') {
      fn = made.run;
      control = made.control;
    } else throw new Error(`createStage of ${data.moduleUrl} returned ${typeof made}, not a function or { run, control? }`);
  } catch (e) {
    send({ type: 'initError', ...errorInfo(e) });
    port.close();
    return;
  }
  initDone();
  send({ type: 'ready' });
  const reason = await run(fn);
  send({ type: 'leaving', reason });
  port.close(); // nothing else keeps the thread alive: it exits
}

void main();
