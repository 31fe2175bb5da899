/**
 * `kvdrive demo --storage DIR`: the synthetic workload decoded through the runtime's memory model
 * (openRuntime({ dramBudget, ssd })), streaming the layers in: each prompt layer is generated,
 * prefilled (index built, sealed to SSD, the DRAM tier filled up to its budget) and dropped before
 * the next, so the process never holds the whole KV. Then every decode step runs over all layers.
 * Printed: bytes per tier per step, time per layer-step, the peak resident set (VmHWM) against the
 * budget plus the stated overhead, and — on the first layers, in the same run — the DRAM+SSD /
 * DRAM-only throughput ratio: after the main run closed (its peak RSS read), a DRAM+SSD runtime and
 * a DRAM-only one are opened side by side on those layers and their steps interleaved (the order
 * alternating every step), so both see the same machine load; outputs must be bit-identical to each
 * other and to the main run's.
 */
import { existsSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { bytes, ms, table } from '../eval/format.js';
import { openRuntime, type Runtime, type RuntimeStats } from '../runtime/runtime.js';
import { checkMemory, formatMemoryCheck, processMemory, type MemoryCheck } from '../runtime/process-memory.js';
import type { SyntheticTrace } from '../trace/synthetic.js';
import { f32ArrayToBf16, f32ArrayToF16, toF32 } from '../util/f16.js';
import type { KvTensor } from '../types.js';
import { ProgressBar } from './progress.js';
import { KvdriveError } from '../errors.js';
import { createPolicy } from '../index/policy.js';
import type { PolicyName } from '../index/selection.js';
import { attendSparse } from '../attention/kernels.js';
import { isTimedStep, prefixView, type AttendedSource, type AttendedStep, type ReplayLayer } from '../eval/replay.js';

export interface RuntimeDemoOptions {
  dir: string;
  /** DRAM budget of the memory model, bytes. */
  dramBudget: number;
  budget: number;
  mode: 'sequential' | 'pipelined';
  /** Layers also decoded DRAM-only for the ratio (default min(layers, 2)). */
  ratioLayers?: number;
  /** Hot tier in front: window xN per (layer, kv head) (0 = none); its bytes count in dramBudget. */
  hotWindows: number;
  /** RuntimeOptions.ssd.streamHeads of the DRAM+SSD runtimes (default: every kv head, no streaming). */
  streamHeads?: number;
  /**
   * Queries of the prompt's last obsWindow positions handed to every prefill (Runtime.prefill's
   * obsQ, what a host's prefill computes): they rank the sealed chunks for the DRAM tier's fill and
   * warm the hot tier. 0: none (the DRAM tier fills in chunk order, the hot tier starts empty).
   */
  obsWindow: number;
}

/** Per decode step, summed over layers. */
interface StepRow {
  ms: number;
  hotChunks: number;
  dramChunks: number;
  ssdChunks: number;
  tailChunks: number;
  ssdReadBytes: number;
}

export interface RuntimeDemoResult {
  kvBytes: number;
  steps: StepRow[];
  chunkBytes: number;
  prefillMs: number;
  /** ms per layer-step on the first ratioLayers layers, interleaved: DRAM+SSD and DRAM-only. */
  tieredMs: number;
  dramOnlyMs: number;
  /** The same layer-steps: process CPU ms (all threads) and select / fetch / compute ms. */
  tieredCpuMs: number;
  dramOnlyCpuMs: number;
  tieredStages: Stages;
  dramOnlyStages: Stages;
  /** dramOnlyMs / tieredMs. */
  ratio: number;
  /** The ratio phase's DRAM+SSD runtime budget (o.dramBudget when ratioLayers = layers). */
  ratioDramBudget: number;
  identical: boolean;
  ratioLayers: number;
  memory: MemoryCheck;
  stats: RuntimeStats;
}

/** Per layer-step ms of the runtime's stages (RuntimeStats' selectionMs, fetchMs, computeMs). */
interface Stages {
  select: number;
  fetch: number;
  compute: number;
}
const stagesOf = (s: RuntimeStats): Stages => ({ select: s.selectionMs, fetch: s.fetchMs, compute: s.computeMs });
/** Process CPU time (user + system, every thread), ms. */
function cpuMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}

