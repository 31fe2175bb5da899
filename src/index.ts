/**
 * kvdrive public API: what a host embeds.
 *
 * - The runtime (`openRuntime`): sequences, prefill, attend (a batch of sequences per layer step),
 *   stats, close — over the memory model (hot tier ← DRAM tier ← SSD) under measured budgets.
 * - Hosts built on it: GGUF models (`loadGgufModel`, `generateGguf`) and the llama2.c reference
 *   host (`loadCheckpoint`, `loadTokenizer`, `generate`); both attend through an attention backend
 *   from `createBackend` ('kvdrive' is the runtime, 'dense' the reference).
 * - Typed errors, and the process-memory reading the budgets are checked against.
 *
 * Only what is exported here is a promise. The parts the runtime is built from (selection
 * policies, attention kernels, stores, pipeline stages) and the tools around it (traces, eval,
 * checkpoint conversion) stay importable by their module paths for tests, benchmarks and the CLI.
 */
export { KvdriveError, isKvdriveError, ErrorCodes } from './errors.js';
export type { ErrorCode } from './errors.js';
export type { Dtype, KvTensor, ModelShape } from './types.js';
// The runtime (the front door) and its memory model.
export { openRuntime } from './runtime/runtime.js';
export type { Runtime, RuntimeOptions, RuntimeStats, AttendEntry, TracedOutput } from './runtime/runtime.js';
export type { MemoryStats } from './runtime/kv-memory.js';
export type { PolicyOptions } from './index/options.js';
export type { Selection, PolicyName } from './index/selection.js';
export { processMemory } from './runtime/process-memory.js';
export type { ProcessMemory } from './runtime/process-memory.js';
/** Which SIMD kernels this CPU runs (detected at load). */
export { cpuFeatures } from './native.js';
// Hosts: GGUF models and the llama2.c reference host, attending through a backend.
export { loadGgufModel } from './model/gguf/model.js';
export type { LoadGgufOptions } from './model/gguf/model.js';
export { generateGguf } from './model/gguf/generate.js';
export type { GgufGenerateOptions, GgufGenerateResult } from './model/gguf/generate.js';
export { loadCheckpoint } from './model/checkpoint.js';
export { loadTokenizer } from './model/tokenizer.js';
export { generate } from './model/generate.js';
export type { GenerateOptions, GenerateResult } from './model/generate.js';
export { createBackend } from './model/backends.js';
export type { AttentionBackend, AttentionShape, BackendOptions } from './model/attention-backend.js';
