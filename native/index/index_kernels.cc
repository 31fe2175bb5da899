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

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <immintrin.h>

#include "common/dtype.h"
#include "index/index.h"
#include "index/group_shares_tail.h"
#include "index/index_kernels_avx2.h"
#include "index/key_sketch.h"

namespace kvd {
namespace {

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

#define KVD_INLINE inline __attribute__((always_inline))

KVD_INLINE v16 Load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// 16 f16 values (IEEE binary16 bits) widened to f32; exact at every level, so f16 tiles score
// bit-identically everywhere. L: 0 scalar, 1 AVX2 + F16C, 2 AVX-512F.
template <int L>
KVD_INLINE v16 LoadH16(const uint16_t* p);
template <>
KVD_INLINE v16 LoadH16<0>(const uint16_t* p) {
  v16 v;
  for (int i = 0; i < 16; ++i) v[i] = F16ToF32(p[i]);
  return v;
}
template <>
KVD_INLINE __attribute__((target("avx2,f16c"))) v16 LoadH16<1>(const uint16_t* p) {
  __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  v16 v;
  std::memcpy(&v, &a, 32);
  std::memcpy(reinterpret_cast<char*>(&v) + 32, &b, 32);
  return v;
}
template <>
KVD_INLINE __attribute__((target("avx512f"))) v16 LoadH16<2>(const uint16_t* p) {
  __m512 a = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  v16 v;
  std::memcpy(&v, &a, 64);
  return v;
}

// Sum of the 16 lanes in a fixed tree: lane i += lane i+8, then i += i+4, i += i+2, i += i+1.
// Done with lane shuffles (no trip through memory); each step is the same scalar addition at
// every level, so the result is identical everywhere.
KVD_INLINE float Reduce16(v16 a) {
  a += __builtin_shuffle(a, v16i{8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15});
  a += __builtin_shuffle(a, v16i{4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7});
  a += __builtin_shuffle(a, v16i{2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3});
  a += __builtin_shuffle(a, v16i{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  return a[0];
}

// Adds the scalar tail a[d..dim) * b[d..dim) lane-wise into lanes 0.. of acc (dim - d < 16).
KVD_INLINE void AddTail(v16& acc, const float* a, const float* b, int d, int dim) {
  if (d >= dim) return;
  float l[16];
  std::memcpy(l, &acc, sizeof(l));
  for (int t = 0; d + t < dim; ++t) l[t] += a[d + t] * b[d + t];
  std::memcpy(&acc, l, sizeof(l));
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
    AddTail(acc[j], qs[j], row, d, dim);
    out[j] = Reduce16(acc[j]);
  }
}

KVD_INLINE float DotBody(const float* a, const float* b, int dim) {
  const float* qs[1] = {a};
  float out;
  Dots<1>(qs, b, dim, &out);
  return out;
}

// Four rows at a time against one vector: independent accumulators hide the add latency; each
// row's sum still runs in DotBody's order, so out[i] == DotBody(x_i, c) exactly.
KVD_INLINE void DotsManyBody(const float* x, size_t n, int dim, const float* c, float* out) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float* r0 = x + i * dim;
    const float* r1 = r0 + dim;
    const float* r2 = r1 + dim;
    const float* r3 = r2 + dim;
    v16 a0 = v16{}, a1 = v16{}, a2 = v16{}, a3 = v16{};
    int d = 0;
    for (; d + 16 <= dim; d += 16) {
      v16 cv = Load16(c + d);
      a0 += Load16(r0 + d) * cv;
      a1 += Load16(r1 + d) * cv;
      a2 += Load16(r2 + d) * cv;
      a3 += Load16(r3 + d) * cv;
    }
    AddTail(a0, r0, c, d, dim);
    AddTail(a1, r1, c, d, dim);
    AddTail(a2, r2, c, d, dim);
    AddTail(a3, r3, c, d, dim);
    out[i] = Reduce16(a0);
    out[i + 1] = Reduce16(a1);
    out[i + 2] = Reduce16(a2);
    out[i + 3] = Reduce16(a3);
  }
  for (; i < n; ++i) out[i] = DotBody(x + i * dim, c, dim);
}

KVD_INLINE void RowNormsBody(const float* x, size_t n, int dim, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = DotBody(x + i * dim, x + i * dim, dim);
}

// max_j (q_j·row + coef[j] * var); coef == nullptr means no variance term.
KVD_INLINE float GroupMax(const float* q, int group, const float* row, int dim, const float* coef, float var) {
  float best = -std::numeric_limits<float>::infinity();
  float out[4];
  int j = 0;
  for (; j + 4 <= group; j += 4) {
    const float* qs[4] = {q + size_t(j) * dim, q + size_t(j + 1) * dim, q + size_t(j + 2) * dim, q + size_t(j + 3) * dim};
    Dots<4>(qs, row, dim, out);
    if (coef)
      for (int t = 0; t < 4; ++t) out[t] += coef[j + t] * var;
    for (int t = 0; t < 4; ++t) best = out[t] > best ? out[t] : best;
  }
  for (; j < group; ++j) {
    float s = DotBody(q + size_t(j) * dim, row, dim);
    if (coef) s += coef[j] * var;
    best = s > best ? s : best;
  }
  return best;
}

KVD_INLINE void ScoreRowsMaxBody(const float* q, int group, const float* rows, size_t n, int dim, float* out,
                                 const float* var, const float* coef) {
  for (size_t i = 0; i < n; ++i) out[i] = GroupMax(q, group, rows + i * dim, dim, var ? coef : nullptr, var ? var[i] : 0.f);
}

KVD_INLINE void ScoreRowsMaxGatherBody(const float* q, int group, const float* rows, const int32_t* ids, size_t n,
                                       int dim, float* out, const float* var, const float* coef) {
  // Rows are scattered over the whole representative array: prefetch a few ids ahead so the
  // misses overlap (a row of dim 128 is 8 cache lines).
  constexpr size_t kAhead = 4;
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      const char* p = reinterpret_cast<const char*>(rows + size_t(ids[i + kAhead]) * dim);
      for (size_t b = 0; b < size_t(dim) * sizeof(float); b += 64) __builtin_prefetch(p + b);
    }
    out[i] = GroupMax(q, group, rows + size_t(ids[i]) * dim, dim, var ? coef : nullptr, var ? var[ids[i]] : 0.f);
  }
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
  if (d < dim) {
    float l[16];
    std::memcpy(l, &acc, sizeof(l));
    for (int t = 0; d + t < dim; ++t) {
      float a = q[d + t] * mn[d + t], b = q[d + t] * mx[d + t];
      l[t] += a > b ? a : b;
    }
    std::memcpy(&acc, l, sizeof(l));
  }
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

