// AVX2 bodies of the index kernels listed in index_kernels_avx2.h (which says why they exist and
// what they must equal). A 16-lane value of the generic bodies is a pair of __m256: `lo` holds
// lanes 0-7, `hi` lanes 8-15.
#include "index/group_shares_tail.h"
#include "index/index_kernels_avx2.h"

#include <immintrin.h>

#include <cstring>
#include <limits>
#include <memory>

#include "common/dtype.h"

// No "fma": GCC would fuse the multiply-adds below (it contracts intrinsics too), and the generic
// bodies they must equal round each product.
#define KVD_AVX2_IDX __attribute__((target("avx2,f16c")))

namespace kvd {
namespace avx2 {
namespace {

struct V16 {
  __m256 lo, hi;
};

KVD_AVX2_IDX inline V16 Load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
KVD_AVX2_IDX inline void Store(float* p, V16 v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}

// Reduce16's tree (index_kernels.cc): lane i += lane i+8, then i += i+4, i += i+2, i += i+1.
KVD_AVX2_IDX inline float Sum16(V16 v) {
  const __m256 a = _mm256_add_ps(v.lo, v.hi);
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

// ReduceMax16's tree, with its `a > b ? a : b` (maxps returns its second operand unless the first
// is greater, so the operand order is the generic body's).
KVD_AVX2_IDX inline float Max16(V16 v) {
  const __m256 a = _mm256_max_ps(v.lo, v.hi);
  const __m128 b = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_max_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_max_ss(c, _mm_movehdup_ps(c)));
}

// ExpNeg (index_kernels.cc) on 8 lanes: the same operations in the same order, unfused.
KVD_AVX2_IDX inline __m256 ExpNeg8(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.f), x);  // x < lo ? lo : x
  const __m256 t = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f));
  __m256i n = _mm256_cvttps_epi32(t);
  __m256 fn = _mm256_cvtepi32_ps(n);
  n = _mm256_add_epi32(n, _mm256_castps_si256(_mm256_cmp_ps(fn, t, _CMP_GT_OS)));  // -1 where fn > t
  fn = _mm256_cvtepi32_ps(n);
  x = _mm256_sub_ps(x, _mm256_mul_ps(fn, _mm256_set1_ps(0.693359375f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fn, _mm256_set1_ps(-2.12194440e-4f)));
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.9875691500e-4f)), _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, z), x), _mm256_set1_ps(1.f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// ExpNeg(v * scale - m) on 16 lanes.
KVD_AVX2_IDX inline V16 ExpScaled(V16 v, __m256 scale, __m256 m) {
  return {ExpNeg8(_mm256_sub_ps(_mm256_mul_ps(v.lo, scale), m)), ExpNeg8(_mm256_sub_ps(_mm256_mul_ps(v.hi, scale), m))};
}

}  // namespace

