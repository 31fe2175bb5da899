// Shared arenas: documented layout (64-byte aligned regions, slot stride), views shared across
// threads, hard size cap.
import { describe, expect, it } from 'vitest';
import { Worker } from 'node:worker_threads';
import { pathToFileURL } from 'node:url';
import { SharedArena, planArena } from '../src/pipeline/shared-arena.js';
import { expectKvdError } from './helpers.js';
import { distPath } from './dist.js';

describe('planArena', () => {
  it('places regions in order on 64-byte boundaries and rounds the slot to 64 bytes', () => {
    const l = planArena(3, { a: { type: 'f32', length: 3 }, b: { type: 'i32', length: 20 }, c: { type: 'f64', length: 1 } });
    expect(l.regions.a).toEqual({ type: 'f32', length: 3, byteOffset: 0, byteLength: 12 });
    expect(l.regions.b).toEqual({ type: 'i32', length: 20, byteOffset: 64, byteLength: 80 });
    expect(l.regions.c).toEqual({ type: 'f64', length: 1, byteOffset: 192, byteLength: 8 });
    expect(l.slotBytes).toBe(256);
  });

  it('rejects bad specs (E_CONFIG) and arenas over the byte cap (E_NOMEM)', async () => {
    await expectKvdError(() => planArena(0, { a: { type: 'f32', length: 1 } }), 'E_CONFIG', /slots/);
    await expectKvdError(() => planArena(1, {}), 'E_CONFIG', /regions/);
    await expectKvdError(() => planArena(1, { a: { type: 'u8' as never, length: 1 } }), 'E_CONFIG', /region 'a' type/);
    await expectKvdError(() => planArena(1, { a: { type: 'f32', length: -1 } }), 'E_CONFIG', /region 'a' length/);
    await expectKvdError(() => planArena(4, { a: { type: 'f32', length: 1000 } }, 8192), 'E_NOMEM', /at most 8192 bytes, got 4 slots x 4032 bytes = 16128 bytes/);
  });
});

describe('SharedArena', () => {
  it('slot views do not overlap and sit at slot*slotBytes + byteOffset', async () => {
    const arena = SharedArena.create(2, { q: { type: 'f32', length: 5 }, ids: { type: 'i32', length: 3 } });
    const q1 = arena.view(1, 'q');
    expect(q1).toBeInstanceOf(Float32Array);
    expect(q1.byteOffset).toBe(arena.layout.slotBytes);
    expect(arena.view(1, 'ids').byteOffset).toBe(arena.layout.slotBytes + 64);
    arena.view(0, 'q').fill(1);
    arena.view(0, 'ids').fill(2);
    q1.fill(3);
    expect(Array.from(arena.view(0, 'q'))).toEqual([1, 1, 1, 1, 1]);
    expect(Array.from(arena.view(0, 'ids'))).toEqual([2, 2, 2]);
    expect(arena.view(1, 'q')).toBe(q1);
    await expectKvdError(() => arena.view(2, 'q'), 'E_RANGE', /slot: expected an integer in \[0, 2\), got 2/);
    await expectKvdError(() => arena.view(0, 'nope' as never), 'E_RANGE', /one of q, ids/);
    await expectKvdError(() => SharedArena.attach(new SharedArrayBuffer(8), arena.layout), 'E_SHAPE', /arena buffer size/);
  });

  it('a worker attached from (buffer, layout) sees and writes the same memory', async () => {
    const arena = SharedArena.create(2, { q: { type: 'f32', length: 3 * 4 * 8 }, selIds: { type: 'i32', length: 3 * 2 * 16 }, out: { type: 'f32', length: 3 * 4 * 8 } });
    expect(arena.view(1, 'q').length).toBe(3 * 4 * 8);
    expect(arena.view(1, 'selIds').length).toBe(3 * 2 * 16);
    arena.view(1, 'q').set([1.5, 2.5], 7);
    const url = pathToFileURL(distPath('src/pipeline/shared-arena.js')).href;
    const code = `
      const { workerData, parentPort } = require('node:worker_threads');
      import(${JSON.stringify(url)}).then(({ SharedArena }) => {
        const a = SharedArena.attach(workerData.buffer, workerData.layout);
        const q = a.view(1, 'q');
        a.view(1, 'out')[0] = q[7] + q[8];
        parentPort.postMessage('done');
      });`;
    const w = new Worker(code, { eval: true, workerData: { buffer: arena.buffer, layout: arena.layout } });
    const exited = new Promise((r) => w.once('exit', r)); // listen before it can happen
    await new Promise((r) => w.once('message', r));
    await exited;
    expect(arena.view(1, 'out')[0]).toBe(4);
    expect(arena.view(0, 'out')[0]).toBe(0);
  });
});
