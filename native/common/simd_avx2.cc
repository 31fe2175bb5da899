// AVX2 + FMA + F16C primitives (8 f32 lanes). Compiled with per-function target attributes: the
// addon is built for plain x86-64 and cpu.cc only hands out this table after CPUID confirms
// avx2, fma and f16c, so none of these functions may be called (or inlined) anywhere else.
//
// Storage dtypes are widened to f32 on load: f16 with vcvtph2ps, bf16 by a 16-bit left shift
// (bf16 is the top half of an f32). Every kernel is instantiated per dtype so the loops carry no
// dtype branch; tails (n % 8) go through a zero-padded 8-lane buffer, so odd dims take the same
// vector path and never read past the row.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "attention/attn_simd.h"
#include "common/simd.h"
#include "common/avx2_util.h"


namespace kvd {
namespace {

template <Dtype DT>
KVD_AVX2 inline __m256 Load8(const void* row, size_t i) {
  if constexpr (DT == Dtype::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  } else {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i));
    if constexpr (DT == Dtype::F16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Loads elements [i, i + rem) (rem < 8) with zeros in the remaining lanes; reads nothing past them.
template <Dtype DT>
KVD_AVX2 inline __m256 LoadTail8(const void* row, size_t i, size_t rem) {
  if constexpr (DT == Dtype::F32) {
    alignas(32) float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(buf, static_cast<const float*>(row) + i, rem * sizeof(float));
    return _mm256_load_ps(buf);
  } else {
    alignas(16) uint16_t buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(buf, static_cast<const uint16_t*>(row) + i, rem * sizeof(uint16_t));
    return Load8<DT>(buf, 0);
  }
}


KVD_AVX2 float DotF32(const float* a, const float* b, size_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
         acc3 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  if (i < n) acc1 = _mm256_fmadd_ps(LoadTail8<Dtype::F32>(a, i, n - i), LoadTail8<Dtype::F32>(b, i, n - i), acc1);
  return HSum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

// NQ queries against one row: each 8-element block of the row is loaded and widened once and
// used by all NQ queries. U independent accumulators per query (U = 4 for a single query, fewer
// as NQ grows) keep enough FMAs in flight to hide their latency.
template <Dtype DT, int NQ, int U>
KVD_AVX2 void DotRowsN(const float* qs, const void* row, size_t n, float* out) {
  __m256 acc[NQ][U];
  for (int j = 0; j < NQ; ++j)
    for (int u = 0; u < U; ++u) acc[j][u] = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 * U <= n; i += 8 * U) {
    for (int u = 0; u < U; ++u) {
      __m256 k = Load8<DT>(row, i + 8 * u);
      for (int j = 0; j < NQ; ++j) acc[j][u] = _mm256_fmadd_ps(_mm256_loadu_ps(qs + j * n + i + 8 * u), k, acc[j][u]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    __m256 k = Load8<DT>(row, i);
    for (int j = 0; j < NQ; ++j) acc[j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(qs + j * n + i), k, acc[j][0]);
  }
  if (i < n) {
    __m256 k = LoadTail8<DT>(row, i, n - i);
    for (int j = 0; j < NQ; ++j) acc[j][0] = _mm256_fmadd_ps(LoadTail8<Dtype::F32>(qs + j * n, i, n - i), k, acc[j][0]);
  }
  for (int j = 0; j < NQ; ++j) {
    __m256 s = acc[j][0];
    for (int u = 1; u < U; ++u) s = _mm256_add_ps(s, acc[j][u]);
    out[j] = HSum(s);
  }
}

using DotRowsFn = void (*)(const float*, const void*, size_t, float*);

template <Dtype DT>
KVD_AVX2 void DotRowsDt(const float* qs, size_t nq, const void* row, size_t n, float* out) {
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

KVD_AVX2 void DotRows(const float* qs, size_t nq, const void* row, Dtype dt, size_t n, float* out) {
  switch (dt) {
    case Dtype::F32: return DotRowsDt<Dtype::F32>(qs, nq, row, n, out);
    case Dtype::F16: return DotRowsDt<Dtype::F16>(qs, nq, row, n, out);
    case Dtype::BF16: return DotRowsDt<Dtype::BF16>(qs, nq, row, n, out);
  }
}

template <Dtype DT>
KVD_AVX2 void AxpyRowDt(float* acc, float w, const void* row, size_t n) {
  const __m256 wv = _mm256_set1_ps(w);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, Load8<DT>(row, i), _mm256_loadu_ps(acc + i)));
    _mm256_storeu_ps(acc + i + 8, _mm256_fmadd_ps(wv, Load8<DT>(row, i + 8), _mm256_loadu_ps(acc + i + 8)));
  }
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, Load8<DT>(row, i), _mm256_loadu_ps(acc + i)));
  if (i < n) {
    alignas(32) float r[8];
    _mm256_store_ps(r, LoadTail8<DT>(row, i, n - i));
    for (size_t t = 0; i + t < n; ++t) acc[i + t] = std::fma(w, r[t], acc[i + t]);
  }
}

KVD_AVX2 void AxpyRow(float* acc, float w, const void* row, Dtype dt, size_t n) {
  switch (dt) {
    case Dtype::F32: return AxpyRowDt<Dtype::F32>(acc, w, row, n);
    case Dtype::F16: return AxpyRowDt<Dtype::F16>(acc, w, row, n);
    case Dtype::BF16: return AxpyRowDt<Dtype::BF16>(acc, w, row, n);
  }
}

template <Dtype DT>
KVD_AVX2 void ToF32Dt(float* dst, const void* row, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, Load8<DT>(row, i));
  if (i < n) {
    alignas(32) float r[8];
    _mm256_store_ps(r, LoadTail8<DT>(row, i, n - i));
    std::memcpy(dst + i, r, (n - i) * sizeof(float));
  }
}

