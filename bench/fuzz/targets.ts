/**
 * The fuzz target registry. Adding a target: write `defineTarget({ name, input, run })` (see
 * harness.ts) in a targets-*.ts file and list it here; the full run (bench/fuzz.ts) and the test
 * slice (test/fuzz/) pick it up by name.
 */
import type { FuzzTarget } from './harness.js';
import { apiTargets } from './targets-api.js';
import { fileTargets } from './targets-files.js';
import { selftestTargets } from './targets-selftest.js';

export function fuzzTargets(): FuzzTarget[] {
  return [...fileTargets, ...apiTargets, ...(process.env.KVDRIVE_FUZZ_SELFTEST === '1' ? selftestTargets : [])];
}
