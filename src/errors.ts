/**
 * Typed errors. Every error kvdrive raises (from TypeScript or from the native addon) is a
 * {@link KvdriveError} with a stable {@link ErrorCode} and a message that says what was expected
 * and what was given, so callers can branch on `code` and users can act on the message.
 */

/** Stable error codes. Native code uses the same strings (native/common/errors.h). */
export const ErrorCodes = [
  'E_SHAPE', // a tensor or array has the wrong length / dimensions
  'E_DTYPE', // wrong element type or storage dtype
  'E_TYPE', // wrong JS type (not a TypedArray, not an object, ...)
  'E_NONFINITE', // NaN or Inf in q/k/v or other numeric input
  'E_RANGE', // an id / index / count outside its valid range
  'E_BUDGET', // a budget that is < 1 or cannot fit
  'E_POLICY', // unknown selection or eviction policy
  'E_CONFIG', // invalid option value
  'E_NOT_FOUND', // missing file or directory
  'E_TRACE_FORMAT', // malformed trace / safetensors file
  'E_MODEL_FORMAT', // malformed model checkpoint or tokenizer
  'E_CORRUPT', // checksum mismatch, truncated data
  'E_VERSION', // file of an unsupported format version
  'E_IO', // other I/O failure
  'E_NOSPC', // disk full
  'E_BUSY', // a store directory another open runtime holds
  'E_NOMEM', // allocation failure / memory budget exceeded
  'E_WORKER', // a worker thread failed
  'E_CLOSED', // use after close
  'E_INTERNAL', // a bug: please report
] as const;

export type ErrorCode = (typeof ErrorCodes)[number];

export class KvdriveError extends Error {
  override readonly name = 'KvdriveError';
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
  }
}

/** True for errors raised by kvdrive (TypeScript or native), optionally of one code. */
export function isKvdriveError(e: unknown, code?: ErrorCode): e is KvdriveError {
  if (e === null || typeof e !== 'object') return false;
  const err = e as { name?: unknown; code?: unknown };
  if (err.name !== 'KvdriveError' || typeof err.code !== 'string') return false;
  return code === undefined || err.code === code;
}

/** Throws a {@link KvdriveError}; `expected`/`given` are rendered into the message. */
export function fail(code: ErrorCode, what: string, expected: string, given: unknown): never {
  throw new KvdriveError(code, `${what}: expected ${expected}, got ${describe(given)}`);
}

/** Short human description of a value for error messages. */
export function describe(v: unknown): string {
  if (v === undefined) return 'undefined';
  if (v === null) return 'null';
  if (typeof v === 'number') return Number.isNaN(v) ? 'NaN' : String(v);
  if (typeof v === 'string') return JSON.stringify(v.length > 80 ? v.slice(0, 77) + '...' : v);
  if (ArrayBuffer.isView(v)) return `${v.constructor.name}(${(v as unknown as { length: number }).length})`;
  if (Array.isArray(v)) return `Array(${v.length})`;
  if (typeof v === 'object') return 'an object';
  return typeof v;
}

/** Re-raises native errors (which carry `code` but are plain Errors) as KvdriveError. */
export function fromNative(e: unknown): unknown {
  if (e instanceof KvdriveError) return e;
  if (e instanceof Error && typeof (e as { code?: unknown }).code === 'string') {
    const code = (e as unknown as { code: string }).code;
    if ((ErrorCodes as readonly string[]).includes(code)) return new KvdriveError(code as ErrorCode, e.message, { cause: e });
  }
  return e;
}
