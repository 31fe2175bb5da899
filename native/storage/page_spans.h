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

// The span of `len` tokens of the page of `chunkSize` tokens at `page`, from its token `skip`.
inline Span PageFirstRowsSpan(const void* page, int64_t skip, int64_t len, int64_t chunkSize, int dim, Dtype dt) {
  const size_t rowBytes = size_t(dim) * DtypeSize(dt);
  const uint8_t* k = static_cast<const uint8_t*>(page) + size_t(skip) * rowBytes;
  return Span{k, k + size_t(chunkSize) * rowBytes, len, dim, dim};
}

// The span of the chunk starting at `chunk` (its first K row).
inline Span PageFirstChunkSpan(const void* chunk, int chunkSize, int dim, Dtype dt) {
  return PageFirstRowsSpan(chunk, 0, chunkSize, chunkSize, dim, dt);
}

// Appends spans of entries [first, first + n) of a fetch buffer (entry i at i * chunkBytes), in
// entry order (TieredKv fills entries in the request's ascending chunk order per kv head).
inline void FetchBufferSpans(const void* buf, size_t first, size_t n, int chunkSize, int dim, Dtype dt, std::vector<Span>& out) {
  const size_t cb = PageFirstChunkBytes(chunkSize, dim, dt);
  const uint8_t* p = static_cast<const uint8_t*>(buf) + first * cb;
  for (size_t i = 0; i < n; ++i, p += cb) out.push_back(PageFirstChunkSpan(p, chunkSize, dim, dt));
}

}  // namespace kvd