type Inputs = { q: Float32Array[]; kNew: (Float32Array | Uint16Array)[]; vNew: (Float32Array | Uint16Array)[] };

/** Prefills layers [0, layers) of `trace` into `rt` one at a time; keeps only the decode inputs. */
async function streamPrefill(rt: Runtime, seq: number, trace: SyntheticTrace, layers: number, obsWindow: number, inputs: Inputs[], tick: (l: number) => void): Promise<void> {
  const { promptTokens: T, decodeSteps: S, kvHeads: H, headDim: D, qHeads } = trace.meta;
  const dtype = trace.dtype;
  for (let l = 0; l < layers; l++) {
    let d: ReturnType<SyntheticTrace['layerData']> | undefined = trace.layerData(l);
    const t = (data: Float32Array | Uint16Array): KvTensor => ({ data, dtype, tokens: T, heads: H, dim: D });
    // The observation window ranks the sealed chunks for the DRAM tier's fill and warms the hot tier.
    await rt.prefill(seq, l, t(d.k), t(d.v), obsWindow > 0 ? trace.observationQueries(l, obsWindow) : undefined);
    if (!inputs[l]) {
      const q = toF32(d.q, dtype);
      const row = H * D;
      inputs[l] = {
        q: Array.from({ length: S }, (_, s) => q.slice(s * qHeads * D, (s + 1) * qHeads * D)),
        kNew: Array.from({ length: S }, (_, s) => d!.kNew.slice(s * row, (s + 1) * row)),
        vNew: Array.from({ length: S }, (_, s) => d!.vNew.slice(s * row, (s + 1) * row)),
      };
    }
    d = undefined; // the layer's prompt KV is garbage from here on
    tick(l);
  }
}

