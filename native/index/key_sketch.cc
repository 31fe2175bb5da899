// Key sketch quantization and scoring (key_sketch.h). The scoring kernels (int8 and packed 4-bit)
// have AVX-512 (BW for int8, BW + VNNI for 4-bit), AVX2 and scalar bodies; all compute the same
// exact int32 dot products.
#include "index/key_sketch.h"

#include "common/huge_pages.h"

#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "common/dtype.h"
#include "index/index.h"

namespace kvd {
namespace {

bool HasF16c() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return ok;
}

// f16 -> f32 with F16C, 8 values per instruction (exact, like F16ToF32).
__attribute__((target("avx,f16c"))) void WidenF16(const uint16_t* r, int dim, float* out) {
  int d = 0;
  for (; d + 8 <= dim; d += 8)
    _mm256_storeu_ps(out + d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + d))));
  for (; d < dim; ++d) out[d] = F16ToF32(r[d]);
}

// Widens row t of kv head h to f32 (one dtype branch per row).
void LoadRow(const KvView& kv, int h, int64_t t, float* out) {
  const void* row = kv.Row(t, h);
  switch (kv.dtype) {
    case Dtype::F32: std::memcpy(out, row, size_t(kv.dim) * 4); break;
    case Dtype::F16: {
      const uint16_t* r = static_cast<const uint16_t*>(row);
      if (HasF16c()) {
        WidenF16(r, kv.dim, out);
        break;
      }
      for (int d = 0; d < kv.dim; ++d) out[d] = F16ToF32(r[d]);
      break;
    }
    case Dtype::BF16: {
      const uint16_t* r = static_cast<const uint16_t*>(row);
      for (int d = 0; d < kv.dim; ++d) out[d] = Bf16ToF32(r[d]);
      break;
    }
  }
}

}  // namespace

// Round to nearest even for |x| < 2^22 without a libm call per element (no -ffast-math here, so
// the compiler keeps the two operations).
inline float RoundNearest(float x) {
  constexpr float kMagic = 12582912.f;  // 1.5 * 2^23
  return x >= 0.f ? (x + kMagic) - kMagic : -((-x + kMagic) - kMagic);
}

namespace {

// QuantizeCodes' first pass over dims [d0, dim), scalar: *finite &= every k[d] finite; returns the
// larger of m and max_d |k[d] * invC[d]| (exact in any order).
inline float RowMaxFrom(const float* k, const float* invC, int d0, int dim, float m, bool* finite) {
  bool f = true;
  for (int d = d0; d < dim; ++d) {
    f &= std::isfinite(k[d]);
    m = std::max(m, std::fabs(k[d] * invC[d]));
  }
  *finite &= f;
  return m;
}

// QuantizeCodes' two passes on 8 lanes, for the AVX2 level: the same operations per element (two
// rounded multiplies, the round-to-even by the magic constant, the clamp), so the codes and the
// scale are the scalar loop's bits; the max is exact in any order. No "fma" in the target: GCC would
// fuse a multiply into the add after it. A dim tail below 8 runs the scalar expressions.
// RowMax: *finite &= every k[d] finite; returns max_d |k[d] * invC[d]|.
__attribute__((target("avx2"))) float RowMaxAvx2(const float* k, const float* invC, int dim, bool* finite) {
  const __m256 absMask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps(), ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  int d = 0;
  for (; d + 8 <= dim; d += 8) {
    const __m256 x = _mm256_loadu_ps(k + d);
    ok = _mm256_and_ps(ok, _mm256_cmp_ps(_mm256_sub_ps(x, x), _mm256_setzero_ps(), _CMP_EQ_OQ));  // x - x == 0: finite
    m = _mm256_max_ps(m, _mm256_and_ps(_mm256_mul_ps(x, _mm256_loadu_ps(invC + d)), absMask));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = 0.f;
  for (float v : lanes) r = std::max(r, v);
  *finite &= _mm256_movemask_ps(ok) == 0xff;
  return RowMaxFrom(k, invC, d, dim, r, finite);
}

inline int8_t QuantizeOne(float k, float invC, float inv, float levels) {
  const float x = RoundNearest(k * invC * inv);
  return int8_t(std::max(-levels, std::min(levels, x)));
}

__attribute__((target("avx2"))) void QuantizeRowAvx2(const float* k, const float* invC, int dim, float inv, float levels,
                                                     int8_t* codes) {
  const __m256 magic = _mm256_set1_ps(12582912.f), vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(levels),
               lo = _mm256_set1_ps(-levels), zero = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.f);
  int d = 0;
  for (; d + 8 <= dim; d += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(k + d), _mm256_loadu_ps(invC + d)), vinv);
    // RoundNearest: x >= 0 ? (x + M) - M : -((-x + M) - M).
    const __m256 pos = _mm256_sub_ps(_mm256_add_ps(x, magic), magic);
    const __m256 neg = _mm256_xor_ps(_mm256_sub_ps(_mm256_add_ps(_mm256_xor_ps(x, sign), magic), magic), sign);
    __m256 r = _mm256_blendv_ps(neg, pos, _mm256_cmp_ps(x, zero, _CMP_GE_OQ));
    r = _mm256_max_ps(_mm256_min_ps(r, hi), lo);  // max(-L, min(L, r)), as std::min / std::max order them
    const __m256i i32 = _mm256_cvttps_epi32(r);
    const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + d), _mm_packs_epi16(i16, i16));
  }
  for (; d < dim; ++d) codes[d] = QuantizeOne(k[d], invC[d], inv, levels);
}

}  // namespace

// See key_sketch.h. A non-finite row is scored as NaN, so the re-rank reports the token
// (E_NONFINITE). The AVX2 passes run at every vector level (the index kernels' level, so tests can
// compare them with these scalar loops).
bool QuantizeCodes(const float* k, const float* invC, int dim, float levels, int8_t* codes, float* scale) {
  if (!invC) {
    // Unit channel scales (the index's centroid tiles and their queries).
    thread_local std::vector<float> ones;
    if (ones.size() < size_t(dim)) ones.assign(size_t(dim), 1.f);
    invC = ones.data();
  }
  const bool vec = IndexKernelLevel() != SimdLevel::Scalar;
  bool finite = true;
  const float m = vec ? RowMaxAvx2(k, invC, dim, &finite) : RowMaxFrom(k, invC, 0, dim, 0.f, &finite);
  if (!finite) {
    std::fill(codes, codes + dim, int8_t(0));
    *scale = NAN;
    return false;
  }
  const float s = m / levels;
  *scale = s;
  if (s == 0.f) {
    std::fill(codes, codes + dim, int8_t(0));
    return true;
  }
  const float inv = 1.f / s;
  if (vec) QuantizeRowAvx2(k, invC, dim, inv, levels, codes);
  else
    for (int d = 0; d < dim; ++d) codes[d] = QuantizeOne(k[d], invC[d], inv, levels);
  return true;
}

