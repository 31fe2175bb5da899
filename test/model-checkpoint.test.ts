import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadCheckpoint } from '../src/model/checkpoint.js';
import { expectKvdError, fixturesDir } from './helpers.js';
import { checkpointBytes, floatsFor, headerBytes, tinyHeader, tmpDir, writeTmp, type TinyHeader } from './model-helpers.js';

const dir = tmpDir();
const withHeader = (patch: Partial<TinyHeader>): TinyHeader => ({ ...tinyHeader, ...patch });

describe('loadCheckpoint', () => {
  it('reads the header and lays the weights out in llama2.c order (shared classifier)', () => {
    const bytes = checkpointBytes(tinyHeader, 7);
    const ck = loadCheckpoint(writeTmp(dir, 'ok.bin', bytes));
    expect(ck.config).toMatchObject({ dim: 16, hiddenDim: 24, nLayers: 2, nHeads: 4, nKvHeads: 2, vocabSize: 300, seqLen: 32, headSize: 4, kvDim: 8, sharedClassifier: true });
    const f = new Float32Array(bytes.buffer.slice(bytes.byteOffset + 28, bytes.byteOffset + bytes.byteLength));
    const { dim, hidden_dim: hd, vocab_size: V } = tinyHeader;
    const kv = 8;
    expect(ck.tokenEmbedding[0]).toBe(f[0]);
    expect(ck.wcls).toBe(ck.tokenEmbedding);
    // rms_att of layer 1 follows the embedding and layer 0's rms_att.
    expect(ck.layers[1]!.rmsAtt[0]).toBe(f[V * dim + dim]);
    // wk of layer 0 follows all rms_att and all wq.
    const wk0 = V * dim + 2 * dim + 2 * dim * dim;
    expect(ck.layers[0]!.wk[0]).toBe(f[wk0]);
    expect(ck.layers[1]!.wv.length).toBe(dim * kv);
    // w3 of layer 1 ends right before rms_final.
    const rmsFinal = floatsFor(tinyHeader) - tinyHeader.seq_len * 4 - dim;
    expect(ck.layers[1]!.w3[dim * hd - 1]).toBe(f[rmsFinal - 1]);
    expect(ck.rmsFinal[0]).toBe(f[rmsFinal]);
  });

  it('reads a separate classifier after the skipped RoPE tables when vocab_size < 0', () => {
    const h = withHeader({ vocab_size: -300 });
    const bytes = checkpointBytes(h, 3);
    const ck = loadCheckpoint(writeTmp(dir, 'sep.bin', bytes));
    expect(ck.config.sharedClassifier).toBe(false);
    expect(ck.config.vocabSize).toBe(300);
    expect(ck.wcls).not.toBe(ck.tokenEmbedding);
    const f = new Float32Array(bytes.buffer.slice(bytes.byteOffset + 28, bytes.byteOffset + bytes.byteLength));
    expect(ck.wcls[0]).toBe(f[f.length - 300 * 16]);
    expect(ck.wcls[300 * 16 - 1]).toBe(f[f.length - 1]);
  });

  it('missing file → E_NOT_FOUND', async () => {
    await expectKvdError(() => loadCheckpoint(join(dir, 'nope.bin')), 'E_NOT_FOUND', /checkpoint not found/);
  });

  it('a directory → E_MODEL_FORMAT', async () => {
    await expectKvdError(() => loadCheckpoint(dir), 'E_MODEL_FORMAT', /expected a regular file, got a directory/);
  });

  it('shorter than the header → E_MODEL_FORMAT', async () => {
    const p = writeTmp(dir, 'short.bin', headerBytes(tinyHeader).subarray(0, 20));
    await expectKvdError(() => loadCheckpoint(p), 'E_MODEL_FORMAT', /expected at least 28 bytes, got 20 bytes/);
  });

  it.each([
    [{ dim: 0 }, /dim: expected an integer in \[1, 65536\], got 0/],
    [{ n_layers: -2 }, /n_layers: expected an integer in \[1, 1024\], got -2/],
    [{ vocab_size: 0 }, /vocab_size: expected an integer in \[1, 4194304\], got 0/],
    [{ seq_len: 0x7fffffff }, /seq_len: expected an integer in \[1, 4194304\], got 2147483647/],
    [{ n_kv_heads: 3 }, /n_heads divisible by n_kv_heads, got n_heads 4, n_kv_heads 3/],
    [{ n_heads: 3, n_kv_heads: 1 }, /dim divisible by n_heads, got dim 16, n_heads 3/],
    [{ n_heads: 8, n_kv_heads: 2, dim: 8 }, /even head size/],
  ] as [Partial<TinyHeader>, RegExp][])('bad header %j → E_MODEL_FORMAT', async (patch, msg) => {
    const p = writeTmp(dir, 'badhdr.bin', Buffer.concat([headerBytes(withHeader(patch)), Buffer.alloc(4096)]));
    await expectKvdError(() => loadCheckpoint(p), 'E_MODEL_FORMAT', msg);
  });

  it('a versioned llama2.c export ("ak42" magic) → E_VERSION', async () => {
    const b = Buffer.alloc(256);
    b.writeUInt32LE(0x616b3432, 0);
    b.writeInt32LE(2, 4);
    const p = writeTmp(dir, 'v2.bin', b);
    await expectKvdError(() => loadCheckpoint(p), 'E_VERSION', /expected the legacy llama2.c format .* got the "ak42" format version 2/);
  });

  it('truncated weights → E_MODEL_FORMAT with expected vs given size', async () => {
    const good = checkpointBytes();
    const p = writeTmp(dir, 'trunc.bin', good.subarray(0, good.length - 100));
    await expectKvdError(() => loadCheckpoint(p), 'E_MODEL_FORMAT', new RegExp(`expected ${good.length} bytes .* got ${good.length - 100} bytes`));
  });

  it('extra trailing data → E_MODEL_FORMAT', async () => {
    const p = writeTmp(dir, 'long.bin', checkpointBytes(tinyHeader, 1, 3));
    await expectKvdError(() => loadCheckpoint(p), 'E_MODEL_FORMAT', /size: expected \d+ bytes/);
  });

  it('a separate classifier with a positive vocab_size is reported with a hint', async () => {
    const sep = checkpointBytes(withHeader({ vocab_size: -300 }));
    headerBytes(tinyHeader).copy(sep, 0); // flip the sign back to "shared"
    const p = writeTmp(dir, 'sign.bin', sep);
    await expectKvdError(() => loadCheckpoint(p), 'E_MODEL_FORMAT', /size with a separate classifier; the sign of vocab_size says otherwise/);
  });

  it('loads the stories260K fixture', (ctx) => {
    const fx = fixturesDir();
    if (!fx) return ctx.skip();
    const ck = loadCheckpoint(join(fx, 'stories260K', 'stories260K.bin'));
    expect(ck.config).toMatchObject({ dim: 64, hiddenDim: 172, nLayers: 5, nHeads: 8, nKvHeads: 4, vocabSize: 512, seqLen: 512, headSize: 8, sharedClassifier: true });
  });
});
