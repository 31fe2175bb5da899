/**
 * kvdrive public API: the runtime a host embeds (openRuntime: sequences, prefill, attend, stats,
 * close, over the memory model — DRAM tier, SSD store, hot tier), the selection policies and
 * attention kernels it is built from, the reference host (llama2.c checkpoints, generate, attention
 * backends) and traces. Everything a user may import is exported here, and only here; the parts
 * (stores, tiers, pipeline stages) stay importable by their module paths for tests and benchmarks
 * but are not a promise.
 */
export { KvdriveError, isKvdriveError, ErrorCodes } from './errors.js';
export type { ErrorCode } from './errors.js';
export type { Dtype, KvTensor, ModelShape } from './types.js';
export { cpuFeatures, setSimdLevel } from './native.js';
// The runtime (the front door) and its memory model.
export { openRuntime } from './runtime/runtime.js';
export type { Runtime, RuntimeOptions, RuntimeStats, AttendEntry, TracedOutput } from './runtime/runtime.js';
export type { MemoryStats } from './runtime/kv-memory.js';
export { processMemory } from './runtime/process-memory.js';
export type { ProcessMemory } from './runtime/process-memory.js';
// Selection and attention.
export { createPolicy } from './index/policy.js';
export type { SelectionPolicy } from './index/policy.js';
export type { PolicyOptions } from './index/options.js';
export type { Selection, PolicyName } from './index/selection.js';
export { attendDense, attendSparse, mergeAttention } from './attention/kernels.js';
// Reference host: llama2.c checkpoints, tokenizer, generation with a pluggable attention backend.
export { loadCheckpoint } from './model/checkpoint.js';
export { loadTokenizer } from './model/tokenizer.js';
export { generate } from './model/generate.js';
export type { GenerateOptions, GenerateResult } from './model/generate.js';
export { createBackend, registerBackend } from './model/backends.js';
export type { AttentionBackend, AttentionShape, BackendOptions } from './model/attention-backend.js';
// Traces (DESIGN.md §7).
export { openTrace, writeTrace } from './trace/trace.js';
export type { TraceMeta } from './trace/trace.js';
export { generateSyntheticTrace } from './trace/synthetic.js';
export type { SyntheticTraceOptions } from './trace/synthetic.js';
// GGUF models: native forward pass with attention through the same backends (src/model/gguf/).
export { loadGgufModel } from './model/gguf/model.js';
export type { LoadGgufOptions } from './model/gguf/model.js';
export { generateGguf } from './model/gguf/generate.js';
export type { GgufGenerateOptions, GgufGenerateResult } from './model/gguf/generate.js';
export { convertLlama2c } from './model/gguf/convert.js';
