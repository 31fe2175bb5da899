/**
 * Registry of attention backends by name, for `kvdrive generate --backend` and other callers that
 * pick a backend from configuration: "dense" (the TS reference), "kvdrive" (the sparse backend over
 * the host's cache, src/model/kvdrive-attention.ts) and "runtime" (the runtime with its memory model
 * and tiers, src/model/runtime-attention.ts); both sparse ones need a budget.
 */
import { KvdriveError, fail } from '../errors.js';
import type { AttentionBackend, AttentionShape, BackendFactory, BackendOptions } from './attention-backend.js';
import { DenseTsAttention } from './dense-attention.js';
import { KvdriveAttention } from './kvdrive-attention.js';
import { RuntimeAttention } from './runtime-attention.js';

/** Builds the kvdrive sparse backend; its options are validated by KvdriveAttention (E_BUDGET without a budget). */
function kvdriveFactory(shape: AttentionShape, options: BackendOptions): AttentionBackend {
  // budget may be missing here: the constructor's validation turns that into E_BUDGET.
  return new KvdriveAttention(shape, { budget: options.budget as number, policy: options.policy, policyOptions: options.policyOptions });
}

/** Builds the runtime backend (memory model: tiers, modes); E_BUDGET without a budget. */
function runtimeFactory(shape: AttentionShape, o: BackendOptions): AttentionBackend {
  return new RuntimeAttention(shape, { budget: o.budget as number, policy: o.policy, policyOptions: o.policyOptions, mode: o.mode, storage: o.storage, dramBudget: o.dramBudget });
}

const factories = new Map<string, BackendFactory>([
  ['dense', (shape) => new DenseTsAttention(shape)],
  ['kvdrive', kvdriveFactory],
  ['runtime', runtimeFactory],
]);

/** Registers a backend under a name (used by `kvdrive generate --backend`). */
export function registerBackend(name: string, factory: BackendFactory): void {
  if (typeof name !== 'string' || name.length === 0) fail('E_CONFIG', 'attention backend name', 'a non-empty string', name);
  if (typeof factory !== 'function') fail('E_CONFIG', `attention backend "${name}" factory`, 'a function (shape, options) => AttentionBackend', factory);
  if (factories.has(name)) throw new KvdriveError('E_CONFIG', `attention backend "${name}" is already registered`);
  factories.set(name, factory);
}

/** Names of the registered backends. */
export function backendNames(): string[] {
  return [...factories.keys()];
}

/** Builds the backend registered under `name`; unknown names are E_CONFIG. */
export function createBackend(name: string, shape: AttentionShape, options: BackendOptions = {}): AttentionBackend {
  const f = factories.get(name);
  if (!f) fail('E_CONFIG', 'attention backend', `one of ${backendNames().join(', ')}`, name);
  if (options.budget !== undefined && (!Number.isInteger(options.budget) || options.budget < 1))
    fail('E_BUDGET', 'attention budget', 'an integer ≥ 1', options.budget);
  return f(shape, options);
}
