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
  // prefetch them, one per row processed, so memory latency overlaps this tile's arithmetic.
  void (*logits_rows)(const float* qs, size_t nq, const void* const* rows, size_t nrows, Dtype dt, size_t n,
                      float* L, size_t ldL, const void* const* next, size_t nNext);
  // Weighted sum of `nrows` rows into `nq` accumulators of `n` floats:
  //   acc[j*n + d] += sum_r w[j*wStride + r] * rows[r][d]      (j < nq, r < nrows, d < n)
  // Each row is read and widened once for all nq weights; rows are summed in index order r, so the
  // result depends only on the row sequence (not on where rows live).
  // `next` / `nNext` as for logits_rows.
  void (*weighted_rows)(float* acc, size_t nq, const float* w, size_t wStride, const void* const* rows,
                        size_t nrows, Dtype dt, size_t n, const void* const* next, size_t nNext);
};

// Table for the active SIMD level (Simd().level).
const AttnKernels& AttnSimd();

const AttnKernels& ScalarAttnKernels();
// Defined in simd_avx2.cc / simd_avx512.cc; only valid when SimdFor() offers that level.
const AttnKernels* Avx2AttnKernels();
const AttnKernels* Avx512AttnKernels();

}  // namespace kvd
