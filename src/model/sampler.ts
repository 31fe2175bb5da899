/**
 * Picks the next token from logits: greedy (temperature 0), or sampling from softmax(logits / T),
 * optionally restricted to the smallest set of tokens whose probability mass reaches top-p
 * (nucleus sampling), with a seeded RNG so a run is reproducible.
 */
import { fail } from '../errors.js';

/** Sampler options. */
export interface SamplerOptions {
  /** 0 = greedy (argmax); > 0 divides the logits before the softmax. Default 1. */
  temperature?: number;
  /** Nucleus sampling mass in (0, 1); 0 or 1 samples the full distribution. Default 1 (off). */
  topP?: number;
  /** RNG seed (an integer; only its low 32 bits are used). Default 0. */
  seed?: number;
}

/** Mulberry32: small, fast, seedable 32-bit PRNG; returns uniform floats in [0, 1). */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Index of the largest value (the first one on ties). */
export function argmax(v: Float32Array): number {
  let best = 0;
  for (let i = 1; i < v.length; i++) if (v[i]! > v[best]!) best = i;
  return best;
}

export class Sampler {
  readonly temperature: number;
  readonly topP: number;
  private readonly random: () => number;
  private probs = new Float64Array(0);
  private order = new Int32Array(0);

  constructor(options: SamplerOptions = {}) {
    const { temperature = 1, topP = 1, seed = 0 } = options;
    if (typeof temperature !== 'number' || !Number.isFinite(temperature) || temperature < 0)
      fail('E_CONFIG', 'sampler temperature', 'a finite number ≥ 0', temperature);
    if (typeof topP !== 'number' || !(topP >= 0 && topP <= 1)) fail('E_CONFIG', 'sampler topP', 'a number in [0, 1]', topP);
    if (!Number.isSafeInteger(seed)) fail('E_CONFIG', 'sampler seed', 'an integer', seed);
    this.temperature = temperature;
    this.topP = topP;
    this.random = mulberry32(seed);
  }

  /** Returns the next token id. Does not modify `logits`. */
  sample(logits: Float32Array): number {
    if (this.temperature === 0) return argmax(logits);
    const n = logits.length;
    if (this.probs.length !== n) {
      this.probs = new Float64Array(n);
      this.order = new Int32Array(n);
    }
    const p = this.probs;
    let max = -Infinity;
    for (let i = 0; i < n; i++) if (logits[i]! > max) max = logits[i]!;
    let sum = 0;
    for (let i = 0; i < n; i++) {
      p[i] = Math.exp((logits[i]! - max) / this.temperature);
      sum += p[i]!;
    }
    for (let i = 0; i < n; i++) p[i]! /= sum;
    const coin = this.random();
    return this.topP > 0 && this.topP < 1 ? this.sampleTopP(coin) : sampleFrom(p, n, coin);
  }

  /** Sorts tokens by probability and samples within the smallest prefix of mass ≥ topP. */
  private sampleTopP(coin: number): number {
    const p = this.probs;
    const n = p.length;
    if (n === 1) return 0;
    // Tokens below (1 - topP) / (n - 1) can never be inside the nucleus; skip sorting them.
    const cutoff = (1 - this.topP) / (n - 1);
    let m = 0;
    for (let i = 0; i < n; i++) if (p[i]! >= cutoff) this.order[m++] = i;
    const cand = this.order.subarray(0, m).sort((a, b) => p[b]! - p[a]! || a - b);
    let mass = 0;
    let last = m - 1;
    for (let i = 0; i < m; i++) {
      mass += p[cand[i]!]!;
      if (mass >= this.topP) {
        last = i;
        break;
      }
    }
    const r = coin * mass;
    let acc = 0;
    for (let i = 0; i <= last; i++) {
      acc += p[cand[i]!]!;
      if (r < acc) return cand[i]!;
    }
    return cand[last]!; // rounding
  }
}

/** Samples index i with probability p[i] (p sums to 1) using a uniform coin in [0, 1). */
function sampleFrom(p: Float64Array, n: number, coin: number): number {
  let acc = 0;
  for (let i = 0; i < n; i++) {
    acc += p[i]!;
    if (coin < acc) return i;
  }
  return n - 1; // rounding
}
