import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { HotTier } from '../src/cache/hot-tier.js';
import { measureWindows, profileTotals, profileTrace } from '../src/cache/profiler.js';
import { openTrace } from '../src/trace/trace.js';
import { parseProfile } from '../src/cache/profile-types.js';
import { parseWindowAllocation } from '../src/cache/window-solver.js';
import { register as registerProfile } from '../src/cli/profile.js';
import { register as registerSolve } from '../src/cli/solve-windows.js';
import { readJsonFile } from '../src/cli/json-file.js';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';
import { expectKvdError } from './helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'kvd-hot-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const tracePath = join(dir, 'syn.safetensors');
const small = { layers: 2, qHeads: 4, kvHeads: 2, headDim: 16, promptTokens: 768, decodeSteps: 8, seed: 4, dtype: 'f16' as const };
beforeAll(async () => {
  await generateSyntheticTrace(small).write(tracePath);
});

async function cli(args: string[]): Promise<string> {
  const program = new Command().exitOverride();
  registerProfile(program);
  registerSolve(program);
  let text = '';
  const write = vi.spyOn(process.stdout, 'write').mockImplementation((s) => {
    text += String(s);
    return true;
  });
  try {
    await program.parseAsync(['node', 'kvdrive', ...args]);
  } finally {
    write.mockRestore();
  }
  return text;
}

describe('window profiler', () => {
  it('measures transfer and resident bytes per (layer, kv head) and window', async () => {
    const trace = generateSyntheticTrace(small);
    const budget = 32;
    const p = await profileTrace(trace, { windows: [0, 1, 2, 4], budget, eviction: 'lookahead', warmup: false });
    expect(p.pairs).toHaveLength(4);
    expect(parseProfile(JSON.parse(JSON.stringify(p))).pairs).toHaveLength(4);
    const chunkSize = p.source!.chunkSize as number;
    const chunkBytes = 2 * chunkSize * 16 * 2;
    const perStep = Math.ceil(budget / chunkSize);
    for (const pair of p.pairs) {
      expect(pair.residentBytes).toEqual([0, 1, 2, 4].map((w) => w * perStep * chunkBytes));
      expect(pair.hitRate![0]).toBe(0); // window 0 keeps nothing
      // Window 0 fetches every selected chunk every step: at most the per-step need.
      expect(pair.fetchedBytesPerStep[0]).toBeLessThanOrEqual(perStep * chunkBytes);
      expect(pair.fetchedBytesPerStep[0]).toBeGreaterThan(0);
      // Larger windows never fetch more here (LRU-like stacks on a drifting working set).
      expect(pair.fetchedBytesPerStep[3]).toBeLessThanOrEqual(pair.fetchedBytesPerStep[0]!);
    }
    const totals = profileTotals(p);
    expect(totals[3]!.hitRate).toBeGreaterThan(totals[1]!.hitRate - 1e-9);
  });

  it('rejects invalid profiler options', async () => {
    const trace = generateSyntheticTrace(small);
    await expectKvdError(() => profileTrace(trace, { windows: [2, 1] }), 'E_CONFIG', /ascending unique/);
    await expectKvdError(() => profileTrace(trace, { budget: 0 }), 'E_CONFIG', /budget/);
    await expectKvdError(() => profileTrace(trace, { eviction: 'fifo' as never }), 'E_CONFIG', /eviction/);
  });
});