KVD_AVX2_IDX int64_t GroupShares(float* logits, int group, size_t n, size_t ld, size_t nShare, float scale, float* share) {
  float invStack[64];
  std::unique_ptr<float[]> invHeap(group > 64 ? new float[size_t(group)] : nullptr);
  float* inv = group > 64 ? invHeap.get() : invStack;
  const size_t full = n / 16 * 16;
  const __m256 zero = _mm256_setzero_ps();
  for (int j = 0; j < group; ++j) {
    float* l = logits + size_t(j) * ld;
    // Max and non-finite detection (x * 0 is NaN exactly for NaN and +-Inf), as the generic body.
    V16 mx = {_mm256_set1_ps(-std::numeric_limits<float>::infinity()), _mm256_set1_ps(-std::numeric_limits<float>::infinity())};
    V16 nan = {zero, zero};
    for (size_t b = 0; b < full; b += 16) {
      const V16 x = Load(l + b);
      nan.lo = _mm256_add_ps(nan.lo, _mm256_mul_ps(x.lo, zero));
      nan.hi = _mm256_add_ps(nan.hi, _mm256_mul_ps(x.hi, zero));
      mx.lo = _mm256_max_ps(x.lo, mx.lo);  // x > mx ? x : mx
      mx.hi = _mm256_max_ps(x.hi, mx.hi);
    }
    float m = Max16(mx);
    const int64_t bad = FinishRowMax(l, full, n, m, Sum16(nan));
    if (bad >= 0) return int64_t(j) * int64_t(ld) + bad;
    m *= scale;
    const __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(m);
    V16 z = {zero, zero};
    for (size_t b = 0; b < full; b += 16) {
      const V16 e = ExpScaled(Load(l + b), vs, vm);
      z.lo = _mm256_add_ps(z.lo, e.lo);
      z.hi = _mm256_add_ps(z.hi, e.hi);
      Store(l + b, e);
    }
    if (full < ld) {
      alignas(32) float e[16];
      const V16 v = ExpScaled(Load(l + full), vs, vm);
      _mm256_store_ps(e, v.lo);
      _mm256_store_ps(e + 8, v.hi);
      for (size_t t = n - full; t < 16; ++t) e[t] = 0.f;
      z.lo = _mm256_add_ps(z.lo, _mm256_load_ps(e));
      z.hi = _mm256_add_ps(z.hi, _mm256_load_ps(e + 8));
      std::memcpy(l + full, e, sizeof(e));
    }
    inv[j] = 1.f / Sum16(z);
  }
  // share = sum over the group in head order.
  for (size_t b = 0; b < nShare; b += 16) {
    const __m256 i0 = _mm256_set1_ps(inv[0]);
    __m256 lo = _mm256_mul_ps(_mm256_loadu_ps(logits + b), i0), hi = _mm256_mul_ps(_mm256_loadu_ps(logits + b + 8), i0);
    for (int j = 1; j < group; ++j) {
      const float* l = logits + size_t(j) * ld + b;
      const __m256 ij = _mm256_set1_ps(inv[j]);
      lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(l), ij));
      hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(l + 8), ij));
    }
    _mm256_storeu_ps(share + b, lo);
    _mm256_storeu_ps(share + b + 8, hi);
  }
  return -1;
}

namespace {

// acc (16 lanes) += a[d..d+16) * b[d..d+16).
KVD_AVX2_IDX inline void MulAdd16(V16& acc, const float* a, __m256 b0, __m256 b1) {
  acc.lo = _mm256_add_ps(acc.lo, _mm256_mul_ps(_mm256_loadu_ps(a), b0));
  acc.hi = _mm256_add_ps(acc.hi, _mm256_mul_ps(_mm256_loadu_ps(a + 8), b1));
}

// AddTail (index_kernels.cc): lanes t < dim - d get a[d + t] * b[d + t] added, the others untouched.
inline void AddTail(V16& acc, const float* a, const float* b, int d, int dim) {
  if (d >= dim) return;
  alignas(32) float l[16];
  std::memcpy(l, &acc.lo, 32);
  std::memcpy(l + 8, &acc.hi, 32);
  for (int t = 0; d + t < dim; ++t) l[t] += a[d + t] * b[d + t];
  std::memcpy(&acc.lo, l, 32);
  std::memcpy(&acc.hi, l + 8, 32);
}

// DotBody (index_kernels.cc): 16 interleaved partial sums over d, the tail, Reduce16.
KVD_AVX2_IDX inline float DotBody(const float* x, const float* c, int dim) {
  V16 a = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  int d = 0;
  for (; d + 16 <= dim; d += 16) MulAdd16(a, x + d, _mm256_loadu_ps(c + d), _mm256_loadu_ps(c + d + 8));
  AddTail(a, x, c, d, dim);
  return Sum16(a);
}

// out[t] = DotBody(xs[t], y) for t < 4, every load of y shared (products commute, so the bits are
// DotBody's whichever operand is the row).
KVD_AVX2_IDX inline void Dots4(const float* const* xs, const float* y, int dim, float* out) {
  V16 a[4];
  for (int t = 0; t < 4; ++t) a[t] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  int d = 0;
  for (; d + 16 <= dim; d += 16) {
    const __m256 y0 = _mm256_loadu_ps(y + d), y1 = _mm256_loadu_ps(y + d + 8);
    for (int t = 0; t < 4; ++t) MulAdd16(a[t], xs[t] + d, y0, y1);
  }
  for (int t = 0; t < 4; ++t) {
    AddTail(a[t], xs[t], y, d, dim);
    out[t] = Sum16(a[t]);
  }
}

}  // namespace

KVD_AVX2_IDX void DotsMany(const float* x, size_t n, int dim, const float* c, float* out) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float* r[4] = {x + i * dim, x + (i + 1) * dim, x + (i + 2) * dim, x + (i + 3) * dim};
    Dots4(r, c, dim, out + i);
  }
  for (; i < n; ++i) out[i] = DotBody(x + i * dim, c, dim);
}

