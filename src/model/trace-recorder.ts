/**
 * Records a kvdrive trace (DESIGN.md §7) from the reference host's forward pass.
 *
 * The recorder observes every layer at every position (after RoPE) and keeps q, k and v. When
 * written, the first `promptTokens` positions become the "prompt" (`layers.{l}.k|v`, T × Hkv × D)
 * and the remaining ones the decode steps (`layers.{l}.q`, S × Hq × D, and `layers.{l}.k_new|v_new`,
 * S × Hkv × D); decode step s attends over the prompt, the earlier steps and itself, exactly what
 * the forward pass did at position T + s.
 */
import { fail } from '../errors.js';
import type { ModelConfig } from './checkpoint.js';
import type { ForwardObserver } from './forward.js';
import { writeTrace, type TraceLayerData, type TraceMeta } from '../trace/trace.js';

export class TraceRecorder implements ForwardObserver {
  /** Per layer, position-major: q maxPositions × dim, k/v maxPositions × kvDim. */
  private readonly q: Float32Array[];
  private readonly k: Float32Array[];
  private readonly v: Float32Array[];
  /** Per layer, the number of positions recorded (they must arrive in order 0, 1, 2, ...). */
  private readonly recorded: Int32Array;

  constructor(
    readonly config: ModelConfig,
    /** Capacity in positions (the generation's step count). */
    readonly maxPositions: number,
  ) {
    if (!Number.isInteger(maxPositions) || maxPositions < 1 || maxPositions > config.seqLen)
      fail('E_RANGE', 'trace recorder positions', `an integer in [1, ${config.seqLen}] (seq_len)`, maxPositions);
    const { nLayers, dim, kvDim } = config;
    this.q = Array.from({ length: nLayers }, () => new Float32Array(maxPositions * dim));
    this.k = Array.from({ length: nLayers }, () => new Float32Array(maxPositions * kvDim));
    this.v = Array.from({ length: nLayers }, () => new Float32Array(maxPositions * kvDim));
    this.recorded = new Int32Array(nLayers);
  }

  /** Positions recorded in every layer. */
  get positions(): number {
    return Math.min(...this.recorded);
  }

  onProjections(layer: number, pos: number, q: Float32Array, k: Float32Array, v: Float32Array): void {
    const { dim, kvDim } = this.config;
    if (pos !== this.recorded[layer]) fail('E_RANGE', `trace recorder layer ${layer} position`, `${this.recorded[layer]} (positions in order)`, pos);
    if (pos >= this.maxPositions) fail('E_RANGE', 'trace recorder position', `< ${this.maxPositions} (capacity)`, pos);
    this.q[layer]!.set(q.subarray(0, dim), pos * dim);
    this.k[layer]!.set(k.subarray(0, kvDim), pos * kvDim);
    this.v[layer]!.set(v.subarray(0, kvDim), pos * kvDim);
    this.recorded[layer]!++;
  }

  /**
   * Writes the trace to `path` (F32, via the trace module's writer). `promptTokens` (default: half
   * the recorded positions, rounded down) must leave at least one position on each side.
   */
  async write(path: string, promptTokens?: number): Promise<TraceMeta> {
    const P = this.positions;
    const T = promptTokens ?? Math.floor(P / 2);
    if (!Number.isInteger(T) || T < 1 || T >= P)
      fail('E_RANGE', 'trace prompt tokens', `an integer in [1, ${P - 1}] (${P} positions were generated)`, T);
    const { nLayers, nHeads, nKvHeads, headSize, dim, kvDim } = this.config;
    const meta: TraceMeta = { version: 1, layers: nLayers, qHeads: nHeads, kvHeads: nKvHeads, headDim: headSize, promptTokens: T, decodeSteps: P - T };
    // Views into the recorded arrays, position-major like the trace layout: no copies.
    const layers: TraceLayerData[] = [];
    for (let l = 0; l < nLayers; l++) {
      const k = this.k[l]!;
      const v = this.v[l]!;
      layers.push({
        k: k.subarray(0, T * kvDim),
        v: v.subarray(0, T * kvDim),
        q: this.q[l]!.subarray(T * dim, P * dim),
        kNew: k.subarray(T * kvDim, P * kvDim),
        vNew: v.subarray(T * kvDim, P * kvDim),
      });
    }
    await writeTrace(path, meta, 'f32', layers);
    return meta;
  }
}
