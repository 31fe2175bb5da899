// Shared pieces of the AVX2 kernel files (simd_avx2.cc, model/quant_avx2.cc): the per-function
// target attribute (the addon is built for plain x86-64; only code reached after the CPU check may
// carry it) and the horizontal sum of an 8-lane f32 vector.
#pragma once
#include <immintrin.h>

#define KVD_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace kvd {

// Sum of the 8 lanes, in a fixed order (pairs of halves, then pairs within the 128-bit half), so
// every kernel that reduces with it gets the same bits.
KVD_AVX2 inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 sh = _mm_movehdup_ps(s);
  s = _mm_add_ps(s, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

}  // namespace kvd
