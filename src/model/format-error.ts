/**
 * Error helper for file-format checks whose "given" side is a description ("20 bytes", "n_heads 4,
 * n_kv_heads 3") rather than a value: errors.ts `fail` would quote and shorten it.
 */
import { KvdriveError, type ErrorCode } from '../errors.js';

/** Throws `KvdriveError(code, "<what>: expected <expected>, got <given>")` with `given` verbatim. */
export function failFormat(code: ErrorCode, what: string, expected: string, given: string): never {
  throw new KvdriveError(code, `${what}: expected ${expected}, got ${given}`);
}