export async function runRuntimeDemo(trace: SyntheticTrace, o: RuntimeDemoOptions): Promise<RuntimeDemoResult> {
  const { layers: L, promptTokens: T, decodeSteps: S, kvHeads: H, headDim: D, qHeads } = trace.meta;
  const es = trace.dtype === 'f32' ? 4 : 2;
  const layerKv = 2 * T * H * D * es;
  const before = processMemory();
  const shape = { layers: L, qHeads, kvHeads: H, headDim: D };
  // No cap of the tier's own: it allocates what its windows need, the memory plan counts that inside
  // dramBudget, and a budget too small for it fails there (E_BUDGET naming dramBudget and its parts).
  const hotTier = o.hotWindows > 0 ? { windows: o.hotWindows, maxBytes: 2 ** 52 } : undefined; // a cap above any tier
  const common = { shape, budget: o.budget, mode: o.mode, maxSequences: 1, maxTokens: T + S, dtype: trace.dtype, ...(hotTier ? { hotTier } : {}) };
  const bar = new ProgressBar(L * (S + 1), 'runtime');
  const rt = await openRuntime({ ...common, dramBudget: o.dramBudget, ssd: { dir: o.dir, direct: true, streamHeads: o.streamHeads } });
  const inputs: Inputs[] = [];
  const outs: Float32Array[][] = [];
  const rows: StepRow[] = [];
  let stats: RuntimeStats;
  let prefillMs: number;
  const R = Math.min(L, o.ratioLayers ?? 2);
  try {
    const seq = rt.createSequence();
    const p0 = performance.now();
    await streamPrefill(rt, seq, trace, L, o.obsWindow, inputs, (l) => bar.tick(`prefill layer ${l}`));
    prefillMs = performance.now() - p0;
    for (let s = 0; s < S; s++) {
      const m0 = (await rt.stats()).memory!.traffic;
      const t0 = performance.now();
      const stepOuts: Float32Array[] = [];
      for (let l = 0; l < L; l++) {
        const a = performance.now();
        const [out] = await rt.attend(l, [{ seq, q: inputs[l]!.q[s]!, kNew: toF32(inputs[l]!.kNew[s]!, trace.dtype), vNew: toF32(inputs[l]!.vNew[s]!, trace.dtype) }]);
        stepOuts.push(out!);
        bar.tick(`step ${s} layer ${l}`);
      }
      const m1 = (await rt.stats()).memory!.traffic;
      rows.push({ ms: (performance.now() - t0) / L, hotChunks: m1.hotChunks - m0.hotChunks, dramChunks: m1.dramChunks - m0.dramChunks, ssdChunks: m1.ssdChunks - m0.ssdChunks, tailChunks: m1.tailChunks - m0.tailChunks, ssdReadBytes: m1.ssdReadBytes - m0.ssdReadBytes });
      outs.push(stepOuts);
    }
    stats = await rt.stats();
  } finally {
    await rt.close();
  }
  bar.finish();
  const after = processMemory();
  const plan = stats.memory!.plan;
  const memory = checkMemory(
    [{ what: 'dramBudget (tails, index reserve, hot tier, fetch buffers, I/O engine buffers, DRAM tier)', bytes: o.dramBudget }],
    [
      { what: 'process before open (node, addon, trace plans)', bytes: before?.rssBytes ?? 0 },
      { what: 'one prompt layer being generated and prefilled (K + V, host dtype)', bytes: layerKv },
      { what: 'synthetic generation scratch (f32 rows of one layer)', bytes: T * H * D * 4 },
      { what: 'decode inputs kept for every layer (q, kNew, vNew) and outputs', bytes: L * S * (qHeads * D * 8 + 2 * H * D * es) },
    ],
    after?.peakRssBytes,
  );

  // The ratio: DRAM+SSD and DRAM-only runtimes on the first R layers, side by side, steps
  // interleaved. With R < L the DRAM+SSD runtime keeps the main run's DRAM tier, hot tier, tails and
  // index per layer (its fixed parts, fetch buffers and the I/O engine's buffers, whole).
  const ratioDramBudget =
    R === L
      ? o.dramBudget
      : Math.ceil(((plan.residentBytes + plan.indexBytes + plan.dramTierBytes + plan.hotTierBytes) * R) / L) + plan.fetchBytes + plan.selectArenaBytes + plan.ioBufferBytes;
  const dramOnlyBudget = Math.ceil(R * (T + S) * 2 * H * D * es * 1.1) + (plan.indexFixedBytes + plan.indexBytesPerToken * (T + S)) * R + Math.ceil((plan.hotTierBytes * R) / L) + 256 * 2 ** 20;
  const runtimes: Runtime[] = [];
  // A scratch store inside the demo's directory, deleted afterwards if this run made it (the demo
  // leaves only its manifest); one an interrupted run left is reused (the runtime deletes its old
  // segments at open) and kept, as a directory of that name the user made would be.
  const ratioDir = join(o.dir, '.ratio-scratch');
  const madeRatioDir = !existsSync(ratioDir);
  const ms2 = [0, 0];
  const cpu2 = [0, 0];
  const stages2: Stages[] = [];
  let identical = true;
  try {
    runtimes.push(await openRuntime({ ...common, shape: { ...shape, layers: R }, dramBudget: ratioDramBudget, ssd: { dir: ratioDir, direct: true, streamHeads: o.streamHeads } }));
    runtimes.push(await openRuntime({ ...common, shape: { ...shape, layers: R }, dramBudget: dramOnlyBudget }));
    const seqs = runtimes.map((r) => r.createSequence());
    for (let k = 0; k < 2; k++) await streamPrefill(runtimes[k]!, seqs[k]!, trace, R, o.obsWindow, inputs, () => undefined);
    const st0: Stages[] = [];
    for (let s = 0; s < S; s++) {
      if (s === 1) for (const r of runtimes) st0.push(stagesOf(await r.stats())); // the first step warms caches
      for (let l = 0; l < R; l++)
        for (const k of s % 2 ? [1, 0] : [0, 1]) {
          const c = cpuMs();
          const a = performance.now();
          const [out] = await runtimes[k]!.attend(l, [{ seq: seqs[k]!, q: inputs[l]!.q[s]!, kNew: toF32(inputs[l]!.kNew[s]!, trace.dtype), vNew: toF32(inputs[l]!.vNew[s]!, trace.dtype) }]);
          if (s > 0) {
            ms2[k]! += performance.now() - a;
            cpu2[k]! += cpuMs() - c;
          }
          const want = outs[s]![l]!;
          if (Buffer.compare(Buffer.from(out!.buffer, out!.byteOffset, out!.byteLength), Buffer.from(want.buffer, want.byteOffset, want.byteLength)) !== 0) identical = false;
        }
    }
    for (let k = 0; k < 2; k++) {
      const e = stagesOf(await runtimes[k]!.stats());
      const b0 = st0[k] ?? e;
      stages2.push({ select: e.select - b0.select, fetch: e.fetch - b0.fetch, compute: e.compute - b0.compute });
    }
  } finally {
    for (const r of runtimes) await r.close();
    if (madeRatioDir) await rm(ratioDir, { recursive: true, force: true });
  }
  const n = Math.max(1, R * (S - 1));
  const per = (x: Stages): Stages => ({ select: x.select / n, fetch: x.fetch / n, compute: x.compute / n });
  return {
    kvBytes: L * layerKv,
    steps: rows,
    chunkBytes: 2 * 4 * D * es,
    prefillMs,
    tieredMs: ms2[0]! / n,
    dramOnlyMs: ms2[1]! / n,
    tieredCpuMs: cpu2[0]! / n,
    dramOnlyCpuMs: cpu2[1]! / n,
    tieredStages: per(stages2[0]!),
    dramOnlyStages: per(stages2[1]!),
    ratio: ms2[1]! / Math.max(1e-9, ms2[0]!),
    ratioDramBudget,
    identical,
    ratioLayers: R,
    memory,
    stats,
  };
}

