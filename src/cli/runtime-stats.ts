/**
 * The one-line summary `kvdrive generate` prints after a run through the runtime backend (llama2.c
 * and GGUF models alike): time per stage and where the selected chunks came from.
 */
import type { AttentionBackend } from '../model/attention-backend.js';
import { RuntimeAttention } from '../model/runtime-attention.js';

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
