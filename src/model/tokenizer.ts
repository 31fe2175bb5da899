/**
 * The llama2.c tokenizer: a sentencepiece-style BPE vocabulary exported to a flat binary file.
 *
 * File layout (little-endian): int32 max_token_length, then per token: f32 score, int32 length,
 * `length` bytes (the piece). The number of tokens is not stored; it is the model's vocab_size.
 *
 * Pieces are byte strings (usually UTF-8, but a piece may hold part of a character). Internally a
 * piece is kept both as bytes and as a latin1 string (one char per byte), so concatenation and
 * lookup work on bytes exactly like run.c's C strings.
 *
 * Conventions (as in llama2.c): token 1 is BOS, 2 is EOS, tokens 3..258 are the byte-fallback
 * pieces "<0x00>".."<0xFF>" (token = byte + 3). Encoding prepends a dummy space (sentencepiece's
 * add_dummy_prefix) and decoding drops the leading space of the piece that follows BOS.
 */
import { KvdriveError, fail } from '../errors.js';
import { bpeMerge } from './bpe.js';
import { readModelFile } from './checkpoint.js';
import { failFormat } from './format-error.js';

export const BOS = 1;
export const EOS = 2;
/** Token id of byte b in the byte-fallback range. */
const BYTE_TOKEN_OFFSET = 3;

/** Options of {@link Tokenizer.encode}. */
export interface EncodeOptions {
  /** Prepend BOS (token 1). Default true. */
  bos?: boolean;
  /** Append EOS (token 2). Default false. */
  eos?: boolean;
}

/** Options of {@link loadTokenizer}. */
export interface LoadTokenizerOptions {
  /**
   * Number of tokens the file must hold (the checkpoint's vocab size). When given, a file holding
   * fewer or more tokens is an E_MODEL_FORMAT error; when omitted, tokens are read until the end.
   */
  vocabSize?: number;
}

const BYTE_PIECE = /^<0x([0-9A-Fa-f]{2})>$/;

export class Tokenizer {
  /** Pieces as latin1 strings (one char per byte). */
  private readonly pieces: string[];
  private readonly pieceBytes: Uint8Array[];
  /** Merge priority: higher merges first. */
  private readonly scores: Float32Array;
  /** Piece (latin1) → lowest token id with that piece. */
  private readonly lookup = new Map<string, number>();
  /** For a byte-fallback piece "<0xXX>", the byte; else -1. */
  private readonly byteOf: Int16Array;

  constructor(
    pieces: Uint8Array[],
    scores: Float32Array,
    /** Longest piece in bytes, as declared by the file. */
    readonly maxTokenLength: number,
  ) {
    this.pieceBytes = pieces;
    this.pieces = pieces.map((p) => Buffer.from(p.buffer, p.byteOffset, p.byteLength).toString('latin1'));
    this.scores = scores;
    this.byteOf = new Int16Array(pieces.length).fill(-1);
    this.pieces.forEach((p, id) => {
      if (!this.lookup.has(p)) this.lookup.set(p, id);
      const m = BYTE_PIECE.exec(p);
      if (m) this.byteOf[id] = parseInt(m[1]!, 16);
    });
  }

  get vocabSize(): number {
    return this.pieces.length;
  }

  /** The raw bytes of a token's piece. */
  piece(token: number): Uint8Array {
    this.checkToken(token);
    return this.pieceBytes[token]!;
  }

  /** A token's merge score (higher merges first). */
  score(token: number): number {
    this.checkToken(token);
    return this.scores[token]!;
  }

  /**
   * Encodes text to token ids like llama2.c's `encode`: dummy-space prefix, UTF-8 code points looked
   * up whole (unknown ones fall back to byte tokens), then repeated merging of the adjacent pair
   * whose concatenation is the highest-scoring vocabulary piece.
   */
  encode(text: string, options: EncodeOptions = {}): number[] {
    if (typeof text !== 'string') fail('E_TYPE', 'tokenizer encode text', 'a string', text);
    const { bos = true, eos = false } = options;
    const tokens: number[] = [];
    if (bos) tokens.push(BOS);
    const bytes = Buffer.from(text, 'utf8');
    if (bytes.length > 0) tokens.push(...this.lookupOrBytes(Buffer.from(' ', 'latin1')));

    // Split into UTF-8 code points: a lead byte starts a new one; at most 4 bytes each.
    let start = 0;
    for (let i = 0; i < bytes.length; i++) {
      const next = i + 1 < bytes.length ? bytes[i + 1]! : 0;
      if ((next & 0xc0) === 0x80 && i + 1 - start < 4) continue;
      tokens.push(...this.lookupOrBytes(bytes.subarray(start, i + 1)));
      start = i + 1;
    }

    // Greedy BPE (never across BOS): merge the best-scoring adjacent pair until none is a piece.
    const first = bos ? 1 : 0;
    const merged = bpeMerge(tokens.slice(first), (a, b) => {
      const id = this.lookup.get(this.pieces[a]! + this.pieces[b]!);
      return id === undefined ? undefined : { id, score: this.scores[id]! };
    });
    tokens.length = first;
    for (const t of merged) tokens.push(t);
    if (eos) tokens.push(EOS);
    return tokens;
  }

