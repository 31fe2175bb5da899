/** Reading and writing the JSON files of the CLI (profiles, window allocations) with typed errors. */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { KvdriveError } from '../errors.js';

/** Reads and parses a JSON file: E_NOT_FOUND if missing, E_CONFIG (with the parser's message) if malformed. */
export function readJsonFile(path: string, what: string): unknown {
  if (!existsSync(path)) throw new KvdriveError('E_NOT_FOUND', `${what} ${path}: expected an existing file, got none`);
  const text = readFileSync(path, 'utf8');
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new KvdriveError('E_CONFIG', `${what} ${path}: expected valid JSON, got a parse error (${(e as Error).message})`);
  }
}

/** Writes `value` as indented JSON. */
export function writeJsonFile(path: string, value: unknown): void {
  writeFileSync(path, JSON.stringify(value, null, 1) + '\n');
}
