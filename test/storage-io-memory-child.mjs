// Child process of storage-io-memory.test.ts: measures what one I/O engine adds to this process's
// anonymous resident memory (RssAnon), with nothing else running in the process.
// Why a child: the test worker also runs vitest's RPC, the promise machinery of other tests and V8's
// own young-generation growth; in CI those moved VmRSS by ~4.5 MB between two readings. Why RssAnon:
// the engine's bounce buffers and rings are anonymous memory, while the first call into a code path
// pages in parts of node's and libstdc++'s text (file-backed, not the engine's).
// Usage: KVDRIVE_TEST_HOOKS=1 node --expose-gc storage-io-memory-child.mjs <pread|uring> <data file>; prints one JSON line.
// Uses the compiled package (dist/), so run `npm run build:ts` first.
import { readFileSync } from 'node:fs';
import { IoEngine } from '../dist/src/storage/io-engine.js';
import { native } from '../dist/src/native.js';

/** RssAnon of this process, bytes, after a full GC (garbage is not the engine's). */
function anonBytes() {
  globalThis.gc();
  const m = /^RssAnon:\s+(\d+) kB/m.exec(readFileSync('/proc/self/status', 'utf8'));
  return Number(m[1]) * 1024;
}

const [kind, path] = process.argv.slice(2);
// Written now: a fresh buffer's pages become resident only when first written, which the reads
// would otherwise do after `before` (3 MiB that are not the engine's).
const dests = [0, 1, 2].map(() => new Uint8Array(1 << 20).fill(1));
const reads = (i) => [{ file: 0, offset: i * (1 << 20), length: 1 << 20, destOffset: 0 }];
// Warm the measuring itself (the regex, readFileSync's buffers) before the baseline.
anonBytes();
const before = anonBytes();
const e = new IoEngine({ kind, queueDepth: 8, threads: 8, maxBatches: 3, maxIoBytes: 1 << 20 });
const out = { info: e.info.bufferBytes, made: e.stats().bufferBytes };
out.grownAtOpen = anonBytes() - before;
e.open(path, false);
// Three callers at once: io_uring makes a ring for each (the barrier holds every batch until three
// are in flight), reaching its maximum; pread serves them one by one with its slots.
if (kind === 'uring') native.ioTestHooks({ batchBarrier: 3 });
try {
  await Promise.all(dests.map((d, i) => e.read(reads(i), d)));
} finally {
  if (kind === 'uring') native.ioTestHooks({ batchBarrier: 0 });
}
out.allocated = e.stats().bufferBytes;
out.peakBatches = e.stats().peakBatches;
out.grownAfterReads = anonBytes() - before;
out.readOk = dests.every((d) => d.every((b) => b === 7));
e.close();
console.log(JSON.stringify(out));
