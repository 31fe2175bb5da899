/**
 * Fuzzing harness: seeded, reproducible inputs run in a CHILD process so that a crash (a signal, an
 * abort) or a hang (no answer within the time limit) is caught and reported with the input that
 * caused it, instead of taking the runner down.
 *
 * A target is `defineTarget({ name, input, run })`: `input(gen, ctx)` builds input i from a seeded
 * generator (the same (seed, target, i) always gives the same input), `run(input, ctx)` calls the
 * code under test. Every input must either succeed or throw (reject with) a KvdriveError with a
 * code; anything else is a finding:
 * - crash: the child died (signal or exit) while running the input;
 * - hang: the input did not finish within `timeoutMs`;
 * - untyped: it threw something that is not a KvdriveError;
 * - badMessage: a KvdriveError whose message reads "expected expected", "got nan" or similar.
 *
 * Protocol (child -> parent, one line each, written synchronously to stdout so nothing is lost
 * when the child dies): `\u0001B <i> <description>` before input i, then `\u0001O <i>` (ok),
 * `\u0001T <i> <code>` (typed error), `\u0001U <i> <message>` (untyped) or `\u0001M <i> <message>`
 * (bad message); `\u0001D` when the range is done. Other output (a library's console) is ignored.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** A seeded generator of fuzz values (Mulberry32 under the hood). */
