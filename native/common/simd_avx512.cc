// AVX-512 (F + BW + VL) primitives, 16 f32 lanes. Compiled with per-function target attributes;
// cpu.cc hands out this table only after CPUID confirms avx512f, avx512bw and avx512vl. F16C is
// implied by AVX-512F (vcvtph2ps on zmm is an AVX-512F instruction). AVX512-FP16 / AVX512-BF16
// dot-product instructions are deliberately not used: they would round q to 16 bits, and every
// level must agree with the scalar reference to f32 accuracy.
//
// Tails (n % 16) use masked loads and stores (16-bit masked loads need AVX512BW+VL), so odd dims
// stay on the vector path and never touch memory past the row.
// GCC 12's AVX-512 intrinsic headers build "undefined" vectors from self-initialised locals, which
// -Wall reports as uninitialised once inlined here; the values are never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

#include "attention/attn_simd.h"
#include "common/simd.h"

#define KVD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace kvd {
namespace {

template <Dtype DT>
KVD_AVX512 inline __m512 Load16(const void* row, size_t i) {
  if constexpr (DT == Dtype::F32) {
    return _mm512_loadu_ps(static_cast<const float*>(row) + i);
  } else {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + i));
    if constexpr (DT == Dtype::F16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// Elements [i, i + popcount(m)) with zeros elsewhere; masked lanes are not read (no fault past the row).
template <Dtype DT>
KVD_AVX512 inline __m512 LoadMasked16(const void* row, size_t i, __mmask16 m) {
  if constexpr (DT == Dtype::F32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(row) + i);
  } else {
    __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(row) + i);
    if constexpr (DT == Dtype::F16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

KVD_AVX512 inline __mmask16 TailMask(size_t rem) { return __mmask16((1u << rem) - 1u); }

KVD_AVX512 float DotF32(const float* a, const float* b, size_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(),
         acc3 = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), acc2);
    acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), acc3);
  }
  for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
  if (i < n) {
    __mmask16 m = TailMask(n - i);
    acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

// NQ queries against one row: each 16-element block of the row is loaded and widened once for
// all NQ queries; U accumulators per query keep enough independent FMAs in flight.
template <Dtype DT, int NQ, int U>
KVD_AVX512 void DotRowsN(const float* qs, const void* row, size_t n, float* out) {
  __m512 acc[NQ][U];
  for (int j = 0; j < NQ; ++j)
    for (int u = 0; u < U; ++u) acc[j][u] = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 16 * U <= n; i += 16 * U) {
    for (int u = 0; u < U; ++u) {
      __m512 k = Load16<DT>(row, i + 16 * u);
      for (int j = 0; j < NQ; ++j) acc[j][u] = _mm512_fmadd_ps(_mm512_loadu_ps(qs + j * n + i + 16 * u), k, acc[j][u]);
    }
  }
  for (; i + 16 <= n; i += 16) {
    __m512 k = Load16<DT>(row, i);
    for (int j = 0; j < NQ; ++j) acc[j][0] = _mm512_fmadd_ps(_mm512_loadu_ps(qs + j * n + i), k, acc[j][0]);
  }
  if (i < n) {
    __mmask16 m = TailMask(n - i);
    __m512 k = LoadMasked16<DT>(row, i, m);
    for (int j = 0; j < NQ; ++j) acc[j][0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qs + j * n + i), k, acc[j][0]);
  }
  for (int j = 0; j < NQ; ++j) {
    __m512 s = acc[j][0];
    for (int u = 1; u < U; ++u) s = _mm512_add_ps(s, acc[j][u]);
    out[j] = _mm512_reduce_add_ps(s);
  }
}

using DotRowsFn = void (*)(const float*, const void*, size_t, float*);

template <Dtype DT>
KVD_AVX512 void DotRowsDt(const float* qs, size_t nq, const void* row, size_t n, float* out) {
  static constexpr DotRowsFn kByGroup[9] = {
      nullptr,
      DotRowsN<DT, 1, 4>,
      DotRowsN<DT, 2, 2>,
      DotRowsN<DT, 3, 2>,
      DotRowsN<DT, 4, 1>,
      DotRowsN<DT, 5, 1>,
      DotRowsN<DT, 6, 1>,
      DotRowsN<DT, 7, 1>,
      DotRowsN<DT, 8, 1>,
  };
  // Groups above 8 (not a GQA ratio in use) go in blocks of 8, re-reading the row per block.
  for (size_t j = 0; j < nq; j += 8) {
    size_t m = nq - j < 8 ? nq - j : 8;
    kByGroup[m](qs + j * n, row, n, out + j);
  }
}

