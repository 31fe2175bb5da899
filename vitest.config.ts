import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Points TMPDIR at one directory per run and removes it afterwards (test/global-setup.ts).
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // The machine has 2 cores; more workers only thrash.
    maxWorkers: 2,
    // The addon's test-only knobs (ioTestHooks: failWritesAfterBytes, batchBarrier) exist only in a
    // process started with this set (native/storage/extent_store.cc).
    env: { KVDRIVE_TEST_HOOKS: '1' },
  },
});
