// `kvdrive demo --batch N --mode ...`: the runtime path of the demo prints the per-step stage
// breakdown for each mode (JSON here) and rejects bad flags.
import { Command } from 'commander';
import { describe, expect, it, vi } from 'vitest';
import { register } from '../src/cli/demo.js';
import { expectKvdError } from './helpers.js';

async function run(args: string[]): Promise<string> {
  const program = new Command().exitOverride();
  register(program);
  let out = '';
  const write = vi.spyOn(process.stdout, 'write').mockImplementation((s: string | Uint8Array) => ((out += String(s)), true));
  try {
    await program.parseAsync(['node', 'kvdrive', 'demo', ...args]);
  } finally {
    write.mockRestore();
  }
  return out;
}

describe('kvdrive demo --batch', () => {
  it('runs both modes and reports the breakdown of every layer step', async () => {
    const out = JSON.parse(await run(['--batch', '2', '--mode', 'both', '--context', '256', '--layers', '2', '--steps', '2', '--budget', '16', '--json']));
    expect(out.runs.map((r: { mode: string }) => r.mode)).toEqual(['sequential', 'pipelined']);
    for (const r of out.runs) {
      expect(r.steps.length).toBe(4); // 2 steps x 2 layers
      for (const s of r.steps) {
        expect(s.entries).toBe(2);
        expect(s.selectionMs).toBeGreaterThan(0);
        expect(s.computeMs).toBeGreaterThan(0);
        expect(s.stallMs).toBeCloseTo(Math.max(0, s.wallMs - s.computeMs), 6);
      }
      expect(r.throughput).toBeGreaterThan(0);
    }
    const text = await run(['--batch', '1', '--mode', 'pipelined', '--context', '256', '--layers', '1', '--steps', '1', '--budget', '16']);
    expect(text).toMatch(/pipelined: [\d.]+ sequence-layer steps\/s/);
    expect(text).toMatch(/step +layer +wall +selection +fetch +compute +stall/);
  });

  it('rejects bad --batch and --mode values', async () => {
    await expectKvdError(() => run(['--batch', '0']), 'E_CONFIG', /--batch/);
    await expectKvdError(() => run(['--batch', '2', '--mode', 'parallel']), 'E_CONFIG', /--mode/);
  });
});
