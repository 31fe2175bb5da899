// Decode from the tiers through the runtime (openRuntime({ dramBudget, ssd, hotTier })), the checks
// the removed one-sequence TieredAttention path had that test/runtime-memory.test.ts does not make:
// without sinks, outputs are bit-identical whichever tier serves a chunk; a corrupt SSD extent
// fails only the steps that read it (E_CORRUPT every time they are retried, consuming no position)
// while another sequence keeps decoding, and after repair the failed sequence continues exactly
// as a clean run (a read failing in one head group after another group's reads and pins were
// taken releases them all: closing the sequences checks no DRAM slot stays pinned).
import { readdirSync } from 'node:fs';
import { afterAll, describe, expect, it } from 'vitest';
import { openRuntime, type Runtime, type RuntimeOptions } from '../src/runtime/runtime.js';
import type { KvTensor } from '../src/types.js';
import { expectKvdError, hotTierBytesOf, ioBufferBytes, randn } from './helpers.js';
import { corruptSegments, removeTempDirs, tempDir } from './storage-kv.js';

const shape = { layers: 2, qHeads: 4, kvHeads: 2, headDim: 16 };
const row = shape.kvHeads * shape.headDim;
const PROMPT = 300;
const STEPS = 8;
const MiB = 2 ** 20;
/** A DRAM budget whose DRAM tier holds a fraction of two sequences' sealed chunks: most reads go to SSD. */
const SMALL = 500_000 + ioBufferBytes(); // + the I/O engine's reserve (the plan's ioBufferBytes)
const SMALL_PIPELINED = 500_000 + ioBufferBytes({}, 'pipelined'); // its engine reserves 4 batches
const tmp = () => tempDir('rt-tiers');
afterAll(removeTempDirs);

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');
const kvt = (data: Float32Array, tokens: number): KvTensor => ({ data, dtype: 'f32', tokens, heads: shape.kvHeads, dim: shape.headDim });
const entry = (seq: number, i: number, l: number, t: number) => ({
  seq,
  q: randn(shape.qHeads * shape.headDim, 7919 * (1 + i) + 131 * l + 17 * t),
  kNew: randn(row, 7919 * (1 + i) + 131 * l + 17 * t + 3),
  vNew: randn(row, 7919 * (1 + i) + 131 * l + 17 * t + 4),
});

async function prefill(rt: Runtime, n: number): Promise<number[]> {
  const seqs = Array.from({ length: n }, () => rt.createSequence());
  for (const [i, s] of seqs.entries())
    for (let l = 0; l < shape.layers; l++) await rt.prefill(s, l, kvt(randn(PROMPT * row, 1000 * i + 100 * l), PROMPT), kvt(randn(PROMPT * row, 1000 * i + 100 * l + 1), PROMPT));
  return seqs;
}

/** Outputs of every (step, layer) of each of `n` sequences decoded together, keyed `${seq index}/${t}/${l}`. */
async function decodeAll(rt: Runtime, n: number): Promise<Map<string, string>> {
  const seqs = await prefill(rt, n);
  const out = new Map<string, string>();
  for (let t = 0; t < STEPS; t++)
    for (let l = 0; l < shape.layers; l++) {
      const r = await rt.attend(l, seqs.map((s, i) => entry(s, i, l, t)));
      r.forEach((o, i) => out.set(`${i}/${t}/${l}`, bits(o)));
    }
  return out;
}

// One select thread: a sequential step selects and fetches kv head by kv head (two head groups,
// step.ts), the pipelined mode fetches a stage worker's whole selection at once.
const base: RuntimeOptions = { shape, budget: 32, policy: 'kvdrive', policyOptions: { sinks: 0, threads: 1 }, microBatch: 2, maxSequences: 2, maxTokens: 512, sealTokens: 32 };
/** A hot tier under a generous cap, and the bytes it takes from a DRAM budget (what it allocates). */
const HOT = { windows: 2, maxBytes: MiB };
const HOT_BYTES = hotTierBytesOf({ ...base, hotTier: HOT });

