// AVX-512 prefill tile for the model's matrix products: the AVX2 table with its 4 × 4 f32 tile
// widened to 16 lanes (prefill is compute-bound; decode products stay on the AVX2 kernels, which
// are bound by memory reads). Built with per-function target attributes; QuantAvx512() hands the
// table out only when cpu.cc found the AVX-512 level usable.
#include <immintrin.h>

#include "model/quant.h"
#include "common/simd.h"

#define KVD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace kvd {
namespace model {
namespace {

KVD_AVX512 void Tile(const float* w, int nw, const float* x, int nx, size_t n, float* out, size_t outStride) {
  if (nw != 4 || nx != 4 || n % 16 != 0) {
    QuantAvx2()->tile(w, nw, x, nx, n, out, outStride);
    return;
  }
  __m512 acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  for (size_t c = 0; c < n; c += 16) {
    __m512 wv[4], xv[4];
    for (int i = 0; i < 4; ++i) wv[i] = _mm512_loadu_ps(w + size_t(i) * n + c);
    for (int j = 0; j < 4; ++j) xv[j] = _mm512_loadu_ps(x + size_t(j) * n + c);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_fmadd_ps(wv[i], xv[j], acc[i][j]);
  }
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 4; ++i) out[size_t(j) * outStride + size_t(i)] = _mm512_reduce_add_ps(acc[i][j]);
}

}  // namespace

const QuantKernels* QuantAvx512() {
  if (!SimdFor(SimdLevel::Avx512) || !QuantAvx2()) return nullptr;
  static const QuantKernels k = [] {
    QuantKernels t = *QuantAvx2();
    t.level = "avx512";
    t.tile = Tile;
    return t;
  }();
  return &k;
}

}  // namespace model
}  // namespace kvd
