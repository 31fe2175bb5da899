// Vector primitives specific to the softmax-attention kernels (attention.cc), dispatched at the
// same SIMD level as the shared table in simd.h (kvd::Simd().level), so setSimdLevel() switches
// both together. Kept apart from SimdKernels so the shared contract in simd.h stays small.
//
// Implementations: scalar (the reference) in attn_simd.cc, AVX2 in simd_avx2.cc, AVX-512 in
// simd_avx512.cc. All buffers are f32 except `rows`, which are in storage dtype `dt`.
#pragma once
#include <cstddef>

#include "common/dtype.h"
#include "common/simd.h"

namespace kvd {

// Where a row kernel sends its prefetches of the `next` rows. L1 (prefetcht0) suits scattered rows
// a tile ahead: L2 was equal or slower there (attend-ab, runs of 1, 4, 16 and 64 rows). L2
// (prefetcht1) suits rows streamed from long spans (dense attention and its parts, attention.cc's
// streamed regime): with L1 prefetches the kernels sat on their row loads at ~8 GB/s, with L2 they
// ran ~1.8x faster (bench/RESULTS.md, "Streamed rows prefetched into L2").
enum class PrefetchTo : unsigned char { L1, L2 };

// Requests one row's lines for a row kernel (the vector levels call it once per row processed, so
// misses stay in flight steadily instead of in one burst that would fill the miss buffers).
inline void PrefetchRowBytes(const void* row, size_t bytes, PrefetchTo to) {
  const char* p = static_cast<const char*>(row);
  // prefetcht1 in asm: GCC 12 merged two __builtin_prefetch loops that differ only in locality
  // into one (both prefetcht0).
  if (to == PrefetchTo::L2)
    for (size_t off = 0; off < bytes; off += 64) {
#if defined(__x86_64__) || defined(__i386__)
      __asm__ volatile("prefetcht1 %0" : : "m"(p[off]));
#else
      __builtin_prefetch(p + off, 0, 2);
#endif
    }
  else
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

struct AttnKernels {
  SimdLevel level;
  // x[i] *= scale for i < n; returns max_i x[i]. *finite is set to false when any scaled value is
  // NaN or +-Inf (the caller then locates it on its error path), else left unchanged.
  float (*scale_max)(float* x, size_t n, float scale, bool* finite);
  // x[i] = exp(x[i] - m) for i < n (every x[i] <= m, so results are in [0, 1]); returns sum_i x[i].
  float (*exp_sum)(float* x, size_t n, float m);
  // Logits of `nrows` rows against nq queries (qs: nq x n):
  //   L[j*ldL + r] = sum_d qs[j*n + d] * rows[r][d]      (j < nq, r < nrows; unscaled)
  // Each row is read and widened once for all nq queries (one GQA group).
  // `next` / `nNext`: rows of a tile the caller processes later (may be null / 0); vector levels
  // prefetch them, one per row processed, so memory latency overlaps this tile's arithmetic; `to`
  // says into which cache.
  void (*logits_rows)(const float* qs, size_t nq, const void* const* rows, size_t nrows, Dtype dt, size_t n,
                      float* L, size_t ldL, const void* const* next, size_t nNext, PrefetchTo to);
  // Weighted sum of `nrows` rows into `nq` accumulators of `n` floats:
  //   acc[j*n + d] += sum_r w[j*wStride + r] * rows[r][d]      (j < nq, r < nrows, d < n)
  // Each row is read and widened once for all nq weights; rows are summed in index order r, so the
  // result depends only on the row sequence (not on where rows live).
  // `next` / `nNext` / `to` as for logits_rows.
  void (*weighted_rows)(float* acc, size_t nq, const float* w, size_t wStride, const void* const* rows,
                        size_t nrows, Dtype dt, size_t n, const void* const* next, size_t nNext, PrefetchTo to);
};

// Table for the active SIMD level (Simd().level).
const AttnKernels& AttnSimd();

const AttnKernels& ScalarAttnKernels();
// Defined in simd_avx2.cc / simd_avx512.cc; only valid when SimdFor() offers that level.
const AttnKernels* Avx2AttnKernels();
const AttnKernels* Avx512AttnKernels();

}  // namespace kvd