// Centroid scoring from tiles of 16 transposed centroids (ct: tiles x dim x 16): each lane is one
// centroid, accumulated sequentially over d for each query head (no horizontal reductions), four
// query heads per pass over a tile. out[i] = max_j (q_j·c_i + coef[j] * var[i]). Per d and tile: 4
// multiplies and 4 adds of 16 lanes, ~4 cycles on Zen 4's FP pipes, i.e. ~24-30 GB/s of f16 tiles
// per core with the tiles in cache; a fused multiply-add form measured no faster (its 4-cycle
// latency chains bind instead), so the kernel is at the FP pipes' limit for this arithmetic.
KVD_INLINE void ScoreTilesMaxBody(const float* q, int group, const float* ct, size_t k, int dim, float* out,
                                  const float* var, const float* coef) {
  const size_t tiles = (k + 15) / 16;
  for (size_t t = 0; t < tiles; ++t) {
    const float* c = ct + t * size_t(dim) * 16;
    const size_t jn = k - t * 16 < 16 ? k - t * 16 : 16;
    v16 vv = v16{};
    if (var)
      for (size_t l = 0; l < jn; ++l) vv[l] = var[t * 16 + l];
    v16 best = v16{} - std::numeric_limits<float>::infinity();
    for (int j0 = 0; j0 < group; j0 += 4) {
      const int nj = group - j0 < 4 ? group - j0 : 4;
      const float* qj[4];
      for (int r = 0; r < 4; ++r) qj[r] = q + size_t(j0 + (r < nj ? r : 0)) * dim;
      v16 a0 = v16{}, a1 = v16{}, a2 = v16{}, a3 = v16{};
      for (int d = 0; d < dim; ++d) {
        v16 cv = Load16(c + size_t(d) * 16);
        a0 += cv * qj[0][d];
        a1 += cv * qj[1][d];
        a2 += cv * qj[2][d];
        a3 += cv * qj[3][d];
      }
      v16* acc[4] = {&a0, &a1, &a2, &a3};
      for (int r = 0; r < nj; ++r) {
        v16 s = *acc[r];
        if (var) s += vv * coef[j0 + r];
        best = s > best ? s : best;
      }
    }
    for (size_t l = 0; l < jn; ++l) out[t * 16 + l] = best[l];
  }
}

// ---- int8 centroid tiles (see ScoreTilesMaxI8 in index.h) ----
//
// Every level computes the same exact int32 dot products of the int8 query with each int8
// centroid, then the same float epilogue (ScoreTilesI8; ScoreTilesVnni and the AVX2 kernels in
// index_kernels_avx2.cc run the same operations on registers), so the scores are bit-identical at
// every level. Tile layout: per tile of 16 centroids, Dim4(dim) / 4 quads of 64 bytes; quad p holds
// lane l's dims 4p..4p+3 at bytes 4l..4l+3 (one 32-bit group per centroid, what VPDPBUSD eats).

// dots[j * 16 + l] = q8_j · c8_l (exact int32) for every query head j and lane l of one tile
// (`quads` groups of 4 dims), code(p, l, b) giving lane l's code of dim 4p + b: plain int32
// multiply-adds.
template <class Code>
void TileDotsScalar(const QueryI8& qq, size_t quads, int32_t* dots, Code&& code) {
  for (int j = 0; j < qq.group; ++j) {
    const int8_t* qj = qq.q.data() + size_t(j) * qq.dim4;
    int32_t* d = dots + size_t(j) * 16;
    for (int l = 0; l < 16; ++l) d[l] = 0;
    for (size_t p = 0; p < quads; ++p)
      for (int l = 0; l < 16; ++l)
        for (int b = 0; b < 4; ++b) d[l] += int32_t(qj[p * 4 + b]) * code(p, l, b);
  }
}

// out[i] = max_j (float(dot_ji) * sq_j * s_i + coef[j] * var[i]) (see ScoreTilesMaxI8 in index.h),
// the dots of tile t by dotsOf(t, dots). The portable level; the vector kernels run this f32 code's
// operations in the same order (|dot| < 2^31, converted to f32 the same way everywhere), so the
// scores are bit-identical.
template <class TileDots>
void ScoreTilesWith(const QueryI8& qq, TileDots dotsOf, const float* scales, size_t k, float* out, const float* var,
                    const float* coef) {
  const size_t tiles = (k + 15) / 16;
  int32_t stackDots[64 * 16];
  std::vector<int32_t> heapDots(qq.group > 64 ? size_t(qq.group) * 16 : 0);
  int32_t* dots = qq.group > 64 ? heapDots.data() : stackDots;
  for (size_t t = 0; t < tiles; ++t) {
    dotsOf(t, dots);
    const size_t jn = k - t * 16 < 16 ? k - t * 16 : 16;
    const v16 cs = Load16(scales + t * 16);  // scales hold whole tiles, padding lanes 0
    v16 vv = v16{};
    if (var)
      for (size_t l = 0; l < jn; ++l) vv[l] = var[t * 16 + l];
    v16 best = v16{} - std::numeric_limits<float>::infinity();
    for (int j = 0; j < qq.group; ++j) {
      v16i d;
      std::memcpy(&d, dots + size_t(j) * 16, sizeof(d));
      v16 s = __builtin_convertvector(d, v16) * qq.scale[j];
      s = s * cs;
      if (var) s += vv * coef[j];
      best = s > best ? s : best;
    }
    for (size_t l = 0; l < jn; ++l) out[t * 16 + l] = best[l];
  }
}

// Int8 tiles: quad p of a tile is 64 bytes, lane l's codes at 4l..4l+3.
void ScoreTilesI8(const QueryI8& qq, const int8_t* ct, const float* scales, size_t k, float* out, const float* var,
                  const float* coef) {
  const size_t quads = size_t(qq.dim4) / 4;
  auto dotsOf = [&](size_t t, int32_t* dots) {
    const int8_t* c = ct + t * quads * 64;
    TileDotsScalar(qq, quads, dots, [c](size_t p, int l, int b) { return int32_t(c[p * 64 + size_t(l) * 4 + size_t(b)]); });
  };
  ScoreTilesWith(qq, dotsOf, scales, k, out, var, coef);
}

