/** Commander value parsers that turn bad option values into typed errors naming the flag. */
import { statSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { KvdriveError, fail, type ErrorCode } from '../errors.js';

/** An integer option ≥ min (and ≤ max); `code` E_CONFIG unless the flag is a budget. */
export function integerOption(flag: string, min: number, max = Number.MAX_SAFE_INTEGER, code: ErrorCode = 'E_CONFIG') {
  return (value: string): number => {
    const n = Number(value);
    if (value.trim() === '' || !Number.isSafeInteger(n) || n < min || n > max)
      fail(code, `option ${flag}`, max === Number.MAX_SAFE_INTEGER ? `an integer ≥ ${min}` : `an integer in [${min}, ${max}]`, value);
    return n;
  };
}

/** One of a fixed set of names. */
export function choiceOption<T extends string>(flag: string, choices: readonly T[], code: ErrorCode = 'E_CONFIG') {
  return (value: string): T => {
    if (!(choices as readonly string[]).includes(value)) fail(code, `option ${flag}`, `one of ${choices.join(', ')}`, value);
    return value as T;
  };
}

/** A comma-separated list of names from a fixed set (e.g. policies). */
export function choiceListOption<T extends string>(flag: string, choices: readonly T[], code: ErrorCode = 'E_CONFIG') {
  const one = choiceOption(flag, choices, code);
  return (value: string): T[] => value.split(',').map((s) => one(s.trim()));
}

/** A finite number in [min, max]. */
export function numberOption(flag: string, min: number, max = Infinity, code: ErrorCode = 'E_CONFIG') {
  return (value: string): number => {
    const n = Number(value);
    if (value.trim() === '' || !Number.isFinite(n) || n < min || n > max)
      fail(code, `option ${flag}`, `a number in [${min}, ${max === Infinity ? '∞' : max}]`, value);
    return n;
  };
}

/**
 * A file the command writes at its end: checked before the work (a directory in the way, or a
 * parent that is missing or not a directory, would otherwise fail only after it).
 */
export function checkOutputFile(path: string, what: string): void {
  const kind = (p: string): 'dir' | 'file' | 'none' => {
    try {
      const st = statSync(p, { throwIfNoEntry: false });
      return st === undefined ? 'none' : st.isDirectory() ? 'dir' : 'file';
    } catch {
      return 'none'; // ENOTDIR on the way, EACCES: as missing
    }
  };
  if (kind(path) === 'dir') throw new KvdriveError('E_CONFIG', `${what}: expected a file to write, got the directory ${path}`);
  const parent = dirname(resolve(path));
  if (kind(parent) !== 'dir') throw new KvdriveError('E_NOT_FOUND', `${what}: expected an existing directory to write ${path} into, got none at ${parent}`);
}