export function renderRuntimeDemo(r: RuntimeDemoResult, o: RuntimeDemoOptions): string {
  const m = r.stats.memory!;
  const p = m.plan;
  const cb = r.chunkBytes;
  const rows: (string | number)[][] = [['step', 'ms/layer-step', 'hot tier bytes', 'DRAM tier bytes', 'SSD bytes', 'SSD device bytes', 'tail bytes']];
  r.steps.forEach((s, i) => rows.push([i, ms(s.ms), bytes(s.hotChunks * cb), bytes(s.dramChunks * cb), bytes(s.ssdChunks * cb), bytes(s.ssdReadBytes), bytes(s.tailChunks * cb)]));
  return [
    '',
    '',
    `runtime memory model (${o.mode}, kvdrive policy, budget ${o.budget}): KV ${bytes(r.kvBytes)} streamed in layer by layer, sealed to SSD at ${o.dir} (O_DIRECT); ` +
      `${o.obsWindow > 0 ? `prefill given the queries of the prompt's last ${o.obsWindow} positions (they rank what the DRAM tier keeps)` : 'no observation window (the DRAM tier fills in chunk order)'}; DRAM budget ${bytes(o.dramBudget)} = tails ${bytes(p.residentBytes)} + index ${bytes(p.indexBytes)} (${p.indexBytesPerToken} B/token/layer + ${bytes(p.indexFixedBytes)} per layer) + hot tier ${bytes(p.hotTierBytes)} (window x${o.hotWindows}) + fetch ${bytes(p.fetchBytes)}${p.selectArenaBytes ? ` + select arena ${bytes(p.selectArenaBytes)}` : ''} + I/O engine buffers ${bytes(p.ioBufferBytes)} + DRAM tier ${bytes(p.dramTierBytes)}; bytes per step are summed over layers`,
    '',
    table(rows),
    '',
    `prefill (generate + index + SSD write + DRAM fill, all layers): ${(r.prefillMs / 1000).toFixed(1)} s; index in use ${bytes(m.indexBytes)}`,
    `DRAM+SSD vs DRAM-only throughput (first ${r.ratioLayers} layers, steps after the first, the two runtimes' steps interleaved in one run; DRAM+SSD budget ${bytes(r.ratioDramBudget)}): ${r.ratio.toFixed(3)} (${ms(r.tieredMs)} vs ${ms(r.dramOnlyMs)} per layer-step); outputs ${r.identical ? 'bit-identical' : 'DIFFERENT (a bug: please report)'}`,
    `  per layer-step, DRAM+SSD vs DRAM-only: process CPU ${ms(r.tieredCpuMs)} vs ${ms(r.dramOnlyCpuMs)} (ratio ${(r.dramOnlyCpuMs / Math.max(1e-9, r.tieredCpuMs)).toFixed(3)}); ` +
      `select ${ms(r.tieredStages.select)} vs ${ms(r.dramOnlyStages.select)}, fetch ${ms(r.tieredStages.fetch)} vs ${ms(r.dramOnlyStages.fetch)}, compute ${ms(r.tieredStages.compute)} vs ${ms(r.dramOnlyStages.compute)}`,
    `peak RSS (VmHWM) against the budget: ${formatMemoryCheck(r.memory)}`,
  ].join('\n');
}

