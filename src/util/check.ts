/**
 * Argument checks for the public functions that take plain arguments (not an options object
 * validated with zod): each throws a KvdriveError naming what was expected and what was given, so a
 * wrong call never surfaces as a TypeError from deep inside.
 */
import { fail } from '../errors.js';

type TypedArrayCtor<T> = { new (n: number): T; name: string };

/** A non-null object (not an array or typed array). */
export function expectObject(v: unknown, what: string): asserts v is Record<string, unknown> {
  if (v === null || typeof v !== 'object' || Array.isArray(v) || ArrayBuffer.isView(v)) fail('E_TYPE', what, 'an object', v);
}

/** An instance of the given TypedArray class. */
export function expectArray<T>(v: unknown, ctor: TypedArrayCtor<T>, what: string): asserts v is T {
  if (!(v instanceof (ctor as unknown as abstract new (...a: never[]) => unknown))) fail('E_TYPE', what, `a ${ctor.name}`, v);
}

/** An integer in [min, max]. */
export function expectInt(v: unknown, what: string, min: number, max: number): asserts v is number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) fail('E_RANGE', what, `an integer in [${min}, ${max}]`, v);
}
