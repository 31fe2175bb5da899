// Test worker: blocks in a RingQueue operation and reports how it ended.
// workerData: { ringModule, buffer, op: 'pop'|'push' }
import { parentPort, workerData } from 'node:worker_threads';

const { RingQueue } = await import(workerData.ringModule);
const q = RingQueue.attach(workerData.buffer, { spinMicros: 0 });
parentPort.postMessage({ started: true });
try {
  if (workerData.op === 'pop') {
    const got = q.pop(new Int32Array(q.words));
    parentPort.postMessage({ result: got });
  } else {
    q.push(new Int32Array(q.words).fill(7));
    parentPort.postMessage({ result: 'pushed' });
  }
} catch (e) {
  parentPort.postMessage({ error: { code: e.code, message: e.message } });
}
