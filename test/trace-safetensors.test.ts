import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { openSafetensors, SafetensorsWriter, writeSafetensors } from '../src/trace/safetensors.js';
import { expectKvdError, randn } from './helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'kvd-st-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;
const tmp = (name = 'f') => join(dir, `${name}-${n++}.safetensors`);

/** Builds a safetensors file byte by byte: header JSON text (as given) + data buffer. */
function craft(headerText: string, dataBytes = 0, lengthOverride?: bigint): string {
  const json = Buffer.from(headerText, 'utf8');
  const prefix = Buffer.alloc(8);
  prefix.writeBigUInt64LE(lengthOverride ?? BigInt(json.length));
  const p = tmp('bad');
  writeFileSync(p, Buffer.concat([prefix, json, Buffer.alloc(dataBytes)]));
  return p;
}

describe('safetensors round trip', () => {
  it('writes and reads F32, F16, BF16, I32, I64 tensors and metadata', async () => {
    const p = tmp();
    const f32 = randn(2 * 3 * 4, 1);
    const f16 = new Uint16Array([0x3c00, 0x8000, 0x7c00, 0x0001, 0x7bff, 0xfc00]);
    const bf16 = new Uint16Array([0x3f80, 0xc000, 0x7f80]);
    const i32 = new Int32Array([1, -2, 2147483647]);
    const i64 = new BigInt64Array([1n, -(2n ** 62n)]);
    await writeSafetensors(
      p,
      [
        { name: 'a', dtype: 'F32', shape: [2, 3, 4], data: f32 },
        { name: 'b', dtype: 'F16', shape: [2, 3], data: f16 },
        { name: 'c', dtype: 'BF16', shape: [3], data: bf16 },
        { name: 'd', dtype: 'I32', shape: [3, 1], data: i32 },
        { name: 'e', dtype: 'I64', shape: [2], data: i64 },
        { name: 'empty', dtype: 'F32', shape: [0, 5], data: new Float32Array(0) },
      ],
      { hello: 'world' },
    );
    const f = await openSafetensors(p);
    expect(f.names()).toEqual(['a', 'b', 'c', 'd', 'e', 'empty']);
    expect(f.metadata).toEqual({ hello: 'world' });
    expect((f.dataStart - 8) % 8).toBe(0); // header padded to 8 like the reference implementation
    const a = await f.read('a');
    expect(a.shape).toEqual([2, 3, 4]);
    expect(Array.from(a.data as Float32Array)).toEqual(Array.from(f32));
    expect(Array.from((await f.read('b')).data as Uint16Array)).toEqual(Array.from(f16));
    expect(Array.from((await f.read('c')).data as Uint16Array)).toEqual(Array.from(bf16));
    expect(Array.from((await f.read('d')).data as Int32Array)).toEqual(Array.from(i32));
    expect(Array.from((await f.read('e')).data as BigInt64Array)).toEqual(Array.from(i64));
    expect((await f.read('empty')).data.length).toBe(0);
    await expectKvdError(() => f.read('nope'), 'E_NOT_FOUND', /no tensor named "nope"/);
    await f.close();
    await expectKvdError(() => f.read('a'), 'E_CLOSED', /after close/);
    expect(readdirSync(dir).some((x) => x.includes('.partial'))).toBe(false);
  });

  it('reads a file written by hand in the reference layout (unpadded header, reordered offsets)', async () => {
    const header = JSON.stringify({ y: { dtype: 'F32', shape: [1], data_offsets: [4, 8] }, x: { dtype: 'F32', shape: [1], data_offsets: [0, 4] } });
    const prefix = Buffer.alloc(8);
    prefix.writeBigUInt64LE(BigInt(Buffer.byteLength(header)));
    const data = Buffer.from(new Float32Array([1.5, -2.5]).buffer);
    const p = tmp();
    writeFileSync(p, Buffer.concat([prefix, Buffer.from(header), data]));
    const f = await openSafetensors(p);
    expect((await f.read('x')).data[0]).toBe(1.5);
    expect((await f.read('y')).data[0]).toBe(-2.5);
    expect(f.metadata).toEqual({});
    await f.close();
  });

  it('rejects unloadable but valid dtypes with E_DTYPE on read only', async () => {
    const p = craft(JSON.stringify({ u: { dtype: 'U8', shape: [3], data_offsets: [0, 3] } }), 3);
    const f = await openSafetensors(p);
    await expectKvdError(() => f.read('u'), 'E_DTYPE', /expected one of F32, F16, BF16, I32, I64 to load, got "U8"/);
    await f.close();
  });
});