KVD_AVX2 void ToF32(float* dst, const void* row, Dtype dt, size_t n) {
  switch (dt) {
    case Dtype::F32: return ToF32Dt<Dtype::F32>(dst, row, n);
    case Dtype::F16: return ToF32Dt<Dtype::F16>(dst, row, n);
    case Dtype::BF16: return ToF32Dt<Dtype::BF16>(dst, row, n);
  }
}

const SimdKernels kAvx2 = {SimdLevel::Avx2, DotF32, DotRows, AxpyRow, ToF32};

// ---- attention primitives (attn_simd.h) ----

// exp(x) for x <= 0 (Cephes expf polynomial, ~2 ulp): exp(x) = 2^n * exp(r), r = x - n ln2 in
// [-ln2/2, ln2/2]. Inputs below -87.34 (where exp underflows to the subnormal range) give 0, so
// 2^n stays a normal number; NaN inputs give 0 (callers reject non-finite logits earlier).
KVD_AVX2 inline __m256 ExpNonPos8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.f));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), keep);
}

KVD_AVX2 float ScaleMax(float* x, size_t n, float scale, bool* finite) {
  const __m256 s = _mm256_set1_ps(scale);
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
  // v - v is 0 for finite v and NaN for NaN/Inf; the NaN sticks in `bad`.
  __m256 bad = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = _mm256_mul_ps(_mm256_loadu_ps(x + i), s);
    __m256 b = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), s);
    _mm256_storeu_ps(x + i, a);
    _mm256_storeu_ps(x + i + 8, b);
    bad = _mm256_add_ps(bad, _mm256_add_ps(_mm256_sub_ps(a, a), _mm256_sub_ps(b, b)));
    m0 = _mm256_max_ps(m0, a);
    m1 = _mm256_max_ps(m1, b);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_mul_ps(_mm256_loadu_ps(x + i), s);
    _mm256_storeu_ps(x + i, a);
    bad = _mm256_add_ps(bad, _mm256_sub_ps(a, a));
    m0 = _mm256_max_ps(m0, a);
  }
  alignas(32) float mv[8];
  _mm256_store_ps(mv, _mm256_max_ps(m0, m1));
  float m = mv[0];
  for (int t = 1; t < 8; ++t) m = mv[t] > m ? mv[t] : m;
  bool ok = !std::isnan(HSum(bad));
  for (; i < n; ++i) {
    float v = x[i] * scale;
    x[i] = v;
    ok &= std::isfinite(v);
    m = v > m ? v : m;
  }
  if (!ok) *finite = false;
  return m;
}