KVD_AVX2_IDX float Dot(const float* a, const float* b, int dim) { return DotBody(a, b, dim); }

KVD_AVX2_IDX void RowNorms(const float* x, size_t n, int dim, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = DotBody(x + i * dim, x + i * dim, dim);
}

namespace {

// GroupMax (index_kernels.cc): max_j (q_j·row + coef[j] * var), each dot in DotBody's order, four
// query heads sharing every load of the row.
KVD_AVX2_IDX inline float GroupMax(const float* q, int group, const float* row, int dim, const float* coef, float var) {
  float best = -std::numeric_limits<float>::infinity();
  int j = 0;
  for (; j + 4 <= group; j += 4) {
    const float* qs[4] = {q + size_t(j) * dim, q + size_t(j + 1) * dim, q + size_t(j + 2) * dim, q + size_t(j + 3) * dim};
    float s[4];
    Dots4(qs, row, dim, s);
    for (int t = 0; t < 4; ++t) {
      if (coef) s[t] += coef[j + t] * var;
      best = s[t] > best ? s[t] : best;
    }
  }
  for (; j < group; ++j) {
    float s = DotBody(q + size_t(j) * dim, row, dim);
    if (coef) s += coef[j] * var;
    best = s > best ? s : best;
  }
  return best;
}

// MinMaxBound (index_kernels.cc) for four query heads at once: per head, 16 lanes of
// max(q*mn, q*mx) summed over d, the tail, Reduce16's tree.
KVD_AVX2_IDX inline void MinMaxBound4(const float* const* qs, const float* mn, const float* mx, int dim, float* out) {
  V16 acc[4];
  for (int t = 0; t < 4; ++t) acc[t] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  int d = 0;
  for (; d + 16 <= dim; d += 16) {
    const __m256 n0 = _mm256_loadu_ps(mn + d), n1 = _mm256_loadu_ps(mn + d + 8);
    const __m256 x0 = _mm256_loadu_ps(mx + d), x1 = _mm256_loadu_ps(mx + d + 8);
    for (int t = 0; t < 4; ++t) {
      const __m256 q0 = _mm256_loadu_ps(qs[t] + d), q1 = _mm256_loadu_ps(qs[t] + d + 8);
      // a > b ? a : b with a = q*mn, b = q*mx: maxps returns its second operand unless the first is greater.
      acc[t].lo = _mm256_add_ps(acc[t].lo, _mm256_max_ps(_mm256_mul_ps(q0, n0), _mm256_mul_ps(q0, x0)));
      acc[t].hi = _mm256_add_ps(acc[t].hi, _mm256_max_ps(_mm256_mul_ps(q1, n1), _mm256_mul_ps(q1, x1)));
    }
  }
  for (int t = 0; t < 4; ++t) {
    if (d < dim) {
      alignas(32) float l[16];
      std::memcpy(l, &acc[t].lo, 32);
      std::memcpy(l + 8, &acc[t].hi, 32);
      for (int u = 0; d + u < dim; ++u) {
        const float a = qs[t][d + u] * mn[d + u], b = qs[t][d + u] * mx[d + u];
        l[u] += a > b ? a : b;
      }
      std::memcpy(&acc[t].lo, l, 32);
      std::memcpy(&acc[t].hi, l + 8, 32);
    }
    out[t] = Sum16(acc[t]);
  }
}

}  // namespace

KVD_AVX2_IDX void ScoreRowsMax(const float* q, int group, const float* rows, const int32_t* ids, size_t n, int dim, float* out,
                               const float* var, const float* coef) {
  // Gathered rows lie anywhere in the representative array: prefetched a few ids ahead (a row of
  // dim 128 is 8 lines), as the generic body does.
  constexpr size_t kAhead = 4;
  for (size_t i = 0; i < n; ++i) {
    const size_t r = ids ? size_t(ids[i]) : i;
    if (ids && i + kAhead < n) {
      const char* p = reinterpret_cast<const char*>(rows + size_t(ids[i + kAhead]) * dim);
      for (size_t b = 0; b < size_t(dim) * sizeof(float); b += 64) __builtin_prefetch(p + b);
    }
    out[i] = GroupMax(q, group, rows + r * dim, dim, var ? coef : nullptr, var ? var[r] : 0.f);
  }
}