describe('kvdrive profile / solve-windows', () => {
  it('profiles a trace file, solves windows under a byte budget, and the hot tier accepts the result', async () => {
    const prof = join(dir, 'profile.json');
    const out = await cli(['profile', '--trace', tracePath, '--windows', '0,1,2,3', '--budget', '32', '--out', prof]);
    expect(out).toMatch(/×3/);
    const p = parseProfile(readJsonFile(prof, 'profile'));
    const min = 0;
    const max = profileTotals(p).at(-1)!.residentBytes;
    const wfile = join(dir, 'windows.json');
    const text = await cli(['solve-windows', '--profile', prof, '--budget', String(Math.floor(max / 2)), '--trace', tracePath, '--out', wfile]);
    expect(text).toMatch(/predicted transfer/);
    expect(text).toMatch(/uniform ×1/);
    const alloc = readJsonFile(wfile, 'windows');
    const windows = parseWindowAllocation(alloc, { layers: 2, kvHeads: 2 });
    expect(windows.flat().every((w) => [0, 1, 2, 3].includes(w))).toBe(true);
    expect((alloc as { totalCostBytes: number }).totalCostBytes).toBeLessThanOrEqual(Math.floor(max / 2));
    expect((alloc as { minimumBytes: number }).minimumBytes).toBe(min);
    // The real tier configured with the solved windows transfers what the solver predicted (pairs
    // are independent given the shared selections).
    const tr = await openTrace(tracePath);
    const measured = await measureWindows(tr, windows, { budget: 32 });
    await tr.close();
    const predicted = (alloc as { predictedFetchedBytesPerStep: number }).predictedFetchedBytesPerStep;
    expect(Math.abs(measured.fetchedBytesPerStep - predicted)).toBeLessThan(1e-6 * predicted + 1e-6);
    expect(measured.residentBytes).toBe((alloc as { totalCostBytes: number }).totalCostBytes);
    const t = new HotTier({ layers: 2, kvHeads: 2, headDim: 16, dtype: 'f16', chunkSize: p.source!.chunkSize as number, budget: 32, windows: alloc as never, maxBytes: 1 << 22 });
    expect(t.options.windows).toEqual(windows);
    t.destroy();
    await expectKvdError(
      () => new HotTier({ layers: 3, kvHeads: 2, headDim: 16, dtype: 'f16', chunkSize: 4, budget: 32, windows: alloc as never, maxBytes: 1 << 22 }),
      'E_SHAPE',
      /3 layers × 2 kv heads, got one for 2 × 2/,
    );
  });

  it('reports bad files, shapes, budgets and flags with typed errors', async () => {
    const prof = join(dir, 'p2.json');
    await cli(['profile', '--trace', tracePath, '--windows', '1,2', '--budget', '16', '--steps', '2', '--out', prof]);
    await expectKvdError(() => cli(['solve-windows', '--profile', join(dir, 'none.json'), '--budget', '1000']), 'E_NOT_FOUND', /none\.json/);
    const bad = join(dir, 'bad.json');
    writeFileSync(bad, '{"version": 1, "shape": ');
    await expectKvdError(() => cli(['solve-windows', '--profile', bad, '--budget', '1000']), 'E_CONFIG', /valid JSON/);
    await expectKvdError(() => cli(['solve-windows', '--profile', prof, '--budget', '10']), 'E_BUDGET', /at least \d+ bytes/);
    await expectKvdError(() => cli(['solve-windows', '--profile', prof, '--budget', 'much']), 'E_CONFIG', /byte count/);
    await expectKvdError(() => cli(['solve-windows', '--profile', prof, '--budget', '1MiB', '--method', 'fast']), 'E_CONFIG', /--method/);
    const other = join(dir, 'other.safetensors');
    await generateSyntheticTrace({ ...small, layers: 1 }).write(other);
    await expectKvdError(() => cli(['solve-windows', '--profile', prof, '--budget', '1MiB', '--trace', other]), 'E_SHAPE', /expected the shape of trace/);
    await expectKvdError(() => cli(['profile', '--trace', tracePath, '--windows', '0,x']), 'E_CONFIG', /--windows/);
    await expectKvdError(() => cli(['profile', '--trace', tracePath, '--eviction', 'fifo']), 'E_POLICY', /--eviction/);
    await expectKvdError(() => cli(['profile', '--trace', tracePath, '--budget', '0']), 'E_BUDGET', /--budget/);
    // Output paths: a directory in the way or a missing parent is a typed error naming the file, and
    // nothing is left behind (the JSON goes to a temporary file renamed into place).
    await expectKvdError(() => cli(['solve-windows', '--profile', dir, '--budget', '1MiB']), 'E_CONFIG', /expected a file, got a directory/);
    await expectKvdError(() => cli(['solve-windows', '--profile', prof, '--budget', '1MiB', '--out', dir]), 'E_CONFIG', /window allocation .*: expected a file, got a directory/);
    await expectKvdError(() => cli(['profile', '--trace', tracePath, '--windows', '1', '--budget', '16', '--steps', '1', '--out', join(dir, 'no', 'p.json')]), 'E_NOT_FOUND', /option --out: expected an existing directory to write .*p\.json into, got none at/);
    await expectKvdError(() => cli(['profile', '--trace', tracePath, '--windows', '1', '--budget', '16', '--steps', '1', '--out', dir]), 'E_CONFIG', /option --out: expected a file to write, got the directory/);
    expect(readdirSync(dir).filter((f) => f.includes('.partial-'))).toEqual([]);
    await expectKvdError(() => generateSyntheticTrace({ ...small, layers: 1 }).write(dir), 'E_CONFIG', /expected a file to write, got a directory/);
  });
});