describe('safetensors writer errors', () => {
  it('checks declared order, data type and length, completeness', async () => {
    const p = tmp();
    const w = await SafetensorsWriter.create(p, [
      { name: 'a', dtype: 'F16', shape: [2] },
      { name: 'b', dtype: 'F32', shape: [3] },
    ]);
    await expectKvdError(() => w.write('b', new Float32Array(3)), 'E_CONFIG', /expected "a"/);
    await expectKvdError(() => w.write('a', new Float32Array(2)), 'E_DTYPE', /Uint16Array/);
    await expectKvdError(() => w.write('a', new Uint16Array(3)), 'E_SHAPE', /expected 2 elements.*got 3/);
    await w.write('a', new Uint16Array(2));
    await expectKvdError(() => w.close(), 'E_SHAPE', /missing b/);
    expect(readdirSync(dir).some((x) => x.includes('.partial'))).toBe(false);
    await expectKvdError(() => w.write('b', new Float32Array(3)), 'E_CLOSED');
  });

  it('rejects bad specs', async () => {
    await expectKvdError(() => SafetensorsWriter.create(tmp(), [{ name: '__metadata__', dtype: 'F32', shape: [1] }]), 'E_CONFIG', /__metadata__/);
    await expectKvdError(
      () => SafetensorsWriter.create(tmp(), [{ name: 'a', dtype: 'F32', shape: [1] }, { name: 'a', dtype: 'F32', shape: [1] }]),
      'E_CONFIG',
      /unique/,
    );
    await expectKvdError(() => SafetensorsWriter.create(tmp(), [{ name: 'a', dtype: 'U8' as never, shape: [1] }]), 'E_DTYPE', /got "U8"/);
    await expectKvdError(() => SafetensorsWriter.create(tmp(), [{ name: 'a', dtype: 'F32', shape: [-1] }]), 'E_SHAPE', /non-negative/);
    await expectKvdError(() => SafetensorsWriter.create(tmp(), [], { a: 1 as never }), 'E_CONFIG', /metadata "a"/);
  });
});

