/**
 * `kvdrive generate`: run the reference host (a llama2.c checkpoint) and print the text as it is
 * generated, then the speed. Attention goes through a named backend (`--backend`); without one it
 * is the sparse backend — the runtime (src/model/runtime-attention.ts) — when `--budget` or a
 * runtime option is given, and dense otherwise. With the runtime the selection / fetch / compute
 * time and the tier traffic are printed at the end.
 */
import type { Command } from 'commander';
import { fail } from '../errors.js';
import { checkOutputFile, choiceOption, integerOption, numberOption } from './options.js';
import { createCliBackend, runtimeStatsLine, type BackendCliOptions } from './backend-choice.js';
import { parseBytes } from '../cache/window-solver.js';
import type { PolicyName } from '../index/selection.js';
import { backendNames } from '../model/backends.js';
import { loadCheckpoint } from '../model/checkpoint.js';
import { attentionShape } from '../model/forward.js';
import { generate } from '../model/generate.js';
import { loadTokenizer } from '../model/tokenizer.js';
import { addGgufOptions, isGgufModel, runGgufGenerate } from './generate-gguf.js';

interface GenerateCliOptions extends BackendCliOptions {
  model: string;
  tokenizer?: string;
  steps?: number;
  prompt?: string;
  temperature: number;
  topP: number;
  seed: number;
  traceOut?: string;
  tracePrompt?: number;
}

const POLICIES: readonly PolicyName[] = ['kvdrive', 'quest', 'shadowkv'];

export function register(program: Command): void {
  addGgufOptions(program
    .command('generate')
    .description('generate text with a llama2.c checkpoint (the reference host) or a GGUF model, printing tokens/s at the end')
    .requiredOption('--model <file>', 'llama2.c checkpoint (.bin) or GGUF model (.gguf)')
    .option('--tokenizer <file>', 'llama2.c tokenizer (.bin) for that checkpoint (required for .bin models)'))
    .option('--steps <n>', 'positions to run, prompt included (default: min(256, seq_len))', integerOption('--steps', 1))
    .option('--prompt <text>', 'text to continue (default: start from BOS)')
    .option('--temperature <x>', '0 = greedy, else sampling temperature', numberOption('--temperature', 0), 1)
    .option('--top-p <p>', 'nucleus sampling mass; 0 or 1 disables it', numberOption('--top-p', 0, 1), 0.9)
    .option('--seed <n>', 'sampling RNG seed', integerOption('--seed', 0), 0)
    .option('--backend <name>', `attention backend (${backendNames().join(', ')}; default: kvdrive with --budget, else dense)`)
    .option(
      '--budget <k>',
      'tokens attended per (layer, kv head) per step beside sinks and local window; selects the kvdrive sparse backend',
      integerOption('--budget', 1, Number.MAX_SAFE_INTEGER, 'E_BUDGET'),
    )
    .option('--policy <name>', `selection policy of the kvdrive backend (${POLICIES.join(', ')}; default kvdrive)`, choiceOption('--policy', POLICIES, 'E_POLICY'))
    .option('--storage <dir>', 'run attention through the runtime (backend "runtime") with an SSD store in this directory')
    .option('--dram-budget <bytes>', 'runtime backend: DRAM budget of the memory model (e.g. 64MiB; default 256MiB)', (v: string) => parseBytes(v, '--dram-budget'))
    .option('--seal-tokens <n>', 'runtime backend: tokens per segment sealed into the tiers while decoding (a multiple of the chunk size; default 1024)', integerOption('--seal-tokens', 1))
    .option('--mode <mode>', 'runtime backend: sequential or pipelined', choiceOption('--mode', ['sequential', 'pipelined'] as const, 'E_CONFIG'))
    .option('--trace-out <file>', 'record a kvdrive trace (safetensors) of this generation')
    .option('--trace-prompt <n>', 'with --trace-out: leading positions that form the trace prompt (default: half)', integerOption('--trace-prompt', 1))
    .action(async (opts: GenerateCliOptions) => {
      if (isGgufModel(opts.model)) return runGgufGenerate(opts);
      if (opts.tokenizer === undefined) fail('E_CONFIG', 'option --tokenizer', 'a llama2.c tokenizer file for a .bin model', undefined);
      const model = loadCheckpoint(opts.model);
      const tokenizer = loadTokenizer(opts.tokenizer, { vocabSize: model.config.vocabSize });
      if (opts.tracePrompt !== undefined && opts.traceOut === undefined)
        fail('E_CONFIG', 'option --trace-prompt', 'to be given together with --trace-out', opts.tracePrompt);
      // Checked before generating: the trace is written at the end.
      if (opts.traceOut !== undefined) checkOutputFile(opts.traceOut, 'option --trace-out');
      const { backend, name: backendName } = createCliBackend(opts, attentionShape(model.config));
      try {
        const r = await generate({
          model,
          tokenizer,
          prompt: opts.prompt,
          steps: opts.steps,
          temperature: opts.temperature,
          topP: opts.topP,
          seed: opts.seed,
          backend,
          traceOut: opts.traceOut,
          tracePromptTokens: opts.tracePrompt,
          onToken: (text) => process.stdout.write(text),
        });
        process.stdout.write('\n');
        process.stderr.write(
          `achieved tok/s: ${r.timings.tokensPerSecond.toFixed(1)} (${r.positions} positions in ${r.timings.totalMs.toFixed(1)} ms, backend ${backendName}, stopped by ${r.stoppedBy})\n`,
        );
        process.stderr.write(await runtimeStatsLine(backend, opts.policy ?? 'kvdrive', opts.budget));
        if (r.trace && opts.traceOut)
          process.stderr.write(`trace: ${opts.traceOut} (${r.trace.layers} layers, ${r.trace.promptTokens} prompt tokens, ${r.trace.decodeSteps} decode steps)\n`);
      } finally {
        await backend.close?.();
      }
    });
}