KVD_AVX512 void DotRows(const float* qs, size_t nq, const void* row, Dtype dt, size_t n, float* out) {
  switch (dt) {
    case Dtype::F32: return DotRowsDt<Dtype::F32>(qs, nq, row, n, out);
    case Dtype::F16: return DotRowsDt<Dtype::F16>(qs, nq, row, n, out);
    case Dtype::BF16: return DotRowsDt<Dtype::BF16>(qs, nq, row, n, out);
  }
}

template <Dtype DT>
KVD_AVX512 void AxpyRowDt(float* acc, float w, const void* row, size_t n) {
  const __m512 wv = _mm512_set1_ps(w);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(wv, Load16<DT>(row, i), _mm512_loadu_ps(acc + i)));
    _mm512_storeu_ps(acc + i + 16, _mm512_fmadd_ps(wv, Load16<DT>(row, i + 16), _mm512_loadu_ps(acc + i + 16)));
  }
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(wv, Load16<DT>(row, i), _mm512_loadu_ps(acc + i)));
  if (i < n) {
    __mmask16 m = TailMask(n - i);
    __m512 r = LoadMasked16<DT>(row, i, m);
    _mm512_mask_storeu_ps(acc + i, m, _mm512_fmadd_ps(wv, r, _mm512_maskz_loadu_ps(m, acc + i)));
  }
}

KVD_AVX512 void AxpyRow(float* acc, float w, const void* row, Dtype dt, size_t n) {
  switch (dt) {
    case Dtype::F32: return AxpyRowDt<Dtype::F32>(acc, w, row, n);
    case Dtype::F16: return AxpyRowDt<Dtype::F16>(acc, w, row, n);
    case Dtype::BF16: return AxpyRowDt<Dtype::BF16>(acc, w, row, n);
  }
}

template <Dtype DT>
KVD_AVX512 void ToF32Dt(float* dst, const void* row, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, Load16<DT>(row, i));
  if (i < n) {
    __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, LoadMasked16<DT>(row, i, m));
  }
}

KVD_AVX512 void ToF32(float* dst, const void* row, Dtype dt, size_t n) {
  switch (dt) {
    case Dtype::F32: return ToF32Dt<Dtype::F32>(dst, row, n);
    case Dtype::F16: return ToF32Dt<Dtype::F16>(dst, row, n);
    case Dtype::BF16: return ToF32Dt<Dtype::BF16>(dst, row, n);
  }
}

const SimdKernels kAvx512 = {SimdLevel::Avx512, DotF32, DotRows, AxpyRow, ToF32};

// ---- attention primitives (attn_simd.h) ----

// exp(x) for x <= 0 (Cephes expf polynomial, ~2 ulp): exp(x) = 2^n * exp(r), r = x - n ln2.
// vscalefps applies 2^n with correct gradual underflow; inputs are clamped at -104 (exp < the
// smallest subnormal) so -inf padding and NaN never reach the reduction step.
KVD_AVX512 inline __m512 ExpNonPos16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(y, n);
}

KVD_AVX512 float ScaleMax(float* x, size_t n, float scale, bool* finite) {
  const __m512 s = _mm512_set1_ps(scale);
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
  // v - v is 0 for finite v and NaN for NaN/Inf; the NaN sticks in `bad`.
  __m512 bad = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 a = _mm512_mul_ps(_mm512_loadu_ps(x + i), s);
    __m512 b = _mm512_mul_ps(_mm512_loadu_ps(x + i + 16), s);
    _mm512_storeu_ps(x + i, a);
    _mm512_storeu_ps(x + i + 16, b);
    bad = _mm512_add_ps(bad, _mm512_add_ps(_mm512_sub_ps(a, a), _mm512_sub_ps(b, b)));
    m0 = _mm512_max_ps(m0, a);
    m1 = _mm512_max_ps(m1, b);
  }
  for (; i < n; i += 16) {
    __mmask16 k = n - i >= 16 ? __mmask16(0xffff) : TailMask(n - i);
    __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), s);
    _mm512_mask_storeu_ps(x + i, k, a);
    bad = _mm512_mask_add_ps(bad, k, bad, _mm512_sub_ps(a, a));
    m0 = _mm512_mask_max_ps(m0, k, m0, a);
  }
  if (std::isnan(_mm512_reduce_add_ps(bad))) *finite = false;
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