namespace {

// 4-bit blocks (key_sketch.h): dims [d0, d0 + n) with n = min(64, dim - d0) sit in ceil(n / 2)
// bytes from byte d0 / 2; byte i holds dim d0 + i (low nibble) and d0 + half + i (high).
inline int Block4(int dim, int d0, int& half) {
  const int n = std::min(64, dim - d0);
  half = (n + 1) / 2;
  return n;
}

// Packs int8 codes in [-7, 7] as u = code + 8 (8 = code 0 in the unused nibble of an odd block).
void PackCodes4(const int8_t* codes, int dim, uint8_t* out) {
  for (int d0 = 0; d0 < dim; d0 += 64) {
    int half;
    const int n = Block4(dim, d0, half);
    uint8_t* o = out + d0 / 2;
    for (int i = 0; i < half; ++i) {
      const int lo = codes[d0 + i] + 8;
      const int hi = half + i < n ? codes[d0 + half + i] + 8 : 8;
      o[i] = uint8_t(lo | (hi << 4));
    }
  }
}

// sum_d q[d] * u[d] over the 4-bit block at d0 (scalar; the vector kernels' tail and reference).
inline int32_t DotBlock4(const int16_t* q, const uint8_t* r, int dim, int d0) {
  int half;
  const int n = Block4(dim, d0, half);
  const uint8_t* b = r + d0 / 2;
  int32_t acc = 0;
  for (int i = 0; i < half; ++i) {
    acc += int32_t(q[d0 + i]) * int32_t(b[i] & 15);
    if (half + i < n) acc += int32_t(q[d0 + half + i]) * int32_t(b[i] >> 4);
  }
  return acc;
}

// Largest |q16| such that dim * |q16| * (largest code magnitude: 127, or 15 for the unsigned 4-bit
// u) fits in int32, capped at int16 (8 bits) or int8 (4 bits: the VNNI kernel multiplies bytes; a
// query rounded to 127 levels adds at most 1/254 of max |q c| per channel, against the 4-bit key's
// 1/14 of its row scale).
int QueryLevels(int dim, int bits) {
  const int64_t lv = int64_t(INT32_MAX) / (int64_t(dim) * (bits == 4 ? 15 : 127));
  return int(std::max<int64_t>(1, std::min<int64_t>(bits == 4 ? 127 : 32767, lv)));
}

void ScoreScalar(const int16_t* q, int group, int dim, const int8_t* codes, const int32_t* rows, size_t n,
                 int32_t* dots, size_t ld) {
  for (size_t i = 0; i < n; ++i) {
    const int8_t* r = codes + size_t(rows[i]) * size_t(dim);
    for (int j = 0; j < group; ++j) {
      const int16_t* qj = q + size_t(j) * dim;
      int32_t acc = 0;
      for (int d = 0; d < dim; ++d) acc += int32_t(qj[d]) * int32_t(r[d]);
      dots[size_t(j) * ld + i] = acc;
    }
  }
}

// Rows prefetched ahead. The re-rank reads runs of rows (a cluster's chunks, slot order) scattered
// over the sketch, too short for the hardware prefetcher to pick up; 32 rows hid more DRAM latency
// than 8 did, and once the 4-bit kernel scored a row in a few VNNI instructions 128 rows (8 KiB at
// 4 bits) ahead cut its share of a 128K select from ~34% to ~27% (perf, same run conditions).
constexpr size_t kAhead = 128;

// The kernels visit the rows as kStreams interleaved streams: with qn = n / kStreams, position k
// (k < kStreams x qn) is row (k % kStreams) x qn + k / kStreams, the rest in order. Consecutive
// rows mostly share a run (~11 rows of 64 B at 4 bits on the demo workload), so in row order the
// loads in flight hit one run — one DRAM / TLB miss at a time, ~23 ns per row cold even with the
// prefetch; four streams put four runs' misses in flight: select CPU -20% in decode mode
// (bench/select-ab.ts, figures in bench/index.md). 8 or 16 streams were slower than 4 (measured on
// the kernel alone in a throwaway harness, not kept). Each dot product is independent,
// so the order changes no value. Each stream prefetches kAhead / kStreams rows ahead of itself.
constexpr size_t kStreams = 4;
inline size_t StreamRow(size_t k, size_t qn) { return k < kStreams * qn ? (k % kStreams) * qn + k / kStreams : k; }
// The row to prefetch while visiting position k (n if none): the same stream's row kAhead /
// kStreams on, or kAhead on in the in-order rest.
inline size_t StreamAhead(size_t k, size_t qn, size_t n) {
  if (k < kStreams * qn) {
    const size_t i = k / kStreams + kAhead / kStreams;
    return i < qn ? (k % kStreams) * qn + i : n;
  }
  return k + kAhead < n ? k + kAhead : n;
}

__attribute__((target("avx2"))) int32_t Hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// One body for both vector levels (a macro, so each level's intrinsics sit in its own target
// function): each row's codes are widened to int16 once and multiplied into four query heads'
// int32 accumulators (madd: pairs of int16 products), then reduced; a dim tail runs scalar.
// W: int16 lanes per vector; VEC / ZERO / LOADC (W codes widened) / LOADQ / MADD_ADD / HSUM.
#define KVD_SKETCH_SCORE_BODY(W, VEC, ZERO, LOADC, LOADQ, MADD_ADD, HSUM)                       \
  const int full = dim / (W) * (W);                                                            \
  const size_t qn = n / kStreams;                                                              \
  for (size_t k = 0; k < n; ++k) {                                                             \
    const size_t i = StreamRow(k, qn), ahead = StreamAhead(k, qn, n);                          \
    if (ahead < n) {                                                                           \
      const char* p = reinterpret_cast<const char*>(codes + size_t(rows[ahead]) * size_t(dim)); \
      for (int b = 0; b < dim; b += 64) __builtin_prefetch(p + b);                             \
    }                                                                                          \
    const int8_t* r = codes + size_t(rows[i]) * size_t(dim);                                 \
    for (int j0 = 0; j0 < group; j0 += 4) {                                                    \
      const int nj = std::min(4, group - j0);                                                  \
      VEC acc[4] = {ZERO, ZERO, ZERO, ZERO};                                                   \
      for (int d = 0; d < full; d += (W)) {                                                    \
        const VEC c = LOADC(r + d);                                                            \
        for (int t = 0; t < nj; ++t) acc[t] = MADD_ADD(acc[t], c, LOADQ(q + size_t(j0 + t) * dim + d)); \
      }                                                                                        \
      for (int t = 0; t < nj; ++t) {                                                           \
        int32_t s = HSUM(acc[t]);                                                              \
        const int16_t* qj = q + size_t(j0 + t) * dim;                                          \
        for (int d = full; d < dim; ++d) s += int32_t(qj[d]) * int32_t(r[d]);                  \
        dots[size_t(j0 + t) * ld + i] = s;                                                     \
      }                                                                                        \
    }                                                                                          \
  }

#define KVD_LOADC2(p) _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
#define KVD_LOADQ2(p) _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
#define KVD_MADD2(a, c, qv) _mm256_add_epi32(a, _mm256_madd_epi16(c, qv))
__attribute__((target("avx2"))) void ScoreAvx2(const int16_t* q, int group, int dim, const int8_t* codes,
                                               const int32_t* rows, size_t n, int32_t* dots, size_t ld) {
  KVD_SKETCH_SCORE_BODY(16, __m256i, _mm256_setzero_si256(), KVD_LOADC2, KVD_LOADQ2, KVD_MADD2, Hsum8)
}

#define KVD_LOADC5(p) _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))
#define KVD_LOADQ5(p) _mm512_loadu_si512(p)
#define KVD_MADD5(a, c, qv) _mm512_add_epi32(a, _mm512_madd_epi16(c, qv))
__attribute__((target("avx512f,avx512bw"))) void ScoreAvx512(const int16_t* q, int group, int dim, const int8_t* codes,
                                                             const int32_t* rows, size_t n, int32_t* dots, size_t ld) {
  KVD_SKETCH_SCORE_BODY(32, __m512i, _mm512_setzero_si512(), KVD_LOADC5, KVD_LOADQ5, KVD_MADD5, _mm512_reduce_add_epi32)
}

// 4-bit: dots[j * ld + i] = sum_d q_j[d] * u_{rows[i]}[d] (unsigned codes; ScoreSketchRows
// subtracts the offset). Full 64-dim blocks unpack into two runs of consecutive dims (key_sketch.h);
// a last block of fewer dims runs scalar.
void Score4Scalar(const int16_t* q, int group, int dim, const uint8_t* codes, const int32_t* rows, size_t n,
                  int32_t* dots, size_t ld) {
  const size_t rb = size_t(KeySketch::RowBytes(dim, 4));
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* r = codes + size_t(rows[i]) * rb;
    for (int j = 0; j < group; ++j) {
      const int16_t* qj = q + size_t(j) * dim;
      int32_t acc = 0;
      for (int d0 = 0; d0 < dim; d0 += 64) acc += DotBlock4(qj, r, dim, d0);
      dots[size_t(j) * ld + i] = acc;
    }
  }
}

