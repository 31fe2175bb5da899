// Vector kernels of the centroid index: fixed-order dot products, blocked nearest-centroid search
// (the k-means GEMM), GQA max scoring and the Quest min/max bound.
//
// Every kernel body is written once with 16-wide GCC vector types and compiled three times: for
// plain x86-64 (the vector ops lower to SSE), for AVX2 and for AVX-512F. All vector arithmetic is
// element-wise, FMA contraction is off, and horizontal reductions use one fixed tree, so each
// level produces bit-identical results; only speed differs. Tests compare the levels.
#pragma GCC optimize("fp-contract=off")
// The vector helpers are always inlined, so no vector crosses a call boundary (no ABI concern).
#pragma GCC diagnostic ignored "-Wpsabi"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "index.h"

namespace kvd {
namespace {

typedef float v16 __attribute__((vector_size(64)));

#define KVD_INLINE inline __attribute__((always_inline))

KVD_INLINE v16 Load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Sum of the 16 lanes plus the scalar tail (already added lane-wise by the caller): fixed tree.
KVD_INLINE float Reduce16(v16 acc) {
  float l[16];
  std::memcpy(l, &acc, sizeof(l));
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) l[i] += l[i + w];
  return l[0];
}

// Dot of `nq` (<= 4) queries with one row; query j accumulates exactly like DotBody.
template <int NQ>
KVD_INLINE void Dots(const float* const* qs, const float* row, int dim, float* out) {
  v16 acc[NQ];
  for (int j = 0; j < NQ; ++j) acc[j] = v16{};
  int d = 0;
  for (; d + 16 <= dim; d += 16) {
    v16 r = Load16(row + d);
    for (int j = 0; j < NQ; ++j) acc[j] += Load16(qs[j] + d) * r;
  }
  for (int j = 0; j < NQ; ++j) {
    float l[16];
    std::memcpy(l, &acc[j], sizeof(l));
    for (int t = 0; d + t < dim; ++t) l[t] += qs[j][d + t] * row[d + t];
    std::memcpy(&acc[j], l, sizeof(l));
    out[j] = Reduce16(acc[j]);
  }
}

KVD_INLINE float DotBody(const float* a, const float* b, int dim) {
  const float* qs[1] = {a};
  float out;
  Dots<1>(qs, b, dim, &out);
  return out;
}

KVD_INLINE float GroupMax(const float* q, int group, const float* row, int dim) {
  float best = -std::numeric_limits<float>::infinity();
  float out[4];
  int j = 0;
  for (; j + 4 <= group; j += 4) {
    const float* qs[4] = {q + size_t(j) * dim, q + size_t(j + 1) * dim, q + size_t(j + 2) * dim, q + size_t(j + 3) * dim};
    Dots<4>(qs, row, dim, out);
    for (int t = 0; t < 4; ++t) best = out[t] > best ? out[t] : best;
  }
  for (; j < group; ++j) {
    float s = DotBody(q + size_t(j) * dim, row, dim);
    best = s > best ? s : best;
  }
  return best;
}

KVD_INLINE void ScoreRowsMaxBody(const float* q, int group, const float* rows, size_t n, int dim, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = GroupMax(q, group, rows + i * dim, dim);
}

KVD_INLINE void ScoreRowsMaxGatherBody(const float* q, int group, const float* rows, const int32_t* ids, size_t n,
                                       int dim, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = GroupMax(q, group, rows + size_t(ids[i]) * dim, dim);
}

KVD_INLINE float MinMaxBound(const float* q, const float* mn, const float* mx, int dim) {
  v16 acc = v16{};
  int d = 0;
  for (; d + 16 <= dim; d += 16) {
    v16 qv = Load16(q + d);
    v16 a = qv * Load16(mn + d);
    v16 b = qv * Load16(mx + d);
    acc += a > b ? a : b;
  }
  float l[16];
  std::memcpy(l, &acc, sizeof(l));
  for (int t = 0; d + t < dim; ++t) {
    float a = q[d + t] * mn[d + t], b = q[d + t] * mx[d + t];
    l[t] += a > b ? a : b;
  }
  std::memcpy(&acc, l, sizeof(l));
  return Reduce16(acc);
}

KVD_INLINE void ScoreMinMaxBody(const float* q, int group, const float* mn, const float* mx, size_t n, int dim,
                                float* out) {
  for (size_t i = 0; i < n; ++i) {
    float best = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < group; ++j) {
      float s = MinMaxBound(q + size_t(j) * dim, mn + i * dim, mx + i * dim, dim);
      best = s > best ? s : best;
    }
    out[i] = best;
  }
}