describe('Runtime decode from the tiers', () => {
  it('without sinks: DRAM only, DRAM + SSD and hot tier + DRAM + SSD give bit-identical outputs, both modes', async () => {
    const runs: Array<[string, RuntimeOptions]> = [
      ['dram', { ...base, dramBudget: 64 * MiB }],
      ['dram+ssd', { ...base, dramBudget: SMALL, ssd: { dir: tmp(), streamHeads: 1 } }],
      ['dram+ssd, one select', { ...base, dramBudget: SMALL, ssd: { dir: tmp() } }],
      ['hot+dram+ssd pipelined', { ...base, mode: 'pipelined', dramBudget: SMALL_PIPELINED + HOT_BYTES, ssd: { dir: tmp() }, hotTier: HOT }],
      // sequential with an SSD: head by head (streamHeads 1), each head split against the hot tier at its headBase
      ['hot+dram+ssd sequential', { ...base, dramBudget: SMALL + HOT_BYTES, ssd: { dir: tmp(), streamHeads: 1 }, hotTier: HOT }],
      // one select: the hot-tier admission runs while the reads are in flight, copies from the pages
      // still being read made once they land; the tier must end as the DRAM-only one's does
      ['hot+dram+ssd sequential, one select', { ...base, dramBudget: SMALL + HOT_BYTES, ssd: { dir: tmp() }, hotTier: HOT }],
      ['hot+dram', { ...base, dramBudget: 64 * MiB, hotTier: HOT }],
    ];
    let want: Map<string, string> | undefined;
    const hotTraffic = new Map<string, string>();
    for (const [name, opts] of runs) {
      const rt = await openRuntime(opts);
      const got = await decodeAll(rt, 2);
      const t = (await rt.stats()).memory!.traffic;
      if (opts.ssd) expect(t.ssdChunks, name).toBeGreaterThan(0);
      if (opts.hotTier) expect(t.hotChunks, name).toBeGreaterThan(0);
      if (opts.hotTier && opts.mode !== 'pipelined') hotTraffic.set(name, `${t.hotChunks} hot, ${t.hotAdmitted} admitted`);
      await rt.close();
      if (want) expect([...got.entries()], name).toEqual([...want.entries()]);
      want = got;
    }
    // Whichever tier served a chunk, the hot tier admitted and hit the same chunks.
    expect(new Set(hotTraffic.values()).size, JSON.stringify([...hotTraffic])).toBe(1);
  });

  // With a hot tier the failed reads' pages were admitted while being read: those slots are freed.
  it.each([
    { mode: 'sequential', hot: false },
    { mode: 'pipelined', hot: false },
    { mode: 'sequential', hot: true },
  ] as const)('a corrupt extent fails only the sequence that reads it, on every retry; the other decodes on; repaired, it continues as a clean run ($mode, hot tier $hot)', async ({ mode, hot }) => {
    const hotTier = hot ? { hotTier: HOT } : {};
    const opts: RuntimeOptions = { ...base, dramBudget: (mode === 'pipelined' ? SMALL_PIPELINED : SMALL) + (hot ? HOT_BYTES : 0), mode, ...hotTier };
    const clean = await openRuntime({ ...opts, dramBudget: SMALL + (hot ? HOT_BYTES : 0), mode: 'sequential', ssd: { dir: tmp() } });
    const want = await decodeAll(clean, 2);
    await clean.close();
    const dir = tmp();
    const rt = await openRuntime({ ...opts, ssd: { dir, streamHeads: 1 } });
    const [s0, s1] = await prefill(rt, 2);
    const got = new Map<string, string>();
    const run = async (l: number, t: number, which: number[]) => {
      const r = await rt.attend(l, which.map((i) => entry([s0!, s1!][i]!, i, l, t)));
      r.forEach((o, j) => got.set(`${which[j]}/${t}/${l}`, bits(o)));
    };
    for (let t = 0; t < 3; t++) for (let l = 0; l < shape.layers; l++) await run(l, t, [0, 1]);
    await run(0, 3, [0, 1]);
    const restore = corruptSegments(dir, 's1_');
    expect(readdirSync(dir).some((f) => f.startsWith('s1_'))).toBe(true);
    // More failed attempts than the steps left: a failed step consumes no position.
    for (let i = 0; i <= STEPS; i++) await expectKvdError(() => run(1, 3, [1]), 'E_CORRUPT');
    await run(1, 3, [0]);
    for (let t = 4; t < STEPS; t++) for (let l = 0; l < shape.layers; l++) await run(l, t, [0]);
    restore();
    await run(1, 3, [1]);
    for (let t = 4; t < STEPS; t++) for (let l = 0; l < shape.layers; l++) await run(l, t, [1]);
    expect([...got.entries()].sort()).toEqual([...want.entries()].sort());
    await rt.close();
  });
});
