/**
 * kvdrive public API. Everything a user may import is exported here, and only here.
 */
export { KvdriveError, isKvdriveError, ErrorCodes } from './errors.js';
export type { ErrorCode } from './errors.js';
export type { Dtype, DtypeArray, KvTensor, ModelShape } from './types.js';
export { cpuFeatures, setSimdLevel } from './native.js';
export type { CpuFeatures, SimdLevel } from './native.js';
export { createPolicy } from './index/policy.js';
export type { SelectionPolicy, SelectOptions, SelectStats } from './index/policy.js';
export type { PolicyOptions } from './index/options.js';
export type { Selection, PolicyName } from './index/selection.js';
export {
  attendDense,
  attendDenseAsync,
  attendSparse,
  attendSparseAsync,
  attentionWeights,
  mergeAttention,
} from './attention/kernels.js';
export type {
  AttendDenseOptions,
  AttendSparseOptions,
  AttentionResult,
  SparseAttentionResult,
  AttentionWeightsOptions,
} from './attention/kernels.js';
// Reference host: llama2.c checkpoints, tokenizer, forward pass with a pluggable attention backend.
export { loadCheckpoint } from './model/checkpoint.js';
export type { Checkpoint, ModelConfig } from './model/checkpoint.js';
export { loadTokenizer } from './model/tokenizer.js';
export type { Tokenizer } from './model/tokenizer.js';
export type { AttentionBackend, AttentionShape, BackendFactory, BackendOptions } from './model/attention-backend.js';
export { registerBackend, createBackend } from './model/backends.js';
export { DenseTsAttention } from './model/dense-attention.js';
export { KvdriveAttention } from './model/kvdrive-attention.js';
export type { KvdriveAttentionOptions, KvdriveAttentionStats } from './model/kvdrive-attention.js';
export { Transformer } from './model/forward.js';
export { generate } from './model/generate.js';
export type { GenerateOptions, GenerateResult } from './model/generate.js';
export { openTrace, writeTrace, memoryTrace, layerKvWithNew, TraceMetaSchema } from './trace/trace.js';
export type { TraceMeta, TraceReader, TraceLayer, TraceLayerData, TraceExtraTensor } from './trace/trace.js';
export { generateSyntheticTrace, SyntheticTraceOptionsSchema, NEEDLES_TENSOR } from './trace/synthetic.js';
export type { SyntheticTrace, SyntheticTraceOptions, SyntheticNeedle, HeadRole } from './trace/synthetic.js';
export { openSafetensors, writeSafetensors, SafetensorsFile, SafetensorsWriter } from './trace/safetensors.js';
export type { Tensor, TensorData, TensorInfo, TensorSpec, DataDtype, SafetensorsDtype } from './trace/safetensors.js';
export { f32ArrayToF16, f32ArrayToBf16, f16ArrayToF32, bf16ArrayToF32 } from './util/f16.js';
