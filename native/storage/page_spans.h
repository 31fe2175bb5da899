// Attention spans over page-first chunks: the layout of SSD extents, DRAM-tier slots and TieredKv
// fetch buffers (a chunk = chunkSize K rows, then chunkSize V rows, dim elements each, storage
// dtype). This is how native attention (AttendHeadSpans) reads staged KV without another copy:
// one Span per chunk (K and V of neighbouring chunks are interleaved, so rows of two chunks never
// share one stride).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention/attention.h"
#include "common/dtype.h"

namespace kvd {

// Bytes of one page-first chunk.
inline size_t PageFirstChunkBytes(int chunkSize, int dim, Dtype dt) { return 2 * size_t(chunkSize) * dim * DtypeSize(dt); }

// The span of the chunk starting at `chunk` (its first K row).
inline Span PageFirstChunkSpan(const void* chunk, int chunkSize, int dim, Dtype dt) {
  const uint8_t* p = static_cast<const uint8_t*>(chunk);
  return Span{p, p + size_t(chunkSize) * dim * DtypeSize(dt), chunkSize, dim, dim};
}

// Appends spans of entries [first, first + n) of a fetch buffer (entry i at i * chunkBytes), in
// entry order (TieredKv fills entries in the request's ascending chunk order per kv head).
inline void FetchBufferSpans(const void* buf, size_t first, size_t n, int chunkSize, int dim, Dtype dt, std::vector<Span>& out) {
  const size_t cb = PageFirstChunkBytes(chunkSize, dim, dt);
  const uint8_t* p = static_cast<const uint8_t*>(buf) + first * cb;
  for (size_t i = 0; i < n; ++i, p += cb) out.push_back(PageFirstChunkSpan(p, chunkSize, dim, dt));
}

}  // namespace kvd
