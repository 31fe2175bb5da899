/** Small helpers shared by the benchmarks: run tinybench suites and read their times, seeded inputs. */
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Bench } from 'tinybench';

/** A task's time per call in ms: tinybench's mean and its fastest call. */
export interface TaskTime {
  mean: number;
  min: number;
}

/** Runs the tasks in one tinybench suite (one after the other) and returns each one's times, by name. */
export async function timeTasks(
  tasks: Iterable<[string, () => unknown]>,
  o: { timeMs?: number; warmupMs?: number; iterations?: number } = {},
): Promise<Map<string, TaskTime>> {
  const bench = new Bench({ time: o.timeMs ?? 400, warmupTime: o.warmupMs ?? 50, ...(o.iterations ? { iterations: o.iterations } : {}) });
  for (const [name, fn] of tasks) bench.add(name, fn);
  await bench.run();
  const out = new Map<string, TaskTime>();
  for (const t of bench.tasks) {
    const r = t.result as { state: string; period?: number; latency?: { min: number }; error?: unknown };
    if (r.state !== 'completed' || r.period === undefined) throw new Error(`bench task ${t.name} did not complete: ${String(r.error ?? r.state)}`);
    out.set(t.name, { mean: r.period, min: r.latency?.min ?? r.period });
  }
  return out;
}

/** Runs each function in one tinybench suite and returns the mean time per call in ms, by name. */
export async function meanMs(tasks: Record<string, () => unknown>, timeMs = 400): Promise<Record<string, number>> {
  const times = await timeTasks(Object.entries(tasks), { timeMs });
  return Object.fromEntries([...times].map(([name, t]) => [name, t.mean]));
}

/**
 * Times of the same tasks over several rounds (each a {@link timeTasks} run): a task's figure is the
 * median of its round means and the least of its minima. On a shared machine a slow few seconds
 * then move one round of every task, not every round of a few.
 */
export class RoundTimes {
  private readonly runs = new Map<string, { means: number[]; min: number }>();

  /** Adds one round's times. */
  add(times: Map<string, TaskTime>): void {
    for (const [name, t] of times) {
      const r = this.runs.get(name) ?? { means: [], min: Infinity };
      r.means.push(t.mean);
      r.min = Math.min(r.min, t.min);
      this.runs.set(name, r);
    }
  }

  /** The task's median round mean and least minimum (E: a task never added). */
  get(name: string): TaskTime {
    const r = this.runs.get(name);
    if (!r) throw new Error(`RoundTimes: no times for task ${name}`);
    return { mean: [...r.means].sort((a, b) => a - b)[r.means.length >> 1]!, min: r.min };
  }
}

/**
 * Imports module `path` (relative to a build's root, e.g. 'src/native.js') from another build's
 * dist/ directory `root` (with its own addon: the "before" of a change, run in the same process),
 * or from this build when `root` is undefined.
 */
export async function importFromBuild<T = Record<string, unknown>>(path: string, root?: string): Promise<T> {
  return (await import(root ? pathToFileURL(join(root, path)).href : `../${path}`)) as T;
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

/** The value after `--name` on the command line, or `dflt` when the flag or its value is missing. */
export function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] ? process.argv[i + 1]! : dflt;
}

/** The median of `a` (the upper one of an even count); `a` is not reordered. */
export function median(a: readonly number[]): number {
  return [...a].sort((x, y) => x - y)[a.length >> 1]!;
}

/** The mean of `a`. */
export function mean(a: readonly number[]): number {
  return a.reduce((x, y) => x + y, 0) / a.length;
}

/** Whether two float arrays hold the same bits (NaN payloads and signed zeros included). */
export function bitsEqual(x: Float32Array, y: Float32Array): boolean {
  return Buffer.compare(Buffer.from(x.buffer, x.byteOffset, x.byteLength), Buffer.from(y.buffer, y.byteOffset, y.byteLength)) === 0;
}

/**
 * A random selection of `perHead` distinct units (of `unit` tokens) per kv head, ascending, among the
 * units between `sinks` and the `local`-token tail of a `tokens`-token context.
 */
export function randomUnits(
  shape: { kvHeads: number; sinks: number; local: number },
  tokens: number,
  seed: number,
  unit: number,
  perHead: number,
): { chunkSize: number; tokens: number; sinkEnd: number; tailStart: number; offsets: Int32Array; chunkIds: Int32Array } {
  const { kvHeads, sinks, local } = shape;
  const next = xorshift(seed);
  const first = Math.ceil(sinks / unit);
  const tailStart = tokens - local;
  const last = Math.floor(tailStart / unit); // exclusive
  const offsets = new Int32Array(kvHeads + 1);
  const chunkIds = new Int32Array(perHead * kvHeads);
  for (let h = 0; h < kvHeads; h++) {
    const chosen = new Set<number>();
    while (chosen.size < perHead) chosen.add(first + (next() % (last - first)));
    chunkIds.set(Int32Array.from([...chosen].sort((a, b) => a - b)), h * perHead);
    offsets[h + 1] = (h + 1) * perHead;
  }
  return { chunkSize: unit, tokens, sinkEnd: sinks, tailStart, offsets, chunkIds };
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

/** What {@link alternateDecode} needs of a runtime (any build's `openRuntime` result). */
export interface DecodeRuntime {
  attend(layer: number, batch: { seq: number; q: Float32Array; kNew: Float32Array; vNew: Float32Array }[]): Promise<Float32Array[]>;
}

/**
 * Decodes `steps` steps of layer 0 through several prefilled runtimes in one process, their
 * attend() calls taking turns: the first runtime goes first on even steps, the last on odd ones,
 * so a machine that slows down mid-run slows all of them. `entry(s)` gives step s's inputs (every
 * runtime gets the same). Steps before `warm` are not timed (caches, V8); `onWarm` runs just before
 * step `warm` (e.g. to snapshot stats); `before(i, s)`, if given, runs untimed just before runtime
 * i's step s (e.g. the work a host does between two attention calls). Returns each runtime's ms per
 * timed step and in how many steps every runtime's output held the first one's bits.
 */
export async function alternateDecode(
  runs: readonly { rt: DecodeRuntime; seq: number }[],
  entry: (s: number) => { q: Float32Array; kNew: Float32Array; vNew: Float32Array },
  steps: number,
  warm: number,
  onWarm?: () => Promise<void>,
  before?: (i: number, s: number) => Promise<void>,
): Promise<{ times: number[][]; identical: number }> {
  const times = runs.map(() => [] as number[]);
  let identical = 0;
  for (let s = 0; s < steps; s++) {
    if (s === warm) await onWarm?.();
    const e = entry(s);
    const outs: Float32Array[] = [];
    const order = runs.map((_, i) => i);
    if (s % 2) order.reverse();
    for (const i of order) {
      await before?.(i, s);
      const t0 = performance.now();
      outs[i] = (await runs[i]!.rt.attend(0, [{ seq: runs[i]!.seq, ...e }]))[0]!;
      if (s >= warm) times[i]!.push(performance.now() - t0);
    }
    if (outs.every((o) => bitsEqual(o, outs[0]!))) identical++;
  }
  return { times, identical };
}
