/**
 * Text generation with a GGUF model: the prompt (BOS first when the tokenizer adds one) is prefilled
 * in chunks of `prefillChunk` positions, then one token is sampled and run per position until
 * `steps` positions have run or the model emits BOS/EOS. Step counting, sampling and stopping are
 * those of the llama2.c reference host (src/model/generate.ts), so the same model gives the same
 * greedy tokens through either path.
 */
import { z } from 'zod';
import { fail } from '../../errors.js';
import type { AttentionBackend } from '../attention-backend.js';
import { DenseTsAttention } from '../dense-attention.js';
import type { GenerateOptions, GenerateResult } from '../generate.js';
import { Sampler } from '../sampler.js';
import { GgufModel, GgufTransformer } from './model.js';

/**
 * Options of {@link generateGguf}: `prompt`, `temperature` (default 1), `topP` (default 0.9) and
 * `seed` (default 0) as in the llama2.c host's {@link GenerateOptions}.
 */
export interface GgufGenerateOptions extends Pick<GenerateOptions, 'prompt' | 'temperature' | 'topP' | 'seed'> {
  /** The model, from loadGgufModel(). */
  model: GgufModel;
  /**
   * Positions to run, prompt included (like llama2.c's -n); at most the context length. Default: the
   * prompt plus 256, within the context length.
   */
  steps?: number;
  /** Attention backend; default a new dense TS backend (closed at the end; one passed in is left open). */
  backend?: AttentionBackend;
  /** Prompt positions per native prefill call (≥ 1). Default 64. */
  prefillChunk?: number;
  /** Called per token appended (prompt included, BOS excluded) with the text it completed. */
  onToken?: (text: string, token: number) => void;
  /** Called after each prefill chunk with the positions done and the prompt length. */
  onPrefill?: (done: number, total: number) => void;
}

/**
 * What {@link generateGguf} returns: `text`, `tokens`, `promptTokens`, `positions` and `stoppedBy`
 * as in the llama2.c host's {@link GenerateResult}, with prefill and decode timed apart.
 */
export interface GgufGenerateResult extends Pick<GenerateResult, 'text' | 'tokens' | 'promptTokens' | 'positions' | 'stoppedBy'> {
  timings: {
    /** Prefill of the prompt (all its positions), ms. */
    prefillMs: number;
    /** Decode positions run after the prompt, and their time. */
    decodeTokens: number;
    decodeMs: number;
    prefillTokensPerSecond: number;
    decodeTokensPerSecond: number;
  };
}

const schema = z.strictObject({
  model: z.custom<GgufModel>((m) => m instanceof GgufModel, { message: 'a GgufModel from loadGgufModel()' }),
  prompt: z.string().optional(),
  steps: z.number().int().min(1).optional(),
  temperature: z.number().min(0).finite().optional(),
  topP: z.number().min(0).max(1).optional(),
  seed: z.number().int().optional(),
  backend: z.custom<AttentionBackend>((b) => typeof b === 'object' && b !== null && typeof (b as AttentionBackend).attend === 'function').optional(),
  prefillChunk: z.number().int().min(1).optional(),
  onToken: z.custom<(text: string, token: number) => void>((f) => typeof f === 'function').optional(),
  onPrefill: z.custom<(done: number, total: number) => void>((f) => typeof f === 'function').optional(),
});

/** Generates text with a GGUF model; see {@link GgufGenerateOptions}. */
export async function generateGguf(options: GgufGenerateOptions): Promise<GgufGenerateResult> {
  const r = schema.safeParse(options);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    fail('E_CONFIG', `generateGguf option ${issue.path.join('.') || '(options)'}`, issue.message, issue.path.length ? (options as unknown as Record<string, unknown>)[String(issue.path[0])] : options);
  }
  const o = r.data;
  const { model } = o;
  const tk = model.tokenizer;
  const prompt = tk.encode(o.prompt ?? '', { bos: true });
  const steps = o.steps ?? Math.min(prompt.length + 256, model.config.contextLength);
  if (steps > model.config.contextLength) fail('E_RANGE', 'generateGguf steps', `an integer in [1, ${model.config.contextLength}] (context length)`, steps);
  if (prompt.length > steps) fail('E_RANGE', 'generateGguf prompt', `at most ${steps} tokens including BOS (steps)`, `${prompt.length} tokens`);
  const ownBackend = o.backend === undefined;
  const backend: AttentionBackend = o.backend ?? new DenseTsAttention(model.attentionShape(steps));
  const sampler = new Sampler({ temperature: o.temperature ?? 1, topP: o.topP ?? 0.9, seed: o.seed ?? 0 });
  const chunk = o.prefillChunk ?? 64;
  const decoder = new TextDecoder('utf-8');
  try {
    const tf = new GgufTransformer(model, backend, steps);
    tf.reset();
    let text = '';
    const emit = (prev: number, t: number): void => {
      const piece = decoder.decode(tk.decodePiece(prev, t), { stream: true });
      text += piece;
      o.onToken?.(piece, t);
    };
    for (let i = 1; i < prompt.length; i++) emit(prompt[i - 1]!, prompt[i]!);

    const t0 = performance.now();
    let logits!: Float32Array;
    let pos = 0;
    while (pos < prompt.length) {
      const n = Math.min(chunk, prompt.length - pos);
      logits = await tf.forwardAsync(prompt.slice(pos, pos + n), pos);
      pos += n;
      o.onPrefill?.(pos, prompt.length);
    }
    const prefillMs = performance.now() - t0;

    const tokens = [...prompt];
    let stoppedBy: GenerateResult['stoppedBy'] = 'steps';
    const t1 = performance.now();
    let decodeTokens = 0;
    for (;;) {
      const next = sampler.sample(logits);
      if (next === tk.bos || next === tk.eos) {
        stoppedBy = next === tk.bos ? 'bos' : 'eos';
        break;
      }
      emit(tokens[tokens.length - 1]!, next);
      tokens.push(next);
      if (pos >= steps) break;
      logits = await tf.forwardAsync([next], pos);
      pos++;
      decodeTokens++;
    }
    const decodeMs = performance.now() - t1;
    const tail = decoder.decode();
    if (tail) {
      text += tail;
      o.onToken?.(tail, -1);
    }
    return {
      text,
      tokens,
      promptTokens: prompt.length,
      positions: pos,
      stoppedBy,
      timings: {
        prefillMs,
        decodeTokens,
        decodeMs,
        prefillTokensPerSecond: prompt.length / (prefillMs / 1000),
        decodeTokensPerSecond: decodeTokens / (decodeMs / 1000),
      },
    };
  } finally {
    if (ownBackend) backend.close?.();
  }
}