KVD_AVX2_IDX void ScoreMinMax(const float* q, int group, const float* mn, const float* mx, size_t n, int dim, float* out) {
  for (size_t i = 0; i < n; ++i) {
    float best = -std::numeric_limits<float>::infinity();
    const float* pn = mn + i * dim;
    const float* px = mx + i * dim;
    int j = 0;
    float s[4];
    for (; j + 4 <= group; j += 4) {
      const float* qs[4] = {q + size_t(j) * dim, q + size_t(j + 1) * dim, q + size_t(j + 2) * dim, q + size_t(j + 3) * dim};
      MinMaxBound4(qs, pn, px, dim, s);
      for (int t = 0; t < 4; ++t) best = s[t] > best ? s[t] : best;
    }
    for (; j < group; ++j) {
      const float* qs[4] = {q + size_t(j) * dim, q + size_t(j) * dim, q + size_t(j) * dim, q + size_t(j) * dim};
      MinMaxBound4(qs, pn, px, dim, s);
      best = s[0] > best ? s[0] : best;
    }
    out[i] = best;
  }
}

namespace {

// NearestBody's tile loop for R points (R <= 4): lane l of a[r] accumulates ct[d][l] * x_r[d]
// sequentially over d; then s = cnorm - 2a, lanes scanned in order with a strict <, so ties keep
// the lowest centroid.
template <int R>
KVD_AVX2_IDX inline void NearestRows(const float* const* xr, const float* ct, const float* cnorm, size_t k, int dim,
                                     float* bestv, int32_t* besti) {
  const size_t tiles = (k + 15) / 16;
  for (size_t t = 0; t < tiles; ++t) {
    const float* c = ct + t * size_t(dim) * 16;
    __m256 lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int d = 0; d < dim; ++d) {
      const __m256 c0 = _mm256_loadu_ps(c + size_t(d) * 16), c1 = _mm256_loadu_ps(c + size_t(d) * 16 + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 xv = _mm256_broadcast_ss(xr[r] + d);
        lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(c0, xv));
        hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(c1, xv));
      }
    }
    const size_t jn = k - t * 16 < 16 ? k - t * 16 : 16;
    const __m256 n0 = _mm256_loadu_ps(cnorm + t * 16), n1 = _mm256_loadu_ps(cnorm + t * 16 + 8), two = _mm256_set1_ps(2.f);
    for (int r = 0; r < R; ++r) {
      alignas(32) float s[16];
      _mm256_store_ps(s, _mm256_sub_ps(n0, _mm256_mul_ps(lo[r], two)));
      _mm256_store_ps(s + 8, _mm256_sub_ps(n1, _mm256_mul_ps(hi[r], two)));
      for (size_t l = 0; l < jn; ++l)
        if (s[l] < bestv[r]) {
          bestv[r] = s[l];
          besti[r] = int32_t(t * 16 + l);
        }
    }
  }
}

}  // namespace

KVD_AVX2_IDX void Nearest(const float* x, const float* xnorm, size_t n, const float* ct, const float* cnorm, size_t k, int dim,
                          int32_t* best, float* dist) {
  constexpr int R = 4;
  for (size_t i0 = 0; i0 < n; i0 += R) {
    const float* xr[R];
    for (int r = 0; r < R; ++r) xr[r] = x + (i0 + r < n ? i0 + r : i0) * size_t(dim);
    float bestv[R];
    int32_t besti[R];
    for (int r = 0; r < R; ++r) bestv[r] = std::numeric_limits<float>::infinity(), besti[r] = 0;
    NearestRows<R>(xr, ct, cnorm, k, dim, bestv, besti);
    for (int r = 0; r < R && i0 + r < n; ++r) {
      const float dd = xnorm[i0 + r] + bestv[r];
      best[i0 + r] = besti[r];
      dist[i0 + r] = dd > 0.f ? dd : 0.f;
    }
  }
}

namespace {

#define KVD_AVX2_FMA __attribute__((target("avx2,fma,f16c")))

// 16 elements of a key row widened to f32 (exact), and a tail of m < 16 zero-padded.
template <Dtype DT>
KVD_AVX2_FMA inline __m256 Widen8(const void* row, int d) {
  if constexpr (DT == Dtype::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + d);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + d));
    if constexpr (DT == Dtype::F16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}