// Blocked nearest-centroid search. Centroids are transposed into tiles of 16 (ct: tiles x dim x 16,
// zero-padded); 4 points share every centroid load and 16 centroids every point load. Output
// (i, j) accumulates x_i[d] * c_j[d] sequentially over d.
KVD_INLINE void NearestBody(const float* x, const float* xnorm, size_t n, const float* ct, const float* cnorm,
                            size_t k, int dim, int32_t* best, float* dist) {
  const size_t tiles = (k + 15) / 16;
  for (size_t i0 = 0; i0 < n; i0 += 4) {
    const float* xr[4];
    for (int r = 0; r < 4; ++r) xr[r] = x + (i0 + r < n ? i0 + r : i0) * size_t(dim);
    float bestv[4];
    int32_t besti[4] = {0, 0, 0, 0};
    for (int r = 0; r < 4; ++r) bestv[r] = std::numeric_limits<float>::infinity();
    for (size_t t = 0; t < tiles; ++t) {
      const float* c = ct + t * size_t(dim) * 16;
      v16 a0 = v16{}, a1 = v16{}, a2 = v16{}, a3 = v16{};
      for (int d = 0; d < dim; ++d) {
        v16 cv = Load16(c + size_t(d) * 16);
        a0 += cv * xr[0][d];
        a1 += cv * xr[1][d];
        a2 += cv * xr[2][d];
        a3 += cv * xr[3][d];
      }
      float acc[4][16];
      std::memcpy(acc[0], &a0, 64);
      std::memcpy(acc[1], &a1, 64);
      std::memcpy(acc[2], &a2, 64);
      std::memcpy(acc[3], &a3, 64);
      const size_t jn = k - t * 16 < 16 ? k - t * 16 : 16;
      for (int r = 0; r < 4; ++r)
        for (size_t l = 0; l < jn; ++l) {
          float s = cnorm[t * 16 + l] - 2.f * acc[r][l];
          if (s < bestv[r]) {
            bestv[r] = s;
            besti[r] = int32_t(t * 16 + l);
          }
        }
    }
    for (int r = 0; r < 4 && i0 + r < n; ++r) {
      float dd = xnorm[i0 + r] + bestv[r];
      best[i0 + r] = besti[r];
      dist[i0 + r] = dd > 0.f ? dd : 0.f;
    }
  }
}

// ---- one instantiation per level ----

struct Table {
  float (*dot)(const float*, const float*, int);
  void (*scoreRowsMax)(const float*, int, const float*, size_t, int, float*);
  void (*scoreRowsMaxGather)(const float*, int, const float*, const int32_t*, size_t, int, float*);
  void (*scoreMinMax)(const float*, int, const float*, const float*, size_t, int, float*);
  void (*nearest)(const float*, const float*, size_t, const float*, const float*, size_t, int, int32_t*, float*);
};

