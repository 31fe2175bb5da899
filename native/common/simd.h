// Vector primitives used by every kernel, behind one dispatch table chosen at run time.
//
// The addon is compiled for plain x86-64; faster variants (AVX2+F16C+FMA, AVX-512) are compiled
// with per-function target attributes and selected by cpu.cc after checking CPUID. The scalar table
// is always available and is what a plain x86-64 (or KVDRIVE_SIMD=scalar) gets; tests run the
// kernels under every level the machine supports and compare against it.
//
// `row` arguments point at one vector of `n` elements in storage dtype `dt` (f32 / f16 / bf16
// bits); q and accumulators are always f32.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace kvd {

enum class SimdLevel : int { Scalar = 0, Avx2 = 1, Avx512 = 2 };

struct SimdKernels {
  SimdLevel level;
  // sum_i a[i] * b[i]
  float (*dot_f32)(const float* a, const float* b, size_t n);
  // out[j] = sum_i qs[j*n + i] * row[i] for j < nq: one read of `row` serves a whole GQA group.
  void (*dot_rows)(const float* qs, size_t nq, const void* row, Dtype dt, size_t n, float* out);
  // acc[i] += w * row[i]
  void (*axpy_row)(float* acc, float w, const void* row, Dtype dt, size_t n);
  // dst[i] = float(row[i])
  void (*to_f32)(float* dst, const void* row, Dtype dt, size_t n);
};

// The active table (set once at load from CPUID and KVDRIVE_SIMD, changeable by setSimdLevel).
const SimdKernels& Simd();
// Tables per level; nullptr when the CPU (or the build) lacks that level.
const SimdKernels* SimdFor(SimdLevel level);
const SimdKernels& ScalarKernels();

}  // namespace kvd
