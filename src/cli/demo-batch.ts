/**
 * `kvdrive demo --batch N [--mode sequential|pipelined|both]`: the decode runtime on a batch of
 * synthetic sequences (Llama-like 32/8 heads, head dim 128, f32 KV), showing the time breakdown of
 * every layer step per stage (selection, fetch, compute, stall) from RuntimeStats, and
 * with `--mode both` the pipelined throughput as a ratio of the sequential one in the same run.
 * The memory model holds the batch DRAM-only (openRuntime sizes its budget to the declared batch).
 */
import { openRuntime, type RuntimeStats, type StepBreakdown } from '../runtime/runtime.js';
import { ms, table } from '../eval/format.js';
import { uniform } from '../util/uniform.js';

export interface BatchDemoOptions {
  batch: number;
  mode: 'sequential' | 'pipelined' | 'both';
  context: number;
  layers: number;
  steps: number;
  budget: number;
  seed: number;
  microBatch: number;
  json?: boolean;
}

const SHAPE = { qHeads: 32, kvHeads: 8, headDim: 128 };

interface ModeRun {
  mode: 'sequential' | 'pipelined';
  steps: StepBreakdown[];
  stats: RuntimeStats;
  /** Batch entries (sequence-layer steps) per second over the decode. */
  throughput: number;
}

async function runMode(mode: 'sequential' | 'pipelined', o: BatchDemoOptions): Promise<ModeRun> {
  const row = SHAPE.kvHeads * SHAPE.headDim;
  const maxTokens = o.context + o.steps + 1;
  const rt = await openRuntime({
    shape: { layers: o.layers, ...SHAPE },
    budget: o.budget,
    mode,
    microBatch: o.microBatch,
    maxSequences: o.batch,
    maxTokens,
  });
  try {
    const seqs = Array.from({ length: o.batch }, () => rt.createSequence());
    for (const [i, s] of seqs.entries())
      for (let l = 0; l < o.layers; l++) {
        const t = { dtype: 'f32' as const, tokens: o.context, heads: SHAPE.kvHeads, dim: SHAPE.headDim };
        await rt.prefill(s, l, { ...t, data: uniform(o.context * row, o.seed + 100 * i + 2 * l) }, { ...t, data: uniform(o.context * row, o.seed + 100 * i + 2 * l + 1) });
      }
    const before = await rt.stats();
    for (let step = 0; step < o.steps; step++)
      for (let l = 0; l < o.layers; l++)
        await rt.attend(
          l,
          seqs.map((seq, i) => ({
            seq,
            q: uniform(SHAPE.qHeads * SHAPE.headDim, o.seed + 7919 * step + 31 * i + l),
            kNew: uniform(row, o.seed + 13 * step + i + 5),
            vNew: uniform(row, o.seed + 17 * step + i + 9),
          })),
        );
    const stats = await rt.stats();
    const steps = stats.recentSteps.slice(-o.steps * o.layers);
    const wall = stats.wallMs - before.wallMs;
    return { mode, steps, stats, throughput: (o.batch * o.steps * o.layers * 1000) / wall };
  } finally {
    await rt.close();
  }
}

function render(runs: ModeRun[], o: BatchDemoOptions): string {
  const out: string[] = [
    `workload: ${o.batch} synthetic sequences x ${o.layers} layers x ${o.steps} decode steps, context ${o.context} tokens, ` +
      `${SHAPE.qHeads} query / ${SHAPE.kvHeads} kv heads, head dim ${SHAPE.headDim}, f32 KV in DRAM (memory model, DRAM only); budget ${o.budget}, microBatch ${o.microBatch}`,
  ];
  for (const r of runs) {
    const rows: (string | number)[][] = [['step', 'layer', 'wall', 'selection', 'fetch', 'compute', 'stall']];
    r.steps.forEach((s, i) =>
      rows.push([Math.floor(i / o.layers), s.layer, ms(s.wallMs), ms(s.selectionMs), ms(s.fetchMs), ms(s.computeMs), ms(s.stallMs)]),
    );
    const st = r.stats;
    out.push('', `${r.mode}: ${r.throughput.toFixed(1)} sequence-layer steps/s; stall ${((100 * st.stallMs) / Math.max(1e-9, st.wallMs)).toFixed(0)}% of attend wall time`, table(rows));
  }
  if (runs.length === 2)
    out.push('', `pipelined / sequential throughput: ${(runs[1]!.throughput / runs[0]!.throughput).toFixed(2)}x (same run, same inputs)`);
  out.push('', 'selection, fetch and compute are summed over micro-batches; pipelined stages overlap, so they may add up to more than the wall time.');
  return out.join('\n');
}

/** Runs the batch demo and writes the table (or JSON) to stdout. */
export async function runBatchDemo(o: BatchDemoOptions): Promise<void> {
  const modes = o.mode === 'both' ? (['sequential', 'pipelined'] as const) : ([o.mode] as const);
  const runs: ModeRun[] = [];
  for (const m of modes) runs.push(await runMode(m, o));
  if (o.json) process.stdout.write(JSON.stringify({ options: o, runs: runs.map((r) => ({ mode: r.mode, throughput: r.throughput, steps: r.steps, stats: r.stats })) }) + '\n');
  else process.stdout.write(render(runs, o) + '\n');
}
