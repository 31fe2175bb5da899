/**
 * kvdrive public API. Everything a user may import is exported here, and only here.
 */
export { KvdriveError, isKvdriveError, ErrorCodes } from './errors.js';
export type { ErrorCode } from './errors.js';
export type { Dtype, DtypeArray, KvTensor, ModelShape } from './types.js';
export { cpuFeatures, setSimdLevel } from './native.js';
export type { CpuFeatures, SimdLevel } from './native.js';
export { IoEngine, ioUringAvailable } from './storage/io-engine.js';
export type { IoEngineKind, IoEngineOptions, IoEngineInfo, IoBatchStats, IoRead } from './storage/io-engine.js';
export { SsdStore, SSD_MANIFEST_VERSION, chunkBytesOf } from './storage/ssd-store.js';
export type { SsdStoreOptions, StoreShape, SegmentData, ClusterLayout, SegmentInfo, ChunkReadItem, SsdReadStats } from './storage/ssd-store.js';
export { DramStore } from './storage/dram-store.js';
export type { DramStoreOptions, DramStats } from './storage/dram-store.js';
export { TieredKv, chunkRows } from './storage/tiered-kv.js';
export type { TieredKvOptions, FetchRequest, FetchStats, PrefetchHandle } from './storage/tiered-kv.js';
