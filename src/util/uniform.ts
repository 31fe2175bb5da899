/**
 * Deterministic values in [-1, 1) from a seeded LCG, for synthetic KV and queries (calibration,
 * the batch demo). Not a quality RNG: the same (n, seed) always gives the same values, which is
 * what a reproducible synthetic workload needs.
 */
export function uniform(n: number, seed: number): Float32Array {
  let s = (seed * 2654435761) >>> 0;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = s / 2147483648 - 1;
  }
  return out;
}
