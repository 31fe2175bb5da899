/**
 * `kvdrive synth`: writes a synthetic trace file (see src/trace/synthetic.ts for its structure).
 * Numeric flags are parsed strictly here; ranges and cross-field rules are checked by the
 * generator's schema (E_CONFIG naming the field).
 */
import type { Command } from 'commander';
import { fail } from '../errors.js';
import { generateSyntheticTrace, type SyntheticTraceOptions } from '../trace/synthetic.js';

function num(flag: string) {
  return (value: string): number => {
    const n = Number(value);
    if (value.trim() === '' || !Number.isFinite(n)) fail('E_CONFIG', `--${flag}`, 'a number', value);
    return n;
  };
}

/** CLI flag → option name; every one is a number. */
const NUMERIC: [flag: string, option: keyof SyntheticTraceOptions, help: string][] = [
  ['layers', 'layers', 'layers L'],
  ['q-heads', 'qHeads', 'query heads Hq'],
  ['kv-heads', 'kvHeads', 'KV heads Hkv'],
  ['head-dim', 'headDim', 'head dimension D'],
  ['prompt', 'promptTokens', 'prompt tokens T'],
  ['steps', 'decodeSteps', 'decode steps S'],
  ['seed', 'seed', 'PRNG seed'],
  ['rope-base', 'ropeBase', 'RoPE base'],
  ['sinks', 'sinkTokens', 'attention-sink tokens'],
  ['topic-span', 'topicSpan', 'mean topic segment length (tokens)'],
  ['topics', 'topics', 'distinct topics per (layer, kv head)'],
  ['needles', 'needlesPerLayer', 'needles per layer'],
  ['needle-steps', 'needleSteps', 'decode steps each needle is attended'],
  ['query-drift', 'queryDrift', 'fraction of query noise renewed per step (0..1)'],
  ['query-noise', 'queryNoise', 'query noise (std of the logits it adds)'],
  ['local-heads', 'localHeads', 'fraction of local query heads'],
  ['retrieval-heads', 'retrievalHeads', 'fraction of retrieval query heads'],
];

export function register(program: Command): void {
  const cmd = program
    .command('synth')
    .description('Write a synthetic trace (safetensors, DESIGN.md §7) with sinks, topics, local/retrieval heads and planted needles')
    .requiredOption('--out <file>', 'output trace file (.safetensors)')
    .option('--dtype <dtype>', 'storage dtype: f32, f16 or bf16', 'f16')
    .option('--rope <style>', "RoPE pairing: 'half', 'interleaved' or 'none'", 'half');
  for (const [flag, , help] of NUMERIC) cmd.option(`--${flag} <n>`, help, num(flag));
  cmd.action(async (opts: Record<string, unknown>) => {
    const options: Record<string, unknown> = { dtype: opts.dtype, ropeStyle: opts.rope };
    for (const [flag, option] of NUMERIC) {
      const key = flag.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());
      if (opts[key] !== undefined) options[option] = opts[key];
    }
    const t0 = performance.now();
    const trace = generateSyntheticTrace(options as SyntheticTraceOptions);
    await trace.write(String(opts.out));
    const m = trace.meta;
    process.stdout.write(
      `wrote ${String(opts.out)}: ${m.layers} layers, ${m.qHeads}/${m.kvHeads} heads, D ${m.headDim}, ` +
        `${m.promptTokens} prompt tokens, ${m.decodeSteps} steps, ${trace.dtype}, ${trace.needles.length} needles ` +
        `in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`,
    );
  });
}
