/**
 * `kvdrive generate`'s attention backend, for llama2.c and GGUF models alike: which backend the
 * options pick (dense, or the runtime with --budget / --storage / --dram-budget / --seal-tokens /
 * --mode), and the one-line summary printed after a run through the runtime.
 */
import { fail } from '../errors.js';
import type { AttentionBackend, AttentionShape } from '../model/attention-backend.js';
import { createBackend } from '../model/backends.js';
import { RuntimeAttention } from '../model/runtime-attention.js';
import type { PolicyName } from '../index/selection.js';

/** The generate options that choose and configure the backend. */
export interface BackendCliOptions {
  backend?: string;
  budget?: number;
  policy?: PolicyName;
  storage?: string;
  dramBudget?: number;
  sealTokens?: number;
  mode?: 'sequential' | 'pipelined';
}

/** Creates the backend the options name (or imply), refusing runtime options on the dense backend. */
export function createCliBackend(opts: BackendCliOptions, shape: AttentionShape): { backend: AttentionBackend; name: string } {
  const wantsRuntime = opts.storage !== undefined || opts.dramBudget !== undefined || opts.mode !== undefined || opts.sealTokens !== undefined;
  const name = opts.backend ?? (wantsRuntime ? 'runtime' : opts.budget !== undefined ? 'kvdrive' : 'dense');
  if (wantsRuntime && name === 'dense')
    fail('E_CONFIG', 'options --storage / --dram-budget / --seal-tokens / --mode', 'the runtime backend (kvdrive or runtime)', `--backend ${name}`);
  if (opts.policy !== undefined && name === 'dense')
    fail('E_CONFIG', 'option --policy', 'the kvdrive backend (give --budget)', `--policy ${opts.policy} with the dense backend`);
  if (opts.budget !== undefined && name === 'dense')
    process.stderr.write(`note: --budget ${opts.budget} applies to the kvdrive sparse backend; the dense backend attends every position\n`);
  const backend = createBackend(name, shape, {
    budget: opts.budget,
    policy: opts.policy,
    mode: opts.mode,
    storage: opts.storage,
    dramBudget: opts.dramBudget,
    sealTokens: opts.sealTokens,
  });
  return { backend, name };
}

/** The summary line (with a trailing newline), or '' for a backend that is not the runtime. */
export async function runtimeStatsLine(backend: AttentionBackend, policy: string, budget: number | undefined): Promise<string> {
  if (!(backend instanceof RuntimeAttention)) return '';
  const s = await backend.stats();
  const m = s?.memory;
  if (!s || !m) return '';
  return (
    `runtime (${s.mode}, policy ${policy}, budget ${budget}): over ${s.attendCalls} layer-steps selection ${s.selectionMs.toFixed(1)} ms, fetch ${s.fetchMs.toFixed(1)} ms, compute ${s.computeMs.toFixed(1)} ms; ` +
    `${m.traffic.chunks} chunks selected, from hot ${m.traffic.hotChunks}, DRAM ${m.traffic.dramChunks}, SSD ${m.traffic.ssdChunks}, tail ${m.traffic.tailChunks}; sealed ${m.sealedTokens} of ${m.tokens} tokens (all layers)\n`
  );
}