/** Tokens and decode steps of {@link warmUp}'s throwaway sequence: 8192 and 40, within the runtime's maxTokens. */
export function warmUpShape(meta: Pick<SyntheticTrace['meta'], 'promptTokens' | 'decodeSteps'>): { tokens: number; steps: number } {
  const tokens = Math.min(8192, meta.promptTokens);
  return { tokens, steps: Math.min(40, meta.decodeSteps + meta.promptTokens - tokens) };
}

/**
 * Decodes a throwaway sequence (random KV, {@link warmUpShape}: 8192 tokens or the prompt if
 * shorter, 40 steps of layer 0) and closes it, before the timed rows. Why: the demo decodes only 8 steps a
 * layer, and V8 compiles the step's JS on a third thread for the first ~25-40 steps of a process,
 * competing with the select's two threads for the two cores (bench/index.md, "The runtime's select
 * column vs the same select out of the step"); the policy rows are single native calls with no such
 * code. Warmed up, the runtime rows show the steps a long decode has. The sequence is independent of
 * the timed ones (their outputs do not depend on it) and its DRAM-tier slots are free again after.
 */
async function warmUp(rt: Runtime, meta: SyntheticTrace['meta'], dtype: SyntheticTrace['dtype']): Promise<void> {
  const { qHeads, kvHeads, headDim } = meta;
  const { tokens, steps } = warmUpShape(meta);
  const row = kvHeads * headDim;
  const { random, stored } = warmUpData(dtype);
  const seq = rt.createSequence();
  try {
    const kv = (): KvTensor => ({ data: stored(random(tokens * row)), dtype, tokens, heads: kvHeads, dim: headDim });
    await rt.prefill(seq, 0, kv(), kv());
    for (let s = 0; s < steps; s++) await rt.attend(0, [{ seq, q: random(qHeads * headDim), kNew: random(row), vNew: random(row) }]);
  } finally {
    await rt.closeSequence(seq);
  }
}

/** Deterministic throwaway data of the warm-ups: random f32 in [-0.5, 0.5) and its storage form. */
function warmUpData(dtype: SyntheticTrace['dtype']) {
  let x = 0x2545f491;
  const random = (n: number) => Float32Array.from({ length: n }, () => ((x = (Math.imul(x, 1103515245) + 12345) | 0) >>> 8) / 2 ** 24 - 0.5);
  const stored = (a: Float32Array): Float32Array | Uint16Array => (dtype === 'f16' ? f32ArrayToF16(a) : dtype === 'bf16' ? f32ArrayToBf16(a) : a);
  return { random, stored };
}

/**
 * The policy rows' counterpart of {@link warmUp}: each policy object (quest, shadowkv) indexes a
 * throwaway context of the same shape and selects and attends over it as many steps, untimed, with
 * the keys as the eval gives them. Its scratch growth and first calls then happen before the timed
 * steps, as the runtime rows' do: every row of the table times steady steps.
 */