export class Gen {
  private s: number;
  constructor(seed: number) {
    this.s = seed >>> 0;
  }
  /** Uniform in [0, 1). */
  next(): number {
    let t = (this.s = (this.s + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  /** Integer in [a, b]. */
  int(a: number, b: number): number {
    return a + Math.floor(this.next() * (b - a + 1));
  }
  bool(p = 0.5): boolean {
    return this.next() < p;
  }
  pick<T>(xs: readonly T[]): T {
    return xs[Math.floor(this.next() * xs.length)]!;
  }
  /** A number a parser must survive: boundaries, huge, negative, fractional, NaN, infinities. */
  edgeNumber(): number {
    return this.pick(EDGE_NUMBERS);
  }
  /** Mostly `valid`, sometimes an edge number. */
  num(valid: number, pBad = 0.1): number {
    return this.bool(pBad) ? this.edgeNumber() : valid;
  }
  /** Float32Array of n values in [-2, 2), with rare NaN / Inf when `nonFinite`. */
  f32(n: number, nonFinite = false): Float32Array {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = this.next() * 4 - 2;
    if (nonFinite && n > 0) a[this.int(0, n - 1)] = this.pick([NaN, Infinity, -Infinity]);
    return a;
  }
}

export const EDGE_NUMBERS: readonly number[] = [
  0, 1, -1, 2, 3, 4, 7, 8, 16, 63, 64, 65, 255, 4096, 65535, 65536, 2 ** 20, 2 ** 30, 2 ** 31 - 1, 2 ** 31, -(2 ** 31),
  2 ** 32, 2 ** 32 + 1, 2 ** 40, 2 ** 40 + 1, 2 ** 53, 2 ** 53 + 2, 2 ** 63, 2 ** 64, 1e300, -1e300, 0.5, -0.5, 1.5, -0,
  Number.MIN_VALUE, NaN, Infinity, -Infinity,
];

/** What a target sees besides its input: a private scratch directory (also the child's cwd). */
export interface FuzzContext {
  dir: string;
}

export interface FuzzTarget<T = unknown> {
  name: string;
  /** Builds one input from the seeded generator (deterministic). */
  input(gen: Gen, ctx: FuzzContext): T;
  /** Runs it: returns (or resolves), or throws (rejects) a KvdriveError. */
  run(input: T, ctx: FuzzContext): unknown;
}

/** Declares a target (typed input). */
export function defineTarget<T>(t: FuzzTarget<T>): FuzzTarget {
  return t as unknown as FuzzTarget;
}

/** The generator seed of input i of a target: a hash of (seed, name, i). */
export function inputSeed(seed: number, name: string, i: number): number {
  let h = (2166136261 ^ seed) >>> 0;
  for (const c of `${name}#${i}`) h = Math.imul(h ^ c.charCodeAt(0), 16777619) >>> 0;
  return h;
}

/** A one-line description of an input: typed arrays as `Type(len)[first values]`, long strings cut. */
export function describeInput(x: unknown): string {
  const seen = new WeakSet<object>();
  const s = JSON.stringify(x, (_k, v: unknown) => {
    if (typeof v === 'number' && !Number.isFinite(v)) return String(v);
    if (typeof v === 'bigint') return `${v}n`;
    if (typeof v === 'function') return `[function ${(v as { name?: string }).name ?? ''}]`;
    if (ArrayBuffer.isView(v)) {
      const a = v as unknown as ArrayLike<number>;
      const head = Array.from({ length: Math.min(a.length, 6) }, (_, i) => a[i]);
      return `${v.constructor.name}(${a.length})[${head.join(',')}${a.length > 6 ? ',…' : ''}]`;
    }
    if (typeof v === 'string' && v.length > 120) return v.slice(0, 117) + '...';
    if (v && typeof v === 'object') {
      if (seen.has(v)) return '[circular]';
      seen.add(v);
    }
    return v;
  });
  return (s ?? String(x)).replace(/\n/g, ' ');
}

/** A KvdriveError message that reads badly: doubled "expected", C++'s "nan" / "inf" spellings. */
export function badMessage(message: string): boolean {
  return /expected expected|\bgot got\b/i.test(message) || /\bgot (-?nan|-?inf)\b/.test(message);
}

export interface Finding {
  kind: 'crash' | 'hang' | 'untyped' | 'badMessage';
  index: number;
  input: string;
  detail: string;
}

export interface TargetReport {
  target: string;
  inputs: number;
  ok: number;
  typed: number;
  codes: Record<string, number>;
  crashes: number;
  hangs: number;
  untyped: number;
  badMessages: number;
  findings: Finding[];
  ms: number;
}

export interface RunOptions {
  /** Target names (from the registry the child loads). */
  targets: string[];
  inputs: number;
  seed: number;
  /** Per-input limit in ms: an input that takes longer is a hang. */
  timeoutMs: number;
  /** The compiled child script (dist/bench/fuzz/child.js). */
  childScript: string;
  /** Called after each target. */
  onTarget?: (r: TargetReport) => void;
  /** Stop a target after this many findings (default 20). */
  maxFindings?: number;
}

/**
 * Runs `inputs` inputs of each target, each target in child processes that are restarted after a
 * crash or hang (the next child starts at the input after the one that failed).
 */
export async function runFuzz(o: RunOptions): Promise<TargetReport[]> {
  const reports: TargetReport[] = [];
  for (const target of o.targets) {
    const r = await runTarget(target, o);
    o.onTarget?.(r);
    reports.push(r);
  }
  return reports;
}

async function runTarget(target: string, o: RunOptions): Promise<TargetReport> {
  const t0 = performance.now();
  const r: TargetReport = { target, inputs: 0, ok: 0, typed: 0, codes: {}, crashes: 0, hangs: 0, untyped: 0, badMessages: 0, findings: [], ms: 0 };
  const maxFindings = o.maxFindings ?? 20;
  let next = 0;
  while (next < o.inputs && r.findings.length < maxFindings) {
    const dir = mkdtempSync(join(tmpdir(), `kvdrive-fuzz-${target}-`));
    try {
      next = await runChild(target, next, o, dir, r);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }
  r.ms = performance.now() - t0;
  return r;
}

/** One child over inputs [from, o.inputs); returns the index to continue from. */
function runChild(target: string, from: number, o: RunOptions, dir: string, r: TargetReport): Promise<number> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [o.childScript, target, String(o.seed), String(from), String(o.inputs)], {
      cwd: dir,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, KVDRIVE_FUZZ_DIR: dir },
    });
    let pending: { index: number; input: string } | undefined;
    let next = from;
    let buf = '';
    let stderr = '';
    let hung = false;
    let timer: NodeJS.Timeout | undefined;
    const arm = (ms: number) => {
      if (timer) clearTimeout(timer);
      timer = setTimeout(() => {
        hung = true;
        p.kill('SIGKILL');
      }, ms);
    };
    const record = (kind: Finding['kind'], index: number, input: string, detail: string) => {
      r[kind === 'badMessage' ? 'badMessages' : kind === 'crash' ? 'crashes' : kind === 'hang' ? 'hangs' : 'untyped']++;
      r.findings.push({ kind, index, input, detail: detail.slice(0, 2000) });
    };
    // Start-up (loading the addon and modules on a loaded machine) gets its own, longer limit.
    arm(Math.max(o.timeoutMs, 60_000));
    p.stdout.on('data', (b: Buffer) => {
      buf += b.toString();
      let nl: number;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        const at = line.indexOf('\u0001');
        if (at < 0) continue;
        const body = line.slice(at + 1);
        const tag = body[0];
        const rest = body.slice(2);
        const sp = rest.indexOf(' ');
        const index = Number(sp < 0 ? rest : rest.slice(0, sp));
        const arg = sp < 0 ? '' : rest.slice(sp + 1);
        if (tag === 'B') {
          pending = { index, input: arg };
          arm(o.timeoutMs);
          continue;
        }
        if (tag === 'D') continue;
        const input = pending?.input ?? '';
        pending = undefined;
        next = index + 1;
        r.inputs++;
        if (tag === 'O') r.ok++;
        else if (tag === 'T') {
          r.typed++;
          r.codes[arg] = (r.codes[arg] ?? 0) + 1;
        } else if (tag === 'U') record('untyped', index, input, arg);
        else if (tag === 'M') {
          r.typed++;
          record('badMessage', index, input, arg);
        }
      }
    });
    p.stderr.on('data', (b: Buffer) => {
      stderr = (stderr + b.toString()).slice(-4000);
    });
    // 'close', not 'exit': 'exit' can come before the child's last stdout lines are read ('close'
    // fires once the child's stdio has ended). A hang is a child our timer killed: on a starved
    // machine the timer can run after the child already died of its own signal (timers run before
    // the exit is seen), and that death is a crash.
    p.on('close', (code, signal) => {
      if (timer) clearTimeout(timer);
      hung = hung && signal === 'SIGKILL';
      if (pending) {
        // The child died (or was killed) while running `pending`: that input is the finding.
        r.inputs++;
        if (hung) record('hang', pending.index, pending.input, `no answer within ${o.timeoutMs} ms`);
        else record('crash', pending.index, pending.input, `child exited with ${signal ?? `code ${code}`}: ${stderr.trim()}`);
        resolve(pending.index + 1);
        return;
      }
      if (next < o.inputs && (code !== 0 || hung)) {
        // Died between inputs (start-up or teardown): report it against the next input and skip it.
        r.inputs++;
        record(hung ? 'hang' : 'crash', next, '(between inputs)', `child exited with ${signal ?? `code ${code}`}: ${stderr.trim()}`);
        resolve(next + 1);
        return;
      }
      resolve(Math.max(next, code === 0 ? o.inputs : next));
    });
  });
}

/** Markdown table of reports (bench/fuzz.md). */
export function reportTable(reports: TargetReport[]): string {
  const rows = [
    '| target | inputs | ok | typed errors | crashes | hangs | untyped errors | bad messages | s |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const r of reports)
    rows.push(`| ${r.target} | ${r.inputs} | ${r.ok} | ${r.typed} | ${r.crashes} | ${r.hangs} | ${r.untyped} | ${r.badMessages} | ${(r.ms / 1000).toFixed(1)} |`);
  return rows.join('\n');
}