// 4-bit tiles (index.h, TileBytes4): quad p is the low (p even) or high (p odd) nibbles of block
// p / 2, each nibble code + 8.
void ScoreTiles4(const QueryI8& qq, const uint8_t* ct, const float* scales, size_t k, float* out, const float* var,
                 const float* coef) {
  const size_t quads = size_t(qq.dim4) / 4;
  auto dotsOf = [&](size_t t, int32_t* dots) {
    const uint8_t* c = ct + t * ((quads + 1) / 2) * 64;
    TileDotsScalar(qq, quads, dots, [c](size_t p, int l, int b) {
      const uint8_t byte = c[(p / 2) * 64 + size_t(l) * 4 + size_t(b)];
      return int32_t(p % 2 ? byte >> 4 : byte & 15) - 8;
    });
  };
  ScoreTilesWith(qq, dotsOf, scales, k, out, var, coef);
}

// AVX-512 VNNI, fused: the dots of a tile stay in registers and the f32 epilogue of ScoreTilesI8
// runs on them in place, with the same operations in the same order (one rounding each: the
// empty asm statements keep the compiler from contracting a multiply and the add after it into
// one FMA, which the portable levels cannot do), so the scores are the same bits. One VPDPBUSD
// per quad and query head (16 centroids x 4 dims); it multiplies unsigned by signed bytes, so the
// centroid bytes are biased to unsigned (x ^ 0x80 = x + 128) and 128 * sum(q_j) is subtracted at
// the end: exact. Four query heads per pass over a tile (two accumulators each, the query's 4 codes
// broadcast per quad). Per-tile dots through memory and an epilogue on portable vectors took ~2.7x
// the time of this (bench/RESULTS.md).
// acc += dpbusd(w, the 4 bytes at ptr in every lane): the broadcast as vpdpbusd's own memory operand
// ({1to16}), which GCC does not fold from _mm512_set1_epi32 (it issued a vpbroadcastd per product).
#define DPBUSD_BCST(acc, w, ptr) __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(ptr)))
// Codes: int8 tiles (bytes biased by x ^ 0x80 = x + 128, one 64-byte quad per load) or 4-bit tiles
// (index.h, TileBytes4: one 64-byte block holds two quads, its nibbles masked out are u = code + 8),
// the bias (128 or 8) x sum(q_j) subtracted at the end. Same integer dots, same epilogue.
template <bool kFour>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void ScoreTilesVnni(const QueryI8& qq, const uint8_t* ct,
                                                                           const float* scales, size_t k, float* out,
                                                                           const float* var, const float* coef) {
  const size_t tiles = (k + 15) / 16, quads = size_t(qq.dim4) / 4;
  const size_t tileBytes = kFour ? (quads + 1) / 2 * 64 : quads * 64;
  const __m512i bias = _mm512_set1_epi8(char(0x80));
  const __m512i low = _mm512_set1_epi8(15);
  const int32_t codeBias = kFour ? 8 : 128;
  for (size_t t = 0; t < tiles; ++t) {
    const uint8_t* c = ct + t * tileBytes;
    const size_t jn = k - t * 16 < 16 ? k - t * 16 : 16;
    const __mmask16 lanes = __mmask16((1u << jn) - 1);
    const __m512 cs = _mm512_loadu_ps(scales + t * 16);  // scales hold whole tiles, padding lanes 0
    const __m512 vv = var ? _mm512_maskz_loadu_ps(lanes, var + t * 16) : _mm512_setzero_ps();
    __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int j0 = 0; j0 < qq.group; j0 += 4) {
      const int nj = qq.group - j0 < 4 ? qq.group - j0 : 4;
      // Two accumulators per query head (even and odd quads of dims), added at the end: with one,
      // each head's 32 dependent vpdpbusd (dim 128) waited on the previous one's latency. Each
      // product takes its query head's 4 codes of the quad (pat8) broadcast from memory by the
      // instruction itself (DPBUSD_BCST). Integer sums: the same dots in any order.
      const int32_t* q0 = qq.pat8.data() + size_t(j0 + 0) * quads;
      const int32_t* q1 = qq.pat8.data() + size_t(j0 + (1 < nj ? 1 : 0)) * quads;
      const int32_t* q2 = qq.pat8.data() + size_t(j0 + (2 < nj ? 2 : 0)) * quads;
      const int32_t* q3 = qq.pat8.data() + size_t(j0 + (3 < nj ? 3 : 0)) * quads;
      __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
      size_t p = 0;
      for (; p + 2 <= quads; p += 2) {
        __m512i w, x;
        if (kFour) {
          const __m512i v = _mm512_loadu_si512(c + p * 32);
          w = _mm512_and_si512(v, low);
          x = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        } else {
          w = _mm512_xor_si512(_mm512_loadu_si512(c + p * 64), bias);
          x = _mm512_xor_si512(_mm512_loadu_si512(c + (p + 1) * 64), bias);
        }
        DPBUSD_BCST(a0, w, q0 + p);
        DPBUSD_BCST(a1, w, q1 + p);
        DPBUSD_BCST(a2, w, q2 + p);
        DPBUSD_BCST(a3, w, q3 + p);
        DPBUSD_BCST(b0, x, q0 + p + 1);
        DPBUSD_BCST(b1, x, q1 + p + 1);
        DPBUSD_BCST(b2, x, q2 + p + 1);
        DPBUSD_BCST(b3, x, q3 + p + 1);
      }
      if (p < quads) {
        const __m512i w = kFour ? _mm512_and_si512(_mm512_loadu_si512(c + p * 32), low)
                                : _mm512_xor_si512(_mm512_loadu_si512(c + p * 64), bias);
        DPBUSD_BCST(a0, w, q0 + p);
        DPBUSD_BCST(a1, w, q1 + p);
        DPBUSD_BCST(a2, w, q2 + p);
        DPBUSD_BCST(a3, w, q3 + p);
      }
      const __m512i a[4] = {_mm512_add_epi32(a0, b0), _mm512_add_epi32(a1, b1), _mm512_add_epi32(a2, b2), _mm512_add_epi32(a3, b3)};
      for (int r = 0; r < nj; ++r) {
        const int j = j0 + r;
        const __m512i d = _mm512_sub_epi32(a[r], _mm512_set1_epi32(codeBias * qq.sum[j]));
        __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_set1_ps(qq.scale[j]));
        s = _mm512_mul_ps(s, cs);
        __asm__("" : "+v"(s));
        if (var) {
          __m512 v = _mm512_mul_ps(vv, _mm512_set1_ps(coef[j]));
          __asm__("" : "+v"(v));
          s = _mm512_add_ps(s, v);
        }
        best = _mm512_max_ps(s, best);  // s > best ? s : best, as ScoreTilesI8 (NaN s keeps best)
      }
    }
    _mm512_mask_storeu_ps(out + t * 16, lanes, best);
  }
}
#undef DPBUSD_BCST