// AVX2, 4 bits: vpmaddubsw multiplies 32 unsigned codes by 32 int8 query values and adds each
// pair into an int16 lane (at most 2 x 15 x 127 = 3810 in magnitude: exact, it never saturates).
// One 32-byte load is a whole 64-dim block: its low nibbles are dims d0..d0+31 and its high ones
// d0+32..d0+63 (key_sketch.h), so the query is used in plain dim order (SketchQuery::q8Dims) and
// nothing is shuffled. Up to four blocks' products add up in int16 (4 x 7620 < 32767) before
// vpmaddwd by ones widens them into int32 lanes; the four heads' lanes of a row are then summed
// together (three vphaddd and one 128-bit add) instead of one horizontal sum each. Integer adds
// throughout, so the dots equal the scalar body's exactly.
// (The earlier AVX2 body widened the nibbles to int16 first; this one is 1.5-2x faster per row in
// `index-levels.bench.js`'s "sketch rows", bench/RESULTS.md, "An AVX2-only CPU".)
// always_inline: GCC kept it a call per row, each paying the call, a vzeroupper and the loop setup
// around ~20 vector instructions of work (bench/RESULTS.md, "The 4-bit re-rank's row kernel
// inlined").
template <int NJ>
__attribute__((target("avx2"), always_inline)) inline void Row4Avx2(const int8_t* q8, int full, const uint8_t* r, __m256i mask, __m256i ones,
                                                     int32_t* out, size_t ld) {
  __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  for (int s0 = 0; s0 < full; s0 += 256) {
    const int s1 = std::min(full, s0 + 256);
    __m256i p[NJ];
    for (int u = 0; u < NJ; ++u) p[u] = _mm256_setzero_si256();
    for (int d0 = s0; d0 < s1; d0 += 64) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + d0 / 2));
      const __m256i lo = _mm256_and_si256(b, mask);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
      for (int u = 0; u < NJ; ++u) {
        const int8_t* qj = q8 + size_t(u) * full + d0;
        const __m256i a = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qj)));
        const __m256i c = _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qj + 32)));
        p[u] = _mm256_add_epi16(p[u], _mm256_add_epi16(a, c));
      }
    }
    for (int u = 0; u < NJ; ++u) acc[u] = _mm256_add_epi32(acc[u], _mm256_madd_epi16(p[u], ones));
  }
  // Lane u of the 128-bit sum: head u's dot (acc[u] past NJ stays zero).
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0], acc[1]), _mm256_hadd_epi32(acc[2], acc[3]));
  alignas(16) int32_t sums[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(sums), _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
  for (int u = 0; u < NJ; ++u) out[size_t(u) * ld] = sums[u];
}

// Position k of the 4-bit bodies' stream order (StreamRow): its row index (*i) and code bytes, rb
// bytes per row; the row kAhead / kStreams on in the same stream is prefetched first.
inline const uint8_t* VisitRow4(const uint8_t* codes, const int32_t* rows, size_t rb, size_t k, size_t qn, size_t n, size_t* i) {
  const size_t ahead = StreamAhead(k, qn, n);
  if (ahead < n) {
    const char* p = reinterpret_cast<const char*>(codes + size_t(rows[ahead]) * rb);
    for (size_t b = 0; b < rb; b += 64) __builtin_prefetch(p + b);
  }
  *i = StreamRow(k, qn);
  return codes + size_t(rows[*i]) * rb;
}

