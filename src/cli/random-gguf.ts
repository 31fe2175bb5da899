/** `kvdrive random-gguf`: a random-weight GGUF file of a named real shape, for speed tests. */
import type { Command } from 'commander';
import { choiceOption, integerOption } from './options.js';
import { MODEL_SHAPES, RANDOM_WEIGHT_TYPES, writeRandomModel, type ModelShape, type RandomWeightType } from '../model/gguf/random-model.js';

export function register(program: Command): void {
  const shapes = Object.keys(MODEL_SHAPES);
  program
    .command('random-gguf')
    .description('write a random-weight GGUF model of a real shape (streamed; for speed tests)')
    .requiredOption('--shape <name>', `model shape (${shapes.join(', ')})`, choiceOption('--shape', shapes))
    .requiredOption('--out <file>', 'GGUF file to write')
    .option('--type <type>', `matrix weight type (${RANDOM_WEIGHT_TYPES.join(', ')})`, choiceOption('--type', RANDOM_WEIGHT_TYPES, 'E_DTYPE'), 'Q8_0')
    .option('--layers <n>', 'override the number of layers', integerOption('--layers', 1, 1024))
    .option('--context <n>', 'override the context length', integerOption('--context', 1))
    .option('--seed <n>', 'weights RNG seed', integerOption('--seed', 0), 1)
    .action((opts: { shape: string; out: string; type: RandomWeightType; layers?: number; context?: number; seed: number }) => {
      const overrides: Partial<ModelShape> = {};
      if (opts.layers !== undefined) overrides.layers = opts.layers;
      if (opts.context !== undefined) overrides.context = opts.context;
      const t0 = performance.now();
      const bytes = writeRandomModel({ shape: opts.shape, type: opts.type, out: opts.out, seed: opts.seed, overrides });
      process.stderr.write(`wrote ${opts.out}: ${opts.shape} ${opts.type}, ${(bytes / 2 ** 20).toFixed(1)} MiB in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
    });
}
