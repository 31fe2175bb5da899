/**
 * Worker threads load compiled JavaScript (dist/), never TypeScript sources. Tests that start
 * workers need `npm run build:ts` first; this helper points at the compiled module and says so
 * when it is missing.
 */
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');

/** Absolute path of a compiled module, e.g. distPath('src/pipeline/ring-queue.js'). */
export function distPath(rel: string): string {
  const p = join(root, 'dist', rel);
  if (!existsSync(p)) throw new Error(`${p} is missing: run \`npm run build:ts\` before tests that start workers`);
  return p;
}

/** Absolute path of a test worker script under test/workers/. */
export function testWorker(name: string): string {
  return join(root, 'test', 'workers', name);
}
