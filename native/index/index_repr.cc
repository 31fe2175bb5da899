// Chunk representatives read from a layer's KV tensor in its storage dtype: the mean key of each
// chunk (kvdrive, shadowkv) and the per-channel min / max (Quest pages). Output is always f32.
//
// Chunk j covers tokens [origin + j*chunk, origin + (j+1)*chunk); tokens below `floorTok` (the attention sinks,
// which are always attended anyway) are left out of its representative.
#include <algorithm>

#include "index/index.h"

namespace kvd {

void ChunkMeans(const KvView& kv, int h, int chunk, int64_t origin, int64_t floorTok, int64_t c0, int64_t c1, float* out,
                float* var) {
  const SimdKernels& simd = Simd();
  std::vector<float> rows(size_t(chunk) * kv.dim);  // the chunk's keys in f32, for the variance pass
  for (int64_t j = c0; j < c1; ++j) {
    float* m = out + (j - c0) * kv.dim;
    std::fill(m, m + kv.dim, 0.f);
    const int64_t t0 = std::max(origin + j * chunk, floorTok), t1 = origin + (j + 1) * chunk;
    for (int64_t t = t0; t < t1; ++t) {
      float* row = rows.data() + size_t(t - t0) * kv.dim;
      simd.to_f32(row, kv.Row(t, h), kv.dtype, kv.dim);
      for (int d = 0; d < kv.dim; ++d) m[d] += row[d];
    }
    const float inv = 1.f / float(t1 - t0);
    for (int d = 0; d < kv.dim; ++d) m[d] *= inv;
    if (var) {
      // Per-dimension variance of the chunk's keys around their mean (two-pass, f64 sum).
      double ss = 0;
      for (int64_t t = t0; t < t1; ++t) {
        const float* row = rows.data() + size_t(t - t0) * kv.dim;
        for (int d = 0; d < kv.dim; ++d) ss += double(row[d] - m[d]) * double(row[d] - m[d]);
      }
      var[j - c0] = float(ss / double((t1 - t0) * int64_t(kv.dim)));
    }
  }
}

void ChunkMinMax(const KvView& kv, int h, int chunk, int64_t origin, int64_t floorTok, int64_t c0, int64_t c1, float* mn, float* mx) {
  const SimdKernels& simd = Simd();
  std::vector<float> row(kv.dim);
  for (int64_t j = c0; j < c1; ++j) {
    float* lo = mn + (j - c0) * kv.dim;
    float* hi = mx + (j - c0) * kv.dim;
    const int64_t t0 = std::max(origin + j * chunk, floorTok), t1 = origin + (j + 1) * chunk;
    simd.to_f32(lo, kv.Row(t0, h), kv.dtype, kv.dim);
    std::copy(lo, lo + kv.dim, hi);
    for (int64_t t = t0 + 1; t < t1; ++t) {
      simd.to_f32(row.data(), kv.Row(t, h), kv.dtype, kv.dim);
      for (int d = 0; d < kv.dim; ++d) {
        lo[d] = std::min(lo[d], row[d]);
        hi[d] = std::max(hi[d], row[d]);
      }
    }
  }
}

}  // namespace kvd
