// The I/O engine's own memory (bounce buffers, io_uring rings): the figure the engine reports is what
// the process's anonymous resident set (RssAnon, measured in a child process) really grows by, the runtime's memory plan reserves it inside
// dramBudget (E_BUDGET when it does not fit), and the test-only knobs stay out of reach of a process
// that did not ask for them.
import { execFileSync } from 'node:child_process';
import { openSync, writeSync, closeSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { ioUringAvailable } from '../src/storage/io-engine.js';
import { native } from '../src/native.js';
import { openRuntime } from '../src/runtime/runtime.js';
import { expectKvdError, ioBufferBytes } from './helpers.js';
import { removeTempDirs, tempDir } from './storage-kv.js';

afterAll(removeTempDirs);

const MiB = 2 ** 20;
const uring = ioUringAvailable();
const kinds = ['pread', ...(uring.usable ? ['uring'] : [])] as const;
const SLOT = (1 << 20) + 2 * 4096; // maxIoBytes 1 MiB + 2 x 4 KiB alignment room

/**
 * Stated tolerance of the resident-set comparisons: 2 MiB + 2% of the figure (the engine's thread
 * stacks and malloc arenas, page-table granularity; measured ~0.1-0.3 MB over in a quiet child).
 */
const tolerance = (bytes: number) => 2 * MiB + 0.02 * bytes;

/**
 * A file of `bytes` bytes, written 64 KiB at a time: a buffer of the whole size would be garbage
 * whose pages the GC may hand back between two VmRSS readings, hiding what the engine added.
 */
function dataFile(bytes: number): string {
  const path = join(tempDir('io-mem'), 'data.bin');
  const fd = openSync(path, 'w');
  const block = new Uint8Array(64 * 1024).fill(7);
  for (let at = 0; at < bytes; at += block.length) writeSync(fd, block, 0, Math.min(block.length, bytes - at));
  closeSync(fd);
  return path;
}

describe.each(kinds)('I/O engine %s: reported buffer memory against the resident set', (kind) => {
  it('bufferBytes is fixed by the options, and anonymous resident memory grows by what stats() says is allocated', () => {
    const path = dataFile(4 * MiB);
    const child = new URL('./storage-io-memory-child.mjs', import.meta.url);
    const out = JSON.parse(execFileSync(process.execPath, ['--expose-gc', fileURLToPath(child), kind, path], { encoding: 'utf8' })) as {
      info: number;
      made: number;
      grownAtOpen: number;
      allocated: number;
      peakBatches: number;
      grownAfterReads: number;
      readOk: boolean;
    };
    if (kind === 'pread') {
      expect(out.info).toBe(8 * SLOT);
    } else {
      // 3 rings x (2 x 8 slots + the ring's SQ/CQ and SQE mappings, a few KiB at depth 8)
      expect(out.info).toBeGreaterThan(3 * 16 * SLOT);
      expect(out.info).toBeLessThan(3 * (16 * SLOT + 64 * 1024));
    }
    // Created: pread's slots, io_uring's first ring.
    expect(out.made).toBe(kind === 'pread' ? out.info : out.info / 3);
    expect(Math.abs(out.grownAtOpen - out.made), `RssAnon grew ${out.grownAtOpen} B at open, engine reports ${out.made} B`).toBeLessThanOrEqual(tolerance(out.made));
    // After three concurrent reads every buffer the options allow exists, and no more.
    expect(out.readOk).toBe(true);
    expect(out.allocated).toBe(out.info);
    if (kind === 'uring') expect(out.peakBatches).toBe(3);
    expect(Math.abs(out.grownAfterReads - out.info), `RssAnon grew ${out.grownAfterReads} B, engine reports at most ${out.info} B`).toBeLessThanOrEqual(tolerance(out.info));
  });
});

describe('the memory plan reserves the I/O engine inside dramBudget', () => {
  const shape = { layers: 2, qHeads: 4, kvHeads: 2, headDim: 32 };
  const base = { shape, budget: 16, maxSequences: 1, maxTokens: 512 };

  it('plan.ioBufferBytes is the store engine figure, counted in the itemised budget', async () => {
    for (const io of [{}, { queueDepth: 4, maxBatches: 1 }, { kind: 'pread' as const, threads: 2 }]) {
      const want = ioBufferBytes(io);
      const rt = await openRuntime({ ...base, dramBudget: 8 * MiB + want, ssd: { dir: tempDir('io-plan'), io } });
      try {
        const p = (await rt.stats()).memory.plan;
        expect(p.ioBufferBytes).toBe(want);
        expect(p.residentBytes + p.indexBytes + p.hotTierBytes + p.fetchBytes + p.selectArenaBytes + p.ioBufferBytes + p.dramTierBytes).toBe(p.dramBudgetBytes);
      } finally {
        await rt.close();
      }
    }
    const dramOnly = await openRuntime({ ...base, dramBudget: 8 * MiB });
    expect((await dramOnly.stats()).memory.plan.ioBufferBytes).toBe(0);
    await dramOnly.close();
  });

  it('a budget that cannot hold the engine buffers is E_BUDGET naming them', async () => {
    // io_uring: 8 rings x 2 x 16 slots of 1 MiB + 8 KiB (258 MiB); only the first ring exists at
    // open, yet the plan reserves all of them. pread: 64 slots (64.5 MiB).
    const io = uring.usable ? { queueDepth: 16, maxBatches: 8, maxIoBytes: 1 << 20 } : { kind: 'pread' as const, threads: 64, maxIoBytes: 1 << 20 };
    const need = ioBufferBytes(io);
    expect(need).toBeGreaterThan(64 * MiB);
    await expectKvdError(() => openRuntime({ ...base, dramBudget: 64 * MiB, ssd: { dir: tempDir('io-plan'), io } }), 'E_BUDGET', new RegExp(`I/O engine buffers ${need}\\b`));
    const rt = await openRuntime({ ...base, dramBudget: 8 * MiB + need, ssd: { dir: tempDir('io-plan'), io } });
    await rt.close();
  });
});

describe('ioTestHooks: only in a process started with KVDRIVE_TEST_HOOKS=1', () => {
  it('a process without it gets a typed error saying how to enable the hooks, and the knobs stay off', () => {
    const nativeJs = new URL('../dist/src/native.js', import.meta.url).href;
    const script = `import(${JSON.stringify(nativeJs)}).then(({ native }) => {
      try { native.ioTestHooks({ batchBarrier: 2 }); console.log(JSON.stringify({ ok: true })); }
      catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); }
    });`;
    const env = { ...process.env };
    delete env.KVDRIVE_TEST_HOOKS;
    const out = JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', script], { env, encoding: 'utf8' })) as { code?: string; message?: string };
    expect(out.code).toBe('E_CONFIG');
    expect(out.message).toMatch(/ioTestHooks: expected a process started with KVDRIVE_TEST_HOOKS=1 .*, got it unset/);
    // This process (vitest.config.ts sets the variable) has them.
    expect(native.ioTestHooks({}).failWritesAfterBytes).toBe(-1);
  });
});
