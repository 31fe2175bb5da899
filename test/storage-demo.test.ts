/** `kvdrive demo --storage`: decode through the runtime memory model (DRAM+SSD) and DRAM-only in one run (src/cli/demo-runtime.ts). */
import { readdirSync } from 'node:fs';
import { Command } from 'commander';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { register } from '../src/cli/demo.js';
import { expectKvdError } from './helpers.js';
import { removeTempDirs, tempDir } from './storage-kv.js';

afterAll(removeTempDirs);

/** Runs `kvdrive demo` with `args` after the small workload of these tests (`base`); returns stdout. */
async function run(args: string[], base = ['--context', '1024', '--layers', '1', '--steps', '3', '--budget', '64', '--policy', 'kvdrive']): Promise<string> {
  const program = new Command().exitOverride();
  register(program);
  let out = '';
  const write = vi.spyOn(process.stdout, 'write').mockImplementation((s) => ((out += String(s)), true));
  const err = vi.spyOn(process.stderr, 'write').mockImplementation(() => true);
  try {
    await program.parseAsync(['node', 'kvdrive', 'demo', ...base, ...args]);
  } finally {
    write.mockRestore();
    err.mockRestore();
  }
  return out;
}

describe('kvdrive demo --storage', () => {
  it('streams layers in, reports bytes per tier per step, peak RSS against the budget and the DRAM+SSD / DRAM-only ratio, with identical outputs', async () => {
    const dir = tempDir('demo');
    // 90 MiB: the I/O engine's reserve (66 MiB with the store's default io_uring options) + 24 MiB.
    const r = JSON.parse(await run(['--layers', '2', '--storage', dir, '--dram-budget', '90MiB', '--json'])) as {
      tiers: {
        kvBytes: number;
        identical: boolean;
        ratio: number;
        chunkBytes: number;
        steps: Array<{ hotChunks: number; dramChunks: number; ssdChunks: number; tailChunks: number }>;
        memory: { within: boolean; budgetBytes: number; measuredBytes: number; overhead: Array<{ what: string; bytes: number }> };
        memoryStats: { plan: { dramBudgetBytes: number; dramTierBytes: number }; sealedTokens: number };
      };
      offloaded: { recall: number; oracleRecall: number };
      policies: Array<{ policy: string; recall: number }>;
      runtime: Array<{ mode: string; eval: { recall: number; oracleRecall: number } }>;
    };
    // The runtime's own attended tokens give the recall kvdrive eval --offloaded reports on the trace.
    expect(r.offloaded.recall).toBeGreaterThan(0);
    expect(r.offloaded.recall).toBeLessThanOrEqual(r.offloaded.oracleRecall + 1e-6);
    expect(r.policies).toEqual([]); // kvdrive runs through the runtime
    expect(r.runtime.map((x) => x.mode)).toEqual(['sequential', 'pipelined']);
    for (const x of r.runtime) expect(x.eval.recall).toBe(r.offloaded.recall);
    const t = r.tiers;
    expect(t.kvBytes).toBe(2 * 1024 * 8 * 128 * 2 * 2);
    expect(t.memoryStats.plan.dramBudgetBytes).toBe(90 * 2 ** 20);
    expect(t.identical).toBe(true);
    expect(t.ratio).toBeGreaterThan(0);
    expect(t.steps).toHaveLength(3);
    // Every selected chunk came from one place; the prompt was sealed (1024 - 64 local, whole chunks).
    for (const s of t.steps) expect(s.dramChunks + s.ssdChunks + s.tailChunks).toBeGreaterThan(0);
    // The hot tier (default window 2) serves the chunks it kept from the step before.
    expect(t.steps.slice(1).every((s) => s.hotChunks > 0)).toBe(true);
    expect(t.memoryStats.sealedTokens).toBe(2 * 960);
    // The process's real memory is read and compared (the figures, not a constant).
    expect(t.memory.budgetBytes).toBe(90 * 2 ** 20);
    expect(t.memory.measuredBytes).toBeGreaterThan(t.memory.overhead[0]!.bytes);
    // Segments are deleted afterwards; the store's manifest and (empty) lock file stay.
    expect(readdirSync(dir).sort()).toEqual(['LOCK', 'manifest.json']);
    const text = await run(['--storage', dir, '--tiers-only', '--hot-windows', '0', '--obs-window', '0']);
    expect(text).toMatch(/hot tier 0 B \(window x0\)/);
    expect(text).toMatch(/no observation window \(the DRAM tier fills in chunk order\)/);
    expect(await run(['--storage', dir, '--tiers-only', '--obs-window', '16'])).toMatch(/prefill given the queries of the prompt's last 16 positions/);
    expect(text).toMatch(/DRAM\+SSD vs DRAM-only throughput .*: \d/);
    expect(text).toMatch(/bit-identical/);
    expect(text).toMatch(/peak RSS \(VmHWM\)/);
  });

  it('rejects bad storage flags with typed errors', async () => {
    const dir = tempDir('demo-bad');
    await expectKvdError(() => run(['--storage', dir, '--dram-budget', 'lots']), 'E_CONFIG', /--dram-budget/);
    await expectKvdError(() => run(['--storage', dir, '--dram-budget', '100']), 'E_BUDGET', /dramBudget/);
    await expectKvdError(() => run(['--tiers-only']), 'E_CONFIG', /--storage/);
    await expectKvdError(() => run(['--storage', dir, '--obs-window', '-1']), 'E_CONFIG', /--obs-window/);
  });
});

describe('kvdrive demo (default table)', () => {
  it('dense, kvdrive through the runtime (sequential and pipelined, per-stage times) and the quest / shadowkv policies in one table', async () => {
    const out = await run(['--json'], ['--context', '2048', '--layers', '2', '--steps', '3', '--budget', '128']);
    const r = JSON.parse(out) as {
      policies: Array<{ policy: string }>;
      attended: Array<{ policy: string; recall: number; oracleRecall: number; relError: number; steps: number; needlesTotal: number }>;
      runtime: Array<{ mode: string; wallMs: number; selectMs: number; fetchMs: number; computeMs: number; dramBudgetBytes: number; eval: { recall: number } }>;
    };
    expect(r.policies.map((p) => p.policy)).toEqual(['quest', 'shadowkv']);
    expect(r.runtime.map((x) => x.mode)).toEqual(['sequential', 'pipelined']);
    expect(r.attended.map((a) => a.policy)).toEqual(['kvdrive (runtime, sequential)', 'kvdrive (runtime, pipelined)']);
    const [seq, pip] = r.attended;
    // Scored from the tokens each runtime attended: the modes attend the same ones.
    expect(seq!.steps).toBe(2 * 3);
    expect(seq!.recall).toBeGreaterThan(0);
    expect(seq!.recall).toBeLessThanOrEqual(seq!.oracleRecall + 1e-6);
    expect(pip!.recall).toBe(seq!.recall);
    expect(pip!.relError).toBe(seq!.relError);
    for (const x of r.runtime) {
      expect(x.selectMs).toBeGreaterThan(0);
      expect(x.fetchMs).toBe(0); // DRAM only, no hot tier: pages read in place, nothing fetched
      expect(x.computeMs).toBeGreaterThan(0);
      expect(x.wallMs).toBeGreaterThanOrEqual(x.computeMs);
      expect(x.dramBudgetBytes).toBeGreaterThan(2 * 2 * 2048 * 8 * 128 * 2); // holds both layers' f16 KV
    }
  });
});
