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
export { openRuntime } from './pipeline/runtime.js';
export type { Runtime, RuntimeOptions, RuntimeStats, AttendEntry, StepBreakdown } from './pipeline/runtime.js';
export { calibrate } from './pipeline/calibrate.js';
export type { CalibrateOptions, CalibrationResult, CalibrationTrial } from './pipeline/calibrate.js';
export type { StageStats } from './pipeline/stage-pool.js';
export type { StageWorkerStats } from './pipeline/stage-contract.js';
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
// GGUF models: reader/writer, native forward pass, tokenizers, conversion, random-weight files.
export { readGguf } from './model/gguf/reader.js';
export type { GgufFile, GgufTensorInfo } from './model/gguf/reader.js';
export { writeGguf } from './model/gguf/writer.js';
export type { GgufWriteSpec, GgufTensorSpec } from './model/gguf/writer.js';
export type { GgufValue, GgmlTypeName } from './model/gguf/ggml-types.js';
export { loadGgufModel, GgufModel, GgufTransformer } from './model/gguf/model.js';
export type { LoadGgufOptions } from './model/gguf/model.js';
export type { LlamaConfig } from './model/gguf/llama-config.js';
export type { GgufTokenizer } from './model/gguf/tokenizer.js';
export { generateGguf } from './model/gguf/generate.js';
export type { GgufGenerateOptions, GgufGenerateResult } from './model/gguf/generate.js';
export { convertLlama2c } from './model/gguf/convert.js';
export type { ConvertOptions, ConvertResult } from './model/gguf/convert.js';
export { writeRandomModel, MODEL_SHAPES } from './model/gguf/random-model.js';
export type { RandomModelOptions, ModelShape as GgufModelShape, RandomWeightType } from './model/gguf/random-model.js';
export { HotTier, EvictionPolicies, resolveWindows } from './cache/hot-tier.js';
export type { HotTierOptions, EvictionPolicy, TierCounters, HotTierStepStats, HotTierStats, HotTierInfo, LayerArgs, AttendArgs, SlotAttentionResult } from './cache/hot-tier.js';
export { importanceScores, importanceScoresAsync, rankChunks, warmUp, warmUpAsync } from './cache/warmup.js';
export type { ObservationWindow } from './cache/warmup.js';
export { solveWindows, parseWindowAllocation, parseBytes } from './cache/window-solver.js';
export type { SolveWindowsOptions, SolveMethod, WindowAllocation } from './cache/window-solver.js';
export { parseProfile, WindowProfileSchema } from './cache/profile-types.js';
export { profileTrace, measureWindows, profileTotals } from './cache/profiler.js';
export type { ProfileOptions } from './cache/profiler.js';
export type { WindowProfile, PairProfile } from './cache/profile-types.js';
export { openTrace, writeTrace, memoryTrace, layerKvWithNew, TraceMetaSchema } from './trace/trace.js';
export type { TraceMeta, TraceReader, TraceLayer, TraceLayerData, TraceExtraTensor } from './trace/trace.js';
export { generateSyntheticTrace, SyntheticTraceOptionsSchema, NEEDLES_TENSOR } from './trace/synthetic.js';
export type { SyntheticTrace, SyntheticTraceOptions, SyntheticNeedle, HeadRole } from './trace/synthetic.js';
export { openSafetensors, writeSafetensors, SafetensorsFile, SafetensorsWriter } from './trace/safetensors.js';
export type { Tensor, TensorData, TensorInfo, TensorSpec, DataDtype, SafetensorsDtype } from './trace/safetensors.js';
export { f32ArrayToF16, f32ArrayToBf16, f16ArrayToF32, bf16ArrayToF32 } from './util/f16.js';
export { IoEngine, ioUringAvailable } from './storage/io-engine.js';
export type { IoEngineKind, IoEngineOptions, IoEngineInfo, IoBatchStats, IoRead } from './storage/io-engine.js';
export { SsdStore, SSD_MANIFEST_VERSION, chunkBytesOf } from './storage/ssd-store.js';
export type { SsdStoreOptions, StoreShape, SegmentData, ClusterLayout, SegmentInfo, ChunkReadItem, SsdReadStats } from './storage/ssd-store.js';
export { DramStore } from './storage/dram-store.js';
export type { DramStoreOptions, DramStats } from './storage/dram-store.js';
export { TieredKv, chunkRows } from './storage/tiered-kv.js';
export type { TieredKvOptions, FetchRequest, FetchStats, PrefetchHandle, PrefetchTotals } from './storage/tiered-kv.js';
export { TieredAttention, attendFetched, attendFetchedAsync } from './storage/tiered-attention.js';
export type { TieredAttentionOptions, PrefillLayer, PrefillStats, TieredStepResult, TieredStepStats, AttendFetchedOptions, FetchedAttentionResult } from './storage/tiered-attention.js';