// The common shape of Score4Avx2: whole groups of four query heads and a head dim of KB whole
// 64-dim blocks (KB <= 4: the int16 partial sums of one head's row then never saturate, see
// Row4Avx2). With the block count known at compile time the row's nibbles are unpacked once into
// 2 x KB registers and reused by every head, and the per-row loops and switch of the general body
// are gone: 16-17 ns per row instead of 33-37 on a Zen 3 core with the rows in cache, 20-25 instead
// of 38-49 cold (runs of 16 rows, a throwaway harness; the dots are the same integers).
template <int KB>
__attribute__((target("avx2"))) void Score4Avx2Blocks(const int8_t* q8, int group, const uint8_t* codes, const int32_t* rows, size_t n,
                                                      int32_t* dots, size_t ld) {
  static_assert(KB >= 1 && KB <= 4, "int16 partial sums hold at most four 64-dim blocks");
  constexpr size_t rb = size_t(KB) * 32;
  constexpr int full = KB * 64;
  const __m256i mask = _mm256_set1_epi8(15);
  const __m256i ones = _mm256_set1_epi16(1);
  const size_t qn = n / kStreams;
  for (size_t k = 0; k < n; ++k) {
    size_t i;
    const uint8_t* r = VisitRow4(codes, rows, rb, k, qn, n, &i);
    __m256i lo[KB], hi[KB];
    for (int blk = 0; blk < KB; ++blk) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + blk * 32));
      lo[blk] = _mm256_and_si256(b, mask);
      hi[blk] = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
    }
    for (int j0 = 0; j0 < group; j0 += 4) {
      __m256i acc[4];
      for (int u = 0; u < 4; ++u) {
        const int8_t* qj = q8 + size_t(j0 + u) * full;
        __m256i p = _mm256_setzero_si256();
        for (int blk = 0; blk < KB; ++blk) {
          const __m256i a = _mm256_maddubs_epi16(lo[blk], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qj + blk * 64)));
          const __m256i c = _mm256_maddubs_epi16(hi[blk], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qj + blk * 64 + 32)));
          p = _mm256_add_epi16(p, _mm256_add_epi16(a, c));
        }
        acc[u] = _mm256_madd_epi16(p, ones);
      }
      // Lane u of the 128-bit sum: head j0 + u's dot.
      const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0], acc[1]), _mm256_hadd_epi32(acc[2], acc[3]));
      const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
      int32_t* o = dots + size_t(j0) * ld + i;
      o[0] = _mm_cvtsi128_si32(s);
      o[ld] = _mm_extract_epi32(s, 1);
      o[2 * ld] = _mm_extract_epi32(s, 2);
      o[3 * ld] = _mm_extract_epi32(s, 3);
    }
  }
}

// Rows in kStreams interleaved streams (as the int8 body), each prefetching ahead; four query
// heads per pass; a last block of fewer than 64 dims runs scalar. Whole groups of four heads over
// 64 to 256 dims in whole blocks run Score4Avx2Blocks.
__attribute__((target("avx2"))) void Score4Avx2(const int8_t* q8, const int16_t* q, int group, int dim, const uint8_t* codes,
                                                const int32_t* rows, size_t n, int32_t* dots, size_t ld) {
  if (group % 4 == 0 && dim % 64 == 0) {
    switch (dim / 64) {
      case 1: return Score4Avx2Blocks<1>(q8, group, codes, rows, n, dots, ld);
      case 2: return Score4Avx2Blocks<2>(q8, group, codes, rows, n, dots, ld);
      case 3: return Score4Avx2Blocks<3>(q8, group, codes, rows, n, dots, ld);
      case 4: return Score4Avx2Blocks<4>(q8, group, codes, rows, n, dots, ld);
      default: break;
    }
  }
  const __m256i mask = _mm256_set1_epi8(15);
  const __m256i ones = _mm256_set1_epi16(1);
  const size_t rb = size_t(KeySketch::RowBytes(dim, 4));
  const int full = dim / 64 * 64;
  const size_t qn = n / kStreams;
  for (size_t k = 0; k < n; ++k) {
    size_t i;
    const uint8_t* r = VisitRow4(codes, rows, rb, k, qn, n, &i);
    for (int j0 = 0; j0 < group; j0 += 4) {
      const int8_t* qj = q8 + size_t(j0) * full;
      int32_t* o = dots + size_t(j0) * ld + i;
      switch (std::min(4, group - j0)) {
        case 4: Row4Avx2<4>(qj, full, r, mask, ones, o, ld); break;
        case 3: Row4Avx2<3>(qj, full, r, mask, ones, o, ld); break;
        case 2: Row4Avx2<2>(qj, full, r, mask, ones, o, ld); break;
        default: Row4Avx2<1>(qj, full, r, mask, ones, o, ld); break;
      }
      if (full < dim)
        for (int j = j0; j < std::min(group, j0 + 4); ++j) dots[size_t(j) * ld + i] += DotBlock4(q + size_t(j) * dim, r, dim, full);
    }
  }
}

// Sums of 4 x 4 vectors at once: x[u][t] (head u, row t) -> lane 4u + t of the result. Integer
// adds, so the sums equal any other order's (the kernels stay bit-identical).
__attribute__((target("avx512f,avx512bw"))) inline __m512i Reduce4x4(const __m512i (&x)[4][4]) {
  __m512i h[4];
  for (int u = 0; u < 4; ++u) {
    // Per 128-bit lane k: [a, b, c, d] partial sums of rows 0..3 over lane k's dims.
    const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(x[u][0], x[u][1]), _mm512_unpackhi_epi32(x[u][0], x[u][1]));
    const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(x[u][2], x[u][3]), _mm512_unpackhi_epi32(x[u][2], x[u][3]));
    h[u] = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  }
  // Sum the four 128-bit lanes of each h[u] into 128-bit lane u of the result.
  const __m512i s01 = _mm512_add_epi32(_mm512_shuffle_i32x4(h[0], h[1], 0x44), _mm512_shuffle_i32x4(h[0], h[1], 0xee));
  const __m512i s23 = _mm512_add_epi32(_mm512_shuffle_i32x4(h[2], h[3], 0x44), _mm512_shuffle_i32x4(h[2], h[3], 0xee));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(s01, s23, 0x88), _mm512_shuffle_i32x4(s01, s23, 0xdd));
}

