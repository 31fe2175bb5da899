// Scalar reference of the attention primitives (attn_simd.h) and their dispatch by SIMD level.
#include "attention/attn_simd.h"

#include <cmath>

namespace kvd {
namespace {

float ScaleMax(float* x, size_t n, float scale, bool* finite) {
  float m = -INFINITY;
  bool ok = true;
  for (size_t i = 0; i < n; ++i) {
    float v = x[i] * scale;
    x[i] = v;
    ok &= std::isfinite(v);
    m = v > m ? v : m;
  }
  if (!ok) *finite = false;
  return m;
}

float ExpSum(float* x, size_t n, float m) {
  float s = 0.f;
  for (size_t i = 0; i < n; ++i) {
    float e = std::exp(x[i] - m);
    x[i] = e;
    s += e;
  }
  return s;
}

void LogitsRows(const float* qs, size_t nq, const void* const* rows, size_t nrows, Dtype dt, size_t n, float* L,
                size_t ldL, const void* const* /*next*/, size_t /*nNext*/, PrefetchTo /*to*/) {
  for (size_t r = 0; r < nrows; ++r)
    for (size_t j = 0; j < nq; ++j) {
      const float* q = qs + j * n;
      float s = 0.f;
      for (size_t d = 0; d < n; ++d) s += q[d] * LoadElem(rows[r], dt, d);
      L[j * ldL + r] = s;
    }
}

void WeightedRows(float* acc, size_t nq, const float* w, size_t wStride, const void* const* rows, size_t nrows,
                  Dtype dt, size_t n, const void* const* /*next*/, size_t /*nNext*/, PrefetchTo /*to*/) {
  for (size_t r = 0; r < nrows; ++r)
    for (size_t j = 0; j < nq; ++j) {
      float wj = w[j * wStride + r];
      float* a = acc + j * n;
      for (size_t d = 0; d < n; ++d) a[d] += wj * LoadElem(rows[r], dt, d);
    }
}

const AttnKernels kScalarAttn = {SimdLevel::Scalar, ScaleMax, ExpSum, LogitsRows, WeightedRows};

}  // namespace

const AttnKernels& ScalarAttnKernels() { return kScalarAttn; }

const AttnKernels& AttnSimd() {
  // Simd() only ever holds a level that SimdFor() offered, so the matching table exists.
  switch (Simd().level) {
    case SimdLevel::Avx512: return *Avx512AttnKernels();
    case SimdLevel::Avx2: return *Avx2AttnKernels();
    case SimdLevel::Scalar: break;
  }
  return kScalarAttn;
}

}  // namespace kvd
