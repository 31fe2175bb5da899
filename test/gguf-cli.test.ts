/** `kvdrive convert`, `kvdrive random-gguf` and `kvdrive generate --model x.gguf`, run in-process. */
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Command } from 'commander';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { register as registerGenerate } from '../src/cli/generate.js';
import { register as registerConvert } from '../src/cli/convert.js';
import { register as registerRandom } from '../src/cli/random-gguf.js';
import { readGguf } from '../src/model/gguf/reader.js';
import { expectKvdError, fixturesDir, ioBufferBytes } from './helpers.js';
import { tmpDir } from './model-helpers.js';

async function run(args: string[]): Promise<{ out: string; err: string }> {
  const program = new Command().exitOverride();
  for (const r of [registerGenerate, registerConvert, registerRandom]) r(program);
  let out = '';
  let err = '';
  vi.spyOn(process.stdout, 'write').mockImplementation((s) => ((out += String(s)), true));
  vi.spyOn(process.stderr, 'write').mockImplementation((s) => ((err += String(s)), true));
  try {
    await program.parseAsync(['node', 'kvdrive', ...args]);
  } finally {
    vi.restoreAllMocks();
  }
  return { out, err };
}

afterEach(() => vi.restoreAllMocks());
const dir = tmpDir();

describe('kvdrive convert + generate on GGUF', () => {
  it('stories260K: the GGUF prints the llama2.c story, dense and sparse, with prefill and decode tok/s', async (ctx) => {
    const fx = fixturesDir();
    if (!fx) return ctx.skip();
    const bin = join(fx, 'stories260K', 'stories260K.bin');
    const tok = join(fx, 'stories260K', 'tok512.bin');
    const gguf = join(dir, 'stories.gguf');
    const c = await run(['convert', '--model', bin, '--tokenizer', tok, '--out', gguf]);
    expect(c.err).toMatch(/47 tensors/);
    expect(existsSync(gguf)).toBe(true);
    const ref = await run(['generate', '--model', bin, '--tokenizer', tok, '--steps', '60', '--temperature', '0', '--prompt', 'Tim and Sue']);
    const promptFile = join(dir, 'prompt.txt');
    writeFileSync(promptFile, 'Tim and Sue');
    const g = await run(['generate', '--model', gguf, '--steps', '60', '--temperature', '0', '--prompt-file', promptFile]);
    expect(g.out).toBe(ref.out);
    expect(g.err).toMatch(/prefill: \d+ tokens in [\d.]+ ms \([\d.]+ tok\/s\); decode: \d+ tokens in [\d.]+ ms \([\d.]+ tok\/s\); backend dense/);
    const s = await run(['generate', '--model', gguf, '--steps', '60', '--temperature', '0', '--prompt', 'Tim and Sue', '--budget', '64']);
    expect(s.out).toBe(ref.out); // the budget covers the whole context: sparse equals dense
    expect(s.err).toMatch(/backend kvdrive/);
    // Through the runtime's tiers: decoded tokens are sealed to the SSD store and read back.
    const store = join(dir, 'store');
    const t = await run(['generate', '--model', gguf, '--steps', '200', '--temperature', '0', '--prompt', 'Tim and Sue', '--budget', '256', '--storage', store, '--dram-budget', String(420000 + ioBufferBytes()), '--seal-tokens', '32']); // DRAM tier ~60 KB of ~256 KB sealed (+ the I/O engine's reserve)
    const dense = await run(['generate', '--model', bin, '--tokenizer', tok, '--steps', '200', '--temperature', '0', '--prompt', 'Tim and Sue']);
    expect(t.out).toBe(dense.out);
    expect(t.err).toMatch(/backend runtime/);
    expect(Number(/SSD (\d+)/.exec(t.err)![1])).toBeGreaterThan(0);
    await expectKvdError(() => run(['generate', '--model', gguf, '--tokenizer', tok]), 'E_CONFIG', /its tokenizer is inside/);
    await expectKvdError(() => run(['generate', '--model', bin]), 'E_CONFIG', /--tokenizer/);
  });

  it('random-gguf writes a loadable file of a named shape with fewer layers', async () => {
    const out = join(dir, 'q.gguf');
    await run(['random-gguf', '--shape', 'qwen2.5-0.5b', '--type', 'Q4_0', '--layers', '1', '--context', '128', '--out', out]);
    const f = readGguf(out);
    expect(f.metadata.get('general.architecture')).toEqual({ type: 'string', value: 'qwen2' });
    expect(f.tensorByName.get('blk.0.attn_q.weight')).toMatchObject({ type: 'Q4_0', dims: [896, 896] });
    expect(f.tensorByName.get('token_embd.weight')!.dims).toEqual([896, 151936]);
    const g = await run(['generate', '--model', out, '--steps', '4', '--temperature', '0', '--prompt', 'hello']);
    expect(g.err).toMatch(/model: qwen2, 1 layers, dim 896, 14\/2 heads × 64, vocab 151936, Q4_0/);
  });
});
