/** The model module's public surface (re-exported by src/index.ts). */
export { loadCheckpoint } from './checkpoint.js';
export type { Checkpoint, ModelConfig, LayerWeights } from './checkpoint.js';
export { loadTokenizer } from './tokenizer.js';
export type { Tokenizer, EncodeOptions, LoadTokenizerOptions } from './tokenizer.js';
export type { AttentionBackend, AttentionShape, BackendFactory, BackendOptions } from './attention-backend.js';
export { registerBackend, createBackend, backendNames } from './backends.js';
export { DenseTsAttention } from './dense-attention.js';
export { Transformer } from './forward.js';
export type { ForwardObserver } from './forward.js';
export { generate } from './generate.js';
export type { GenerateOptions, GenerateResult } from './generate.js';
export type { TraceMetadata } from './trace-recorder.js';
