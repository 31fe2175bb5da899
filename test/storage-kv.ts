/** Test data for the storage tests: random segment KV and the expected page-first chunk bytes. */
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ClusterLayout, SegmentData, StoreShape } from '../src/storage/ssd-store.js';
import type { KvTensor } from '../src/types.js';
import { randn, rng } from './helpers.js';

const made: string[] = [];

/** A fresh temporary directory; {@link removeTempDirs} deletes every one made so far. */
export function tempDir(tag: string): string {
  const d = mkdtempSync(join(tmpdir(), `kvd-storage-${tag}-`));
  made.push(d);
  return d;
}

export function removeTempDirs(): void {
  for (const d of made.splice(0)) rmSync(d, { recursive: true, force: true });
}

function tensor(shape: StoreShape, tokens: number, seed: number): KvTensor {
  const n = tokens * shape.kvHeads * shape.headDim;
  const f = randn(n, seed);
  if (shape.dtype === 'f32') return { data: f, dtype: 'f32', tokens, heads: shape.kvHeads, dim: shape.headDim };
  // 16-bit storage: random bit patterns are fine for byte-exact storage tests.
  const u = new Uint16Array(f.buffer, 0, n);
  return { data: new Uint16Array(u), dtype: shape.dtype, tokens, heads: shape.kvHeads, dim: shape.headDim };
}

/** Random KV for one segment of `tokens` tokens. */
export function segmentKv(shape: StoreShape, tokens: number, seed: number): SegmentData {
  const layers = [];
  for (let l = 0; l < shape.layers; l++) layers.push({ k: tensor(shape, tokens, seed * 1000 + 2 * l), v: tensor(shape, tokens, seed * 1000 + 2 * l + 1) });
  return { layers };
}

/** Random cluster membership per (layer, head): a shuffled permutation cut into clusters of 1..maxSize. */
export function randomClusters(shape: StoreShape, chunks: number, seed: number, maxSize = 6): ClusterLayout[] {
  const r = rng(seed);
  const out: ClusterLayout[] = [];
  for (let i = 0; i < shape.layers * shape.kvHeads; i++) {
    const ids = Int32Array.from({ length: chunks }, (_, j) => j);
    for (let j = chunks - 1; j > 0; j--) {
      const k = Math.floor(r() * (j + 1));
      [ids[j], ids[k]] = [ids[k]!, ids[j]!];
    }
    const offsets = [0];
    while (offsets[offsets.length - 1]! < chunks) offsets.push(Math.min(chunks, offsets[offsets.length - 1]! + 1 + Math.floor(r() * maxSize)));
    out.push({ offsets: Int32Array.from(offsets), chunkIds: ids });
  }
  return out;
}

/** The page-first bytes of chunk `j` of (layer, head): c K rows then c V rows. */
export function expectedChunk(shape: StoreShape, data: SegmentData, layer: number, head: number, j: number): Uint8Array {
  const c = shape.chunkSize;
  const D = shape.headDim;
  const es = shape.dtype === 'f32' ? 4 : 2;
  const out = new Uint8Array(2 * c * D * es);
  const { k, v } = data.layers[layer]!;
  let at = 0;
  for (const t of [k, v]) {
    const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    for (let i = 0; i < c; i++) {
      const row = ((j * c + i) * shape.kvHeads + head) * D * es;
      out.set(bytes.subarray(row, row + D * es), at);
      at += D * es;
    }
  }
  return out;
}

/** Flips bytes in every segment file of `dir` whose name starts with `prefix`; returns a function restoring them. */
export function corruptSegments(dir: string, prefix: string): () => void {
  const saved: Array<[string, Buffer]> = [];
  for (const f of readdirSync(dir)) {
    if (!f.startsWith(prefix)) continue;
    const p = join(dir, f);
    const b = readFileSync(p);
    saved.push([p, Buffer.from(b)]);
    for (let i = 0; i < b.length; i += 512) b[i] = b[i]! ^ 0xff;
    writeFileSync(p, b);
  }
  return () => {
    for (const [p, b] of saved) writeFileSync(p, b);
  };
}
