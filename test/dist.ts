/**
 * Worker threads load compiled JavaScript (dist/), never TypeScript sources. Tests that start
 * workers need `npm run build:ts` first; these helpers point at the compiled modules and refuse a
 * dist/ that is missing or older than its sources (workers would silently run stale code).
 */
import { existsSync, readdirSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
let checked = false;

/** Throws when some src/**.ts is newer than its dist/src/**.js. */
function checkFresh(dir = join(root, 'src')): void {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) checkFresh(p);
    else if (e.name.endsWith('.ts') && !e.name.endsWith('.d.ts')) {
      const out = join(root, 'dist', p.slice(root.length + 1).replace(/\.ts$/, '.js'));
      if (!existsSync(out) || statSync(p).mtimeMs > statSync(out).mtimeMs)
        throw new Error(`${out} is missing or older than ${p}: run \`npm run build:ts\` before tests that start workers`);
    }
  }
}

/** Absolute path of a compiled module, e.g. distPath('src/pipeline/ring-queue.js'). */
export function distPath(rel: string): string {
  if (!checked) {
    checkFresh();
    checked = true;
  }
  return join(root, 'dist', rel);
}

/** Absolute path of a test worker script under test/workers/. */
export function testWorker(name: string): string {
  return join(root, 'test', 'workers', name);
}