// ---- level 3 of kvdrive select: exact scores of gathered key rows ----

// Dots of `group` queries with one f32 row, query j's into out[j * ld]; each equals
// DotBody(q_j, row) bit for bit (Dots<> accumulates exactly like DotBody, products commute).
KVD_INLINE void GroupDotsBody(const float* q, int group, const float* row, int dim, float* out, size_t ld) {
  int j = 0;
  float o[4];
  for (; j + 4 <= group; j += 4) {
    const float* qs[4] = {q + size_t(j) * dim, q + size_t(j + 1) * dim, q + size_t(j + 2) * dim, q + size_t(j + 3) * dim};
    Dots<4>(qs, row, dim, o);
    for (int t = 0; t < 4; ++t) out[size_t(j + t) * ld] = o[t];
  }
  for (; j < group; ++j) out[size_t(j) * ld] = DotBody(q + size_t(j) * dim, row, dim);
}

typedef uint16_t v16h __attribute__((vector_size(32)));

// a * b + c rounded once (fused multiply-add): hardware FMA at the vector levels, fmaf per lane at
// the scalar level, so every level gives the same bits.
template <int L>
KVD_INLINE v16 Fma16(v16 a, v16 b, v16 c);
template <>
KVD_INLINE v16 Fma16<0>(v16 a, v16 b, v16 c) {
  v16 r;
  for (int i = 0; i < 16; ++i) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
  return r;
}
template <>
KVD_INLINE __attribute__((target("avx2,fma"))) v16 Fma16<1>(v16 a, v16 b, v16 c) {
  __m256 a0, a1, b0, b1, c0, c1;
  std::memcpy(&a0, &a, 32), std::memcpy(&a1, reinterpret_cast<char*>(&a) + 32, 32);
  std::memcpy(&b0, &b, 32), std::memcpy(&b1, reinterpret_cast<char*>(&b) + 32, 32);
  std::memcpy(&c0, &c, 32), std::memcpy(&c1, reinterpret_cast<char*>(&c) + 32, 32);
  c0 = _mm256_fmadd_ps(a0, b0, c0);
  c1 = _mm256_fmadd_ps(a1, b1, c1);
  v16 r;
  std::memcpy(&r, &c0, 32);
  std::memcpy(reinterpret_cast<char*>(&r) + 32, &c1, 32);
  return r;
}
template <>
KVD_INLINE __attribute__((target("avx512f"))) v16 Fma16<2>(v16 a, v16 b, v16 c) {
  __m512 x, y, z;
  std::memcpy(&x, &a, 64), std::memcpy(&y, &b, 64), std::memcpy(&z, &c, 64);
  z = _mm512_fmadd_ps(x, y, z);
  v16 r;
  std::memcpy(&r, &z, 64);
  return r;
}

KVD_INLINE v16 LoadBf16(const uint16_t* p) {
  v16h b;
  std::memcpy(&b, p, sizeof(b));
  v16i w = __builtin_convertvector(b, v16i) << 16;
  v16 r;
  std::memcpy(&r, &w, sizeof(r));
  return r;
}

