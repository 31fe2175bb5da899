/**
 * kvdrive public API. Everything a user may import is exported here, and only here.
 */
export { KvdriveError, isKvdriveError, ErrorCodes } from './errors.js';
export type { ErrorCode } from './errors.js';
export type { Dtype, DtypeArray, KvTensor, ModelShape } from './types.js';
export { cpuFeatures, setSimdLevel } from './native.js';
export type { CpuFeatures, SimdLevel } from './native.js';
export { openTrace, writeTrace, memoryTrace, layerKvWithNew, TraceMetaSchema } from './trace/trace.js';
export type { TraceMeta, TraceReader, TraceLayer, TraceLayerData, TraceExtraTensor } from './trace/trace.js';
export { generateSyntheticTrace, SyntheticTraceOptionsSchema, NEEDLES_TENSOR } from './trace/synthetic.js';
export type { SyntheticTrace, SyntheticTraceOptions, SyntheticNeedle, HeadRole } from './trace/synthetic.js';
export { openSafetensors, writeSafetensors, SafetensorsFile, SafetensorsWriter } from './trace/safetensors.js';
export type { Tensor, TensorData, TensorInfo, TensorSpec, DataDtype, SafetensorsDtype } from './trace/safetensors.js';
export { f32ArrayToF16, f32ArrayToBf16, f16ArrayToF32, bf16ArrayToF32 } from './util/f16.js';