template <Dtype DT>
KVD_AVX2_FMA inline V16 WidenTail16(const void* row, int d, int m) {
  alignas(32) uint8_t buf[64] = {};
  std::memcpy(buf, static_cast<const uint8_t*>(row) + size_t(d) * DtypeSize(DT), size_t(m) * DtypeSize(DT));
  return {Widen8<DT>(buf, 0), Widen8<DT>(buf, 8)};
}
inline V16 LoadTail16(const float* p, int m) {
  alignas(32) float buf[16] = {};
  std::memcpy(buf, p, size_t(m) * 4);
  V16 v;
  std::memcpy(&v.lo, buf, 32);
  std::memcpy(&v.hi, buf + 8, 32);
  return v;
}
KVD_AVX2_FMA inline void Fma16(V16& acc, V16 a, __m256 b0, __m256 b1) {
  acc.lo = _mm256_fmadd_ps(a.lo, b0, acc.lo);
  acc.hi = _mm256_fmadd_ps(a.hi, b1, acc.hi);
}

// The generic KVD_KEY_ROW_DOTS for one dtype: rows prefetched kAhead ahead, each widened once for
// four query heads, lanes fused-multiply-added over d (the zero-padded tail too), Reduce16's tree
// (the generic Reduce4x16 sums each head in that same tree).
template <Dtype DT>
KVD_AVX2_FMA void KeyRowDots(const float* q, int group, const KvView& keys, int h, const int32_t* tokens, size_t n, float* out,
                             size_t ld) {
  constexpr size_t kAhead = 16;
  const int dim = keys.dim;
  const size_t rowBytes = size_t(dim) * DtypeSize(DT);
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      const char* p = static_cast<const char*>(keys.Row(tokens[i + kAhead], h));
      for (size_t b = 0; b < rowBytes; b += 64) __builtin_prefetch(p + b);
    }
    const void* row = keys.Row(tokens[i], h);
    int j = 0;
    for (; j + 4 <= group; j += 4) {
      const float* q0 = q + size_t(j) * dim;
      V16 a[4];
      for (int t = 0; t < 4; ++t) a[t] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
      int d = 0;
      for (; d + 16 <= dim; d += 16) {
        const __m256 r0 = Widen8<DT>(row, d), r1 = Widen8<DT>(row, d + 8);
        for (int t = 0; t < 4; ++t) Fma16(a[t], Load(q0 + size_t(t) * dim + d), r0, r1);
      }
      if (d < dim) {
        const V16 r = WidenTail16<DT>(row, d, dim - d);
        for (int t = 0; t < 4; ++t) Fma16(a[t], LoadTail16(q0 + size_t(t) * dim + d, dim - d), r.lo, r.hi);
      }
      for (int t = 0; t < 4; ++t) out[size_t(j + t) * ld + i] = Sum16(a[t]);
    }
    for (; j < group; ++j) {
      const float* qj = q + size_t(j) * dim;
      V16 a = {_mm256_setzero_ps(), _mm256_setzero_ps()};
      int d = 0;
      for (; d + 16 <= dim; d += 16) Fma16(a, Load(qj + d), Widen8<DT>(row, d), Widen8<DT>(row, d + 8));
      if (d < dim) {
        const V16 r = WidenTail16<DT>(row, d, dim - d);
        Fma16(a, LoadTail16(qj + d, dim - d), r.lo, r.hi);
      }
      out[size_t(j) * ld + i] = Sum16(a);
    }
  }
}

}  // namespace

void ScoreKeyRows(const float* q, int group, const KvView& keys, int h, const int32_t* tokens, size_t n, float* out, size_t ld) {
  switch (keys.dtype) {
    case Dtype::F32: return KeyRowDots<Dtype::F32>(q, group, keys, h, tokens, n, out, ld);
    case Dtype::F16: return KeyRowDots<Dtype::F16>(q, group, keys, h, tokens, n, out, ld);
    case Dtype::BF16: return KeyRowDots<Dtype::BF16>(q, group, keys, h, tokens, n, out, ld);
  }
}