KVD_AVX2 float ExpSum(float* x, size_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = ExpNonPos8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
    __m256 b = ExpNonPos8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), mv));
    _mm256_storeu_ps(x + i, a);
    _mm256_storeu_ps(x + i + 8, b);
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, b);
  }
  if (i < n) {
    // Pad with -inf: exp gives 0 there, so the padded lanes add nothing.
    alignas(32) float buf[16];
    size_t rem = n - i;
    for (size_t t = 0; t < 16; ++t) buf[t] = t < rem ? x[i + t] : -INFINITY;
    __m256 a = ExpNonPos8(_mm256_sub_ps(_mm256_load_ps(buf), mv));
    __m256 b = ExpNonPos8(_mm256_sub_ps(_mm256_load_ps(buf + 8), mv));
    _mm256_store_ps(buf, a);
    _mm256_store_ps(buf + 8, b);
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, b);
    std::memcpy(x + i, buf, rem * sizeof(float));
  }
  return HSum(_mm256_add_ps(s0, s1));
}

// Horizontal sums of four vectors at once: [sum a, sum b, sum c, sum d].
KVD_AVX2 inline __m128 Reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// Logits of R rows (rows[0..R)) for NQ queries, written group-major (L[j*ldL + r]). Each 8-lane
// block of q_j is loaded once for the R rows and each row block once for the NQ queries; the NQ*R
// accumulators are independent FMA chains (16 ymm registers: NQ*R accumulators + R row blocks + one
// query block, at most 15 in the table below). Every (j, r) logit is a single accumulator summed
// over the blocks in order and reduced by the same Reduce4 tree whatever R is, so a row's logit
// does not depend on how rows are blocked.
//
// Why R = 3 for a GQA group of 4 (12 chains, not 8) and always_inline: with 8 chains of 4-cycle
// FMAs the loop had no slack, and the call and reduction per pair of rows cost as much again; in a
// cache-resident microbenchmark (16 f16 rows of dim 128, min over 60 alternated rounds, Zen 3 AVX2)
// a row took ~52-57 TSC cycles before and ~37 after, outputs bit-identical (bench/RESULTS.md,
// "AVX2 attention row kernels").
template <Dtype DT, int NQ, int R>
KVD_AVX2 __attribute__((always_inline)) inline void LogitsBlock(const float* qs, const void* const* rows, size_t n, float* L, size_t ldL) {
  __m256 acc[NQ][R];
  for (int j = 0; j < NQ; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 k[R];
    for (int r = 0; r < R; ++r) k[r] = Load8<DT>(rows[r], i);
    for (int j = 0; j < NQ; ++j) {
      const __m256 q = _mm256_loadu_ps(qs + j * n + i);
      for (int r = 0; r < R; ++r) acc[j][r] = _mm256_fmadd_ps(q, k[r], acc[j][r]);
    }
  }
  if (i < n) {
    __m256 k[R];
    for (int r = 0; r < R; ++r) k[r] = LoadTail8<DT>(rows[r], i, n - i);
    for (int j = 0; j < NQ; ++j) {
      const __m256 q = LoadTail8<Dtype::F32>(qs + j * n, i, n - i);
      for (int r = 0; r < R; ++r) acc[j][r] = _mm256_fmadd_ps(q, k[r], acc[j][r]);
    }
  }
  // Reduced four logits at a time in (j, r) order; every logit goes through the same Reduce4 tree.
  constexpr int kN = NQ * R;
  const __m256 z = _mm256_setzero_ps();
  for (int i0 = 0; i0 < kN; i0 += 4) {
    alignas(16) float s4[4];
    _mm_store_ps(s4, Reduce4(acc[i0 / R][i0 % R], i0 + 1 < kN ? acc[(i0 + 1) / R][(i0 + 1) % R] : z,
                             i0 + 2 < kN ? acc[(i0 + 2) / R][(i0 + 2) % R] : z, i0 + 3 < kN ? acc[(i0 + 3) / R][(i0 + 3) % R] : z));
    for (int t = 0; t < 4 && i0 + t < kN; ++t) L[size_t((i0 + t) / R) * ldL + (i0 + t) % R] = s4[t];
  }
}

