// The reference host through the runtime (backend "runtime"): with a budget covering the context
// the stories260K greedy text is the dense one in every mode and tier configuration (DRAM only,
// DRAM + SSD with a DRAM tier too small to hold the KV); decoded tokens are sealed into the tiers
// as they leave the local window; the CLI flags reach the same path.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { loadCheckpoint } from '../src/model/checkpoint.js';
import { attentionShape } from '../src/model/forward.js';
import { generate } from '../src/model/generate.js';
import { RuntimeAttention } from '../src/model/runtime-attention.js';
import { createBackend } from '../src/model/backends.js';
import { loadTokenizer } from '../src/model/tokenizer.js';
import { expectKvdError, fixturesDir, ioBufferBytes } from './helpers.js';

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), 'kvd-rt-gen-'));
  dirs.push(d);
  return d;
};

/**
 * DRAM budgets leaving the DRAM tier about a third of the KV the run seals (5 layers x 200 tokens x 256 B):
 * the fixed parts (tails, index reserve, fetch buffers — four in flight when pipelined) come first.
 */
const SMALL = { sequential: 669_000 + ioBufferBytes(), pipelined: 1_061_000 + ioBufferBytes({}, 'pipelined') }; // + the I/O engine's reserve

function stories() {
  const fx = fixturesDir();
  if (!fx) return undefined;
  const model = loadCheckpoint(join(fx, 'stories260K', 'stories260K.bin'));
  return { model, tokenizer: loadTokenizer(join(fx, 'stories260K', 'tok512.bin'), { vocabSize: model.config.vocabSize }) };
}

describe('generate through the runtime', () => {
  it('budget covering the context: the dense greedy text in every mode, DRAM only and DRAM + SSD', async (ctx) => {
    const s = stories();
    if (!s) return ctx.skip();
    const steps = 200; // leaves the 64-token local window: prompt-free decode seals tokens as it goes
    const dense = await generate({ ...s, steps, temperature: 0 });
    const shape = attentionShape(s.model.config);
    for (const mode of ['sequential', 'pipelined'] as const)
      for (const storage of [undefined, tmp()]) {
        const backend = new RuntimeAttention(shape, { budget: shape.seqLen, mode, storage, dramBudget: storage ? SMALL[mode] : undefined, sealTokens: 32 });
        const r = await generate({ ...s, steps, temperature: 0, backend });
        expect(r.text, `${mode} ${storage ? 'dram+ssd' : 'dram'}`).toBe(dense.text);
        const m = (await backend.stats())!.memory!;
        expect(m.sealedTokens).toBeGreaterThan(0);
        if (storage) expect(m.traffic.ssdChunks, `${mode}: chunks read from SSD`).toBeGreaterThan(0);
        await backend.close();
      }
  });

  it('a new sequence after reset gives the same text; bad options are typed errors', async (ctx) => {
    const s = stories();
    if (!s) return ctx.skip();
    const shape = attentionShape(s.model.config);
    const backend = createBackend('runtime', shape, { budget: 64 });
    const a = await generate({ ...s, steps: 80, temperature: 0, backend });
    const b = await generate({ ...s, steps: 80, temperature: 0, backend });
    expect(b.text).toBe(a.text);
    await backend.close?.();
    await expectKvdError(() => createBackend('runtime', shape, {}), 'E_BUDGET');
  });
});
