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