KVD_AVX512 float ExpSum(float* x, size_t n, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 a = ExpNonPos16(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
    __m512 b = ExpNonPos16(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), mv));
    _mm512_storeu_ps(x + i, a);
    _mm512_storeu_ps(x + i + 16, b);
    s0 = _mm512_add_ps(s0, a);
    s1 = _mm512_add_ps(s1, b);
  }
  for (; i < n; i += 16) {
    __mmask16 k = n - i >= 16 ? __mmask16(0xffff) : TailMask(n - i);
    __m512 a = ExpNonPos16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv));
    _mm512_mask_storeu_ps(x + i, k, a);
    s0 = _mm512_mask_add_ps(s0, k, s0, a);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

// Horizontal sums of four vectors at once: [sum a, sum b, sum c, sum d] (one shuffle tree instead
// of four separate reductions).
KVD_AVX512 inline __m256 Fold(__m512 x) {
  return _mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
}

KVD_AVX512 inline __m128 Reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m256 ab = _mm256_hadd_ps(Fold(a), Fold(b));
  const __m256 cd = _mm256_hadd_ps(Fold(c), Fold(d));
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// Logits of R rows (rows[0..R)) for NQ queries, written group-major (L[j*ldL + r]). Each 16-lane
// block of q_j is loaded once for the R rows and each row block once for the NQ queries; the NQ*R
// accumulators are independent FMA chains. Every (j, r) logit is a single accumulator summed over
// the blocks in order and reduced by the same Reduce4 tree whatever R is, so a row's logit does
// not depend on how rows are blocked. Always inlined: as a call per R rows GCC 12 built a 0x388-byte
// frame and stored the NQ*R zeroed accumulators to it on every call (dense 128K 3-5% slower).
template <Dtype DT, int NQ, int R>
__attribute__((always_inline)) KVD_AVX512 inline void LogitsBlock(const float* qs, const void* const* rows, size_t n, float* L, size_t ldL) {
  __m512 acc[NQ][R];
  for (int j = 0; j < NQ; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 k[R];
    for (int r = 0; r < R; ++r) k[r] = Load16<DT>(rows[r], i);
    for (int j = 0; j < NQ; ++j) {
      const __m512 q = _mm512_loadu_ps(qs + j * n + i);
      for (int r = 0; r < R; ++r) acc[j][r] = _mm512_fmadd_ps(q, k[r], acc[j][r]);
    }
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    __m512 k[R];
    for (int r = 0; r < R; ++r) k[r] = LoadMasked16<DT>(rows[r], i, m);
    for (int j = 0; j < NQ; ++j) {
      const __m512 q = _mm512_maskz_loadu_ps(m, qs + j * n + i);
      for (int r = 0; r < R; ++r) acc[j][r] = _mm512_fmadd_ps(q, k[r], acc[j][r]);
    }
  }
  const __m512 z = _mm512_setzero_ps();
  if constexpr (R == 4) {
    for (int j = 0; j < NQ; ++j) _mm_storeu_ps(L + size_t(j) * ldL, Reduce4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
  } else if constexpr (R == 2) {
    for (int j = 0; j < NQ; j += 2) {
      alignas(16) float s4[4];
      _mm_store_ps(s4, Reduce4(acc[j][0], acc[j][1], j + 1 < NQ ? acc[j + 1][0] : z, j + 1 < NQ ? acc[j + 1][1] : z));
      L[size_t(j) * ldL] = s4[0];
      L[size_t(j) * ldL + 1] = s4[1];
      if (j + 1 < NQ) {
        L[size_t(j + 1) * ldL] = s4[2];
        L[size_t(j + 1) * ldL + 1] = s4[3];
      }
    }
  } else {
    static_assert(R == 1, "row blocks of 1, 2 or 4");
    for (int j0 = 0; j0 < NQ; j0 += 4) {
      alignas(16) float s4[4];
      _mm_store_ps(s4, Reduce4(acc[j0][0], j0 + 1 < NQ ? acc[j0 + 1][0] : z, j0 + 2 < NQ ? acc[j0 + 2][0] : z,
                               j0 + 3 < NQ ? acc[j0 + 3][0] : z));
      for (int t = 0; t < 4 && j0 + t < NQ; ++t) L[size_t(j0 + t) * ldL] = s4[t];
    }
  }
}

// Logits of a tile of rows: blocks of R rows, then single rows.
template <Dtype DT, int NQ, int R>
KVD_AVX512 void LogitsRowsN(const float* qs, const void* const* rows, size_t nrows, size_t n, float* L, size_t ldL,
                            const void* const* next, size_t nNext, PrefetchTo to) {
  const size_t rowBytes = n * DtypeSize(DT);
  size_t r = 0;
  for (; r + R <= nrows; r += R) {
    for (int t = 0; t < R; ++t)
      if (r + t < nNext) PrefetchRowBytes(next[r + t], rowBytes, to);
    LogitsBlock<DT, NQ, R>(qs, rows + r, n, L + r, ldL);
  }
  for (; r < nrows; ++r) {
    if (r < nNext) PrefetchRowBytes(next[r], rowBytes, to);
    LogitsBlock<DT, NQ, 1>(qs, rows + r, n, L + r, ldL);
  }
  for (; r < nNext; ++r) PrefetchRowBytes(next[r], rowBytes, to);
}

using LogitsRowsFn = void (*)(const float*, const void* const*, size_t, size_t, float*, size_t, const void* const*,
                             size_t, PrefetchTo);

template <Dtype DT>
KVD_AVX512 void LogitsRowsDt(const float* qs, size_t nq, const void* const* rows, size_t nrows, size_t n, float* L,
                             size_t ldL, const void* const* next, size_t nNext, PrefetchTo to) {
  static constexpr LogitsRowsFn kByGroup[9] = {
      nullptr,
      LogitsRowsN<DT, 1, 4>,
      LogitsRowsN<DT, 2, 4>,
      LogitsRowsN<DT, 3, 4>,
      LogitsRowsN<DT, 4, 4>,
      LogitsRowsN<DT, 5, 2>,
      LogitsRowsN<DT, 6, 2>,
      LogitsRowsN<DT, 7, 2>,
      LogitsRowsN<DT, 8, 2>,
  };
  for (size_t j = 0; j < nq; j += 8) {
    size_t m = nq - j < 8 ? nq - j : 8;
    kByGroup[m](qs + j * n, rows, nrows, n, L + j * ldL, ldL, j == 0 ? next : nullptr, j == 0 ? nNext : 0, to);
  }
}

KVD_AVX512 void LogitsRows(const float* qs, size_t nq, const void* const* rows, size_t nrows, Dtype dt, size_t n,
                           float* L, size_t ldL, const void* const* next, size_t nNext, PrefetchTo to) {
  switch (dt) {
    case Dtype::F32: return LogitsRowsDt<Dtype::F32>(qs, nq, rows, nrows, n, L, ldL, next, nNext, to);
    case Dtype::F16: return LogitsRowsDt<Dtype::F16>(qs, nq, rows, nrows, n, L, ldL, next, nNext, to);
    case Dtype::BF16: return LogitsRowsDt<Dtype::BF16>(qs, nq, rows, nrows, n, L, ldL, next, nNext, to);
  }
}

// acc[j][d] += sum_r w[j][r] * rows[r][d] for NQ queries, DB 16-lane blocks of d at a time
// (NQ*DB independent FMA chains; each row block is widened once and used by all NQ queries, each
// weight broadcast once per DB blocks). Per element the rows are summed in order r = 0, 1, ...
// whatever DB is.
template <Dtype DT, int NQ, int DB>
KVD_AVX512 void WeightedRowsN(float* acc, const float* w, size_t wStride, const void* const* rows, size_t nrows,
                              size_t n, const void* const* next, size_t nNext, PrefetchTo to) {
  const size_t rowBytes = n * DtypeSize(DT);
  bool first = true;  // prefetch during the first sweep over the rows only
  size_t d0 = 0;
  for (; d0 + 16 * DB <= n; d0 += 16 * DB) {
    __m512 a[NQ][DB];
    for (int j = 0; j < NQ; ++j)
      for (int b = 0; b < DB; ++b) a[j][b] = _mm512_loadu_ps(acc + j * n + d0 + 16 * b);
    for (size_t r = 0; r < nrows; ++r) {
      if (first && r < nNext) PrefetchRowBytes(next[r], rowBytes, to);
      __m512 v[DB];
      for (int b = 0; b < DB; ++b) v[b] = Load16<DT>(rows[r], d0 + 16 * b);
      for (int j = 0; j < NQ; ++j) {
        __m512 wj = _mm512_set1_ps(w[j * wStride + r]);
        for (int b = 0; b < DB; ++b) a[j][b] = _mm512_fmadd_ps(wj, v[b], a[j][b]);
      }
    }
    for (int j = 0; j < NQ; ++j)
      for (int b = 0; b < DB; ++b) _mm512_storeu_ps(acc + j * n + d0 + 16 * b, a[j][b]);
    first = false;
  }
  for (; d0 < n; d0 += 16) {
    const __mmask16 k = n - d0 >= 16 ? __mmask16(0xffff) : TailMask(n - d0);
    __m512 a[NQ];
    for (int j = 0; j < NQ; ++j) a[j] = _mm512_maskz_loadu_ps(k, acc + j * n + d0);
    for (size_t r = 0; r < nrows; ++r) {
      if (first && r < nNext) PrefetchRowBytes(next[r], rowBytes, to);
      __m512 v = LoadMasked16<DT>(rows[r], d0, k);
      for (int j = 0; j < NQ; ++j) a[j] = _mm512_fmadd_ps(_mm512_set1_ps(w[j * wStride + r]), v, a[j]);
    }
    for (int j = 0; j < NQ; ++j) _mm512_mask_storeu_ps(acc + j * n + d0, k, a[j]);
    first = false;
  }
  for (size_t r = first ? 0 : nrows; r < nNext; ++r) PrefetchRowBytes(next[r], rowBytes, to);
}

using WeightedRowsFn = void (*)(float*, const float*, size_t, const void* const*, size_t, size_t, const void* const*,
                               size_t, PrefetchTo);

template <Dtype DT>
KVD_AVX512 void WeightedRowsDt(float* acc, size_t nq, const float* w, size_t wStride, const void* const* rows,
                               size_t nrows, size_t n, const void* const* next, size_t nNext, PrefetchTo to) {
  static constexpr WeightedRowsFn kByGroup[9] = {
      nullptr,
      WeightedRowsN<DT, 1, 4>,
      WeightedRowsN<DT, 2, 4>,
      WeightedRowsN<DT, 3, 4>,
      WeightedRowsN<DT, 4, 4>,
      WeightedRowsN<DT, 5, 1>,
      WeightedRowsN<DT, 6, 1>,
      WeightedRowsN<DT, 7, 1>,
      WeightedRowsN<DT, 8, 1>,
  };
  for (size_t j = 0; j < nq; j += 8) {
    size_t m = nq - j < 8 ? nq - j : 8;
    kByGroup[m](acc + j * n, w + j * wStride, wStride, rows, nrows, n, j == 0 ? next : nullptr, j == 0 ? nNext : 0, to);
  }
}

KVD_AVX512 void WeightedRows(float* acc, size_t nq, const float* w, size_t wStride, const void* const* rows,
                             size_t nrows, Dtype dt, size_t n, const void* const* next, size_t nNext, PrefetchTo to) {
  switch (dt) {
    case Dtype::F32: return WeightedRowsDt<Dtype::F32>(acc, nq, w, wStride, rows, nrows, n, next, nNext, to);
    case Dtype::F16: return WeightedRowsDt<Dtype::F16>(acc, nq, w, wStride, rows, nrows, n, next, nNext, to);
    case Dtype::BF16: return WeightedRowsDt<Dtype::BF16>(acc, nq, w, wStride, rows, nrows, n, next, nNext, to);
  }
}

const AttnKernels kAvx512Attn = {SimdLevel::Avx512, ScaleMax, ExpSum, LogitsRows, WeightedRows};

}  // namespace

const SimdKernels* Avx512Kernels() { return &kAvx512; }
const AttnKernels* Avx512AttnKernels() { return &kAvx512Attn; }

}  // namespace kvd