export async function warmUpPolicies(names: readonly PolicyName[], meta: SyntheticTrace['meta'], dtype: SyntheticTrace['dtype'], budget: number, threads: number): Promise<void> {
  const { qHeads, kvHeads, headDim } = meta;
  const { tokens, steps } = warmUpShape(meta);
  const { random, stored } = warmUpData(dtype);
  const kv = (): KvTensor => ({ data: stored(random(tokens * kvHeads * headDim)), dtype, tokens, heads: kvHeads, dim: headDim });
  const k = kv();
  const v = kv();
  for (const name of names) {
    const policy = createPolicy(name, { qHeads, kvHeads, headDim, threads });
    await policy.build(k, tokens);
    for (let s = 0; s < steps; s++) {
      const q = random(qHeads * headDim);
      attendSparse({ q, qHeads, k, v, selection: policy.select(q, Math.min(budget, tokens), { keys: k }), threads });
    }
  }
}

/**
 * One row of the default demo: kvdrive decoded through openRuntime (the memory model, DRAM only,
 * its default budget) in one mode, as an eval source (ReplayOptions.attended): before the eval
 * replays a layer, `prepare` prefills that layer's prompt into the runtime; the eval then asks for
 * each decode step among the policies' steps (`step`, one attendTraced), so the eval scores
 * the tokens the runtime actually attended against the same dense reference as the policies (the
 * layer is generated once for both), and every row's step is timed in the same conditions: after
 * that step's dense pass, with the caches cold as a layer's step finds them in a real decode
 * between the other layers' steps. (Decoding a layer's steps back to back instead, as this row
 * did until 2026-11-29, left each step the previous one's index and rows in cache: ~3-6% faster
 * than after a 256 MiB read, a throwaway measurement.) Layers are independent, so each trace layer
 * is decoded as its own sequence, closed before the next: the runtime holds one layer's KV at a
 * time and reuses its DRAM tier slots (the eval holds one layer at a time too).
 */
export class RuntimeRow implements AttendedSource {
  readonly name: string;
  /** steps[layer][step]: the selection attention ran over, its output and per-stage times. */
  readonly steps: AttendedStep[][] = [];
  /**
   * Sums over the timed layer-steps (isTimedStep: those after each layer's first), ms: attend()
   * wall, selection, fetch, compute; the first steps' wall apart; prefill of every layer.
   */
  readonly time = { wallMs: 0, selectMs: 0, fetchMs: 0, computeMs: 0, prefillMs: 0, layerSteps: 0, firstWallMs: 0, firstSteps: 0 };
  /** The sequence decoding the current layer. */
  private seq: number | undefined;
  /** The layer being decoded (set by `prepare`); its steps are decoded one `step` call at a time. */
  private layer: ReplayLayer | undefined;

  private constructor(
    readonly mode: 'sequential' | 'pipelined',
    private readonly rt: Runtime,
    private readonly onStep?: (what: string) => void,
  ) {
    this.name = `kvdrive (runtime, ${mode})`;
  }

  static async open(meta: SyntheticTrace['meta'], dtype: SyntheticTrace['dtype'], o: { budget: number; threads: number; mode: 'sequential' | 'pipelined'; onStep?: (what: string) => void }): Promise<RuntimeRow> {
    const { layers, qHeads, kvHeads, headDim, promptTokens, decodeSteps } = meta;
    const rt = await openRuntime({
      shape: { layers, qHeads, kvHeads, headDim },
      budget: o.budget,
      mode: o.mode,
      dtype,
      maxSequences: 1,
      maxTokens: promptTokens + decodeSteps,
      policyOptions: { threads: o.threads },
    });
    await warmUp(rt, meta, dtype);
    return new RuntimeRow(o.mode, rt, o.onStep);
  }

  /** Prefills layer.layer's prompt (into a fresh sequence); `step` then decodes its steps in order. */
  async prepare(layer: ReplayLayer): Promise<void> {
    if (this.seq !== undefined) await this.rt.closeSequence(this.seq);
    this.seq = this.rt.createSequence();
    this.layer = layer;
    this.steps[layer.layer] = [];
    const T = layer.promptTokens;
    const t0 = performance.now();
    await this.rt.prefill(this.seq, layer.layer, prefixView(layer.k, T), prefixView(layer.v, T));
    this.time.prefillMs += performance.now() - t0;
  }