  /**
   * Bytes of `token` as it appears after `prev`: byte-fallback tokens give their byte, and the
   * piece right after BOS loses its leading space (the dummy prefix added by encode).
   */
  decodePiece(prev: number, token: number): Uint8Array {
    this.checkToken(token);
    const b = this.byteOf[token]!;
    if (b >= 0) return Uint8Array.of(b);
    const p = this.pieceBytes[token]!;
    return prev === BOS && p[0] === 0x20 ? p.subarray(1) : p;
  }

  /**
   * Decodes a token sequence to text. BOS and EOS contribute nothing; byte tokens are assembled
   * into UTF-8 (invalid sequences become U+FFFD).
   */
  decode(tokens: readonly number[]): string {
    const parts: Uint8Array[] = [];
    let prev = -1;
    for (const t of tokens) {
      if (t !== BOS && t !== EOS) parts.push(this.decodePiece(prev, t));
      prev = t;
    }
    return new TextDecoder().decode(Buffer.concat(parts));
  }

  private lookupOrBytes(piece: Uint8Array): number[] {
    const id = this.lookup.get(Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength).toString('latin1'));
    if (id !== undefined) return [id];
    return Array.from(piece, (b) => {
      const t = b + BYTE_TOKEN_OFFSET;
      if (t >= this.pieces.length || this.byteOf[t] !== b)
        failFormat('E_RANGE', `tokenizer encode: byte 0x${b.toString(16).padStart(2, '0')}`, 'a vocabulary piece or a byte-fallback token <0xXX> at id byte+3', `none in a ${this.pieces.length}-token vocabulary`);
      return t;
    });
  }

  private checkToken(token: number): void {
    if (!Number.isInteger(token) || token < 0 || token >= this.pieces.length)
      fail('E_RANGE', 'token id', `an integer in [0, ${this.pieces.length})`, token);
  }
}

/** Parses a tokenizer file already in memory (see the file layout above). */
export function parseTokenizer(buf: Uint8Array, options: LoadTokenizerOptions = {}, path = '<buffer>'): Tokenizer {
  const { vocabSize } = options;
  if (vocabSize !== undefined && (!Number.isInteger(vocabSize) || vocabSize < 1))
    fail('E_CONFIG', 'tokenizer vocabSize', 'an integer ≥ 1', vocabSize);
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  if (buf.byteLength < 4) failFormat('E_MODEL_FORMAT', `tokenizer ${path}`, 'at least 4 bytes (max_token_length)', `${buf.byteLength} bytes`);
  const maxTokenLength = dv.getInt32(0, true);
  if (maxTokenLength < 1 || maxTokenLength > 1 << 16)
    fail('E_MODEL_FORMAT', `tokenizer ${path} max_token_length`, 'an integer in [1, 65536]', maxTokenLength);

  const pieces: Uint8Array[] = [];
  const scores: number[] = [];
  let off = 4;
  while (vocabSize === undefined ? off < buf.byteLength : pieces.length < vocabSize) {
    const id = pieces.length;
    if (off + 8 > buf.byteLength)
      failFormat('E_MODEL_FORMAT', `tokenizer ${path} token ${id}`, `8 bytes (score, length) at offset ${off}`, `${buf.byteLength - off} bytes (file truncated${vocabSize !== undefined ? `; vocab size ${vocabSize}` : ''})`);
    const score = dv.getFloat32(off, true);
    const len = dv.getInt32(off + 4, true);
    off += 8;
    if (!Number.isFinite(score)) fail('E_MODEL_FORMAT', `tokenizer ${path} token ${id} score`, 'a finite float', score);
    if (len < 0 || len > maxTokenLength)
      fail('E_MODEL_FORMAT', `tokenizer ${path} token ${id} length`, `an integer in [0, ${maxTokenLength}] (max_token_length)`, len);
    if (off + len > buf.byteLength)
      failFormat('E_MODEL_FORMAT', `tokenizer ${path} token ${id} bytes`, `${len} bytes at offset ${off}`, `${buf.byteLength - off} bytes (file truncated)`);
    pieces.push(buf.slice(off, off + len));
    scores.push(score);
    off += len;
  }
  if (off !== buf.byteLength)
    failFormat('E_MODEL_FORMAT', `tokenizer ${path}`, `exactly ${vocabSize} tokens (the model's vocab size) ending at byte ${off}`, `${buf.byteLength} bytes (${buf.byteLength - off} trailing)`);
  if (pieces.length <= EOS) failFormat('E_MODEL_FORMAT', `tokenizer ${path}`, 'at least 3 tokens (<unk>, BOS, EOS)', `${pieces.length} tokens`);
  return new Tokenizer(pieces, Float32Array.from(scores), maxTokenLength);
}

/**
 * Loads a llama2.c tokenizer file. Pass the checkpoint's vocab size as `vocabSize` so a tokenizer
 * that does not belong to the model is rejected (E_MODEL_FORMAT). Missing file: E_NOT_FOUND.
 */
export function loadTokenizer(path: string, options: LoadTokenizerOptions = {}): Tokenizer {
  const buf = readModelFile(path, 'tokenizer');
  try {
    return parseTokenizer(buf, options, path);
  } catch (e) {
    if (e instanceof KvdriveError) throw e;
    throw new KvdriveError('E_MODEL_FORMAT', `tokenizer ${path}: ${(e as Error).message}`, { cause: e });
  }
}