namespace {

// The four quarter sums a[u][g] (g < 4) of NH query heads (patterns pj[u], pat16) over one tile `c`
// of `quads` quads: each quarter sign-extended once per pass and multiplied by every head's
// broadcast pattern; 8 / NH quarters per pass, so NH x 8 / NH = 8 accumulators stay in registers.
// Integer sums, exact in any grouping.
template <int NH>
KVD_AVX2_IDX inline void QuarterSums(const int8_t* c, const int64_t* const* pj, size_t quads, __m256i (&a)[4][4]) {
  constexpr int kQ = 8 / NH;
  for (int g0 = 0; g0 < 4; g0 += kQ) {
    __m256i x[NH][kQ];
    for (int u = 0; u < NH; ++u)
      for (int t = 0; t < kQ; ++t) x[u][t] = _mm256_setzero_si256();
    for (size_t p = 0; p < quads; ++p) {
      __m256i w[kQ];
      for (int t = 0; t < kQ; ++t)
        w[t] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + p * 64 + (g0 + t) * 16)));
      for (int u = 0; u < NH; ++u) {
        const __m256i qv = _mm256_set1_epi64x(pj[u][p]);
        for (int t = 0; t < kQ; ++t) x[u][t] = _mm256_add_epi32(x[u][t], _mm256_madd_epi16(w[t], qv));
      }
    }
    for (int u = 0; u < NH; ++u)
      for (int t = 0; t < kQ; ++t) a[u][g0 + t] = x[u][t];
  }
}

}  // namespace

// The f32 epilogue of the int8 tile kernels for one tile (16 centroids): each query head's exact
// int32 dots d0 (centroids 0-7) and d1 (8-15), in centroid order, are scaled, the spread term
// added, and max-ed into the tile's best: ScoreTilesI8's operations in its order, so the bits are
// the generic level's. Store writes the tile's `jn` live lanes.
struct TileEpilogue {
  __m256 cs0, cs1, vv0, vv1, best0, best1;
  const QueryI8& qq;
  const float* coef;
  bool spread;
  KVD_AVX2_IDX TileEpilogue(const QueryI8& q, const float* scales, const float* var, const float* cf, size_t t, size_t jn)
      : qq(q), coef(cf), spread(var != nullptr) {
    cs0 = _mm256_loadu_ps(scales + t * 16);
    cs1 = _mm256_loadu_ps(scales + t * 16 + 8);
    alignas(32) float vvs[16] = {};
    if (var)
      for (size_t l = 0; l < jn; ++l) vvs[l] = var[t * 16 + l];
    vv0 = _mm256_load_ps(vvs);
    vv1 = _mm256_load_ps(vvs + 8);
    best0 = best1 = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  }
  KVD_AVX2_IDX void Add(__m256i d0, __m256i d1, int j) {
    const __m256 sj = _mm256_set1_ps(qq.scale[size_t(j)]);
    __m256 s0 = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(d0), sj), cs0);
    __m256 s1 = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(d1), sj), cs1);
    if (spread) {
      const __m256 cj = _mm256_set1_ps(coef[j]);
      s0 = _mm256_add_ps(s0, _mm256_mul_ps(vv0, cj));
      s1 = _mm256_add_ps(s1, _mm256_mul_ps(vv1, cj));
    }
    best0 = _mm256_max_ps(s0, best0);  // s > best ? s : best
    best1 = _mm256_max_ps(s1, best1);
  }
  KVD_AVX2_IDX void Store(float* out, size_t t, size_t jn) const {
    alignas(32) float b[16];
    _mm256_store_ps(b, best0);
    _mm256_store_ps(b + 8, best1);
    for (size_t l = 0; l < jn; ++l) out[t * 16 + l] = b[l];
  }
};

