/**
 * Tokenizers from GGUF metadata (`tokenizer.ggml.*`), encoding as llama.cpp does (without parsing
 * special tokens in the text):
 *
 * - `llama` (SentencePiece-style): a space is prepended (tokenizer.ggml.add_space_prefix, default
 *   true) and spaces become "▁"; the text is split into UTF-8 characters, then the adjacent pair
 *   whose concatenation is the highest-scoring vocabulary piece is merged (leftmost on ties) until no
 *   pair is a piece; a character that is no piece becomes its byte tokens "<0xXX>".
 * - `gpt2` (byte-level BPE): the text is split by the pre-tokenizer regex of tokenizer.ggml.pre
 *   (Llama 3 "llama-bpe", Qwen2 "qwen2", else GPT-2's), each piece's bytes are mapped to GPT-2's
 *   printable byte alphabet, and the pair of lowest merge rank (tokenizer.ggml.merges) is merged
 *   (leftmost on ties) until none applies.
 *
 * Decoding turns "▁" back into spaces (llama) or the byte alphabet back into bytes (gpt2); control
 * tokens decode to nothing.
 */
import { fail } from '../../errors.js';
import { failFormat } from '../format-error.js';
import { bpeMerge } from '../bpe.js';
import { GgufMeta, type GgufFile } from './reader.js';

/** Token types of tokenizer.ggml.token_type. */
const TOKEN_TYPE = { normal: 1, unknown: 2, control: 3, userDefined: 4, unused: 5, byte: 6 } as const;

export type TokenizerModel = 'llama' | 'gpt2';

/** Options of {@link GgufTokenizer.encode}. */
export interface GgufEncodeOptions {
  /** Prepend BOS. Default: the file's tokenizer.ggml.add_bos_token (true for llama, else false). */
  bos?: boolean;
}

/** GPT-2's reversible byte → printable character map (bytes that print as themselves keep their code). */
function byteAlphabet(): string[] {
  const keep = new Set<number>();
  for (let b = 0x21; b <= 0x7e; b++) keep.add(b);
  for (let b = 0xa1; b <= 0xac; b++) keep.add(b);
  for (let b = 0xae; b <= 0xff; b++) keep.add(b);
  const out: string[] = [];
  let n = 0;
  for (let b = 0; b < 256; b++) out.push(String.fromCodePoint(keep.has(b) ? b : 256 + n++));
  return out;
}