// AVX-512 VNNI, 4 bits: vpdpbusd multiplies 64 unsigned codes by 64 int8 query values and adds
// each 4 products into an int32 lane, so one 64-byte load (128 dims: two 64-dim blocks) is masked
// into its low and high nibbles and scored by two instructions per query head, no widening.
// q8 is the query in the kernel's order (SketchQuery::q8): per head, for each pair of full blocks
// 64 bytes matching the low nibbles (dims d0..d0+31, d0+64..d0+95) then 64 matching the high ones
// (d0+32..d0+63, d0+96..d0+127); a last single full block is its 64 dims in order (the load puts
// its low nibbles in the lower 256 bits, its high ones in the upper). The query values fit int8
// (QueryLevels), so the int32 sums equal the scalar body's exactly.
// Adds the full blocks of row r (dims [0, full)) times head qj's q8 into acc.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline __m512i Row4Vnni(__m512i acc, const uint8_t* r, const int8_t* qj,
                                                                                int full, __m512i mask) {
  int d0 = 0;
  for (; d0 + 128 <= full; d0 += 128) {
    const __m512i b = _mm512_loadu_si512(r + d0 / 2);
    acc = _mm512_dpbusd_epi32(acc, _mm512_and_si512(b, mask), _mm512_loadu_si512(qj + d0));
    acc = _mm512_dpbusd_epi32(acc, _mm512_and_si512(_mm512_srli_epi16(b, 4), mask), _mm512_loadu_si512(qj + d0 + 64));
  }
  if (d0 < full) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + d0 / 2));
    const __m256i m = _mm512_castsi512_si256(mask);
    const __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b, m)), _mm256_and_si256(_mm256_srli_epi16(b, 4), m), 1);
    acc = _mm512_dpbusd_epi32(acc, u, _mm512_loadu_si512(qj + d0));
  }
  return acc;
}

// One row at a time, every head of the group: what Score4Vnni's 4 x 4 blocks leave over (rb: bytes
// per row, full: the dims of whole 64-dim blocks, mask: 15 in every byte, all as there).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void Score4RowsVnni(const int8_t* q8, const int16_t* q, int group, int dim,
                                                                          size_t rb, int full, __m512i mask, const uint8_t* codes,
                                                                          const int32_t* rows, size_t n, int32_t* dots, size_t ld) {
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* r = codes + size_t(rows[i]) * rb;
    for (int j = 0; j < group; ++j) {
      const __m512i acc = Row4Vnni(_mm512_setzero_si512(), r, q8 + size_t(j) * full, full, mask);
      dots[size_t(j) * ld + i] = _mm512_reduce_add_epi32(acc) + (full < dim ? DotBlock4(q + size_t(j) * dim, r, dim, full) : 0);
    }
  }
}

// Where Tiles16Vnni does not apply (a head dim with a last single 64-dim block, a group with fewer
// than 4 heads or not a multiple of 4): blocks of 4 rows x 4 query heads share every code load and
// mask, and their 16 dot products are reduced together (Reduce4x4) rather than one horizontal sum each; the rows left over and a group
// not a multiple of 4 run the one-row body. Block b holds row b of each of the kStreams = 4 streams
// (rows b, qn + b, 2 qn + b, 3 qn + b: four runs' misses in flight, see kStreams), each stream
// prefetching kAhead / 4 rows ahead of itself.
// The blocks of Score4Vnni for rows at[0..3] (positions in rows / dots) of a head dim whose
// whole 64-dim blocks are `full` dims: pairs of blocks, then (kTail64) one more block. A template,
// so that the common dim of 128 has no tail code in its loop: with the tail path inside, the
// compiler spilled the 16 accumulators, and the kernel ran ~25% slower.
template <bool kTail64>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline void Blocks4Vnni(const int8_t* q8, int groupFull, int full, __m512i mask,
                                                                                const uint8_t* const* r, const size_t* at, int32_t* dots,
                                                                                size_t ld) {
  const int pairs = kTail64 ? full - 64 : full;
  for (int j0 = 0; j0 < groupFull; j0 += 4) {
    __m512i acc[4][4];
    for (int u = 0; u < 4; ++u)
      for (int t = 0; t < 4; ++t) acc[u][t] = _mm512_setzero_si512();
    for (int d0 = 0; d0 < pairs; d0 += 128) {
      __m512i ql[4], qh[4];
      for (int u = 0; u < 4; ++u) {
        const int8_t* qj = q8 + size_t(j0 + u) * full + d0;
        ql[u] = _mm512_loadu_si512(qj);
        qh[u] = _mm512_loadu_si512(qj + 64);
      }
      for (int t = 0; t < 4; ++t) {
        const __m512i c = _mm512_loadu_si512(r[t] + d0 / 2);
        const __m512i lo = _mm512_and_si512(c, mask);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), mask);
        for (int u = 0; u < 4; ++u) acc[u][t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[u][t], lo, ql[u]), hi, qh[u]);
      }
    }
    if (kTail64)
      for (int u = 0; u < 4; ++u)
        for (int t = 0; t < 4; ++t) acc[u][t] = Row4Vnni(acc[u][t], r[t] + pairs / 2, q8 + size_t(j0 + u) * full + pairs, 64, mask);
    const __m512i sums = Reduce4x4(acc);
    alignas(64) int32_t lane[16];
    _mm512_store_si512(lane, sums);
    for (int u = 0; u < 4; ++u) {
      int32_t* o = dots + size_t(j0 + u) * ld;
      for (int t = 0; t < 4; ++t) o[at[t]] = lane[4 * u + t];
    }
  }
}