// Int8 centroid tiles (index.h, TileBytesI8): quarter g of quad p is 16 bytes, centroids 4g..4g+3
// x dims 4p..4p+3. Each quarter is sign-extended to 16 x int16 and multiplied (vpmaddwd: exact
// pairs in int32) by a query head's 4 dims (pat16, broadcast): lanes 2m and 2m+1 of quarter g's
// sum are centroid 4g + m's two pair sums. Groups of three or more query heads go four heads at a
// time, two quarters per pass over the tile (8 accumulators); one or two heads, all four quarters
// per pass. The sums are paired up (vphaddd, then a lane permutation into centroid order) and scored
// in registers by the epilogue (`score`): the same f32 operations in the same order, so the scores
// are the generic level's bits (integer sums are exact in any grouping).
// Why four heads by two quarters: each sign-extended quarter then serves four heads instead of two,
// halving the conversions (2 uops each here), for two more broadcasts (a load each); for a GQA
// group of 4 at dim 128 a tile of 16 centroids took ~1.8x less (bench/RESULTS.md, "Centroid scoring
// on AVX2: four heads per pass"). (The generic epilogue, fed through memory, was lowered lane by lane
// on AVX2; four heads with the quarters one after another was slower: it broadcasts every query
// pattern four times per quad.)
KVD_AVX2_IDX void ScoreTilesI8(const QueryI8& qq, const int8_t* ct, const float* scales, size_t k, float* out, const float* var,
                               const float* coef) {
  const size_t tiles = (k + 15) / 16, quads = size_t(qq.dim4) / 4;
  // vphaddd of quarters (0, 1) gives centroids [0, 1, 4, 5 | 2, 3, 6, 7]; this puts them in order.
  const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  for (size_t t = 0; t < tiles; ++t) {
    const int8_t* c = ct + t * quads * 64;
    const size_t jn = k - t * 16 < 16 ? k - t * 16 : 16;
    TileEpilogue epi(qq, scales, var, coef, t, jn);
    // One query head's scores of the tile's 16 centroids from its four quarter sums, max-ed in.
    auto score = [&](const __m256i (&ar)[4], int j) KVD_AVX2_IDX {
      epi.Add(_mm256_permutevar8x32_epi32(_mm256_hadd_epi32(ar[0], ar[1]), order),
              _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(ar[2], ar[3]), order), j);
    };
    // Four heads at a time while three or more are left (a three repeats its last head), then a
    // pair or a single (repeated): see QuarterSums.
    for (int j0 = 0; j0 < qq.group;) {
      const int left = qq.group - j0;
      const int nh = left >= 3 ? 4 : 2, nj = left < nh ? left : nh;
      const int64_t* pj[4];
      for (int u = 0; u < nh; ++u) pj[u] = qq.pat16.data() + size_t(j0 + (u < nj ? u : nj - 1)) * quads;
      __m256i a[4][4];
      if (nh == 4) QuarterSums<4>(c, pj, quads, a);
      else QuarterSums<2>(c, pj, quads, a);
      for (int r = 0; r < nj; ++r) score(a[r], j0 + r);
      j0 += nj;
    }
    epi.Store(out, t, jn);
  }
}

// Tiles whose codes are unsigned bytes once loaded: quad p of a tile as two 32-byte halves (centroids
// 0-7 and 8-15, dims 4p..4p+3) from a loader (below: 7-bit int8 codes offset by 64; 4-bit codes
// masked out of their nibble). vpmaddubsw multiplies them by a query head's 4 codes (pat8, broadcast)
// and adds adjacent pairs into int16 (at most 2 x 127 x 127 = 32258: no saturation), and vpmaddwd by
// ones sums each centroid's two pairs into its int32 lane, in centroid order: no sign extension, no
// lane shuffles. The loader's offset, offset x the sum of the head's codes (QueryI8::sum), is
// subtracted at the end, so the dots are the exact integers of every other level and the f32
// epilogue (the same operations as ScoreTilesI8's) gives the same scores.
template <class LoadQuad>
KVD_AVX2_IDX void ScoreUnsignedTiles(const QueryI8& qq, size_t tileBytes, int32_t offset, const float* scales, size_t k, float* out,
                                     const float* var, const float* coef, LoadQuad&& load) {
  const size_t tiles = (k + 15) / 16, quads = size_t(qq.dim4) / 4;
  const __m256i ones = _mm256_set1_epi16(1);
  for (size_t t = 0; t < tiles; ++t) {
    const size_t jn = k - t * 16 < 16 ? k - t * 16 : 16;
    TileEpilogue epi(qq, scales, var, coef, t, jn);
    for (int j0 = 0; j0 < qq.group; j0 += 4) {
      const int nj = qq.group - j0 < 4 ? qq.group - j0 : 4;
      __m256i lo[4], hi[4];
      for (int u = 0; u < 4; ++u) lo[u] = hi[u] = _mm256_setzero_si256();
      for (size_t p = 0; p < quads; ++p) {
        __m256i a0, a1;
        load(t * tileBytes, p, j0 == 0, a0, a1);
        for (int u = 0; u < nj; ++u) {
          const __m256i qv = _mm256_set1_epi32(qq.pat8[size_t(j0 + u) * quads + p]);
          lo[u] = _mm256_add_epi32(lo[u], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, qv), ones));
          hi[u] = _mm256_add_epi32(hi[u], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, qv), ones));
        }
      }
      for (int u = 0; u < nj; ++u) {
        const __m256i bias = _mm256_set1_epi32(offset * qq.sum[size_t(j0 + u)]);
        epi.Add(_mm256_sub_epi32(lo[u], bias), _mm256_sub_epi32(hi[u], bias), j0 + u);
      }
    }
    epi.Store(out, t, jn);
  }
}

