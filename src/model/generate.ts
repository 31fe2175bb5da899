/**
 * Text generation with the reference host (llama2.c's `generate`): feed the prompt (BOS first)
 * position by position, then sample one token per position until `steps` positions have run or
 * the model emits BOS/EOS (the end of a story). Optionally records a trace of every layer's
 * q/k/v (see trace-recorder.ts).
 */
import { z } from 'zod';
import { describe, fail, KvdriveError } from '../errors.js';
import { failFormat } from './format-error.js';
import type { AttentionBackend } from './attention-backend.js';
import type { Checkpoint } from './checkpoint.js';
import { DenseTsAttention } from './dense-attention.js';
import { attentionShape, Transformer } from './forward.js';
import { Sampler } from './sampler.js';
import { BOS, EOS, Tokenizer } from './tokenizer.js';
import type { TraceMeta } from '../trace/trace.js';
import { TraceRecorder } from './trace-recorder.js';

/** Options of {@link generate}. */
export interface GenerateOptions {
  /** The model, from loadCheckpoint(). */
  model: Checkpoint;
  /** Its tokenizer, from loadTokenizer(); its vocab size must equal the model's. */
  tokenizer: Tokenizer;
  /** Text to continue; omitted or empty starts from BOS alone. */
  prompt?: string;
  /**
   * Positions to run, prompt included (like llama2.c's -n): integer in [1, seq_len].
   * Default min(256, seq_len). A prompt longer than this is an E_RANGE error.
   */
  steps?: number;
  /** 0 = greedy; > 0 samples from softmax(logits / temperature). Default 1. */
  temperature?: number;
  /** Nucleus sampling mass in [0, 1]; 0 or 1 disables it. Default 0.9 (as llama2.c). */
  topP?: number;
  /** Seed of the sampling RNG (integer). Default 0. */
  seed?: number;
  /**
   * Attention backend. Default: a new {@link DenseTsAttention}. A backend passed in is reset before
   * use and left open; one created here is closed at the end.
   */
  backend?: AttentionBackend;
  /**
   * Called once per token appended (prompt tokens included, BOS excluded) with the text it
   * completed: a token holding part of a UTF-8 character yields '' and the character arrives with
   * the token that completes it. An incomplete UTF-8 sequence left at the end is flushed as U+FFFD
   * with token -1.
   */
  onToken?: (text: string, token: number) => void;
  /** Write a trace (safetensors, DESIGN.md §7) of this generation to this path. */
  traceOut?: string;
  /**
   * With traceOut: how many leading positions count as the trace's prompt; the rest are its
   * decode steps. Integer ≥ 1 and < steps. Default: half of the positions run (rounded down).
   */
  tracePromptTokens?: number;
}

/** What {@link generate} returns. */
export interface GenerateResult {
  /** Decoded text of all tokens after BOS (the prompt and the generated continuation). */
  text: string;
  /**
   * All token ids, BOS first, prompt included; the last one was sampled but not run through the
   * model. A stop token (BOS/EOS) is not included.
   */
  tokens: number[];
  /** Prompt tokens including BOS. */
  promptTokens: number;
  /** Forward passes run (= positions 0 .. positions-1). */
  positions: number;
  /** Why generation ended. */
  stoppedBy: 'steps' | 'bos' | 'eos';
  timings: {
    /** Wall time of the whole loop, ms. */
    totalMs: number;
    /** Time to run the positions whose next token is given by the prompt (0 without a prompt), ms. */
    promptMs: number;
    /** Forward passes per second over the whole loop. */
    tokensPerSecond: number;
  };
  /** The trace's metadata when traceOut was given. */
  trace?: TraceMeta;
}

const optionsSchema = z.strictObject({
  model: z.custom<Checkpoint>((m) => typeof m === 'object' && m !== null && 'config' in m && 'layers' in m, {
    message: 'a checkpoint from loadCheckpoint()',
  }),
  tokenizer: z.custom<Tokenizer>((t) => t instanceof Tokenizer, { message: 'a Tokenizer from loadTokenizer()' }),
  prompt: z.string().optional(),
  steps: z.number().int().min(1).optional(),
  temperature: z.number().min(0).finite().optional(),
  topP: z.number().min(0).max(1).optional(),
  seed: z.number().int().optional(),
  backend: z
    .custom<AttentionBackend>((b) => typeof b === 'object' && b !== null && typeof (b as AttentionBackend).attend === 'function', {
      message: 'an object with an attend() method',
    })
    .optional(),
  onToken: z.custom<(text: string, token: number) => void>((f) => typeof f === 'function', { message: 'a function' }).optional(),
  traceOut: z.string().min(1).optional(),
  tracePromptTokens: z.number().int().min(1).optional(),
});