// Transposes 16 rows of 16 dwords in place: afterwards x[d] holds dword d of row r in its lane r.
// Three rounds of 16 shuffles: dwords, then qwords within 128-bit lanes, then the 128-bit lanes.
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) inline void Transpose16x16(__m512i (&x)[16]) {
  __m512i a[16];
  for (int k = 0; k < 8; ++k) {
    a[2 * k] = _mm512_unpacklo_epi32(x[2 * k], x[2 * k + 1]);
    a[2 * k + 1] = _mm512_unpackhi_epi32(x[2 * k], x[2 * k + 1]);
  }
  // b[4k + c], 128-bit lane l: dword 4l + c of rows 4k..4k+3.
  __m512i b[16];
  for (int k = 0; k < 4; ++k) {
    b[4 * k] = _mm512_unpacklo_epi64(a[4 * k], a[4 * k + 2]);
    b[4 * k + 1] = _mm512_unpackhi_epi64(a[4 * k], a[4 * k + 2]);
    b[4 * k + 2] = _mm512_unpacklo_epi64(a[4 * k + 1], a[4 * k + 3]);
    b[4 * k + 3] = _mm512_unpackhi_epi64(a[4 * k + 1], a[4 * k + 3]);
  }
  // x[4l + c], lane m = b[4m + c], lane l: a 4 x 4 transpose of 128-bit lanes per c.
  for (int c = 0; c < 4; ++c) {
    const __m512i p0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44), p1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xee);
    const __m512i p2 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44), p3 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xee);
    x[c] = _mm512_shuffle_i32x4(p0, p2, 0x88);
    x[4 + c] = _mm512_shuffle_i32x4(p0, p2, 0xdd);
    x[8 + c] = _mm512_shuffle_i32x4(p1, p3, 0x88);
    x[12 + c] = _mm512_shuffle_i32x4(p1, p3, 0xdd);
  }
}

// Score4Vnni for head dims of whole 128-dim segments (64-byte row pieces) and groups of whole
// fours: tiles of 16 rows (4 consecutive positions of each of the kStreams streams) are transposed
// so that each dword lane holds one row, and the query is broadcast a dword (4 dims) at a time
// (qt, see ArrangeQueryTiles). A lane then accumulates its own row's dot product: no horizontal
// sums, 4 shuffles per row against Blocks4Vnni's ~7.5 for its reduction. The int32 sums are the
// same integers. Rows in cache (a throwaway harness over the sketchScores binding, 16K rows, which
// adds ~12 ns of its own per row): 24 -> 19 ns per row in order, 28 -> 21.5 in runs of 16; inside
// a decode-step select (rows from DRAM) the select's CPU fell by ~4.5% (bench/RESULTS.md).
// Tiles [0, nb) of streams of qn positions each.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void Tiles16Vnni(const int32_t* qt, int group, int segs, const uint8_t* codes,
                                                                       size_t rb, const int32_t* rows, size_t qn, size_t nb,
                                                                       int32_t* dots, size_t ld) {
  const __m512i mask = _mm512_set1_epi8(15);
  const size_t ahead = kAhead / 4;
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* rp[16];
    for (size_t t = 0; t < 4; ++t) {
      const int32_t* rt = rows + t * qn + 4 * b;
      if (4 * b + 4 + ahead <= qn)
        for (size_t r = 0; r < 4; ++r) {
          const char* p = reinterpret_cast<const char*>(codes + size_t(rt[r + ahead]) * rb);
          for (size_t o = 0; o < rb; o += 64) __builtin_prefetch(p + o);
        }
      for (size_t r = 0; r < 4; ++r) rp[4 * t + r] = codes + size_t(rt[r]) * rb;
    }
    for (int j0 = 0; j0 < group; j0 += 4) {
      __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
      for (int sg = 0; sg < segs; ++sg) {
        __m512i x[16];
        for (int i = 0; i < 16; ++i) x[i] = _mm512_loadu_si512(rp[i] + 64 * sg);
        Transpose16x16(x);
        for (int d = 0; d < 16; ++d) {
          const __m512i lo = _mm512_and_si512(x[d], mask);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x[d], 4), mask);
          for (int u = 0; u < 4; ++u) {
            const int32_t* qj = qt + (size_t(j0 + u) * size_t(segs) + size_t(sg)) * 32 + 2 * d;
            acc[u] = _mm512_dpbusd_epi32(acc[u], lo, _mm512_set1_epi32(qj[0]));
            acc[u] = _mm512_dpbusd_epi32(acc[u], hi, _mm512_set1_epi32(qj[1]));
          }
        }
      }
      // Lanes 4t..4t+3: stream t's positions 4b..4b+3.
      for (int u = 0; u < 4; ++u) {
        int32_t* o = dots + size_t(j0 + u) * ld + 4 * b;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm512_extracti32x4_epi32(acc[u], 0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + qn), _mm512_extracti32x4_epi32(acc[u], 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * qn), _mm512_extracti32x4_epi32(acc[u], 2));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 3 * qn), _mm512_extracti32x4_epi32(acc[u], 3));
      }
    }
  }
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void Score4Vnni(const int8_t* q8, const int16_t* q, int group, int dim,
                                                                      const uint8_t* codes, const int32_t* rows, size_t n,
                                                                      int32_t* dots, size_t ld, const int32_t* qt) {
  const __m512i mask = _mm512_set1_epi8(15);
  const size_t rb = size_t(KeySketch::RowBytes(dim, 4));
  const int full = dim / 64 * 64;
  const int groupFull = group / 4 * 4;
  static_assert(kStreams == 4, "a block takes one row of each stream");
  // Head dims of whole 128-dim segments and groups of whole fours (qt set): transposed tiles.
  if (qt) {
    const size_t qs = n / 4, nb = qs / 4;
    Tiles16Vnni(qt, group, dim / 128, codes, rb, rows, qs, nb, dots, ld);
    for (size_t t = 0; t < 4; ++t) {
      const size_t p0 = t * qs + 4 * nb;
      if (qs > 4 * nb) Score4RowsVnni(q8, q, group, dim, rb, full, mask, codes, rows + p0, qs - 4 * nb, dots + p0, ld);
    }
    if (4 * qs < n) Score4RowsVnni(q8, q, group, dim, rb, full, mask, codes, rows + 4 * qs, n - 4 * qs, dots + 4 * qs, ld);
    return;
  }
  // Blocks cover whole 64-dim blocks; a head dim with a partial last block takes the one-row body.
  const size_t qn = groupFull > 0 && full == dim ? n / 4 : 0;
  const bool tail64 = full % 128 != 0;
  const size_t ahead = kAhead / 4;
  for (size_t b = 0; b < qn; ++b) {
    size_t at[4];
    for (size_t t = 0; t < 4; ++t) at[t] = t * qn + b;
    if (b + ahead < qn)
      for (size_t t = 0; t < 4; ++t) {
        const char* p = reinterpret_cast<const char*>(codes + size_t(rows[at[t] + ahead]) * rb);
        for (size_t o = 0; o < rb; o += 64) __builtin_prefetch(p + o);
      }
    const uint8_t* r[4];
    for (int t = 0; t < 4; ++t) r[t] = codes + size_t(rows[at[t]]) * rb;
    if (tail64) Blocks4Vnni<true>(q8, groupFull, full, mask, r, at, dots, ld);
    else Blocks4Vnni<false>(q8, groupFull, full, mask, r, at, dots, ld);
  }
  // Rows after the streams (every row when the group has fewer than 4 heads), and the heads past
  // groupFull of the streamed rows.
  const size_t done = 4 * qn;
  if (done < n) Score4RowsVnni(q8, q, group, dim, rb, full, mask, codes, rows + done, n - done, dots + done, ld);
  if (groupFull < group && done > 0)
    Score4RowsVnni(q8 + size_t(groupFull) * full, q + size_t(groupFull) * dim, group - groupFull, dim, rb, full, mask, codes,
                   rows, done, dots + size_t(groupFull) * ld, ld);
}

