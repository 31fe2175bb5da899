/** Builders of small llama2.c-format files for the model tests (written into a tmp dir). */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randn } from './helpers.js';

export interface TinyHeader {
  dim: number;
  hidden_dim: number;
  n_layers: number;
  n_heads: number;
  n_kv_heads: number;
  vocab_size: number;
  seq_len: number;
}

export const tinyHeader: TinyHeader = { dim: 16, hidden_dim: 24, n_layers: 2, n_heads: 4, n_kv_heads: 2, vocab_size: 300, seq_len: 32 };

/** f32 count after the header that llama2.c expects for h (independent of src/model/checkpoint.ts). */
export function floatsFor(h: TinyHeader): number {
  const V = Math.abs(h.vocab_size);
  const hs = h.dim / h.n_heads;
  const kv = h.n_kv_heads * hs;
  const L = h.n_layers;
  let n = V * h.dim + L * h.dim + L * h.dim * h.dim + 2 * L * h.dim * kv + L * h.dim * h.dim + L * h.dim;
  n += 3 * L * h.dim * h.hidden_dim + h.dim + h.seq_len * hs;
  if (h.vocab_size < 0) n += V * h.dim;
  return n;
}

export function headerBytes(h: TinyHeader): Buffer {
  const b = Buffer.alloc(28);
  [h.dim, h.hidden_dim, h.n_layers, h.n_heads, h.n_kv_heads, h.vocab_size, h.seq_len].forEach((v, i) => b.writeInt32LE(v, i * 4));
  return b;
}

/** A checkpoint file with random weights (scaled small) and `extraFloats` appended (may be negative). */
export function checkpointBytes(h: TinyHeader = tinyHeader, seed = 1, extraFloats = 0): Buffer {
  const w = randn(floatsFor(h) + extraFloats, seed).map((x) => x * 0.3);
  return Buffer.concat([headerBytes(h), Buffer.from(w.buffer)]);
}

/** A tokenizer file: pieces with scores (score defaults to -index). */
export function tokenizerBytes(pieces: (string | Uint8Array)[], scores?: number[], maxLen?: number): Buffer {
  const bufs = pieces.map((p) => (typeof p === 'string' ? Buffer.from(p, 'utf8') : Buffer.from(p)));
  const parts: Buffer[] = [];
  const head = Buffer.alloc(4);
  head.writeInt32LE(maxLen ?? Math.max(...bufs.map((b) => b.length)));
  parts.push(head);
  bufs.forEach((b, i) => {
    const e = Buffer.alloc(8);
    e.writeFloatLE(scores?.[i] ?? -i, 0);
    e.writeInt32LE(b.length, 4);
    parts.push(e, b);
  });
  return Buffer.concat(parts);
}

/** llama2.c-style vocabulary: <unk>, BOS, EOS, 256 byte tokens, then `extra` pieces. */
export function byteVocab(extra: string[]): string[] {
  const bytes = Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
  return ['<unk>', '\n<s>\n', '\n</s>\n', ...bytes, ...extra];
}

export function tmpDir(): string {
  return mkdtempSync(join(tmpdir(), 'kvdrive-model-'));
}

export function writeTmp(dir: string, name: string, data: Uint8Array): string {
  const p = join(dir, name);
  writeFileSync(p, data);
  return p;
}