  /** Decodes decode step `step` of the prepared layer (the new tokens follow the prompt in layer.k / layer.v). */
  async step(layerId: number, step: number): Promise<AttendedStep> {
    const layer = this.layer;
    const steps = this.steps[layerId];
    if (!layer || layer.layer !== layerId || this.seq === undefined || !steps || step !== steps.length || step >= layer.decodeSteps)
      throw new KvdriveError('E_INTERNAL', `demo: expected the ${this.mode} runtime to be asked for step ${steps?.length ?? 0} of its prepared layer ${layer?.layer ?? 'none'}, got layer ${layerId} step ${step}`);
    const { promptTokens: T, qHeads } = layer;
    const { heads: H, dim: D } = layer.k;
    const row = H * D;
    const dtype = layer.k.dtype;
    const rowAt = (t: KvTensor) => toF32(t.data.subarray((T + step) * row, (T + step + 1) * row), dtype);
    const [r] = await this.rt.attendTraced(layer.layer, [{ seq: this.seq, q: layer.q.subarray(step * qHeads * D, (step + 1) * qHeads * D), kNew: rowAt(layer.k), vNew: rowAt(layer.v) }]);
    const st = (await this.rt.stats()).recentSteps.at(-1)!;
    const out: AttendedStep = { selection: r!.selection, out: r!.out, bytesScored: r!.bytesScored, selectMs: st.selectionMs, attendMs: st.computeMs };
    steps.push(out);
    const t = this.time;
    if (isTimedStep(step, layer.decodeSteps)) {
      t.wallMs += st.wallMs;
      t.selectMs += st.selectionMs;
      t.fetchMs += st.fetchMs;
      t.computeMs += st.computeMs;
      t.layerSteps++;
    } else {
      t.firstWallMs += st.wallMs;
      t.firstSteps++;
    }
    this.onStep?.(`${this.mode} runtime: layer ${layer.layer} step ${step}`);
    return out;
  }

  /** A step this row has decoded (E_INTERNAL if it has not). */
  private decoded(layer: number, step: number): AttendedStep {
    const s = this.steps[layer]?.[step];
    if (!s) throw new KvdriveError('E_INTERNAL', `demo: expected the ${this.mode} runtime to have decoded layer ${layer} step ${step}, got nothing`);
    return s;
  }

  /** Means per layer-step (ms) and the runtime's memory figures. */
  async summary(): Promise<{ mode: string; wallMs: number; selectMs: number; fetchMs: number; computeMs: number; firstStepMs: number; prefillMs: number; dramBudgetBytes: number; indexBytes: number }> {
    const n = Math.max(1, this.time.layerSteps);
    const m = (await this.rt.stats()).memory;
    const t = this.time;
    const firstStepMs = t.firstWallMs / Math.max(1, t.firstSteps);
    return { mode: this.mode, wallMs: t.wallMs / n, selectMs: t.selectMs / n, fetchMs: t.fetchMs / n, computeMs: t.computeMs / n, firstStepMs, prefillMs: t.prefillMs, dramBudgetBytes: m.plan.dramBudgetBytes, indexBytes: m.indexBytes };
  }

  /** E_INTERNAL unless every output equals `other`'s bit for bit (the modes must agree). */
  checkIdentical(other: RuntimeRow): void {
    const b = (x: Float32Array) => Buffer.from(x.buffer, x.byteOffset, x.byteLength);
    this.steps.forEach((layer, l) =>
      layer.forEach((st, s) => {
        if (Buffer.compare(b(st.out), b(other.decoded(l, s).out)) !== 0)
          throw new KvdriveError('E_INTERNAL', `demo: expected the ${this.mode} runtime's output at layer ${l} step ${s} to equal the ${other.mode} one bit for bit, got a difference`);
      }),
    );
  }

  close(): Promise<void> {
    return this.rt.close();
  }
}