// The four sums of a, b, c, d (their 16 lanes each) in lanes 0, 4, 8, 12: a transposed tree
// (halves, then quarters, then pairs), 8 shuffles and 5 adds for four dot products.
KVD_INLINE v16 Reduce4x16(v16 a, v16 b, v16 c, v16 d) {
  const v16i lo = v16i{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const v16i hi = v16i{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const v16 ab = __builtin_shuffle(a, b, lo) + __builtin_shuffle(a, b, hi);  // a: 0-7, b: 8-15
  const v16 cd = __builtin_shuffle(c, d, lo) + __builtin_shuffle(c, d, hi);
  v16 t = __builtin_shuffle(ab, cd, v16i{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}) +
          __builtin_shuffle(ab, cd, v16i{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
  t += __builtin_shuffle(t, v16i{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
  t += __builtin_shuffle(t, v16i{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
  return t;
}

// Level-3 row scoring (see ScoreKeyRows in index.h): each key row is loaded and widened once and
// multiplied into the accumulators of four query heads at a time (16 lanes over d, FMA), then
// reduced by Reduce4x16 (a leftover head by Reduce16); a dim tail below 16 is widened into a
// zero-padded block. Rows are scattered (a token-major cache): prefetch kAhead rows ahead so the
// misses overlap (16 rows: four 4-token chunks, 64 lines in flight; 8 left the gather latency-bound
// in a standalone gather test, 16-64 were ~1.3-2x faster per row). A macro, so LoadH16 / Fma16's target-specific intrinsics sit directly in each
// level's function (like KVD_SCORE_TILES_H_BODY).
#define KVD_KEY_ROW_DOTS(LV, LOAD)                                                              \
  for (size_t i = 0; i < n; ++i) {                                                              \
    if (i + kAhead < n) {                                                                       \
      const char* p = static_cast<const char*>(keys.Row(tokens[i + kAhead], h));                \
      for (size_t b = 0; b < rowBytes; b += 64) __builtin_prefetch(p + b);                      \
    }                                                                                           \
    const auto* row = static_cast<const Elem*>(keys.Row(tokens[i], h));                         \
    int j = 0;                                                                                  \
    for (; j + 4 <= group; j += 4) {                                                            \
      const float* q0 = q + size_t(j) * dim;                                                    \
      v16 a0 = v16{}, a1 = v16{}, a2 = v16{}, a3 = v16{};                                       \
      int d = 0;                                                                                \
      for (; d + 16 <= dim; d += 16) {                                                          \
        const v16 r = LOAD(row + d);                                                            \
        a0 = Fma16<LV>(Load16(q0 + d), r, a0);                                                  \
        a1 = Fma16<LV>(Load16(q0 + dim + d), r, a1);                                            \
        a2 = Fma16<LV>(Load16(q0 + 2 * dim + d), r, a2);                                        \
        a3 = Fma16<LV>(Load16(q0 + 3 * dim + d), r, a3);                                        \
      }                                                                                         \
      if (d < dim) {                                                                            \
        const v16 r = WidenTail(row + d, dim - d);                                              \
        a0 = Fma16<LV>(LoadTail(q0 + d, dim - d), r, a0);                                       \
        a1 = Fma16<LV>(LoadTail(q0 + dim + d, dim - d), r, a1);                                 \
        a2 = Fma16<LV>(LoadTail(q0 + 2 * dim + d, dim - d), r, a2);                             \
        a3 = Fma16<LV>(LoadTail(q0 + 3 * dim + d, dim - d), r, a3);                             \
      }                                                                                         \
      const v16 s = Reduce4x16(a0, a1, a2, a3);                                                 \
      for (int t = 0; t < 4; ++t) out[size_t(j + t) * ld + i] = s[4 * t];                      \
    }                                                                                           \
    for (; j < group; ++j) {                                                                    \
      const float* qj = q + size_t(j) * dim;                                                    \
      v16 a = v16{};                                                                            \
      int d = 0;                                                                                \
      for (; d + 16 <= dim; d += 16) a = Fma16<LV>(Load16(qj + d), LOAD(row + d), a);           \
      if (d < dim) a = Fma16<LV>(LoadTail(qj + d, dim - d), WidenTail(row + d, dim - d), a);    \
      out[size_t(j) * ld + i] = Reduce16(a);                                                    \
    }                                                                                           \
  }

KVD_INLINE v16 LoadTail(const float* p, int m) {
  v16 v = v16{};
  for (int t = 0; t < m; ++t) v[t] = p[t];
  return v;
}
KVD_INLINE v16 WidenTail(const float* p, int m) { return LoadTail(p, m); }
KVD_INLINE v16 WidenTail(const uint16_t* p, int m) {  // f16 or bf16 by the caller's Elem: see below
  v16 v = v16{};
  for (int t = 0; t < m; ++t) v[t] = F16ToF32(p[t]);
  return v;
}
struct Bf16Bits {
  uint16_t bits;
};
KVD_INLINE v16 WidenTail(const Bf16Bits* p, int m) {
  v16 v = v16{};
  for (int t = 0; t < m; ++t) {
    uint32_t u = uint32_t(p[t].bits) << 16;
    std::memcpy(&v[0] + t, &u, 4);
  }
  return v;
}

#define KVD_SCORE_KEY_ROWS_BODY(LV)                                                             \
  constexpr size_t kAhead = 16;                                                                 \
  const int dim = keys.dim;                                                                     \
  const size_t rowBytes = size_t(dim) * DtypeSize(keys.dtype);                                  \
  if (keys.dtype == Dtype::F32) {                                                               \
    using Elem = float;                                                                         \
    KVD_KEY_ROW_DOTS(LV, Load16)                                                                \
  } else if (keys.dtype == Dtype::F16) {                                                        \
    using Elem = uint16_t;                                                                      \
    KVD_KEY_ROW_DOTS(LV, LoadH16<LV>)                                                           \
  } else {                                                                                      \
    using Elem = Bf16Bits;                                                                      \
    KVD_KEY_ROW_DOTS(LV, LoadBf16Elem)                                                          \
  }

KVD_INLINE v16 LoadBf16Elem(const Bf16Bits* p) { return LoadBf16(&p->bits); }

// e^x for x <= 0 (Cephes expf: range reduction by ln 2 in two parts, degree-5 polynomial), inputs
// below -87 clamped there (e^-87 ~ 1.6e-38, still normal). Element-wise vector arithmetic only, so
// every level gives the same bits. Relative error ~2 ulp.
KVD_INLINE v16 ExpNeg(v16 x) {
  const v16 lo = v16{} - 87.f;
  x = x < lo ? lo : x;
  v16 t = x * 1.44269504088896341f + 0.5f;
  v16i n = __builtin_convertvector(t, v16i);  // truncation; floor for negative t below
  v16 fn = __builtin_convertvector(n, v16);
  n += fn > t ? v16i{} - 1 : v16i{};  // vector compare: -1 where true
  fn = __builtin_convertvector(n, v16);
  x = x - fn * 0.693359375f;
  x = x - fn * -2.12194440e-4f;
  const v16 z = x * x;
  v16 y = x * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.f;
  v16i e = (n + 127) << 23;
  v16 scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return y * scale;
}

KVD_INLINE float ReduceMax16(v16 a) {
  v16 b = __builtin_shuffle(a, v16i{8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15});
  a = a > b ? a : b;
  b = __builtin_shuffle(a, v16i{4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7});
  a = a > b ? a : b;
  b = __builtin_shuffle(a, v16i{2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3});
  a = a > b ? a : b;
  b = __builtin_shuffle(a, v16i{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  a = a > b ? a : b;
  return a[0];
}

// See GroupShares in index.h.
KVD_INLINE int64_t GroupSharesBody(float* logits, int group, size_t n, size_t ld, size_t nShare, float scale,
                                   float* share) {
  float invStack[64];  // 1 / z per query head
  std::vector<float> invHeap(group > 64 ? size_t(group) : 0);
  float* inv = group > 64 ? invHeap.data() : invStack;
  const size_t full = n / 16 * 16;  // whole blocks; the partial block [full, n) is handled per lane
  for (int j = 0; j < group; ++j) {
    float* l = logits + size_t(j) * ld;
    // The max of the raw logits: scale > 0 and rounding is monotonic, so scale * max is the max of
    // the scaled logits. x * 0 is NaN exactly where x is NaN or +-Inf, so `nan` stays 0 (not NaN)
    // while every logit is finite.
    v16 mx = v16{} - std::numeric_limits<float>::infinity();
    v16 nan = v16{};
    for (size_t b = 0; b < full; b += 16) {
      const v16 x = Load16(l + b);
      nan += x * 0.f;
      mx = x > mx ? x : mx;
    }
    float m = ReduceMax16(mx);
    const int64_t bad = FinishRowMax(l, full, n, m, Reduce16(nan));
    if (bad >= 0) return int64_t(j) * int64_t(ld) + bad;
    m *= scale;
    v16 z = v16{};
    for (size_t b = 0; b < full; b += 16) {
      const v16 e = ExpNeg(Load16(l + b) * scale - m);
      z += e;
      std::memcpy(l + b, &e, sizeof(e));
    }
    if (full < ld) {
      v16 e = ExpNeg(Load16(l + full) * scale - m);
      for (size_t t = n - full; t < 16; ++t) e[t] = 0.f;
      z += e;
      std::memcpy(l + full, &e, sizeof(e));
    }
    inv[j] = 1.f / Reduce16(z);
  }
  // share = sum over the group in head order, one pass.
  for (size_t b = 0; b < nShare; b += 16) {
    v16 s = Load16(logits + b) * inv[0];
    for (int j = 1; j < group; ++j) s = s + Load16(logits + size_t(j) * ld + b) * inv[j];
    std::memcpy(share + b, &s, sizeof(s));
  }
  return -1;
}

// Blocked nearest-centroid search. Centroids are transposed into tiles of 16 (ct: tiles x dim x 16,
// zero-padded); R points share every centroid load and 16 centroids every point load. Output
// (i, j) accumulates x_i[d] * c_j[d] sequentially over d, whatever R is, so every blocking gives
// the same bits. R = 8 keeps 8 independent add chains in flight (AVX-512 has the registers).
template <int R>
KVD_INLINE void NearestBody(const float* x, const float* xnorm, size_t n, const float* ct, const float* cnorm,
                            size_t k, int dim, int32_t* best, float* dist) {
  const size_t tiles = (k + 15) / 16;
  for (size_t i0 = 0; i0 < n; i0 += R) {
    const float* xr[R];
    for (int r = 0; r < R; ++r) xr[r] = x + (i0 + r < n ? i0 + r : i0) * size_t(dim);
    float bestv[R];
    int32_t besti[R];
    for (int r = 0; r < R; ++r) bestv[r] = std::numeric_limits<float>::infinity(), besti[r] = 0;
    for (size_t t = 0; t < tiles; ++t) {
      const float* c = ct + t * size_t(dim) * 16;
      v16 a[R];
      for (int r = 0; r < R; ++r) a[r] = v16{};
      for (int d = 0; d < dim; ++d) {
        v16 cv = Load16(c + size_t(d) * 16);
        for (int r = 0; r < R; ++r) a[r] += cv * xr[r][d];
      }
      const size_t jn = k - t * 16 < 16 ? k - t * 16 : 16;
      for (int r = 0; r < R; ++r) {
        v16 s = Load16(cnorm + t * 16) - a[r] * 2.f;
        for (size_t l = 0; l < jn; ++l)
          if (s[l] < bestv[r]) {
            bestv[r] = s[l];
            besti[r] = int32_t(t * 16 + l);
          }
      }
    }
    for (int r = 0; r < R && i0 + r < n; ++r) {
      float dd = xnorm[i0 + r] + bestv[r];
      best[i0 + r] = besti[r];
      dist[i0 + r] = dd > 0.f ? dd : 0.f;
    }
  }
}

// ---- one instantiation per level ----

struct Table {
  float (*dot)(const float*, const float*, int);
  void (*dotsMany)(const float*, size_t, int, const float*, float*);
  void (*rowNorms)(const float*, size_t, int, float*);
  void (*scoreRowsMax)(const float*, int, const float*, size_t, int, float*, const float*, const float*);
  void (*scoreRowsMaxGather)(const float*, int, const float*, const int32_t*, size_t, int, float*, const float*,
                             const float*);
  void (*scoreMinMax)(const float*, int, const float*, const float*, size_t, int, float*);
  void (*scoreTilesMax)(const float*, int, const float*, size_t, int, float*, const float*, const float*);
  void (*nearest)(const float*, const float*, size_t, const float*, const float*, size_t, int, int32_t*, float*);
  void (*scoreKeyRows)(const float*, int, const KvView&, int, const int32_t*, size_t, float*, size_t);
  int64_t (*groupShares)(float*, int, size_t, size_t, size_t, float, float*);
};

#define KVD_INDEX_LEVEL(NAME, ATTR, ROWS, LV)                                                                           \
  ATTR float Dot##NAME(const float* a, const float* b, int dim) { return DotBody(a, b, dim); }                  \
  ATTR void DotsMany##NAME(const float* x, size_t n, int dim, const float* c, float* out) {                    \
    DotsManyBody(x, n, dim, c, out);                                                                            \
  }                                                                                                             \
  ATTR void RowNorms##NAME(const float* x, size_t n, int dim, float* out) { RowNormsBody(x, n, dim, out); }     \
  ATTR void ScoreRowsMax##NAME(const float* q, int g, const float* rows, size_t n, int dim, float* out,        \
                                const float* var, const float* coef) {                                         \
    ScoreRowsMaxBody(q, g, rows, n, dim, out, var, coef);                                                       \
  }                                                                                                             \
  ATTR void ScoreRowsMaxGather##NAME(const float* q, int g, const float* rows, const int32_t* ids, size_t n,   \
                                     int dim, float* out, const float* var, const float* coef) {               \
    ScoreRowsMaxGatherBody(q, g, rows, ids, n, dim, out, var, coef);                                            \
  }                                                                                                             \
  ATTR void ScoreMinMax##NAME(const float* q, int g, const float* mn, const float* mx, size_t n, int dim,      \
                              float* out) {                                                                    \
    ScoreMinMaxBody(q, g, mn, mx, n, dim, out);                                                                 \
  }                                                                                                             \
  ATTR void ScoreTilesMax##NAME(const float* q, int g, const float* ct, size_t k, int dim, float* out,         \
                                 const float* var, const float* coef) {                                        \
    ScoreTilesMaxBody(q, g, ct, k, dim, out, var, coef);                                                        \
  }                                                                                                             \
  ATTR void Nearest##NAME(const float* x, const float* xn, size_t n, const float* ct, const float* cn, size_t k, \
                          int dim, int32_t* best, float* dist) {                                               \
    NearestBody<ROWS>(x, xn, n, ct, cn, k, dim, best, dist);                                                    \
  }                                                                                                             \
  ATTR void ScoreKeyRows##NAME(const float* q, int group, const KvView& keys, int h, const int32_t* tokens,     \
                               size_t n, float* out, size_t ld) {                                              \
    KVD_SCORE_KEY_ROWS_BODY(LV)                                                                                 \
  }                                                                                                             \
  ATTR int64_t GroupShares##NAME(float* l, int group, size_t n, size_t ld, size_t nShare, float scale,         \
                                 float* share) {                                                               \
    return GroupSharesBody(l, group, n, ld, nShare, scale, share);                                              \
  }                                                                                                             \
  const Table k##NAME = {Dot##NAME, DotsMany##NAME, RowNorms##NAME, ScoreRowsMax##NAME, ScoreRowsMaxGather##NAME, ScoreMinMax##NAME, ScoreTilesMax##NAME, \
                           Nearest##NAME, ScoreKeyRows##NAME, GroupShares##NAME};

KVD_INDEX_LEVEL(Scalar, , 4, 0)
// The AVX2 table: its own bodies (index_kernels_avx2.h: GCC's 256-bit lowering of the generic ones
// spilled lane by lane), with the same bits; only the f32 tile scoring, which benches and tests
// call and no select does, keeps the generic body.
__attribute__((target("avx2,f16c,fma"))) void ScoreTilesMaxAvx2(const float* q, int g, const float* ct, size_t k, int dim, float* out,
                                                               const float* var, const float* coef) {
  ScoreTilesMaxBody(q, g, ct, k, dim, out, var, coef);
}
void ScoreRowsMaxAvx2(const float* q, int g, const float* rows, size_t n, int dim, float* out, const float* var, const float* coef) {
  avx2::ScoreRowsMax(q, g, rows, nullptr, n, dim, out, var, coef);
}
const Table kAvx2 = {avx2::Dot,             avx2::DotsMany,    avx2::RowNorms,           ScoreRowsMaxAvx2,
                     avx2::ScoreRowsMax,    avx2::ScoreMinMax, ScoreTilesMaxAvx2,        avx2::Nearest,
                     avx2::ScoreKeyRows,    avx2::GroupShares};
KVD_INDEX_LEVEL(Avx512, __attribute__((target("avx512f"))), 8, 2)

SimdLevel CpuMax() {
  static const SimdLevel l = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return SimdLevel::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma"))
      return SimdLevel::Avx2;
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
void DotsFixed(const float* x, size_t n, int dim, const float* c, float* out) { Active().dotsMany(x, n, dim, c, out); }
void RowNormsFixed(const float* x, size_t n, int dim, float* out) { Active().rowNorms(x, n, dim, out); }

void ScoreRowsMax(const float* q, int group, const float* rows, size_t n, int dim, float* out, const float* var,
                  const float* coef) {
  Active().scoreRowsMax(q, group, rows, n, dim, out, var, coef);
}
void ScoreRowsMaxGather(const float* q, int group, const float* rows, const int32_t* ids, size_t n, int dim,
                        float* out, const float* var, const float* coef) {
  Active().scoreRowsMaxGather(q, group, rows, ids, n, dim, out, var, coef);
}
void ScoreMinMaxMax(const float* q, int group, const float* mn, const float* mx, size_t n, int dim, float* out) {
  Active().scoreMinMax(q, group, mn, mx, n, dim, out);
}

void ScoreKeyRows(const float* q, int group, const KvView& keys, int h, const int32_t* tokens, size_t n, float* out,
                  size_t ld) {
  Active().scoreKeyRows(q, group, keys, h, tokens, n, out, ld);
}
int64_t GroupShares(float* logits, int group, size_t n, size_t ld, size_t nShare, float scale, float* share) {
  return Active().groupShares(logits, group, n, ld, nShare, scale, share);
}

void TransposeTiles(const float* c, size_t k, int dim, float* ct) {
  const size_t tiles = (k + 15) / 16;
  std::fill(ct, ct + tiles * size_t(dim) * 16, 0.f);
  for (size_t j = 0; j < k; ++j)
    for (int d = 0; d < dim; ++d) ct[(j / 16) * size_t(dim) * 16 + size_t(d) * 16 + (j % 16)] = c[j * dim + d];
}

void UntransposeTiles(const float* ct, size_t k, int dim, float* c) {
  for (size_t j = 0; j < k; ++j)
    for (int d = 0; d < dim; ++d) c[j * dim + d] = ct[(j / 16) * size_t(dim) * 16 + size_t(d) * 16 + (j % 16)];
}

void ScoreTilesMax(const float* q, int group, const float* ct, size_t k, int dim, float* out, const float* var,
                   const float* coef) {
  Active().scoreTilesMax(q, group, ct, k, dim, out, var, coef);
}

bool CpuHasVnni512() {
  static const bool v = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
  }();
  return v;
}

void ScoreTilesMaxI8(const QueryI8& q, const int8_t* ct, const float* scales, size_t k, float* out, const float* var,
                     const float* coef, TileCodes codes) {
  switch (IndexKernelLevel()) {
    case SimdLevel::Avx512:
      // AVX-512F without VNNI: the AVX2 kernels.
      if (CpuHasVnni512()) return ScoreTilesVnni<false>(q, reinterpret_cast<const uint8_t*>(ct), scales, k, out, var, coef);
      [[fallthrough]];
    case SimdLevel::Avx2:
      if (codes == TileCodes::kSevenBit) return avx2::ScoreTilesI8Codes7(q, ct, scales, k, out, var, coef);
      if (codes == TileCodes::kCheck && avx2::ScoreTilesI8Codes7Checked(q, ct, scales, k, out, var, coef)) return;
      return avx2::ScoreTilesI8(q, ct, scales, k, out, var, coef);
    default: return ScoreTilesI8(q, ct, scales, k, out, var, coef);
  }
}

void ScoreTilesMax4(const QueryI8& q, const uint8_t* ct, const float* scales, size_t k, float* out, const float* var,
                    const float* coef) {
  switch (IndexKernelLevel()) {
    case SimdLevel::Avx512:
      if (CpuHasVnni512()) return ScoreTilesVnni<true>(q, ct, scales, k, out, var, coef);
      [[fallthrough]];  // AVX-512F without VNNI: the AVX2 kernel
    case SimdLevel::Avx2: return avx2::ScoreTiles4(q, ct, scales, k, out, var, coef);
    default: return ScoreTiles4(q, ct, scales, k, out, var, coef);
  }
}

namespace {
// One centroid's codes (QuantizeCodes with `levels`, its scale written to *scale), in a scratch row
// on the stack up to 4096 dims, on the heap beyond: what the tile writers lay out lane by lane.
class CentroidCodes {
 public:
  CentroidCodes(const float* centroid, int dim, float levels, float* scale) : big_(dim > 4096 ? size_t(dim) : 0) {
    row_ = dim > 4096 ? big_.data() : small_;
    QuantizeCodes(centroid, nullptr, dim, levels, row_, scale);
  }
  CentroidCodes(const CentroidCodes&) = delete;
  CentroidCodes& operator=(const CentroidCodes&) = delete;
  int8_t operator[](int d) const { return row_[d]; }

 private:
  int8_t small_[4096];
  std::vector<int8_t> big_;
  int8_t* row_;
};

// Byte of lane l, dim d inside a tile (see TileBytesI8).
inline size_t TileByteI8(size_t l, int d) { return size_t(d / 4) * 64 + l * 4 + size_t(d % 4); }
}  // namespace

void QuantizeTilesI8(const float* c, size_t k, int dim, int8_t* ct, float* scales, float levels) {
  std::fill(ct, ct + TileBytesI8(k, dim), int8_t(0));
  std::fill(scales, scales + TileScalesI8(k), 0.f);
  for (size_t j = 0; j < k; ++j) SetTileI8(c + j * size_t(dim), j, dim, ct, scales, levels);
}

void SetTileI8(const float* centroid, size_t j, int dim, int8_t* ct, float* scales, float levels) {
  int8_t* tile = ct + (j / 16) * 16 * size_t(Dim4(dim));
  // Dims of one lane are contiguous in groups of 4: write them through a scratch row.
  const CentroidCodes row(centroid, dim, levels, &scales[j]);
  for (int d = 0; d < dim; ++d) tile[TileByteI8(j % 16, d)] = row[d];
}

void DequantizeTilesI8(const int8_t* ct, const float* scales, size_t k, int dim, float* c) {
  for (size_t j = 0; j < k; ++j) {
    const int8_t* tile = ct + (j / 16) * 16 * size_t(Dim4(dim));
    for (int d = 0; d < dim; ++d) c[j * size_t(dim) + d] = float(tile[TileByteI8(j % 16, d)]) * scales[j];
  }
}

namespace {
// Byte of lane l, dim d inside a 4-bit tile, and whether d is in its high nibble (see TileBytes4).
inline size_t TileByte4(size_t l, int d) { return size_t(d / 8) * 64 + l * 4 + size_t(d % 4); }
inline bool HighNibble4(int d) { return (d / 4) % 2 == 1; }
}  // namespace

void QuantizeTiles4(const float* c, size_t k, int dim, uint8_t* ct, float* scales) {
  std::fill(ct, ct + TileBytes4(k, dim), uint8_t(0x88));  // code 0 in both nibbles
  std::fill(scales, scales + TileScalesI8(k), 0.f);
  for (size_t j = 0; j < k; ++j) SetTile4(c + j * size_t(dim), j, dim, ct, scales);
}

void SetTile4(const float* centroid, size_t j, int dim, uint8_t* ct, float* scales) {
  uint8_t* tile = ct + (j / 16) * TileBlocks4(dim) * 64;
  const CentroidCodes row(centroid, dim, kCentroidLevels4, &scales[j]);
  for (int d = 0; d < dim; ++d) {
    uint8_t& b = tile[TileByte4(j % 16, d)];
    const uint8_t u = uint8_t(row[d] + 8);
    b = HighNibble4(d) ? uint8_t((b & 0x0f) | (u << 4)) : uint8_t((b & 0xf0) | u);
  }
}

void DequantizeTiles4(const uint8_t* ct, const float* scales, size_t k, int dim, float* c) {
  for (size_t j = 0; j < k; ++j) {
    const uint8_t* tile = ct + (j / 16) * TileBlocks4(dim) * 64;
    for (int d = 0; d < dim; ++d) {
      const uint8_t b = tile[TileByte4(j % 16, d)];
      c[j * size_t(dim) + d] = float(int(HighNibble4(d) ? b >> 4 : b & 15) - 8) * scales[j];
    }
  }
}

void QuantizeQueryI8(const float* q, int group, int dim, QueryI8& out) {
  const int dim4 = Dim4(dim), quads = dim4 / 4;
  out.group = group;
  out.dim4 = dim4;
  out.q.assign(size_t(group) * dim4, 0);
  out.scale.resize(size_t(group));
  out.sum.assign(size_t(group), 0);
  out.pat8.resize(size_t(group) * quads);
  out.pat16.resize(size_t(group) * quads);
  for (int j = 0; j < group; ++j) {
    int8_t* qj = out.q.data() + size_t(j) * dim4;
    QuantizeCodes(q + size_t(j) * dim, nullptr, dim, 127.f, qj, &out.scale[j]);
    for (int d = 0; d < dim4; ++d) out.sum[j] += qj[d];
    for (int p = 0; p < quads; ++p) {
      uint32_t w8 = 0;
      uint64_t w16 = 0;
      for (int b = 0; b < 4; ++b) {
        w8 |= uint32_t(uint8_t(qj[4 * p + b])) << (8 * b);
        w16 |= uint64_t(uint16_t(int16_t(qj[4 * p + b]))) << (16 * b);
      }
      out.pat8[size_t(j) * quads + p] = int32_t(w8);
      out.pat16[size_t(j) * quads + p] = int64_t(w16);
    }
  }
}

void NearestCentroids(const float* x, const float* xnorm, size_t n, const float* c, const float* cnorm, size_t k,
                      int dim, int32_t* best, float* dist) {
  const size_t tiles = (k + 15) / 16;
  std::vector<float> ct(tiles * size_t(dim) * 16);
  TransposeTiles(c, k, dim, ct.data());
  // The kernel reads centroid norms 16 at a time: pad them (the padded lanes are never compared).
  std::vector<float> cn(tiles * 16, 0.f);
  std::copy(cnorm, cnorm + k, cn.begin());
  Active().nearest(x, xnorm, n, ct.data(), cn.data(), k, dim, best, dist);
}

}  // namespace kvd
