/** Small helpers shared by the index benchmarks: run a tinybench suite, read mean times. */
import { Bench } from 'tinybench';

/** Runs each function in one tinybench suite and returns the mean time per call in ms, by name. */
export async function meanMs(tasks: Record<string, () => unknown>, timeMs = 400): Promise<Record<string, number>> {
  const bench = new Bench({ time: timeMs, warmupTime: 50 });
  for (const [name, fn] of Object.entries(tasks)) bench.add(name, fn);
  await bench.run();
  const out: Record<string, number> = {};
  for (const t of bench.tasks) {
    const r = t.result as { state: string; period?: number; error?: unknown };
    if (r.state !== 'completed' || r.period === undefined) throw new Error(`bench task ${t.name} did not complete: ${String(r.error ?? r.state)}`);
    out[t.name] = r.period;
  }
  return out;
}

/** Float32Array of n uniform values in [-1, 1) from a seeded LCG (benchmarks need no quality RNG). */
export function uniform(n: number, seed: number): Float32Array {
  let s = seed >>> 0;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = s / 2147483648 - 1;
  }
  return out;
}

/** Gaussian-blob points: `clusters` centres spread 3 apart, unit-ish noise; n x dim. */
export function blobPoints(n: number, dim: number, clusters: number, seed: number): Float32Array {
  const centres = uniform(clusters * dim, seed);
  const noise = uniform(n * dim, seed + 1);
  const out = new Float32Array(n * dim);
  for (let i = 0; i < n; i++) {
    const c = (i * 7919) % clusters;
    for (let d = 0; d < dim; d++) out[i * dim + d] = 3 * centres[c * dim + d]! + noise[i * dim + d]!;
  }
  return out;
}

/** xorshift32 stream. */
export function xorshift(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s;
  };
}

/** f16 bits of random values with |x| in ~[2^-4, 2^1) and random sign: realistic magnitudes, never NaN/Inf. */
export function fillF16(data: Uint16Array, seed: number): void {
  const next = xorshift(seed);
  const block = Math.min(data.length, 1 << 22);
  for (let i = 0; i < block; i++) {
    const r = next();
    const sign = r & 0x8000;
    const exp = 11 + (r >>> 16) % 5; // biased exponent 11..15
    data[i] = sign | (exp << 10) | ((r >>> 3) & 0x3ff);
  }
  // Tile the random block (distinct memory, so it is still streamed from DRAM).
  for (let off = block; off < data.length; off += block) data.copyWithin(off, 0, Math.min(block, data.length - off));
}
