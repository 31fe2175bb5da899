// Child process of the crash test (storage-crash.test.ts): appends segments to an SSD store forever,
// printing "sealed <id>" after each write resolved, until the parent kills it with SIGKILL.
// Uses the compiled package (dist/), so run `npm run build:ts` first.
import { SsdStore } from '../dist/src/storage/ssd-store.js';

export const crashShape = { layers: 3, kvHeads: 4, headDim: 64, dtype: 'f16', chunkSize: 4 };
export const crashTokens = 256;

/** Deterministic segment data from its index: a cheap hash per element. */
export function crashSegment(i) {
  const s = crashShape;
  const n = crashTokens * s.kvHeads * s.headDim;
  const layers = [];
  for (let l = 0; l < s.layers; l++) {
    const kv = [0, 1].map((w) => {
      const data = new Uint16Array(n);
      let x = (i * 7919 + l * 104729 + w * 1299709) >>> 0;
      for (let e = 0; e < n; e++) {
        x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + e) >>> 0;
        data[e] = x & 0xffff;
      }
      return { data, dtype: 'f16', tokens: crashTokens, heads: s.kvHeads, dim: s.headDim };
    });
    layers.push({ k: kv[0], v: kv[1] });
  }
  return { layers };
}

if (process.argv[2]) {
  const dir = process.argv[2];
  const store = await SsdStore.open({ dir, shape: crashShape, kind: 'pread' });
  let i = store.segments().length;
  process.stdout.write('ready\n');
  for (;;) {
    const id = `seg${i}`;
    await store.writeSegment(id, crashSegment(i));
    process.stdout.write(`sealed ${id}\n`);
    i++;
  }
}
