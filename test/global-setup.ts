/**
 * One scratch directory per test run. Every test file makes its temporary files under os.tmpdir()
 * (mkdtemp): pointing TMPDIR at a fresh directory here, before the test workers start (they inherit
 * the environment), and removing it once the run ends leaves nothing behind, including what a
 * failed test did not get to clean up (a run used to leave ~50 directories in /tmp). A run killed
 * before its end leaves this one directory.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export default function setup(): () => void {
  const root = mkdtempSync(join(tmpdir(), 'kvdrive-test-'));
  const before = process.env.TMPDIR;
  process.env.TMPDIR = root;
  return () => {
    if (before === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = before;
    rmSync(root, { recursive: true, force: true });
  };
}
