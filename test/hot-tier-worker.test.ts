import { Worker } from 'node:worker_threads';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { HotTier } from '../src/cache/hot-tier.js';

const addon = resolve(dirname(fileURLToPath(import.meta.url)), '..', 'build', 'Release', 'kvdrive.node');

// A worker that loads the addon itself and steps the tier by handle over shared KV memory.
const workerCode = `
const { parentPort, workerData } = require('node:worker_threads');
const native = require(workerData.addon);
const { handle, kBuf, vBuf, tokens } = workerData;
const k = { data: new Float32Array(kBuf), dtype: 'f32', tokens, heads: 2, dim: 8 };
const v = { data: new Float32Array(vBuf), dtype: 'f32', tokens, heads: 2, dim: 8 };
const hits = [];
for (let step = 0; step < 3; step++) {
  const selection = { chunkSize: 4, tokens, sinkEnd: 4, tailStart: tokens - 8,
    offsets: Int32Array.from([0, 2, 4]), chunkIds: Int32Array.from([2, 5, 3, 6]) };
  const s = native.hotTierFetch(handle, { layer: 1, k, v, selection });
  hits.push(s.hits[0] + s.hits[1]);
}
let code = '';
try { native.hotTierFetch(999999, { layer: 0, k, v, selection: {} }); } catch (e) { code = e.code; }
parentPort.postMessage({ hits, code });
`;

let t: HotTier | undefined;
afterEach(() => t?.destroy());

describe('hot tier across worker threads', () => {
  it('is reachable by handle from a worker; residency and stats are shared with the main thread', async () => {
    t = new HotTier({ layers: 2, kvHeads: 2, headDim: 8, dtype: 'f32', chunkSize: 4, budget: 8, windows: 2, maxBytes: 1 << 20 });
    const tokens = 64;
    const kBuf = new SharedArrayBuffer(tokens * 2 * 8 * 4);
    const vBuf = new SharedArrayBuffer(tokens * 2 * 8 * 4);
    new Float32Array(kBuf).forEach((_, i, a) => (a[i] = Math.sin(i)));
    new Float32Array(vBuf).forEach((_, i, a) => (a[i] = Math.cos(i)));
    const w = new Worker(workerCode, { eval: true, workerData: { addon, handle: t.handle, kBuf, vBuf, tokens } });
    const msg = await new Promise<{ hits: number[]; code: string }>((res, rej) => {
      w.once('message', res);
      w.once('error', rej);
    });
    await w.terminate();
    expect(msg.hits).toEqual([0, 4, 4]);
    expect(msg.code).toBe('E_CLOSED');
    // The main thread sees what the worker did.
    expect(Array.from(t.residents(1, 0))).toEqual([2, 5]);
    expect(Array.from(t.residents(1, 1))).toEqual([3, 6]);
    const st = t.stats();
    expect(st.pairs[2]!.hits + st.pairs[3]!.hits).toBe(8);
    expect(st.total.admitted).toBe(4);
    expect(t.check()).toBe('');
  });
});