describe('safetensors malformed files → E_TRACE_FORMAT', () => {
  const ok = (extra: Record<string, unknown> = {}) => JSON.stringify({ t: { dtype: 'F32', shape: [2], data_offsets: [0, 8] }, ...extra });

  it('missing file → E_NOT_FOUND', async () => {
    await expectKvdError(() => openSafetensors(join(dir, 'does-not-exist.safetensors')), 'E_NOT_FOUND', /no such file/);
  });

  it('file shorter than 8 bytes', async () => {
    const p = tmp('short');
    writeFileSync(p, Buffer.from([1, 0, 0]));
    await expectKvdError(() => openSafetensors(p), 'E_TRACE_FORMAT', /file size: expected at least 8 bytes.*got 3 bytes/);
  });

  it('header length beyond the file', async () => {
    await expectKvdError(() => openSafetensors(craft(ok(), 8, 10_000n)), 'E_TRACE_FORMAT', /header length: expected at most \d+ bytes \(file is \d+ bytes\), got 10000 bytes/);
  });

  it('absurd header length (> 100 MiB)', async () => {
    await expectKvdError(() => openSafetensors(craft(ok(), 8, 2n ** 63n)), 'E_TRACE_FORMAT', /header length: expected at most 104857600 bytes, got 9223372036854775808/);
  });

  it('header not JSON', async () => {
    await expectKvdError(() => openSafetensors(craft('{"t": {dtype', 8)), 'E_TRACE_FORMAT', /header: expected valid JSON, got unparsable/);
  });

  it('header not an object', async () => {
    await expectKvdError(() => openSafetensors(craft('[1,2]', 8)), 'E_TRACE_FORMAT', /header: expected a JSON object, got a JSON array/);
    await expectKvdError(() => openSafetensors(craft('42', 8)), 'E_TRACE_FORMAT', /header: expected a JSON object, got JSON number/);
  });

  it('tensor entry not an object', async () => {
    await expectKvdError(() => openSafetensors(craft(JSON.stringify({ t: 5 }), 8)), 'E_TRACE_FORMAT', /tensor "t": expected an object/);
  });

  it('bad __metadata__', async () => {
    await expectKvdError(() => openSafetensors(craft(ok({ __metadata__: { a: 1 } }), 8)), 'E_TRACE_FORMAT', /"__metadata__"."a": expected a string, got 1/);
    await expectKvdError(() => openSafetensors(craft(ok({ __metadata__: 'x' }), 8)), 'E_TRACE_FORMAT', /"__metadata__": expected an object/);
  });

  it('unknown dtype', async () => {
    const h = JSON.stringify({ t: { dtype: 'F33', shape: [2], data_offsets: [0, 8] } });
    await expectKvdError(() => openSafetensors(craft(h, 8)), 'E_TRACE_FORMAT', /tensor "t" dtype: expected one of BOOL.*got "F33"/);
  });

  it('shape not an array of non-negative integers', async () => {
    for (const shape of [[2, -1], [1.5], 'x', [null]]) {
      const h = JSON.stringify({ t: { dtype: 'F32', shape, data_offsets: [0, 8] } });
      await expectKvdError(() => openSafetensors(craft(h, 8)), 'E_TRACE_FORMAT', /tensor "t" shape: expected an array of non-negative integers/);
    }
  });

  it('malformed data_offsets', async () => {
    for (const off of [[0], [8, 0], [0, -8], 'x']) {
      const h = JSON.stringify({ t: { dtype: 'F32', shape: [2], data_offsets: off } });
      await expectKvdError(() => openSafetensors(craft(h, 8)), 'E_TRACE_FORMAT', /tensor "t" data_offsets: expected \[begin, end\]/);
    }
  });

  it('data_offsets outside the buffer', async () => {
    const h = JSON.stringify({ t: { dtype: 'F32', shape: [2], data_offsets: [4, 12] } });
    await expectKvdError(() => openSafetensors(craft(h, 8)), 'E_TRACE_FORMAT', /data_offsets: expected within the data buffer of 8 bytes, got \[4, 12\]/);
  });

  it('offsets length ≠ prod(shape) × dtype size', async () => {
    const h = JSON.stringify({ t: { dtype: 'F16', shape: [2, 3], data_offsets: [0, 8] } });
    await expectKvdError(() => openSafetensors(craft(h, 8)), 'E_TRACE_FORMAT', /data_offsets length: expected 12 bytes \(shape \[2, 3\] × 2 bytes of F16\), got 8 bytes/);
  });

  it('overlapping tensors', async () => {
    const h = JSON.stringify({
      a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] },
      b: { dtype: 'F32', shape: [2], data_offsets: [4, 12] },
    });
    await expectKvdError(() => openSafetensors(craft(h, 12)), 'E_TRACE_FORMAT', /"a" \[0, 8\) and "b" \[4, 12\): expected non-overlapping/);
  });

  it('invalid UTF-8 in the header', async () => {
    const prefix = Buffer.alloc(8);
    prefix.writeBigUInt64LE(2n);
    const p = tmp('utf');
    writeFileSync(p, Buffer.concat([prefix, Buffer.from([0xff, 0xfe])]));
    await expectKvdError(() => openSafetensors(p), 'E_TRACE_FORMAT', /expected UTF-8 JSON text/);
  });
});