/** Validates options with zod, reporting the first problem as E_CONFIG with expected vs given. */
function parseOptions(options: unknown): z.infer<typeof optionsSchema> {
  const r = optionsSchema.safeParse(options);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  if (issue.code === 'unrecognized_keys')
    failFormat('E_CONFIG', 'generate options', `only ${Object.keys(optionsSchema.shape).join(', ')}`, `unknown ${issue.keys.join(', ')}`);
  const key = issue.path.join('.');
  const given = key && typeof options === 'object' && options !== null ? (options as Record<string, unknown>)[String(issue.path[0])] : options;
  // zod says e.g. "Too small: expected number to be >=1" or "Invalid input: expected int, received number".
  const expected = issue.message.replace(/^[^:]*: expected /, '').replace(/, received \w+$/, '');
  throw new KvdriveError('E_CONFIG', `generate option ${key || '(options)'}: expected ${expected}, got ${describe(given)}`);
}

/**
 * Generates text; see {@link GenerateOptions}. The forward passes run on the calling thread (this
 * is the reference host), awaiting the backend's attention where it answers asynchronously; the
 * promise settles after the optional trace is written.
 */
export async function generate(options: GenerateOptions): Promise<GenerateResult> {
  const o = parseOptions(options);
  const { model, tokenizer } = o;
  const config = model.config;
  if (tokenizer.vocabSize !== config.vocabSize)
    fail('E_MODEL_FORMAT', 'tokenizer vocab size', `${config.vocabSize} (the model's)`, tokenizer.vocabSize);
  const steps = o.steps ?? Math.min(256, config.seqLen);
  if (steps > config.seqLen) fail('E_RANGE', 'generate steps', `an integer in [1, ${config.seqLen}] (seq_len)`, steps);
  if (o.tracePromptTokens !== undefined && o.traceOut === undefined)
    fail('E_CONFIG', 'generate tracePromptTokens', 'to be given together with traceOut', o.tracePromptTokens);
  if (o.tracePromptTokens !== undefined && o.tracePromptTokens >= steps)
    fail('E_RANGE', 'generate tracePromptTokens', `an integer in [1, ${steps - 1}] (< steps)`, o.tracePromptTokens);
  if (o.traceOut !== undefined && steps < 2) fail('E_RANGE', 'generate steps with traceOut', 'at least 2 (one prompt and one decode position)', steps);

  const prompt = tokenizer.encode(o.prompt ?? '', { bos: true });
  if (prompt.length > steps)
    failFormat('E_RANGE', 'generate prompt', `at most ${steps} tokens including BOS (steps)`, `${prompt.length} tokens`);

  const sampler = new Sampler({ temperature: o.temperature ?? 1, topP: o.topP ?? 0.9, seed: o.seed ?? 0 });
  const ownBackend = o.backend === undefined;
  const backend: AttentionBackend = o.backend ?? new DenseTsAttention(attentionShape(config));
  const recorder = o.traceOut !== undefined ? new TraceRecorder(config, steps) : undefined;
  const transformer = new Transformer(model, backend, recorder);
  const decoder = new TextDecoder('utf-8');

  try {
    transformer.reset();
    const tokens = [prompt[0]!];
    let text = '';
    let stoppedBy: GenerateResult['stoppedBy'] = 'steps';
    let token = prompt[0]!;
    let pos = 0;
    const t0 = performance.now();
    let promptMs = 0;
    while (pos < steps) {
      const logits = await transformer.forwardAsync(token, pos);
      const inPrompt = pos < prompt.length - 1;
      const next = inPrompt ? prompt[pos + 1]! : sampler.sample(logits);
      pos++;
      if (inPrompt && pos === prompt.length - 1) promptMs = performance.now() - t0;
      if (!inPrompt && (next === BOS || next === EOS)) {
        stoppedBy = next === BOS ? 'bos' : 'eos';
        break;
      }
      tokens.push(next);
      const piece = decoder.decode(tokenizer.decodePiece(token, next), { stream: true });
      text += piece;
      o.onToken?.(piece, next);
      token = next;
    }
    const tail = decoder.decode();
    if (tail) {
      text += tail;
      o.onToken?.(tail, -1);
    }
    const totalMs = performance.now() - t0;
    const result: GenerateResult = {
      text,
      tokens,
      promptTokens: prompt.length,
      positions: pos,
      stoppedBy,
      timings: { totalMs, promptMs, tokensPerSecond: pos / (totalMs / 1000) },
    };
    if (recorder && o.traceOut !== undefined) result.trace = await recorder.write(o.traceOut, o.tracePromptTokens);
    return result;
  } finally {
    if (ownBackend) await backend.close?.();
  }
}
