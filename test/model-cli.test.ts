import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { register } from '../src/cli/generate.js';
import { expectKvdError, fixturesDir, ioBufferBytes } from './helpers.js';
import { tmpDir } from './model-helpers.js';

/** Runs `kvdrive generate <args>` in-process; returns what it wrote to stdout and stderr. */
async function run(args: string[]): Promise<{ out: string; err: string }> {
  const program = new Command().exitOverride();
  register(program);
  let out = '';
  let err = '';
  vi.spyOn(process.stdout, 'write').mockImplementation((s) => ((out += String(s)), true));
  vi.spyOn(process.stderr, 'write').mockImplementation((s) => ((err += String(s)), true));
  try {
    await program.parseAsync(['node', 'kvdrive', 'generate', ...args]);
  } finally {
    vi.restoreAllMocks();
  }
  return { out, err };
}

afterEach(() => vi.restoreAllMocks());

describe('kvdrive generate', () => {
  const files = (): string[] | undefined => {
    const fx = fixturesDir();
    return fx ? ['--model', join(fx, 'stories260K', 'stories260K.bin'), '--tokenizer', join(fx, 'stories260K', 'tok512.bin')] : undefined;
  };

  it('prints the greedy story, then tokens/s; --budget is noted for an explicit dense backend', async (ctx) => {
    const f = files();
    if (!f) return ctx.skip();
    const { out, err } = await run([...f, '--steps', '30', '--temperature', '0', '--backend', 'dense', '--budget', '64']);
    expect(out.startsWith('Once upon a time, there was a little girl named Lily.')).toBe(true);
    expect(err).toMatch(/achieved tok\/s: \d+(\.\d+)? \(30 positions in [\d.]+ ms, backend dense/);
    expect(err).toMatch(/--budget 64 applies to the kvdrive sparse backend/);
    expect(err).not.toMatch(/runtime \(/);
  });

  it('--budget selects the kvdrive backend (the runtime; any --policy) and prints its cost and tier traffic', async (ctx) => {
    const f = files();
    if (!f) return ctx.skip();
    const dense = await run([...f, '--steps', '40', '--temperature', '0']);
    expect(dense.err).toMatch(/backend dense/);
    for (const policy of ['kvdrive', 'quest', 'shadowkv']) {
      const { out, err } = await run([...f, '--steps', '40', '--temperature', '0', '--budget', '512', '--policy', policy]);
      // A budget covering the whole context reproduces dense attention, hence the same greedy story.
      expect(out).toBe(dense.out);
      expect(err).toMatch(/backend kvdrive, stopped by steps/);
      expect(err).toMatch(new RegExp(`runtime \\(sequential, policy ${policy}, budget 512\\): over 200 layer-steps selection [\\d.]+ ms, fetch [\\d.]+ ms, compute [\\d.]+ ms; \\d+ chunks selected`));
    }
    // A small budget (beyond the 64-token local window: 40 positions never leave it, so use 120):
    // per layer-step and kv head (stories260K: 4) at most floor(8 / 4) + 2 chunks of 4 tokens.
    const small = await run([...f, '--steps', '120', '--temperature', '0', '--budget', '8']);
    expect(small.out.length).toBeGreaterThan(0);
    const m = /over (\d+) layer-steps .* (\d+) chunks selected/.exec(small.err);
    expect(Number(m?.[1])).toBe(600);
    expect(Number(m?.[2])).toBeGreaterThan(0);
    expect(Number(m?.[2])).toBeLessThanOrEqual(600 * 4 * 4);
  });

  it('--storage / --dram-budget / --seal-tokens / --mode: decoded tokens are sealed and read back from SSD; the dense greedy story, both modes', async (ctx) => {
    const f = files();
    if (!f) return ctx.skip();
    const steps = ['--steps', '200', '--temperature', '0'];
    const dense = await run([...f, ...steps]);
    // DRAM budgets leaving the DRAM tier about 50 KB beside the fixed parts (tails, index reserve, fetch
    // buffers: 465 / 871 KB; and the SSD store's I/O engine reserve), a fraction of the ~160 KB sealed.
    for (const [mode, dram] of [['sequential', 620000], ['pipelined', 1000000]] as const) {
      const { out, err } = await run([...f, ...steps, '--budget', '256', '--storage', tmpDir(), '--dram-budget', String(dram + ioBufferBytes({}, mode)), '--seal-tokens', '32', '--mode', mode]);
      expect(out, mode).toBe(dense.out);
      const m = /SSD (\d+), tail \d+; sealed (\d+) of/.exec(err);
      expect(Number(m?.[1]), mode).toBeGreaterThan(0);
      expect(Number(m?.[2]), mode).toBeGreaterThan(0);
    }
  });

  it('writes a trace with --trace-out / --trace-prompt', async (ctx) => {
    const f = files();
    if (!f) return ctx.skip();
    const path = join(tmpDir(), 'cli.safetensors');
    const { err } = await run([...f, '--steps', '16', '--temperature', '0', '--trace-out', path, '--trace-prompt', '10']);
    expect(existsSync(path)).toBe(true);
    expect(err).toMatch(/10 prompt tokens, 6 decode steps/);
  });

  it('validates options with typed errors', async (ctx) => {
    const f = files() ?? ['--model', '/nonexistent/m.bin', '--tokenizer', '/nonexistent/t.bin'];
    await expectKvdError(() => run([...f, '--budget', '0']), 'E_BUDGET', /option --budget: expected an integer ≥ 1, got "0"/);
    await expectKvdError(() => run([...f, '--budget', '2.5']), 'E_BUDGET', /got "2.5"/);
    await expectKvdError(() => run([...f, '--steps', 'ten']), 'E_CONFIG', /option --steps: expected an integer ≥ 1, got "ten"/);
    await expectKvdError(() => run([...f, '--temperature', '-0.5']), 'E_CONFIG', /option --temperature: expected a number in \[0, ∞\]/);
    await expectKvdError(() => run([...f, '--top-p', '1.1']), 'E_CONFIG', /option --top-p: expected a number in \[0, 1\]/);
    await expectKvdError(() => run(['--model', '/nonexistent/m.bin', '--tokenizer', '/nonexistent/t.bin']), 'E_NOT_FOUND', /checkpoint not found/);
    if (!files()) return ctx.skip();
    await expectKvdError(() => run([...f, '--backend', 'nope']), 'E_CONFIG', /attention backend: expected one of dense, kvdrive, runtime, got "nope"/);
    await expectKvdError(() => run([...f, '--backend', 'kvdrive']), 'E_BUDGET', /attention backend options\.budget: expected an integer >= 1 \(tokens per kv head\), got undefined/);
    await expectKvdError(() => run([...f, '--budget', '16', '--policy', 'lru']), 'E_POLICY', /option --policy: expected one of kvdrive, quest, shadowkv, got "lru"/);
    await expectKvdError(() => run([...f, '--policy', 'quest']), 'E_CONFIG', /option --policy: expected the kvdrive backend \(give --budget\)/);
    await expectKvdError(() => run([...f, '--trace-prompt', '3']), 'E_CONFIG', /--trace-prompt: expected to be given together with --trace-out/);
    // The trace is written after the generation: where it goes is checked before.
    await expectKvdError(() => run([...f, '--trace-out', tmpdir()]), 'E_CONFIG', /option --trace-out: expected a file to write, got the directory/);
    await expectKvdError(() => run([...f, '--trace-out', join(tmpdir(), 'kvd-missing-dir', 't.safetensors')]), 'E_NOT_FOUND', /option --trace-out: expected an existing directory to write/);
  });
});