// The query for Tiles16Vnni (head dims a multiple of 128, from the int16 query, values within int8):
// per head, per 128-dim segment, per dword d of the segment's 64 packed bytes, the 4 query values
// of that dword's low nibbles then the 4 of its high nibbles, each 4 as one int32 (byte i = byte i
// of the dword). Dword d covers bytes 4d..4d+3 of the segment: 64-dim block d / 8, block bytes
// 4(d % 8)..+3, i.e. dims (d / 8) 64 + 4(d % 8) + i (low) and 32 more (high).
void ArrangeQueryTiles(const int16_t* q, int group, int dim, std::vector<int32_t>& qt) {
  const int segs = dim / 128;
  qt.resize(size_t(group) * size_t(segs) * 32);
  for (int j = 0; j < group; ++j)
    for (int sg = 0; sg < segs; ++sg)
      for (int d = 0; d < 16; ++d) {
        const int16_t* base = q + size_t(j) * dim + sg * 128 + (d / 8) * 64 + 4 * (d % 8);
        uint8_t lo[4], hi[4];
        for (int i = 0; i < 4; ++i) {
          lo[i] = uint8_t(int8_t(base[i]));
          hi[i] = uint8_t(int8_t(base[32 + i]));
        }
        int32_t* o = qt.data() + (size_t(j) * size_t(segs) + size_t(sg)) * 32 + 2 * d;
        std::memcpy(o, lo, 4);
        std::memcpy(o + 1, hi, 4);
      }
}

// The 4-bit query in Score4Vnni's order (see there) from the int16 one (values within int8).
void ArrangeQuery8(const int16_t* q, int group, int dim, std::vector<int8_t>& q8) {
  const int full = dim / 64 * 64;
  q8.resize(size_t(group) * size_t(full));
  for (int j = 0; j < group; ++j) {
    const int16_t* qj = q + size_t(j) * dim;
    int8_t* o = q8.data() + size_t(j) * full;
    int d0 = 0;
    for (; d0 + 128 <= full; d0 += 128)
      for (int i = 0; i < 32; ++i) {
        o[d0 + i] = int8_t(qj[d0 + i]);            // low nibbles: block 0
        o[d0 + 32 + i] = int8_t(qj[d0 + 64 + i]);  // low nibbles: block 1
        o[d0 + 64 + i] = int8_t(qj[d0 + 32 + i]);  // high nibbles: block 0
        o[d0 + 96 + i] = int8_t(qj[d0 + 96 + i]);  // high nibbles: block 1
      }
    for (int d = d0; d < full; ++d) o[d] = int8_t(qj[d]);
  }
}

bool HasAvx512Bw() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }();
  return ok;
}

// The 4-bit AVX-512 kernel needs VNNI too (vpdpbusd); without it the AVX2 body runs.
bool HasAvx512Vnni() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return HasAvx512Bw() && __builtin_cpu_supports("avx512vnni");
  }();
  return ok;
}

}  // namespace

void CalibrateSketch(const KvView& kv, int h, int64_t tokens, KeySketch& s) {
  const int dim = kv.dim;
  s.dim = dim;
  s.channelScale.assign(size_t(dim), 0.f);
  std::vector<float> row(static_cast<size_t>(dim), 0.f);
  for (int64_t t = 0; t < tokens; ++t) {
    LoadRow(kv, h, t, row.data());
    for (int d = 0; d < dim; ++d)
      if (std::isfinite(row[d])) s.channelScale[d] = std::max(s.channelScale[d], std::fabs(row[d]));
  }
  for (float& c : s.channelScale)
    if (!(c > 0.f)) c = 1.f;
  s.calibratedAt = tokens;
  s.codes.clear();
  s.rowScale.clear();
  // Room for the context to double before extend() reallocates (growing by one row would otherwise
  // copy the whole sketch on the first decode step). Reserved pages are not touched until written:
  // address space, not memory.
  const size_t room = size_t(2 * tokens + 4096);
  s.codes.reserve(room * size_t(s.RowBytes()));
  s.rowScale.reserve(room);
  // The re-rank reads its candidates' rows at random over the whole sketch (8 MiB per kv head at
  // 128K, 4 bits): on 4 KiB pages nearly every run of rows was a TLB miss, a nested page walk in
  // a VM. 2 MiB pages took the DRAM-only decode step to 0.93-0.97x (bench/RESULTS.md). PageVector
  // starts a sketch this large on a 2 MiB boundary, so all of its written rows qualify.
  s.hugePageBytes = int64_t(AdviseHugePages(s.codes.data(), size_t(tokens) * size_t(s.RowBytes())));
  AppendSketch(kv, h, tokens, s);
}

void AppendSketch(const KvView& kv, int h, int64_t tokens, KeySketch& s, int64_t first) {
  const int64_t t0 = s.tokens();
  if (tokens <= t0) return;
  const int dim = s.dim;
  const size_t rb = size_t(s.RowBytes());
  const bool packed = s.bits == 4;
  s.codes.resize(size_t(tokens) * rb);
  s.rowScale.resize(size_t(tokens));
  std::vector<float> row(static_cast<size_t>(dim), 0.f), invC(static_cast<size_t>(dim), 0.f);
  std::vector<int8_t> codes(packed ? size_t(dim) : 0);
  for (int d = 0; d < dim; ++d) invC[d] = 1.f / s.channelScale[d];
  for (int64_t t = t0; t < tokens; ++t) {
    LoadRow(kv, h, t - first, row.data());  // kv holds tokens [first, first + kv.tokens), first <= t0
    int8_t* dst = s.codes.data() + size_t(t) * rb;
    QuantizeCodes(row.data(), invC.data(), dim, packed ? 7.f : 127.f, packed ? codes.data() : dst, &s.rowScale[size_t(t)]);
    if (packed) PackCodes4(codes.data(), dim, reinterpret_cast<uint8_t*>(dst));
  }
}

