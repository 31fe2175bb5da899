// In a file of its own: it restricts every thread of this test process to one CPU (vitest runs each
// test file in a process of its own).
import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { attendDense } from '../src/attention/kernels.js';
import { randn } from './helpers.js';
import { allowedCpus, poolThreads } from './threads.js';

describe('the native thread pool keeps a host\'s later CPU restriction', () => {
  const pool = poolThreads();
  const haveTaskset = spawnSync('taskset', ['--version']).status === 0;
  // Wake placement runs in pools of 1-4 threads (native/common/thread_pool.h, kMaxPlacedThreads).
  it.skipIf(pool.length < 1 || pool.length > 4 || !haveTaskset)('after `taskset -a` narrows the process to one CPU, no wake-up widens a pool thread past it', async () => {
    const qHeads = 8, kvHeads = 2, dim = 64, tokens = 16384;
    const t = (seed: number) => ({ data: randn(tokens * kvHeads * dim, seed), dtype: 'f32' as const, tokens, heads: kvHeads, dim });
    const k = t(1), v = t(2), q = randn(qHeads * dim, 3);
    const want = attendDense({ q, qHeads, k, v, threads: 1 }).out;
    const call = async () => {
      await new Promise((r) => setTimeout(r, 3)); // the pool's threads go back to sleep
      const got = attendDense({ q, qHeads, k, v, threads: 2 }).out;
      expect(Buffer.from(got.buffer).equals(Buffer.from(want.buffer))).toBe(true);
    };
    for (let i = 0; i < 3; i++) await call(); // placements happen (narrowed, widened)
    const one = allowedCpus()[0]!;
    expect(spawnSync('taskset', ['-a', '-p', '-c', String(one), String(process.pid)]).status).toBe(0);
    for (let i = 0; i < 5; i++) await call();
    for (const p of pool) expect(allowedCpus(p)).toEqual([one]);
  });
});