// Logits of a tile of rows: blocks of R rows, then single rows.
template <Dtype DT, int NQ, int R>
KVD_AVX2 void LogitsRowsN(const float* qs, const void* const* rows, size_t nrows, size_t n, float* L, size_t ldL,
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
KVD_AVX2 void LogitsRowsDt(const float* qs, size_t nq, const void* const* rows, size_t nrows, size_t n, float* L,
                           size_t ldL, const void* const* next, size_t nNext, PrefetchTo to) {
  static constexpr LogitsRowsFn kByGroup[9] = {
      nullptr,
      LogitsRowsN<DT, 1, 4>,
      LogitsRowsN<DT, 2, 4>,
      LogitsRowsN<DT, 3, 3>,
      LogitsRowsN<DT, 4, 3>,
      LogitsRowsN<DT, 5, 2>,
      LogitsRowsN<DT, 6, 2>,
      LogitsRowsN<DT, 7, 1>,
      LogitsRowsN<DT, 8, 1>,
  };
  for (size_t j = 0; j < nq; j += 8) {
    size_t m = nq - j < 8 ? nq - j : 8;
    kByGroup[m](qs + j * n, rows, nrows, n, L + j * ldL, ldL, j == 0 ? next : nullptr, j == 0 ? nNext : 0, to);
  }
}

KVD_AVX2 void LogitsRows(const float* qs, size_t nq, const void* const* rows, size_t nrows, Dtype dt, size_t n,
                         float* L, size_t ldL, const void* const* next, size_t nNext, PrefetchTo to) {
  switch (dt) {
    case Dtype::F32: return LogitsRowsDt<Dtype::F32>(qs, nq, rows, nrows, n, L, ldL, next, nNext, to);
    case Dtype::F16: return LogitsRowsDt<Dtype::F16>(qs, nq, rows, nrows, n, L, ldL, next, nNext, to);
    case Dtype::BF16: return LogitsRowsDt<Dtype::BF16>(qs, nq, rows, nrows, n, L, ldL, next, nNext, to);
  }
}

// Loads every 64-byte line of rows that lie apart once, in one tight loop, and drops the values.
// The loads are independent and nothing waits on them, so the core keeps as many in flight as it
// can; the row kernel's own loads, spread over its sweeps with FMAs between them, kept few (a
// dense 128K call's samples sat on its value loads). A tile of kTileRows rows is 4 KiB at f16 x
// 128: the sweeps then read it from L1. Rows that follow each other in memory (a head-major arena,
// the gathered copies of attention.cc) are left alone: the hardware prefetcher streams them, and
// the extra loads cost ~5% on a cache-resident compact arena.
KVD_AVX2 inline void TouchRows(const void* const* rows, size_t nrows, size_t rowBytes) {
  if (nrows < 2 || static_cast<const char*>(rows[nrows - 1]) == static_cast<const char*>(rows[0]) + (nrows - 1) * rowBytes) return;
  __m256i x = _mm256_setzero_si256();
  for (size_t r = 0; r < nrows; ++r) {
    const char* p = static_cast<const char*>(rows[r]);
    for (size_t off = 0; off + 32 <= rowBytes; off += 64) x = _mm256_or_si256(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + off)));
  }
  __asm__ volatile("" : : "x"(x));  // keeps the loads
}

