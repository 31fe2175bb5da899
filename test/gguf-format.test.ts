/** GGUF reader/writer round trip and the typed errors of malformed or unsupported files. */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { readGguf } from '../src/model/gguf/reader.js';
import { writeGguf } from '../src/model/gguf/writer.js';
import { loadGgufModel } from '../src/model/gguf/model.js';
import { MODEL_SHAPES, writeRandomModel, type ModelShape } from '../src/model/gguf/random-model.js';
import { quantize, dequantize } from '../src/model/gguf/quant.js';
import type { GgufValue } from '../src/model/gguf/ggml-types.js';
import { expectKvdError } from './helpers.js';
import { tmpDir } from './model-helpers.js';

const dir = tmpDir();
const tiny: ModelShape = { ...MODEL_SHAPES['llama-3.2-1b']!, dim: 64, hiddenDim: 128, layers: 1, heads: 2, kvHeads: 1, headSize: 32, vocab: 270, context: 32 };
const good = join(dir, 'good.gguf');
writeRandomModel({ shape: tiny, type: 'Q8_0', out: good });

/** A copy of the good file with `edit` applied to its bytes. */
function variant(name: string, edit: (b: Buffer) => Buffer): string {
  const p = join(dir, name);
  writeFileSync(p, edit(Buffer.from(readFileSync(good))));
  return p;
}

/** Offset just past a length-prefixed string `s` in the header. */
function after(b: Buffer, s: string): number {
  const at = b.indexOf(Buffer.from(s, 'utf8'));
  expect(at).toBeGreaterThan(0);
  return at + Buffer.byteLength(s);
}

describe('GGUF reader and writer', () => {
  it('round-trips every metadata value type, nested arrays, alignment and tensor data', async () => {
    const meta: [string, GgufValue][] = [
      ['a.u8', { type: 'u8', value: 200 }],
      ['a.i8', { type: 'i8', value: -5 }],
      ['a.u16', { type: 'u16', value: 60000 }],
      ['a.i16', { type: 'i16', value: -300 }],
      ['a.u32', { type: 'u32', value: 4000000000 }],
      ['a.i32', { type: 'i32', value: -2000000000 }],
      ['a.f32', { type: 'f32', value: 1.5 }],
      ['a.f64', { type: 'f64', value: Math.PI }],
      ['a.bool', { type: 'bool', value: true }],
      ['a.str', { type: 'string', value: 'héllo ▁wörld' }],
      ['a.u64', { type: 'u64', value: 2n ** 40n }],
      ['a.i64', { type: 'i64', value: -(2n ** 40n) }],
      ['a.arr', { type: 'array', itemType: 'string', value: ['x', '', 'zz'] }],
      ['a.nums', { type: 'array', itemType: 'f32', value: [0.5, -2] }],
      ['a.nested', { type: 'array', itemType: 'array', value: [{ type: 'array', itemType: 'i32', value: [1, 2] }] }],
    ];
    const w = Float32Array.from({ length: 64 }, (_, i) => Math.sin(i));
    const p = join(dir, 'rt.gguf');
    writeGguf(p, { metadata: meta, alignment: 64, tensors: [
      { name: 'w', dims: [32, 2], type: 'Q8_0', data: quantize(w, 'Q8_0') },
      { name: 'v', dims: [3], type: 'F32', data: (write) => write(new Uint8Array(Float32Array.of(1, 2, 3).buffer)) },
    ] });
    const f = readGguf(p);
    expect(f.alignment).toBe(64);
    for (const [k, v] of meta) expect(f.metadata.get(k)).toEqual(v);
    const bytes = readFileSync(p);
    const t = f.tensorByName.get('w')!;
    expect(t.offset % 64).toBe(0);
    const back = dequantize(bytes.subarray(t.offset, t.offset + t.bytes), 'Q8_0', 64);
    for (let i = 0; i < 64; i++) expect(Math.abs(back[i]! - w[i]!)).toBeLessThan(0.01);
    const v = f.tensorByName.get('v')!;
    expect(Array.from(new Float32Array(bytes.buffer.slice(bytes.byteOffset + v.offset, bytes.byteOffset + v.offset + 12)))).toEqual([1, 2, 3]);
  });

  it('writer rejects a tensor whose data length differs from its shape', async () => {
    await expectKvdError(() => writeGguf(join(dir, 'bad.gguf'), { metadata: [], tensors: [{ name: 'x', dims: [4], type: 'F32', data: new Uint8Array(8) }] }), 'E_SHAPE', /16 bytes/);
  });
});

describe('malformed or unsupported GGUF files are typed errors', () => {
  it('missing file', async () => await expectKvdError(() => readGguf(join(dir, 'nope.gguf')), 'E_NOT_FOUND'));
  it('wrong magic', async () => {
    const p = variant('magic.gguf', (b) => (b.write('GGUX', 0, 'latin1'), b));
    await expectKvdError(() => readGguf(p), 'E_MODEL_FORMAT', /magic: expected "GGUF", got "GGUX"/);
  });
  it('another version', async () => {
    const p = variant('v2.gguf', (b) => (b.writeUInt32LE(2, 4), b));
    await expectKvdError(() => readGguf(p), 'E_VERSION', /expected 3, got 2/);
  });
  it('truncated in the header, the metadata, the tensor table and the data', async () => {
    const size = readFileSync(good).length;
    const f = readGguf(good);
    for (const cut of [10, 200, f.dataOffset - 10, size - 100]) {
      const p = variant(`cut${cut}.gguf`, (b) => b.subarray(0, cut));
      await expectKvdError(() => readGguf(p), 'E_MODEL_FORMAT', /truncated/);
    }
  });
  it('unknown tensor type', async () => {
    const p = variant('type.gguf', (b) => {
      const o = after(b, 'blk.0.attn_q.weight') + 4 + 2 * 8; // n_dims, ne[0], ne[1]
      expect(b.readUInt32LE(o)).toBe(8); // Q8_0
      b.writeUInt32LE(13, o); // Q5_K
      return b;
    });
    await expectKvdError(() => readGguf(p), 'E_MODEL_FORMAT', /attn_q.weight" type: expected one of .*, got Q5_K \(13\)/);
  });
  it('unknown architecture', async () => {
    const p = variant('arch.gguf', (b) => {
      const o = after(b, 'general.architecture') + 4 + 8; // value type, string length
      b.write('mamba', o, 'latin1');
      return b;
    });
    await expectKvdError(() => loadGgufModel(p), 'E_MODEL_FORMAT', /general.architecture: expected one of llama, qwen2, got "mamba"/);
  });
  it('tensor shape mismatch with the metadata', async () => {
    const p = variant('shape.gguf', (b) => {
      const o = after(b, 'llama.feed_forward_length') + 4;
      b.writeUInt32LE(192, o);
      return b;
    });
    await expectKvdError(() => loadGgufModel(p), 'E_MODEL_FORMAT', /ffn_gate.weight" shape: expected \[64, 192\], got \[64, 128\]/);
  });
  it('a bad metadata value type', async () => {
    const p = variant('vtype.gguf', (b) => (b.writeUInt32LE(99, after(b, 'general.architecture')), b));
    await expectKvdError(() => readGguf(p), 'E_MODEL_FORMAT', /type: expected a value type in 0..12, got 99/);
  });
});
