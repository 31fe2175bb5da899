/**
 * Fuzz child: `node dist/bench/fuzz/child.js <target> <seed> <from> <to>` runs inputs [from, to) of
 * one target and reports each on stdout (protocol: harness.ts). Its cwd is a scratch directory.
 * `--only` as a fifth argument runs input <from> alone and prints the error (reproduction).
 */
import { writeSync } from 'node:fs';
import { isKvdriveError } from '../../src/errors.js';
import { Gen, badMessage, describeInput, inputSeed, type FuzzContext } from './harness.js';
import { fuzzTargets } from './targets.js';

function emit(line: string): void {
  writeSync(1, `\u0001${line.replace(/\n/g, ' ')}\n`);
}

async function main(): Promise<void> {
  const [name, seedArg, fromArg, toArg, only] = process.argv.slice(2);
  const target = fuzzTargets().find((t) => t.name === name);
  if (!target) throw new Error(`unknown fuzz target ${name}`);
  const seed = Number(seedArg);
  const from = Number(fromArg);
  const to = only ? from + 1 : Number(toArg);
  const ctx: FuzzContext = { dir: process.env.KVDRIVE_FUZZ_DIR ?? process.cwd() };
  // A rejection nobody awaited is a bug of the code under test (an async API must reject the
  // promise it returned); report it against the running input.
  let current = -1;
  process.on('unhandledRejection', (e) => {
    emit(`U ${current} unhandled rejection: ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`);
  });
  for (let i = from; i < to; i++) {
    current = i;
    const input = target.input(new Gen(inputSeed(seed, name!, i)), ctx);
    emit(`B ${i} ${describeInput(input)}`);
    try {
      await target.run(input, ctx);
      emit(`O ${i}`);
    } catch (e) {
      if (only) console.error(e);
      if (isKvdriveError(e)) emit(badMessage(e.message) ? `M ${i} ${e.code}: ${e.message}` : `T ${i} ${e.code}`);
      else emit(`U ${i} ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`);
    }
  }
  emit('D');
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e);
    process.exit(3);
  },
);
