import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { attendDense } from '../src/attention/kernels.js';
import { randn } from './helpers.js';

/** CPUs of a Cpus_allowed_list such as "0-3,6". */
function cpuList(s: string): number[] {
  const out: number[] = [];
  for (const part of s.trim().split(',')) {
    const [a, b] = part.split('-').map(Number);
    for (let c = a!; c <= (b ?? a)!; c++) out.push(c);
  }
  return out;
}

const allowed = (statusPath: string) => cpuList(/Cpus_allowed_list:\s*(\S+)/.exec(readFileSync(statusPath, 'utf8'))![1]!);
/** The CPU a thread last ran on (field 39 of its stat). */
function lastCpu(statPath: string): number {
  const s = readFileSync(statPath, 'utf8');
  return Number(s.slice(s.lastIndexOf(')') + 2).split(' ')[36]);
}
const poolThreads = () =>
  readdirSync('/proc/self/task').filter((t) => {
    try {
      return readFileSync(`/proc/self/task/${t}/comm`, 'utf8').trim() === 'kvd-pool';
    } catch {
      return false;
    }
  });

describe('the native thread pool keeps off its caller\'s CPU', () => {
  const cpus = allowed('/proc/self/status');
  it('starts one named thread per allowed CPU but the caller\'s', () => {
    expect(poolThreads().length).toBe(Math.min(cpus.length, 64) - 1);
  });

  it.skipIf(cpus.length < 2)('after a parallel call, every pool thread may run on each of the process\'s CPUs except the caller\'s', () => {
    const qHeads = 8, kvHeads = 2, dim = 64, tokens = 4096;
    const t = (seed: number) => ({ data: randn(tokens * kvHeads * dim, seed), dtype: 'f32' as const, tokens, heads: kvHeads, dim });
    const k = t(1), v = t(2), q = randn(qHeads * dim, 3);
    const one = attendDense({ q, qHeads, k, v, threads: 1 }).out;
    // The JS thread may migrate around the call: retry until it ran on one CPU before and after.
    for (let attempt = 0; attempt < 20; attempt++) {
      const before = lastCpu('/proc/thread-self/stat');
      const two = attendDense({ q, qHeads, k, v, threads: 2 }).out;
      const after = lastCpu('/proc/thread-self/stat');
      expect(Buffer.from(two.buffer).equals(Buffer.from(one.buffer))).toBe(true);
      if (before !== after) continue;
      const pool = poolThreads();
      expect(pool.length).toBe(Math.min(cpus.length, 64) - 1);
      for (const p of pool) expect(allowed(`/proc/self/task/${p}/status`)).toEqual(cpus.filter((c) => c !== before));
      return;
    }
    throw new Error('the JS thread migrated around every one of 20 calls');
  });
});
