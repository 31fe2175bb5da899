/** `kvdrive demo --storage`: decode through DRAM+SSD and DRAM-only in one run (src/eval/tiered-replay.ts). */
import { readdirSync } from 'node:fs';
import { Command } from 'commander';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { register } from '../src/cli/demo.js';
import { expectKvdError } from './helpers.js';
import { removeTempDirs, tempDir } from './storage-kv.js';

afterAll(removeTempDirs);

async function run(args: string[]): Promise<string> {
  const program = new Command().exitOverride();
  register(program);
  let out = '';
  const write = vi.spyOn(process.stdout, 'write').mockImplementation((s) => ((out += String(s)), true));
  const err = vi.spyOn(process.stderr, 'write').mockImplementation(() => true);
  try {
    await program.parseAsync(['node', 'kvdrive', 'demo', '--context', '1024', '--layers', '1', '--steps', '3', '--budget', '64', '--policy', 'kvdrive', ...args]);
  } finally {
    write.mockRestore();
    err.mockRestore();
  }
  return out;
}

describe('kvdrive demo --storage', () => {
  it('reports bytes per tier per step and the DRAM+SSD / DRAM-only ratio, with identical outputs', async () => {
    const dir = tempDir('demo');
    const r = JSON.parse(await run(['--storage', dir, '--dram-budget', '256KiB', '--json'])) as {
      tiers: { kvBytes: number; identical: boolean; ratio: number; tiered: { dramBudget: number; steps: Array<{ hotBytes: number; dramBytes: number; ssdBytes: number; prefetchedBytes: number }> }; dramOnly: { steps: Array<{ hotBytes: number; ssdBytes: number; dramBytes: number }> } };
    };
    const t = r.tiers;
    expect(t.kvBytes).toBe(1024 * 8 * 128 * 2 * 2);
    expect(t.tiered.dramBudget).toBe(256 * 1024);
    expect(t.identical).toBe(true);
    expect(t.ratio).toBeGreaterThan(0);
    expect(t.tiered.steps).toHaveLength(3);
    // 64 tokens x 8 kv heads x (K + V) x 128 x f16 = 256 KiB of selected chunks per step.
    for (const s of t.tiered.steps) expect(s.hotBytes + s.dramBytes + s.prefetchedBytes + s.ssdBytes).toBe(256 * 1024);
    for (const s of t.dramOnly.steps) expect([s.ssdBytes, s.hotBytes + s.dramBytes]).toEqual([0, 256 * 1024]);
    // The hot tier (default window 2) serves part of every step after its importance warm-up.
    expect(t.tiered.steps.every((s) => s.hotBytes > 0)).toBe(true);
    expect(t.tiered.steps.some((s) => s.ssdBytes + s.prefetchedBytes > 0)).toBe(true);
    // Segments are deleted afterwards; the store's manifest stays.
    expect(readdirSync(dir)).toEqual(['manifest.json']);
    const text = await run(['--storage', dir, '--pool', '0', '--hot-windows', '0']);
    expect(text).toMatch(/hot tier window 0/);
    expect(text).toMatch(/DRAM\+SSD vs DRAM-only throughput: \d/);
    expect(text).toMatch(/bit-identical/);
  });

  it('rejects bad storage flags with typed errors', async () => {
    const dir = tempDir('demo-bad');
    await expectKvdError(() => run(['--storage', dir, '--dram-budget', 'lots']), 'E_CONFIG', /--dram-budget/);
    await expectKvdError(() => run(['--storage', dir, '--dram-budget', '100']), 'E_BUDGET', /budgetBytes/);
    await expectKvdError(() => run(['--storage', dir, '--pool', '32']), 'E_BUDGET', /pool/);
    await expectKvdError(() => run(['--storage', dir, '--hot-windows', '-1']), 'E_CONFIG', /--hot-windows/);
  });
});
