// Test worker: one endpoint of a RingQueue (compiled dist/). workerData:
//   { ringModule, buffer, role: 'produce'|'consume', count, words, id, spinMicros }
// produce: pushes `count` descriptors [id, seq, seq*31+id, ...]; posts {done}.
// consume: pops until the queue is closed; checks each producer's sequence is in order and the
//          payload intact; posts {received, seqSums (per producer), errors}.
import { parentPort, workerData } from 'node:worker_threads';

const { RingQueue } = await import(workerData.ringModule);
const q = RingQueue.attach(workerData.buffer, { spinMicros: workerData.spinMicros ?? 50 });
const words = q.words;

if (workerData.role === 'produce') {
  // count < 0: push until the queue is closed; report how many pushes returned normally
  const d = new Int32Array(words);
  const n = workerData.count < 0 ? Infinity : workerData.count;
  let i = 0;
  let closedCode;
  for (; i < n; i++) {
    d[0] = workerData.id;
    d[1] = i;
    for (let w = 2; w < words; w++) d[w] = (i * 31 + workerData.id + w) | 0;
    try {
      q.push(d);
    } catch (e) {
      closedCode = e.code;
      break;
    }
    if (i === 0 && n === Infinity) parentPort.postMessage({ started: true }); // after one real push
  }
  parentPort.postMessage(closedCode ? { done: i, closedCode } : { done: i });
} else {
  const out = new Int32Array(words);
  const next = new Map();
  const sum = new Map();
  let received = 0;
  const errors = [];
  while (q.pop(out)) {
    received++;
    const id = out[0], i = out[1];
    const want = next.get(id) ?? 0;
    // One consumer sees every producer's sequence contiguously; several consumers each see an
    // increasing subsequence.
    const ok = workerData.strict ? i === want : i >= want;
    if (!ok && errors.length < 5) errors.push(`producer ${id}: expected seq ${workerData.strict ? '' : '>= '}${want}, got ${i}`);
    sum.set(id, (sum.get(id) ?? 0) + i);
    next.set(id, i + 1);
    for (let w = 2; w < words; w++)
      if (out[w] !== ((i * 31 + id + w) | 0) && errors.length < 5) errors.push(`producer ${id} seq ${i}: word ${w} corrupt`);
  }
  parentPort.postMessage({ received, seqSums: Object.fromEntries(sum), errors });
}
