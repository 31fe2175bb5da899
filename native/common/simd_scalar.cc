// Portable scalar primitives: the reference every SIMD level is tested against, and the table a
// plain x86-64 without AVX2 runs.
#include "common/simd.h"

namespace kvd {
namespace {

float DotF32(const float* a, const float* b, size_t n) {
  float s = 0.f;
  for (size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void DotRows(const float* qs, size_t nq, const void* row, Dtype dt, size_t n, float* out) {
  for (size_t j = 0; j < nq; ++j) {
    const float* q = qs + j * n;
    float s = 0.f;
    for (size_t i = 0; i < n; ++i) s += q[i] * LoadElem(row, dt, i);
    out[j] = s;
  }
}

void AxpyRow(float* acc, float w, const void* row, Dtype dt, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += w * LoadElem(row, dt, i);
}

void ToF32(float* dst, const void* row, Dtype dt, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = LoadElem(row, dt, i);
}

const SimdKernels kScalar = {SimdLevel::Scalar, DotF32, DotRows, AxpyRow, ToF32};

}  // namespace

const SimdKernels& ScalarKernels() { return kScalar; }

}  // namespace kvd
