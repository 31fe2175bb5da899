/** Shared test helpers: fixtures lookup, seeded randomness, error assertions. */
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect, vi } from 'vitest';
import { native } from '../src/native.js';
import { isKvdriveError, type ErrorCode } from '../src/errors.js';
import { mulberry32 } from '../src/model/sampler.js';
import { IoEngine, type IoEngineOptions } from '../src/storage/io-engine.js';
import { runtimeIoDefaults } from '../src/runtime/memory-runtime.js';
import { HotTier } from '../src/cache/hot-tier.js';
import { resolvePolicyOptions } from '../src/index/options.js';
import { hotTierOptionsOf, type RuntimeOptions } from '../src/runtime/runtime.js';

const here = dirname(fileURLToPath(import.meta.url));

/**
 * The shared fixtures folder: $KVDRIVE_FIXTURES, else ../shared/fixtures beside the repository.
 * Returns undefined (and prints a visible notice once) when absent, so tests can skip.
 */
export function fixturesDir(): string | undefined {
  const candidates = [process.env.KVDRIVE_FIXTURES, resolve(here, '..', '..', 'shared', 'fixtures')].filter(
    (p): p is string => !!p,
  );
  for (const c of candidates) if (existsSync(join(c, 'stories260K', 'stories260K.bin'))) return c;
  if (!warned) {
    warned = true;
    console.warn(`NOTICE: stories260K fixture not found (looked in ${candidates.join(', ')}); tests that need it are skipped`);
  }
  return undefined;
}
let warned = false;

/** Seeded PRNG for tests: the sampler's Mulberry32. */
export const rng = mulberry32;

/** Float32Array of n standard-normal-ish values. */
export function randn(n: number, seed: number): Float32Array {
  const r = rng(seed);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const u = Math.max(r(), 1e-12);
    out[i] = Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * r());
  }
  return out;
}

/** Asserts that fn throws (or rejects with) a KvdriveError of `code` whose message matches. */
export async function expectKvdError(fn: () => unknown, code: ErrorCode, message?: RegExp): Promise<void> {
  let caught: unknown;
  try {
    await fn();
  } catch (e) {
    caught = e;
  }
  expect(caught, `expected a KvdriveError ${code}, but nothing was thrown`).toBeDefined();
  if (!isKvdriveError(caught)) throw new Error(`expected KvdriveError ${code}, got ${String(caught)}`);
  expect(caught.code).toBe(code);
  if (message) expect(caught.message).toMatch(message);
}

/**
 * What an SSD store with these I/O options (default: the runtime's, runtimeIoDefaults) reserves inside a
 * runtime's dramBudget for its engine (MemoryPlan.ioBufferBytes, IoEngineInfo.bufferBytes): tests
 * giving a small budget on purpose add it, so their DRAM tier keeps the size they chose.
 */
export function ioBufferBytes(io: IoEngineOptions = {}, mode: 'sequential' | 'pipelined' = 'sequential'): number {
  const e = new IoEngine({ ...runtimeIoDefaults(mode), ...io });
  try {
    return e.info.bufferBytes;
  } finally {
    e.close();
  }
}

/**
 * Runs `fn` with native.adviseHugePages replaced by a recorder, and returns the arrays it was asked
 * to advise. Each must still be untouched (all zero) when advised: the advice only helps pages not
 * faulted in yet.
 */
export async function recordHugePageAdvice(fn: () => unknown): Promise<ArrayBufferView[]> {
  const advised: ArrayBufferView[] = [];
  const spy = vi.spyOn(native, 'adviseHugePages').mockImplementation((a: Uint8Array) => {
    expect(a.every((x) => x === 0)).toBe(true);
    advised.push(a);
    return 0;
  });
  try {
    await fn();
  } finally {
    spy.mockRestore();
  }
  return advised;
}

/**
 * Bytes the hot tier of runtime options `o` allocates (its windows' slots and metadata for
 * o.maxSequences): what the runtime's memory plan counts for it, whatever its maxBytes cap. Tests
 * that size a DRAM budget around a hot tier add this, so the DRAM tier stays as small as they mean.
 */
export function hotTierBytesOf(o: RuntimeOptions): number {
  const options = hotTierOptionsOf(o, resolvePolicyOptions(o.policy ?? 'kvdrive', o.policyOptions ?? {}).chunkSize);
  if (!options) return 0;
  // The tier the runtime would create, without its cap (a probe must not fail where the plan would).
  const probe = new HotTier({ ...options, maxBytes: 2 ** 40 });
  try {
    return probe.info().bytes;
  } finally {
    probe.destroy();
  }
}
