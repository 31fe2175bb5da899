import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { attendDense } from '../src/attention/kernels.js';
import { randn } from './helpers.js';
import { allowedCpus, poolThreads } from './threads.js';

/** The CPU a thread last ran on (field 39 of its stat). */
function lastCpu(statPath: string): number {
  const s = readFileSync(statPath, 'utf8');
  return Number(s.slice(s.lastIndexOf(')') + 2).split(' ')[36]);
}

describe('the native thread pool wakes its threads off the caller\'s CPU', () => {
  const cpus = allowedCpus();
  it('starts one named thread per allowed CPU but the caller\'s', () => {
    expect(poolThreads().length).toBe(Math.min(cpus.length, 64) - 1);
  });

  // Pools of more than 4 threads (native/common/thread_pool.h, kMaxPlacedThreads) wake plainly.
  const placed = cpus.length >= 2 && Math.min(cpus.length, 64) - 1 <= 4;
  it.skipIf(!placed)('a woken pool thread runs on another CPU than the calling thread, and works on every CPU', async () => {
    const qHeads = 8, kvHeads = 2, dim = 64, tokens = 4096;
    const t = (seed: number) => ({ data: randn(tokens * kvHeads * dim, seed), dtype: 'f32' as const, tokens, heads: kvHeads, dim });
    const k = t(1), v = t(2), q = randn(qHeads * dim, 3);
    const one = attendDense({ q, qHeads, k, v, threads: 1 }).out;
    const pool = poolThreads();
    expect(pool.length).toBe(Math.min(cpus.length, 64) - 1);
    let calls = 0, together = 0;
    for (let attempt = 0; attempt < 60 && calls < 20; attempt++) {
      await new Promise((r) => setTimeout(r, 3)); // the pool's threads go back to sleep
      const before = lastCpu('/proc/thread-self/stat');
      const two = attendDense({ q, qHeads, k, v, threads: 2 }).out;
      const after = lastCpu('/proc/thread-self/stat');
      expect(Buffer.from(two.buffer).equals(Buffer.from(one.buffer))).toBe(true);
      if (before !== after) continue; // the JS thread moved: nothing to compare with
      // All CPUs once it claimed the job; still narrowed if the caller ran every task before it woke.
      for (const p of pool) expect([cpus, cpus.filter((c) => c !== before)]).toContainEqual(allowedCpus(p));
      calls++;
      if (pool.some((p) => lastCpu(`/proc/self/task/${p}/stat`) === before)) together++;
    }
    expect(calls).toBeGreaterThanOrEqual(10);
    // A call long enough that every pool thread claims a part of it: all of them on every CPU again.
    const T = 65536, big = (seed: number) => ({ data: randn(T * kvHeads * dim, seed), dtype: 'f32' as const, tokens: T, heads: kvHeads, dim });
    await new Promise((r) => setTimeout(r, 3));
    attendDense({ q, qHeads, k: big(4), v: big(5), threads: 2 });
    for (const p of pool) expect(allowedCpus(p)).toEqual(cpus);
    // Woken plainly, the thread was queued on the caller's CPU in ~9 calls of 10 on a 2-vCPU VM.
    expect(together).toBeLessThanOrEqual(Math.floor(calls / 5));
  });
});
