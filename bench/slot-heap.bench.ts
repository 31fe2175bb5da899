/**
 * The DRAM tier's eviction heap (src/storage/slot-heap.ts) under the load one layer-step of the
 * held-out storage demo puts on it, with the cache as cold as a decode step leaves it, against the
 * same load on another build's SlotHeap (`--before DIST`: that tree's dist/, built) in the same run.
 *
 * One iteration: 3,000 score refreshes of distinct random resident slots (the attention mass of the
 * chunks a step read from the DRAM tier: mostly small increases, some decreases; `refresh`, the
 * native pass) and 110 admissions into a full tier (peek the least important slot, remove it,
 * insert the newcomer: the SSD chunks a step admits), over a heap of 170,000 slots (a 332 MiB DRAM
 * tier of 2 KiB chunks). Before each iteration 64 MiB of other memory is read and written (not
 * timed), as the step's attention does to the heap's lines. Each build's heap gets the same
 * operations from the same seed.
 *
 *   npm run build:ts && node dist/bench/slot-heap.bench.js [--before DIST] [--time MS]
 */
import { Bench } from 'tinybench';
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';
import { SlotHeap } from '../src/storage/slot-heap.js';
import { xorshift } from './bench-util.js';

function arg(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

const CAPACITY = 170_000;
const REFRESHES = 3_000;
const ADMISSIONS = 110;
const FLUSH = new Int32Array((64 << 20) / 4);

type HeapLike = Pick<SlotHeap, 'insert' | 'remove' | 'peek' | 'refresh' | 'scoreOf'>;

/** A full heap and the step load on it: every call of `step` runs one iteration. */
function workload(make: (n: number) => HeapLike, seed: number) {
  const next = xorshift(seed);
  const r = () => next() / 2 ** 32; // uniform in [0, 1)
  const heap = make(CAPACITY);
  for (let s = 0; s < CAPACITY; s++) heap.insert(s, r());
  const slots = new Int32Array(REFRESHES);
  const entries = Int32Array.from({ length: REFRESHES }, (_, k) => k);
  const scores = new Float32Array(REFRESHES);
  const picked = new Uint8Array(CAPACITY);
  let round = 0;
  return {
    prepare() {
      // Distinct slots; nine in ten scores rise a little (lazy increases), one in ten drops.
      picked.fill(0);
      for (let k = 0; k < REFRESHES; k++) {
        let s = Math.floor(r() * CAPACITY);
        while (picked[s]) s = (s + 1) % CAPACITY;
        picked[s] = 1;
        slots[k] = s;
        const old = heap.scoreOf(s);
        scores[k] = r() < 0.9 ? old + r() * 0.01 : old * r();
      }
      for (let i = 0; i < FLUSH.length; i += 16) FLUSH[i]!++;
    },
    step() {
      heap.refresh(slots, entries, scores);
      round++;
      for (let j = 0; j < ADMISSIONS; j++) {
        const victim = heap.peek();
        heap.remove(victim);
        heap.insert(victim, r() + round * 1e-3);
      }
    },
  };
}

const heaps: { name: string; make: (n: number) => HeapLike }[] = [{ name: 'this build', make: (n) => new SlotHeap(n) }];
const before = arg('before');
if (before) {
  const mod = (await import(pathToFileURL(resolve(before, 'src/storage/slot-heap.js')).href)) as { SlotHeap: new (n: number) => HeapLike };
  heaps.push({ name: `before (${before})`, make: (n) => new mod.SlotHeap(n) });
}

const bench = new Bench({ time: Number(arg('time') ?? 2000), warmupTime: 200 });
for (const h of heaps) {
  const w = workload(h.make, 7);
  bench.add(h.name, () => w.step(), { beforeEach: () => w.prepare() });
}
await bench.run();

const rows = bench.tasks.map((t) => {
  const res = t.result as { state?: string; error?: Error; latency?: { p50?: number; min?: number } } | undefined;
  if (res?.state !== 'completed') throw new Error(`${t.name}: ${res?.state}: ${res?.error?.stack}`);
  return { name: t.name, p50: res?.latency?.p50 ?? NaN, min: res?.latency?.min ?? NaN };
});
const base = rows[1];
console.log(`SlotHeap, ${CAPACITY} slots, per iteration: ${REFRESHES} refreshes + ${ADMISSIONS} evict-and-insert, 64 MiB touched before each`);
console.log('heap'.padEnd(40), 'p50 ms'.padStart(9), 'min ms'.padStart(9), base ? 'p50 before / this' : '');
for (const r of rows)
  console.log(r.name.padEnd(40), r.p50.toFixed(4).padStart(9), r.min.toFixed(4).padStart(9), base ? (base.p50 / r.p50).toFixed(2).padStart(12) : '');
