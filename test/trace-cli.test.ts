import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { register } from '../src/cli/synth.js';
import { openTrace } from '../src/trace/trace.js';
import { NEEDLES_TENSOR } from '../src/trace/synthetic.js';
import { expectKvdError } from './helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'kvd-cli-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function run(args: string[]): Promise<unknown> {
  const program = new Command().exitOverride();
  register(program);
  return program.parseAsync(['node', 'kvdrive', 'synth', ...args]);
}

describe('kvdrive synth', () => {
  it('writes a trace with the requested shape and the needles tensor', async () => {
    const out = join(dir, 'cli.safetensors');
    const write = vi.spyOn(process.stdout, 'write').mockImplementation(() => true);
    try {
      await run(['--out', out, '--layers', '1', '--q-heads', '4', '--kv-heads', '2', '--head-dim', '16', '--prompt', '128', '--steps', '3', '--dtype', 'bf16', '--seed', '5', '--needles', '1']);
    } finally {
      write.mockRestore();
    }
    const r = await openTrace(out);
    expect(r.meta).toEqual({ version: 1, layers: 1, qHeads: 4, kvHeads: 2, headDim: 16, promptTokens: 128, decodeSteps: 3 });
    expect(r.dtype).toBe('bf16');
    expect((await r.extra(NEEDLES_TENSOR))!.shape).toEqual([1, 5]);
    await r.close();
  });

  it('rejects bad flags with E_CONFIG', async () => {
    const out = join(dir, 'bad.safetensors');
    await expectKvdError(() => run(['--out', out, '--prompt', 'lots']), 'E_CONFIG', /--prompt: expected a number, got "lots"/);
    await expectKvdError(() => run(['--out', out, '--dtype', 'f8']), 'E_CONFIG', /dtype.*got dtype="f8"/);
    await expectKvdError(() => run(['--out', out, '--q-heads', '6', '--kv-heads', '4']), 'E_CONFIG', /multiple of kvHeads; got qHeads=6/);
  });
});