void PrepareSketchQuery(const float* q, int group, const KeySketch& s, SketchQuery& out) {
  const int dim = s.dim;
  const float levels = float(QueryLevels(dim, s.bits));
  out.q.resize(size_t(group) * size_t(dim));
  out.scale.resize(size_t(group));
  out.offset.assign(size_t(group), 0);
  for (int j = 0; j < group; ++j) {
    const float* qj = q + size_t(j) * dim;
    float m = 0.f;
    for (int d = 0; d < dim; ++d) m = std::max(m, std::fabs(qj[d] * s.channelScale[d]));
    const float qs = m > 0.f ? m / levels : 1.f;
    const float inv = 1.f / qs;
    out.scale[j] = qs;
    for (int d = 0; d < dim; ++d) {
      const float x = std::nearbyint(qj[d] * s.channelScale[d] * inv);
      out.q[size_t(j) * dim + d] = int16_t(std::max(-levels, std::min(levels, x)));
      if (s.bits == 4) out.offset[j] += 8 * int32_t(out.q[size_t(j) * dim + d]);
    }
  }
  if (s.bits == 4) {
    const SimdLevel level = IndexKernelLevel();
    using K = SketchQuery::Kernel4;
    out.kernel4 = level == SimdLevel::Avx512 && HasAvx512Vnni() ? K::Vnni : level != SimdLevel::Scalar ? K::Avx2 : K::Scalar;
    if (out.kernel4 == K::Vnni) {
      ArrangeQuery8(out.q.data(), group, dim, out.q8);
      if (dim % 128 == 0 && group % 4 == 0) ArrangeQueryTiles(out.q.data(), group, dim, out.qt);
      else out.qt.clear();
    } else if (out.kernel4 == K::Avx2) {
      const int full = dim / 64 * 64;
      out.q8.resize(size_t(group) * size_t(full));
      for (int j = 0; j < group; ++j)
        for (int d = 0; d < full; ++d) out.q8[size_t(j) * full + d] = int8_t(out.q[size_t(j) * dim + d]);
    }
  }
}

namespace {
typedef int32_t __attribute__((may_alias)) AliasedI32;  // ScoreSketchRows' dots share `out`'s memory

// o[i] = float(d[i] - off) * (qs * rs[i]) for i < n, in place (d is o's memory read as int32): the
// plain loop, and an AVX-512 one with the same operations per element (two rounded products, no
// fused multiply-add), so the logits are the same bits. The plain loop only gets SSE2 in this
// portable build, which left it ~a quarter of the sketch re-rank's epilogue.
void SketchLogits(float* o, size_t n, float qs, int32_t off, const float* rs) {
  const AliasedI32* d = reinterpret_cast<const AliasedI32*>(o);
  for (size_t i = 0; i < n; ++i) o[i] = float(d[i] - off) * (qs * rs[i]);
}
__attribute__((target("avx512f"))) void SketchLogitsAvx512(float* o, size_t n, float qs, int32_t off, const float* rs) {
  const AliasedI32* d = reinterpret_cast<const AliasedI32*>(o);
  const __m512i vo = _mm512_set1_epi32(off);
  const __m512 vq = _mm512_set1_ps(qs);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(d + i), vo));
    _mm512_storeu_ps(o + i, _mm512_mul_ps(x, _mm512_mul_ps(vq, _mm512_loadu_ps(rs + i))));
  }
  SketchLogits(o + i, n - i, qs, off, rs + i);
}
}  // namespace

void ScoreSketchRows(SketchQuery& q, int group, const KeySketch& s, const int32_t* rows, size_t n, float* out,
                     size_t ld) {
  // Integer dots land in `out` reinterpreted, then become floats in place.
  int32_t* dots = reinterpret_cast<int32_t*>(out);
  const SimdLevel level = IndexKernelLevel();
  const bool avx512 = level == SimdLevel::Avx512 && HasAvx512Bw();
  if (s.bits == 4) {
    const uint8_t* c = reinterpret_cast<const uint8_t*>(s.codes.data());
    switch (q.kernel4) {
      case SketchQuery::Kernel4::Vnni: Score4Vnni(q.q8.data(), q.q.data(), group, s.dim, c, rows, n, dots, ld, q.qt.empty() ? nullptr : q.qt.data()); break;
      case SketchQuery::Kernel4::Avx2: Score4Avx2(q.q8.data(), q.q.data(), group, s.dim, c, rows, n, dots, ld); break;
      case SketchQuery::Kernel4::Scalar: Score4Scalar(q.q.data(), group, s.dim, c, rows, n, dots, ld); break;
    }
  } else if (avx512) {
    ScoreAvx512(q.q.data(), group, s.dim, s.codes.data(), rows, n, dots, ld);
  } else if (level != SimdLevel::Scalar) {
    ScoreAvx2(q.q.data(), group, s.dim, s.codes.data(), rows, n, dots, ld);
  } else {
    ScoreScalar(q.q.data(), group, s.dim, s.codes.data(), rows, n, dots, ld);
  }
  // The row scales gathered once for every head of the group, then a plain (vectorizable) pass per
  // head; each value is float(dot - off) * (qs * s_t), the same operations at every SIMD level.
  std::vector<float>& rowScale = q.rowScale;
  rowScale.resize(n);
  // The rows come in short runs scattered over the sketch, so most scale lines miss the cache:
  // prefetched kScaleAhead rows ahead (without it the gather was ~6% of a 128K select, perf). A
  // run of ~16 rows shares one line, so 512 rows keep ~30 lines in flight; 64 kept ~4, and the
  // gather waited on each (a phase timer: 90 -> 80 kcycles per head select).
  constexpr size_t kScaleAhead = 512;
  const float* scales = s.rowScale.data();
  size_t i = 0;
  for (; i + kScaleAhead < n; ++i) {
    __builtin_prefetch(scales + rows[i + kScaleAhead]);
    rowScale[i] = scales[size_t(rows[i])];
  }
  for (; i < n; ++i) rowScale[i] = scales[size_t(rows[i])];
  for (int j = 0; j < group; ++j) {
    const float qs = q.scale[j];
    const int32_t off = q.offset.empty() ? 0 : q.offset[j];
    if (avx512) SketchLogitsAvx512(out + size_t(j) * ld, n, qs, off, rowScale.data());
    else SketchLogits(out + size_t(j) * ld, n, qs, off, rowScale.data());
  }
}

}  // namespace kvd
