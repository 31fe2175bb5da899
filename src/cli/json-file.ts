/** Reading and writing the JSON files of the CLI (profiles, window allocations) with typed errors. */
import { readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { KvdriveError } from '../errors.js';

/** A failed file operation as a typed error naming the file (ENOENT, ENOSPC, EISDIR, ... by code). */
function fileError(what: string, path: string, doing: string, e: unknown): KvdriveError {
  const code = (e as NodeJS.ErrnoException)?.code;
  const msg = (e as Error)?.message ?? String(e);
  if (code === 'ENOENT') return new KvdriveError('E_NOT_FOUND', `${what} ${path}: expected ${doing === 'reading' ? 'an existing file' : 'an existing directory to write into'}, got none (${msg})`, { cause: e });
  if (code === 'EISDIR') return new KvdriveError('E_CONFIG', `${what} ${path}: expected a file, got a directory`, { cause: e });
  if (code === 'ENOSPC' || code === 'EDQUOT') return new KvdriveError('E_NOSPC', `${what} ${path}: disk full while ${doing}`, { cause: e });
  return new KvdriveError('E_IO', `${what} ${path}: ${doing} failed: ${msg}`, { cause: e });
}

/** Reads and parses a JSON file: E_NOT_FOUND if missing, E_CONFIG (with the parser's message) if malformed. */
export function readJsonFile(path: string, what: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw fileError(what, path, 'reading', e);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new KvdriveError('E_CONFIG', `${what} ${path}: expected valid JSON, got a parse error (${(e as Error).message})`);
  }
}

/**
 * Writes `value` as indented JSON: to `<path>.partial-<pid>` first, renamed over `path` once whole,
 * so a failed write (disk full, a directory in the way) leaves any earlier file as it was.
 */
export function writeJsonFile(path: string, value: unknown, what = 'output'): void {
  const tmp = `${path}.partial-${process.pid}`;
  try {
    writeFileSync(tmp, JSON.stringify(value, null, 1) + '\n');
    renameSync(tmp, path);
  } catch (e) {
    rmSync(tmp, { force: true });
    throw fileError(what, path, 'writing', e);
  }
}
