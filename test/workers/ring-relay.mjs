// Test worker: a stage without a stage function. Pops descriptors from ring `a` into its hand-off
// record and pushes them to ring `b`, until `a` is closed. The test terminates it at random points.
// workerData: { ringModule, a, b, control, at }
import { parentPort, workerData } from 'node:worker_threads';

const { RingQueue, HandoffRecord } = await import(workerData.ringModule);
const a = RingQueue.attach(workerData.a, { spinMicros: 20 });
const b = RingQueue.attach(workerData.b, { spinMicros: 20 });
const record = new HandoffRecord(new Int32Array(workerData.control), workerData.at, a.words);
parentPort.postMessage('up');
for (;;) {
  const s = a.popWait(record.desc, 50, { record });
  if (s === 'closed') break;
  if (s === 'item') b.push(record.desc, record);
}