// Tiles of 7-bit codes (every byte in [-63, 63]: ScoreTilesMaxI8's TileCodes::kSevenBit): a quad's
// bytes offset by 64 are unsigned.
// kCheck: also tests every byte as it is loaded (uint8(b + 63) <= 126 iff b in [-63, 63]) and
// returns false if one was outside (the scores are then wrong: the caller scores again with the
// general kernel). Two more instructions per 32 loaded bytes, no second pass over the tiles.
template <bool kCheck>
KVD_AVX2_IDX bool ScoreTilesI8Codes7Impl(const QueryI8& qq, const int8_t* ct, const float* scales, size_t k, float* out,
                                         const float* var, const float* coef) {
  const __m256i offset = _mm256_set1_epi8(64), shift63 = _mm256_set1_epi8(63);
  __m256i spread = _mm256_setzero_si256();  // kCheck: max over the bytes of uint8(b + 63)
  ScoreUnsignedTiles(qq, size_t(qq.dim4) * 16, 64, scales, k, out, var, coef,
                     [&](size_t tile, size_t p, bool first, __m256i& a0, __m256i& a1) KVD_AVX2_IDX {
                       const int8_t* c = ct + tile + p * 64;
                       const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c));
                       const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 32));
                       if (kCheck && first)
                         spread = _mm256_max_epu8(spread, _mm256_max_epu8(_mm256_add_epi8(b0, shift63), _mm256_add_epi8(b1, shift63)));
                       a0 = _mm256_add_epi8(b0, offset);
                       a1 = _mm256_add_epi8(b1, offset);
                     });
  if (!kCheck) return true;
  // Every byte of `spread` <= 126: their max, folded over the register.
  const __m256i over = _mm256_cmpeq_epi8(_mm256_max_epu8(spread, _mm256_set1_epi8(126)), _mm256_set1_epi8(126));
  return _mm256_movemask_epi8(over) == -1;
}

KVD_AVX2_IDX void ScoreTilesI8Codes7(const QueryI8& qq, const int8_t* ct, const float* scales, size_t k, float* out,
                                     const float* var, const float* coef) {
  ScoreTilesI8Codes7Impl<false>(qq, ct, scales, k, out, var, coef);
}

KVD_AVX2_IDX bool ScoreTilesI8Codes7Checked(const QueryI8& qq, const int8_t* ct, const float* scales, size_t k, float* out,
                                            const float* var, const float* coef) {
  return ScoreTilesI8Codes7Impl<true>(qq, ct, scales, k, out, var, coef);
}

// 4-bit centroid tiles (index.h, TileBytes4): quad p is the low (p even) or high (p odd) nibbles
// of block p / 2, i.e. u = code + 8 in [0, 15] once masked out (offset 8).
KVD_AVX2_IDX void ScoreTiles4(const QueryI8& qq, const uint8_t* ct, const float* scales, size_t k, float* out, const float* var,
                              const float* coef) {
  const __m256i low = _mm256_set1_epi8(15);
  const size_t quads = size_t(qq.dim4) / 4;
  ScoreUnsignedTiles(qq, (quads + 1) / 2 * 64, 8, scales, k, out, var, coef,
                     [&](size_t tile, size_t p, bool, __m256i& a0, __m256i& a1) KVD_AVX2_IDX {
                       const uint8_t* c = ct + tile + (p / 2) * 64;
                       __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c));
                       __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 32));
                       if (p % 2) {
                         b0 = _mm256_srli_epi16(b0, 4);
                         b1 = _mm256_srli_epi16(b1, 4);
                       }
                       a0 = _mm256_and_si256(b0, low);
                       a1 = _mm256_and_si256(b1, low);
                     });
}

}  // namespace avx2
}  // namespace kvd