#define KVD_INDEX_LEVEL(NAME, ATTR)                                                                             \
  ATTR float Dot##NAME(const float* a, const float* b, int dim) { return DotBody(a, b, dim); }                  \
  ATTR void ScoreRowsMax##NAME(const float* q, int g, const float* rows, size_t n, int dim, float* out) {      \
    ScoreRowsMaxBody(q, g, rows, n, dim, out);                                                                  \
  }                                                                                                             \
  ATTR void ScoreRowsMaxGather##NAME(const float* q, int g, const float* rows, const int32_t* ids, size_t n,   \
                                     int dim, float* out) {                                                    \
    ScoreRowsMaxGatherBody(q, g, rows, ids, n, dim, out);                                                       \
  }                                                                                                             \
  ATTR void ScoreMinMax##NAME(const float* q, int g, const float* mn, const float* mx, size_t n, int dim,      \
                              float* out) {                                                                    \
    ScoreMinMaxBody(q, g, mn, mx, n, dim, out);                                                                 \
  }                                                                                                             \
  ATTR void Nearest##NAME(const float* x, const float* xn, size_t n, const float* ct, const float* cn, size_t k, \
                          int dim, int32_t* best, float* dist) {                                               \
    NearestBody(x, xn, n, ct, cn, k, dim, best, dist);                                                          \
  }                                                                                                             \
  const Table k##NAME = {Dot##NAME, ScoreRowsMax##NAME, ScoreRowsMaxGather##NAME, ScoreMinMax##NAME, Nearest##NAME};

KVD_INDEX_LEVEL(Scalar, )
KVD_INDEX_LEVEL(Avx2, __attribute__((target("avx2"))))
KVD_INDEX_LEVEL(Avx512, __attribute__((target("avx512f"))))

SimdLevel CpuMax() {
  static const SimdLevel l = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return SimdLevel::Avx512;
    if (__builtin_cpu_supports("avx2")) return SimdLevel::Avx2;
    return SimdLevel::Scalar;
  }();
  return l;
}

SimdLevel EnvCap() {
  static const SimdLevel l = [] {
    const char* e = std::getenv("KVDRIVE_SIMD");
    std::string s = e ? e : "";
    if (s == "scalar") return SimdLevel::Scalar;
    if (s == "avx2") return SimdLevel::Avx2;
    return SimdLevel::Avx512;
  }();
  return l;
}

SimdLevel g_cap = SimdLevel::Avx512;

SimdLevel Min(SimdLevel a, SimdLevel b) { return int(a) < int(b) ? a : b; }

const Table& Active() {
  switch (IndexKernelLevel()) {
    case SimdLevel::Avx512: return kAvx512;
    case SimdLevel::Avx2: return kAvx2;
    default: return kScalar;
  }
}

}  // namespace

SimdLevel IndexKernelLevel() {
  SimdLevel l = Min(Min(CpuMax(), EnvCap()), g_cap);
  // Once the shared dispatch table offers vector levels, setSimdLevel() steers these kernels too.
  if (SimdFor(SimdLevel::Avx2) || SimdFor(SimdLevel::Avx512)) l = Min(l, Simd().level);
  return l;
}
void SetIndexKernelCap(SimdLevel cap) { g_cap = cap; }
SimdLevel IndexKernelCap() { return g_cap; }

float DotFixed(const float* a, const float* b, int dim) { return Active().dot(a, b, dim); }

void ScoreRowsMax(const float* q, int group, const float* rows, size_t n, int dim, float* out) {
  Active().scoreRowsMax(q, group, rows, n, dim, out);
}
void ScoreRowsMaxGather(const float* q, int group, const float* rows, const int32_t* ids, size_t n, int dim,
                        float* out) {
  Active().scoreRowsMaxGather(q, group, rows, ids, n, dim, out);
}
void ScoreMinMaxMax(const float* q, int group, const float* mn, const float* mx, size_t n, int dim, float* out) {
  Active().scoreMinMax(q, group, mn, mx, n, dim, out);
}

void NearestCentroids(const float* x, const float* xnorm, size_t n, const float* c, const float* cnorm, size_t k,
                      int dim, int32_t* best, float* dist) {
  const size_t tiles = (k + 15) / 16;
  std::vector<float> ct(tiles * size_t(dim) * 16, 0.f);
  for (size_t j = 0; j < k; ++j)
    for (int d = 0; d < dim; ++d) ct[(j / 16) * size_t(dim) * 16 + size_t(d) * 16 + (j % 16)] = c[j * dim + d];
  Active().nearest(x, xnorm, n, ct.data(), cnorm, k, dim, best, dist);
}

}  // namespace kvd
