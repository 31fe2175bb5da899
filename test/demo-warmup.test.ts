/** The demo's untimed warm-ups (src/cli/demo-runtime.ts): they run before the timed rows and change no result. */
import { describe, expect, it } from 'vitest';
import { warmUpPolicies, warmUpShape } from '../src/cli/demo-runtime.js';
import { evaluateTrace } from '../src/eval/replay.js';
import { generateSyntheticTrace } from '../src/trace/synthetic.js';

describe('demo warm-ups', () => {
  it('the throwaway shape stays inside the runtime and the prompt', () => {
    expect(warmUpShape({ promptTokens: 131072, decodeSteps: 8 })).toEqual({ tokens: 8192, steps: 40 });
    expect(warmUpShape({ promptTokens: 1024, decodeSteps: 3 })).toEqual({ tokens: 1024, steps: 3 });
  });

  it("the policy rows' warm-up indexes, selects and attends a throwaway context and leaves every scored figure as it was", async () => {
    const trace = generateSyntheticTrace({ layers: 1, promptTokens: 2048, decodeSteps: 3, qHeads: 8, kvHeads: 2, headDim: 32, seed: 4 });
    const policies = ['quest', 'shadowkv'] as const;
    const scored = async () => (await evaluateTrace(trace, { policies: [...policies], budget: 64, denseThreads: 2 })).policies.map((p) => [p.policy, p.recall, p.relError, p.needlesFound]);
    const cold = await scored();
    await warmUpPolicies(policies, trace.meta, trace.dtype, 64, 2);
    expect(await scored()).toEqual(cold);
  });
});
