#!/usr/bin/env node
/**
 * The `kvdrive` command. Each subcommand lives in its own file under src/cli/ and exports
 * `register(program)`; this file only wires them together and turns errors into exit codes.
 */
import { Command } from 'commander';
import { isKvdriveError } from '../errors.js';

async function main(): Promise<void> {
  // Imported here, not at the top: loading the addon can fail with a typed error (not built, a bad
  // KVDRIVE_SIMD), reported below like any other.
  const { commands } = await import('./commands.js');
  const program = new Command();
  program
    .name('kvdrive')
    .description('Sparse, tiered KV-cache attention for long-context local inference')
    .showHelpAfterError();
  for (const register of commands) register(program);
  await program.parseAsync(process.argv);
}

main().catch((e: unknown) => {
  if (isKvdriveError(e)) {
    process.stderr.write(`kvdrive: error ${e.code}: ${e.message}\n`);
    process.exit(2);
  }
  process.stderr.write(`kvdrive: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
  process.exit(1);
});
