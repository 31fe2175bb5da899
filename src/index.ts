/**
 * kvdrive public API. Everything a user may import is exported here, and only here.
 */
export { KvdriveError, isKvdriveError, ErrorCodes } from './errors.js';
export type { ErrorCode } from './errors.js';
export type { Dtype, DtypeArray, KvTensor, ModelShape } from './types.js';
export { cpuFeatures, setSimdLevel } from './native.js';
export type { CpuFeatures, SimdLevel } from './native.js';
// Reference host: llama2.c checkpoints, tokenizer, forward pass with a pluggable attention backend.
export { loadCheckpoint, loadTokenizer, generate, Transformer, DenseTsAttention, registerBackend, createBackend } from './model/index.js';
export type { AttentionBackend, AttentionShape, BackendFactory, BackendOptions, Checkpoint, ModelConfig, Tokenizer, GenerateOptions, GenerateResult } from './model/index.js';
