// SSD segment files: one file per sealed segment holding, per (layer, kv head) region, that head's
// chunks packed cluster by cluster (semantic contiguity: one cluster = one extent = one sequential
// read), each chunk page-first (its c K rows, then its c V rows, D elements each, storage dtype).
//
// File layout (little-endian), format version kSegmentVersion:
//   [region 0][pad][region 1][pad]...   each region starts at a 4096-aligned offset; its extents
//                                       are packed back to back in cluster order
//   [index]                             at a 4096-aligned offset; per region (layer-major, then head):
//                                       u64 regionOffset, u32 nExtents, u32 nChunks,
//                                       nExtents x {u64 offset, u32 bytes, u32 firstPos, u32 chunks},
//                                       nChunks x u32 crc32c of each chunk's bytes, in layout order,
//                                       nChunks x i32 chunk id in layout order
//   [footer, 64 bytes]                  magic "KVDSEG\0\1", u32 version, u32 dtype, u32 layers,
//                                       u32 heads, u32 dim, u32 chunkSize, u64 tokens, u64 indexOffset,
//                                       u64 indexBytes, u32 indexCrc, u32 footerCrc (of bytes 0..59)
// A chunk at layout position p of extent e lies at e.offset + (p - e.firstPos) * chunkBytes: that is
// the per-extent chunk -> offset table (chunks have one size per segment). Reads fetch only the
// requested chunks (neighbours in the file merged into one read) and verify each chunk's crc32c
// before using any of its bytes; extents (clusters) remain the unit of locality, not of I/O.
// Version 1 (one crc32c per extent, whole-extent reads) is refused with E_VERSION.
#pragma once
#include <cstdint>

namespace kvd {

constexpr uint32_t kSegmentVersion = 2;
constexpr uint64_t kSegmentFooterBytes = 64;

}  // namespace kvd
