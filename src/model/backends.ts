/**
 * Registry of attention backends by name, for `kvdrive generate --backend` and other callers that
 * pick a backend from configuration: "dense" (the TS reference) and the sparse one, registered as
 * "kvdrive" and as "runtime": both are the runtime with its memory model and tiers
 * (src/model/runtime-attention.ts), the one decode path; they need a budget.
 */
import { KvdriveError, fail } from '../errors.js';
import type { AttentionBackend, AttentionShape, BackendFactory, BackendOptions } from './attention-backend.js';
import { DenseTsAttention } from './dense-attention.js';
import { RuntimeAttention, type RuntimeAttentionOptions } from './runtime-attention.js';

/** Builds the runtime backend (memory model: tiers, modes); its options are validated by RuntimeAttention (E_BUDGET without a budget). */
function runtimeFactory(shape: AttentionShape, o: BackendOptions): AttentionBackend {
  // Only the options given: RuntimeAttention rejects unknown keys and validates the rest.
  const given = Object.entries({ budget: o.budget, policy: o.policy, policyOptions: o.policyOptions, mode: o.mode, storage: o.storage, dramBudget: o.dramBudget, sealTokens: o.sealTokens });
  return new RuntimeAttention(shape, Object.fromEntries(given.filter(([, v]) => v !== undefined)) as unknown as RuntimeAttentionOptions);
}

const factories = new Map<string, BackendFactory>([
  ['dense', (shape) => new DenseTsAttention(shape)],
  ['kvdrive', runtimeFactory],
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
