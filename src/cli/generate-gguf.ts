/**
 * `kvdrive generate --model file.gguf`: the GGUF branch of `kvdrive generate` (src/cli/generate.ts
 * dispatches here for a .gguf model). Prefills the prompt in native chunks with a progress bar,
 * streams the text, then prints prefill and decode tokens/s; attention goes through the same named
 * backends as the llama2.c path.
 */
import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import { fail, KvdriveError } from '../errors.js';
import { integerOption } from './options.js';
import { ProgressBar } from './progress.js';
import { createCliBackend, runtimeStatsLine, type BackendCliOptions } from './backend-choice.js';
import { generateGguf } from '../model/gguf/generate.js';
import { loadGgufModel } from '../model/gguf/model.js';

/** The options `kvdrive generate` passes on for a GGUF model. */
export interface GgufCliOptions extends BackendCliOptions {
  model: string;
  tokenizer?: string;
  steps?: number;
  prompt?: string;
  promptFile?: string;
  temperature: number;
  topP: number;
  seed: number;
  traceOut?: string;
  threads?: number;
  prefillChunk?: number;
}

/** True when `kvdrive generate --model` names a GGUF file. */
export function isGgufModel(path: string): boolean {
  return path.toLowerCase().endsWith('.gguf');
}

/** Adds the options only the GGUF branch reads. */
export function addGgufOptions(cmd: Command): Command {
  return cmd
    .option('--prompt-file <file>', 'read the prompt from a file (GGUF models)')
    .option('--threads <n>', 'threads of the native matrix products (GGUF models; default: all cores)', integerOption('--threads', 1, 1024))
    .option('--prefill-chunk <n>', 'prompt positions per native prefill call (GGUF models; default 64)', integerOption('--prefill-chunk', 1));
}

export async function runGgufGenerate(opts: GgufCliOptions): Promise<void> {
  if (opts.tokenizer !== undefined) fail('E_CONFIG', 'option --tokenizer', 'no tokenizer file for a GGUF model (its tokenizer is inside)', opts.tokenizer);
  if (opts.traceOut !== undefined) fail('E_CONFIG', 'option --trace-out', 'a llama2.c model (traces of GGUF models are not recorded yet)', opts.traceOut);
  if (opts.prompt !== undefined && opts.promptFile !== undefined) fail('E_CONFIG', 'option --prompt-file', 'either --prompt or --prompt-file', 'both');
  let prompt = opts.prompt;
  if (opts.promptFile !== undefined) {
    try {
      prompt = readFileSync(opts.promptFile, 'utf8');
    } catch (e) {
      throw new KvdriveError('E_NOT_FOUND', `prompt file ${opts.promptFile}: ${(e as Error).message}`, { cause: e });
    }
  }
  const model = loadGgufModel(opts.model, { threads: opts.threads });
  const c = model.config;
  process.stderr.write(`model: ${c.arch}, ${c.nLayers} layers, dim ${c.dim}, ${c.nHeads}/${c.nKvHeads} heads × ${c.headSize}, vocab ${c.vocabSize}, ${c.weightType}\n`);
  const promptTokens = model.tokenizer.encode(prompt ?? '', { bos: true }).length;
  const steps = opts.steps ?? Math.min(promptTokens + 256, c.contextLength);
  const { backend, name: backendName } = createCliBackend(opts, model.attentionShape(steps));
  // A long prompt is not echoed: a progress bar shows its prefill and only the continuation is printed.
  const longPrompt = promptTokens > 64;
  const bar = longPrompt ? new ProgressBar(promptTokens, 'prefill') : undefined;
  let prefilled = 0;
  let pieces = 0;
  try {
    const r = await generateGguf({
      model,
      prompt,
      steps,
      temperature: opts.temperature,
      topP: opts.topP,
      seed: opts.seed,
      backend,
      prefillChunk: opts.prefillChunk,
      onPrefill: (done, total) => {
        bar?.tick(`${done}/${total}`, done - prefilled);
        prefilled = done;
        if (done === total) bar?.finish();
      },
      // Pieces 1 .. promptTokens-1 are the prompt's (BOS gives none).
      onToken: (text) => {
        if (!longPrompt || ++pieces >= promptTokens) process.stdout.write(text);
      },
    });
    process.stdout.write('\n');
    const t = r.timings;
    process.stderr.write(
      `prefill: ${r.promptTokens} tokens in ${t.prefillMs.toFixed(1)} ms (${t.prefillTokensPerSecond.toFixed(1)} tok/s); ` +
        `decode: ${t.decodeTokens} tokens in ${t.decodeMs.toFixed(1)} ms (${t.decodeTokensPerSecond.toFixed(2)} tok/s); backend ${backendName}, stopped by ${r.stoppedBy}\n`,
    );
    process.stderr.write(await runtimeStatsLine(backend, opts.policy ?? 'kvdrive', opts.budget));
  } finally {
    await backend.close?.();
    model.close();
  }
}