/** Pre-tokenizer regexes (llama.cpp's, with the case-insensitive contractions spelled out). */
const PRE_TOKENIZERS: Record<string, RegExp> = {
  'llama-bpe':
    /(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu,
  qwen2:
    /(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu,
  gpt2: /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu,
};

export class GgufTokenizer {
  readonly vocabSize: number;
  readonly bos: number;
  readonly eos: number;
  readonly addBos: boolean;
  private readonly ids = new Map<string, number>();
  private readonly types: number[];
  /** llama: merge priority per token. */
  private readonly scores: number[];
  /** gpt2: rank of each merge "left right". */
  private readonly ranks = new Map<string, number>();
  private readonly pre: RegExp;
  private readonly alphabet = byteAlphabet();
  private readonly unAlphabet = new Map<string, number>();
  private readonly addSpacePrefix: boolean;
  private readonly ignoreMerges: boolean;
  /** Decoded bytes per token. */
  private readonly bytes: Uint8Array[];

  constructor(
    readonly model: TokenizerModel,
    readonly tokens: string[],
    options: { scores?: number[]; types?: number[]; merges?: string[]; bos: number; eos: number; addBos: boolean; addSpacePrefix?: boolean; pre?: string },
  ) {
    this.vocabSize = tokens.length;
    this.bos = options.bos;
    this.eos = options.eos;
    this.addBos = options.addBos;
    this.addSpacePrefix = options.addSpacePrefix ?? true;
    this.types = options.types ?? tokens.map(() => TOKEN_TYPE.normal);
    this.scores = options.scores ?? tokens.map(() => 0);
    tokens.forEach((t, id) => {
      if (!this.ids.has(t)) this.ids.set(t, id);
    });
    (options.merges ?? []).forEach((m, rank) => this.ranks.set(m, rank));
    this.pre = PRE_TOKENIZERS[options.pre ?? 'gpt2'] ?? PRE_TOKENIZERS.gpt2!;
    this.ignoreMerges = options.pre === 'llama-bpe';
    this.alphabet.forEach((c, b) => this.unAlphabet.set(c, b));
    this.bytes = tokens.map((t, id) => this.tokenBytes(t, this.types[id]!));
  }

  private tokenBytes(t: string, type: number): Uint8Array {
    if (type === TOKEN_TYPE.control || type === TOKEN_TYPE.unknown || type === TOKEN_TYPE.unused) return new Uint8Array(0);
    if (this.model === 'llama') {
      const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(t);
      if (type === TOKEN_TYPE.byte && m) return Uint8Array.of(parseInt(m[1]!, 16));
      return Buffer.from(t.replaceAll('\u2581', ' '), 'utf8');
    }
    if (type === TOKEN_TYPE.userDefined) return Buffer.from(t, 'utf8');
    const out: number[] = [];
    for (const ch of t) {
      const b = this.unAlphabet.get(ch);
      if (b === undefined) out.push(...Buffer.from(ch, 'utf8'));
      else out.push(b);
    }
    return Uint8Array.from(out);
  }

  /** Encodes text to token ids (see the file comment). */
  encode(text: string, options: GgufEncodeOptions = {}): number[] {
    if (typeof text !== 'string') fail('E_TYPE', 'tokenizer encode text', 'a string', text);
    const out: number[] = [];
    if (options.bos ?? this.addBos) out.push(this.bos);
    if (text.length === 0) return out;
    if (this.model === 'llama') out.push(...this.encodeSpm(text));
    else for (const m of text.matchAll(this.pre)) out.push(...this.encodeBpeWord(m[0]));
    return out;
  }

  private encodeSpm(text: string): number[] {
    const s = (this.addSpacePrefix ? ' ' + text : text).replaceAll(' ', '\u2581');
    // Symbols are strings; characters that are no piece get ids past the vocabulary.
    const extra: string[] = [];
    const str = (id: number): string => (id < this.vocabSize ? this.tokens[id]! : extra[id - this.vocabSize]!);
    const symbols = Array.from(s, (ch) => this.ids.get(ch) ?? this.vocabSize + extra.push(ch) - 1);
    const merged = bpeMerge(symbols, (a, b) => {
      const id = this.ids.get(str(a) + str(b));
      return id === undefined ? undefined : { id, score: this.scores[id]! };
    });
    const out: number[] = [];
    for (const id of merged) {
      if (id < this.vocabSize) {
        out.push(id);
        continue;
      }
      for (const b of Buffer.from(str(id), 'utf8')) {
        const t = this.ids.get(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
        if (t === undefined)
          failFormat('E_RANGE', `tokenizer encode: byte 0x${b.toString(16).padStart(2, '0')}`, 'a vocabulary piece or a byte token <0xXX>', `none in a ${this.vocabSize}-token vocabulary`);
        out.push(t);
      }
    }
    return out;
  }

  private encodeBpeWord(word: string): number[] {
    const mapped = Array.from(Buffer.from(word, 'utf8'), (b) => this.alphabet[b]!).join('');
    // Llama 3's tokenizer takes a pre-token that is itself a piece whole (llama.cpp's ignore_merges).
    const whole = this.ids.get(mapped);
    if (whole !== undefined && this.ignoreMerges) return [whole];
    const extra: string[] = [];
    const str = (id: number): string => (id < this.vocabSize ? this.tokens[id]! : extra[id - this.vocabSize]!);
    const symbols = Array.from(mapped, (ch) => this.ids.get(ch) ?? this.vocabSize + extra.push(ch) - 1);
    const merged = bpeMerge(symbols, (a, b) => {
      const rank = this.ranks.get(`${str(a)} ${str(b)}`);
      if (rank === undefined) return undefined;
      const id = this.ids.get(str(a) + str(b));
      return id === undefined ? undefined : { id, score: -rank };
    });
    return merged.map((id) => {
      if (id >= this.vocabSize) failFormat('E_RANGE', 'tokenizer encode', `a vocabulary piece for ${JSON.stringify(str(id))}`, 'none');
      return id;
    });
  }

  /** Bytes of `token` as it appears after `prev` (the piece right after BOS loses a leading space). */
  decodePiece(prev: number, token: number): Uint8Array {
    if (!Number.isInteger(token) || token < 0 || token >= this.vocabSize) fail('E_RANGE', 'token id', `an integer in [0, ${this.vocabSize})`, token);
    const p = this.bytes[token]!;
    return this.model === 'llama' && this.addSpacePrefix && prev === this.bos && p[0] === 0x20 ? p.subarray(1) : p;
  }

  /** Decodes ids to text (control tokens give nothing; invalid UTF-8 becomes U+FFFD). */
  decode(ids: readonly number[]): string {
    const parts: Uint8Array[] = [];
    let prev = -1;
    for (const t of ids) {
      parts.push(this.decodePiece(prev, t));
      prev = t;
    }
    return new TextDecoder().decode(Buffer.concat(parts));
  }
}

/** Builds the tokenizer a GGUF file describes; a missing or unknown tokenizer is E_MODEL_FORMAT. */
export function ggufTokenizer(file: GgufFile): GgufTokenizer {
  const m = new GgufMeta(file);
  const model = m.string('tokenizer.ggml.model');
  if (model !== 'llama' && model !== 'gpt2')
    failFormat('E_MODEL_FORMAT', `GGUF ${file.path} tokenizer.ggml.model`, '"llama" or "gpt2"', JSON.stringify(model));
  const tokens = m.stringArray('tokenizer.ggml.tokens');
  const scores = m.numberArray('tokenizer.ggml.scores');
  const types = m.numberArray('tokenizer.ggml.token_type');
  for (const [k, a] of [['scores', scores], ['token_type', types]] as const)
    if (a && a.length !== tokens.length)
      failFormat('E_MODEL_FORMAT', `GGUF ${file.path} tokenizer.ggml.${k}`, `${tokens.length} entries (one per token)`, `${a.length}`);
  const merges = model === 'gpt2' ? m.stringArray('tokenizer.ggml.merges') : undefined;
  const idKey = (k: string, fallback: number): number => {
    const id = m.int(k, fallback);
    if (!Number.isInteger(id) || id < 0 || id >= tokens.length)
      failFormat('E_MODEL_FORMAT', `GGUF ${file.path} ${k}`, `a token id in [0, ${tokens.length})`, String(id));
    return id;
  };
  return new GgufTokenizer(model, tokens, {
    scores,
    types,
    merges,
    bos: idKey('tokenizer.ggml.bos_token_id', model === 'llama' ? 1 : 0),
    eos: idKey('tokenizer.ggml.eos_token_id', model === 'llama' ? 2 : 0),
    addBos: m.bool('tokenizer.ggml.add_bos_token', model === 'llama'),
    addSpacePrefix: m.bool('tokenizer.ggml.add_space_prefix', model === 'llama'),
    pre: m.string('tokenizer.ggml.pre', 'gpt2'),
  });
}
