/**
 * Concurrent callers on one I/O engine (native/storage/io_engine.cc): K batches of N/K random reads
 * issued at once (Promise.all: what K pipelined entries, or K streamed head groups, do) against the
 * same N reads as one batch, with this tree's engine and, with --before DIST, another build's, the
 * two alternated in one process. Reports median wall and process CPU per round.
 *
 *   node dist/bench/io-batches.js [--before /work/main/dist] [--file PATH] [--reads 200]
 *        [--callers 4] [--bytes 8192] [--kind uring] [--queue-depth 32] [--rounds 21]
 *
 * PATH (default: a 512 MiB file of random bytes written to the temp dir, deleted afterwards) is
 * read with O_DIRECT, so the page cache does not serve repeats.
 */
import { randomFillSync } from 'node:crypto';
import { closeSync, mkdtempSync, openSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { IoEngine } from '../src/storage/io-engine.js';

const { values: a } = parseArgs({
  options: {
    before: { type: 'string' },
    file: { type: 'string' },
    reads: { type: 'string', default: '200' },
    callers: { type: 'string', default: '4' },
    bytes: { type: 'string', default: '8192' },
    kind: { type: 'string', default: 'uring' },
    'queue-depth': { type: 'string', default: '32' },
    rounds: { type: 'string', default: '21' },
  },
});
const N = Number(a.reads), K = Number(a.callers), LEN = Number(a.bytes), ROUNDS = Number(a.rounds);
if (!(N > 0 && K > 0 && N % K === 0 && LEN > 0 && LEN % 4096 === 0)) throw new Error('--reads must be a multiple of --callers; --bytes a multiple of 4096');

let dir: string | undefined;
let path = a.file;
const FILE_BYTES = 512 << 20;
if (!path) {
  dir = mkdtempSync(join(tmpdir(), 'kvd-io-batches-'));
  path = join(dir, 'data.bin');
  const fd = openSync(path, 'w');
  const block = new Uint8Array(16 << 20);
  for (let at = 0; at < FILE_BYTES; at += block.length) writeSync(fd, randomFillSync(block));
  closeSync(fd);
}

type Ctor = typeof IoEngine;
const trees: Array<{ name: string; Engine: Ctor }> = [{ name: 'this tree', Engine: IoEngine }];
if (a.before) {
  const mod = (await import(resolve(a.before, 'src/storage/io-engine.js'))) as { IoEngine: Ctor };
  trees.push({ name: `before (${a.before})`, Engine: mod.IoEngine });
}
const engines = trees.map((t) => {
  const e = new t.Engine({ kind: a.kind as 'uring', queueDepth: Number(a['queue-depth']) });
  return { ...t, e, file: e.open(path!, true).file, samples: { one: [] as number[][], concurrent: [] as number[][] } };
});
const dests = Array.from({ length: K }, () => new Uint8Array((N / K) * LEN));
const oneDest = new Uint8Array(N * LEN);
const batch = (file: number, n: number) => {
  const files = new Int32Array(n).fill(file);
  const offsets = new Float64Array(n);
  const lengths = new Float64Array(n).fill(LEN);
  const destOffsets = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    offsets[i] = Math.floor(Math.random() * ((FILE_BYTES - LEN) / 4096)) * 4096;
    destOffsets[i] = i * LEN;
  }
  return { files, offsets, lengths, destOffsets };
};
try {
  for (let r = 0; r < ROUNDS; r++)
    for (const t of r % 2 ? [...engines].reverse() : engines)
      for (const mode of ['one', 'concurrent'] as const) {
        const reqs = mode === 'one' ? [{ ...batch(t.file, N), dest: oneDest }] : dests.map((dest) => ({ ...batch(t.file, N / K), dest }));
        const c0 = process.cpuUsage();
        const w0 = performance.now();
        await Promise.all(reqs.map((q) => t.e.readArrays(q)));
        const c = process.cpuUsage(c0);
        t.samples[mode].push([performance.now() - w0, (c.user + c.system) / 1000]);
      }
  const med = (v: number[]) => v.slice().sort((x, y) => x - y)[v.length >> 1]!;
  console.log(`${N} random ${LEN}-byte O_DIRECT reads of ${path}, engine ${engines[0]!.e.info.kind}, queue depth ${a['queue-depth']}, ${ROUNDS} rounds (medians)`);
  for (const t of engines)
    for (const mode of ['one', 'concurrent'] as const) {
      const s = t.samples[mode];
      const what = mode === 'one' ? 'one batch' : `${K} callers x ${N / K}`;
      console.log(`${t.name.padEnd(32)} ${what.padEnd(16)} wall ${med(s.map((x) => x[0]!)).toFixed(2)} ms  CPU ${med(s.map((x) => x[1]!)).toFixed(2)} ms`);
    }
  const mine = engines[0]!.e.stats().peakBatches;
  console.log(`this tree's engine: at most ${mine} batches in flight at once`);
} finally {
  for (const t of engines) t.e.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
}
