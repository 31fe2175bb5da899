/**
 * Canary targets that misbehave on purpose (a crash, a hang, an untyped error, a badly worded
 * message at fixed inputs), so a test can check that the harness reports each with its input.
 * Registered only when KVDRIVE_FUZZ_SELFTEST=1.
 */
import { KvdriveError } from '../../src/errors.js';
import { defineTarget, type FuzzTarget } from './harness.js';

export const selftestTargets: FuzzTarget[] = [
  defineTarget<{ i: number }>({
    name: 'selftest',
    input: (g) => ({ i: g.int(0, 3) }),
    // (the generator is seeded per input index, so which input gets which kind is fixed)
    run({ i }) {
      if (i === 0) process.kill(process.pid, 'SIGSEGV');
      if (i === 1) for (;;);
      if (i === 2) throw new TypeError('not a KvdriveError');
      throw new KvdriveError('E_RANGE', 'x: expected expected 1, got 2');
    },
  }),
];
