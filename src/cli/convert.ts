/** `kvdrive convert`: a llama2.c checkpoint and its tokenizer → one GGUF file (see src/model/gguf/convert.ts). */
import type { Command } from 'commander';
import { choiceOption } from './options.js';
import { convertLlama2c } from '../model/gguf/convert.js';
import { QUANTIZE_TYPES, type QuantizeType } from '../model/gguf/quant.js';

export function register(program: Command): void {
  program
    .command('convert')
    .description('convert a llama2.c checkpoint + tokenizer into a GGUF file (architecture llama, tokenizer inside)')
    .requiredOption('--model <file>', 'llama2.c checkpoint (.bin)')
    .requiredOption('--tokenizer <file>', 'llama2.c tokenizer (.bin) of that checkpoint')
    .requiredOption('--out <file>', 'GGUF file to write')
    .option('--type <type>', `matrix weight type (${QUANTIZE_TYPES.join(', ')})`, choiceOption('--type', QUANTIZE_TYPES, 'E_DTYPE'), 'F32')
    .action((opts: { model: string; tokenizer: string; out: string; type: QuantizeType }) => {
      const r = convertLlama2c(opts);
      process.stderr.write(`wrote ${opts.out}: ${r.tensors} tensors, ${r.bytes} bytes, ${opts.type}` +
        (r.keptF32.length ? ` (kept F32, rows not whole ${opts.type} blocks: ${r.keptF32.join(', ')})` : '') + '\n');
    });
}