// acc[j][d] += sum_r w[j][r] * rows[r][d] for NQ queries, DB 8-lane blocks of d at a time
// (NQ*DB independent FMA chains; each row block is widened once and used by all NQ queries).
// Every accumulator lane sums its rows in order whatever DB is, so DB changes speed, not bits. The
// table keeps 8-12 chains where the registers allow (a group of 2 at DB 4, 5-6 at DB 2): with 4-6
// chains of 4-cycle FMAs a row took ~1.4x longer in the cache-resident microbenchmark above.
// The rows are touched first (TouchRows): each row is swept n / (8 DB) times, one block per
// sweep, so without it a line still on its way stalled a sweep; with it a dense 128K call took
// 9-11% less time and sparse calls over scattered rows 3-10% (bench/kernels-ab.ts; bench/RESULTS.md,
// "The values pass touches its tile first").
template <Dtype DT, int NQ, int DB>
KVD_AVX2 void WeightedRowsN(float* acc, const float* w, size_t wStride, const void* const* rows, size_t nrows,
                            size_t n, const void* const* next, size_t nNext, PrefetchTo to) {
  const size_t rowBytes = n * DtypeSize(DT);
  bool first = true;  // prefetch during the first sweep over the rows only
  TouchRows(rows, nrows, rowBytes);
  size_t d0 = 0;
  for (; d0 + 8 * DB <= n; d0 += 8 * DB) {
    __m256 a[NQ][DB];
    for (int j = 0; j < NQ; ++j)
      for (int b = 0; b < DB; ++b) a[j][b] = _mm256_loadu_ps(acc + j * n + d0 + 8 * b);
    for (size_t r = 0; r < nrows; ++r) {
      if (first && r < nNext) PrefetchRowBytes(next[r], rowBytes, to);
      __m256 v[DB];
      for (int b = 0; b < DB; ++b) v[b] = Load8<DT>(rows[r], d0 + 8 * b);
      for (int j = 0; j < NQ; ++j) {
        __m256 wj = _mm256_broadcast_ss(w + j * wStride + r);
        for (int b = 0; b < DB; ++b) a[j][b] = _mm256_fmadd_ps(wj, v[b], a[j][b]);
      }
    }
    for (int j = 0; j < NQ; ++j)
      for (int b = 0; b < DB; ++b) _mm256_storeu_ps(acc + j * n + d0 + 8 * b, a[j][b]);
    first = false;
  }
  for (; d0 < n; d0 += 8) {
    const size_t rem = n - d0 < 8 ? n - d0 : 8;
    alignas(32) float buf[NQ][8];
    for (int j = 0; j < NQ; ++j) {
      for (size_t t = 0; t < 8; ++t) buf[j][t] = t < rem ? acc[j * n + d0 + t] : 0.f;
    }
    __m256 a[NQ];
    for (int j = 0; j < NQ; ++j) a[j] = _mm256_load_ps(buf[j]);
    for (size_t r = 0; r < nrows; ++r) {
      if (first && r < nNext) PrefetchRowBytes(next[r], rowBytes, to);
      __m256 v = rem == 8 ? Load8<DT>(rows[r], d0) : LoadTail8<DT>(rows[r], d0, rem);
      for (int j = 0; j < NQ; ++j) a[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + j * wStride + r), v, a[j]);
    }
    for (int j = 0; j < NQ; ++j) {
      _mm256_store_ps(buf[j], a[j]);
      std::memcpy(acc + j * n + d0, buf[j], rem * sizeof(float));
    }
    first = false;
  }
  for (size_t r = first ? 0 : nrows; r < nNext; ++r) PrefetchRowBytes(next[r], rowBytes, to);
}

using WeightedRowsFn = void (*)(float*, const float*, size_t, const void* const*, size_t, size_t, const void* const*,
                               size_t, PrefetchTo);

template <Dtype DT>
KVD_AVX2 void WeightedRowsDt(float* acc, size_t nq, const float* w, size_t wStride, const void* const* rows,
                             size_t nrows, size_t n, const void* const* next, size_t nNext, PrefetchTo to) {
  static constexpr WeightedRowsFn kByGroup[9] = {
      nullptr,
      WeightedRowsN<DT, 1, 4>,
      WeightedRowsN<DT, 2, 4>,
      WeightedRowsN<DT, 3, 2>,
      WeightedRowsN<DT, 4, 2>,
      WeightedRowsN<DT, 5, 2>,
      WeightedRowsN<DT, 6, 2>,
      WeightedRowsN<DT, 7, 1>,
      WeightedRowsN<DT, 8, 1>,
  };
  for (size_t j = 0; j < nq; j += 8) {
    size_t m = nq - j < 8 ? nq - j : 8;
    kByGroup[m](acc + j * n, w + j * wStride, wStride, rows, nrows, n, j == 0 ? next : nullptr, j == 0 ? nNext : 0, to);
  }
}

KVD_AVX2 void WeightedRows(float* acc, size_t nq, const float* w, size_t wStride, const void* const* rows,
                           size_t nrows, Dtype dt, size_t n, const void* const* next, size_t nNext, PrefetchTo to) {
  switch (dt) {
    case Dtype::F32: return WeightedRowsDt<Dtype::F32>(acc, nq, w, wStride, rows, nrows, n, next, nNext, to);
    case Dtype::F16: return WeightedRowsDt<Dtype::F16>(acc, nq, w, wStride, rows, nrows, n, next, nNext, to);
    case Dtype::BF16: return WeightedRowsDt<Dtype::BF16>(acc, nq, w, wStride, rows, nrows, n, next, nNext, to);
  }
}

const AttnKernels kAvx2Attn = {SimdLevel::Avx2, ScaleMax, ExpSum, LogitsRows, WeightedRows};

}  // namespace

const SimdKernels* Avx2Kernels() { return &kAvx2; }
const AttnKernels* Avx2AttnKernels() { return &kAvx2Attn; }

}  // namespace kvd
