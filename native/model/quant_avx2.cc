// AVX2 + FMA + F16C GGML block kernels. Built with per-function target attributes (the addon targets
// plain x86-64); QuantAvx2() hands the table out only when the CPU has AVX2, FMA and F16C, so none of
// these functions may be called any other way.
//
// Decode-time products are memory-bound: each row is read once, widened to f32 in registers and
// multiplied into the f32 activations with FMAs (8-lane accumulators per block, one multiply by the
// block scale). K-quant blocks (256 elements, 6-bit scales) are decoded by the scalar code into a
// small buffer first (vectorised nibble / bit-plane unpacking); their products then run on the
// same vector dot.
#include <immintrin.h>

#include <cstring>

#include "model/quant.h"
#include "common/simd.h"
#include "common/avx2_util.h"


namespace kvd {
namespace model {
namespace {


KVD_AVX2 inline float H(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 8 int8 at p → 8 f32.
KVD_AVX2 inline __m256 I8x8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Q4_0 block → 32 int8 values (q - 8): bytes 0..15 are the low nibbles, 16..31 the high nibbles.
KVD_AVX2 inline void Q40Bytes(const uint8_t* qs, int8_t* out) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_sub_epi8(_mm_and_si128(b, m), eight));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), m), eight));
}

// sum_j q[j] * x[j] over 32 int8 quants.
KVD_AVX2 inline __m256 Block32(const int8_t* q, const float* x) {
  __m256 a = _mm256_mul_ps(I8x8(q), _mm256_loadu_ps(x));
  a = _mm256_fmadd_ps(I8x8(q + 8), _mm256_loadu_ps(x + 8), a);
  a = _mm256_fmadd_ps(I8x8(q + 16), _mm256_loadu_ps(x + 16), a);
  return _mm256_fmadd_ps(I8x8(q + 24), _mm256_loadu_ps(x + 24), a);
}

// 32 int8 values (signed, or unsigned nibbles when `isUnsigned`) → y[0..32) = scale_k * v - bias_k,
// where elements 0..15 take (s0, b0) and 16..31 take (s1, b1).
KVD_AVX2 inline void Store32(__m256i v, bool isUnsigned, float s0, float b0, float s1, float b1, float* y) {
  const __m128i halves[2] = {_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)};
  for (int h = 0; h < 2; ++h) {
    const __m256 sc = _mm256_set1_ps(h == 0 ? s0 : s1), bi = _mm256_set1_ps(h == 0 ? b0 : b1);
    for (int k = 0; k < 2; ++k) {
      const __m128i b8 = k == 0 ? halves[h] : _mm_srli_si128(halves[h], 8);
      const __m256i w = isUnsigned ? _mm256_cvtepu8_epi32(b8) : _mm256_cvtepi8_epi32(b8);
      _mm256_storeu_ps(y + 16 * h + 8 * k, _mm256_fmsub_ps(sc, _mm256_cvtepi32_ps(w), bi));
    }
  }
}

// Q4_K block (see quant_scalar.cc DequantQ4K): per 64 elements, low nibbles then high nibbles of 32
// bytes, each half with its own 6-bit scale and min.
KVD_AVX2 void DequantQ4K(const uint8_t* b, float* y) {
  const float d = H(b), dmin = H(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* q = b + 16;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32, y += 64) {
    int s[2], m[2];
    for (int u = 0; u < 2; ++u) {
      const int k = is + u;
      s[u] = k < 4 ? sc[k] & 63 : (sc[k + 4] & 0xF) | ((sc[k - 4] >> 6) << 4);
      m[u] = k < 4 ? sc[k + 4] & 63 : (sc[k + 4] >> 4) | ((sc[k] >> 6) << 4);
    }
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    const float d0 = d * s[0], o0 = dmin * m[0], d1 = d * s[1], o1 = dmin * m[1];
    Store32(_mm256_and_si256(v, m4), true, d0, o0, d0, o0, y);
    Store32(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), true, d1, o1, d1, o1, y + 32);
  }
}

// Q6_K block (see quant_scalar.cc DequantQ6K): per 128 elements, four 32-element runs combining
// 4 low bits from ql and 2 high bits from qh, minus 32, each 16 elements with an int8 scale.
KVD_AVX2 void DequantQ6K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = H(b + 208);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8(32);
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
    const __m256i q[4] = {
        _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30)),
        _mm256_or_si256(_mm256_and_si256(c, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(h, m30)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4), _mm256_and_si256(_mm256_srli_epi16(h, 2), m30)),
    };
    for (int r = 0; r < 4; ++r)
      Store32(_mm256_sub_epi8(q[r], off), false, d * sc[2 * r], 0.f, d * sc[2 * r + 1], 0.f, y + 32 * r);
  }
}

KVD_AVX2 inline __m256 Load16(QType t, const uint8_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (t == QType::F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

KVD_AVX2 float DotF32(const float* a, const float* x, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(x + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), s0);
  float s = HSum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * x[i];
  return s;
}

KVD_AVX2 float Dot(QType t, const uint8_t* row, const float* x, size_t n) {
  switch (t) {
    case QType::F32: return DotF32(reinterpret_cast<const float*>(row), x, n);
    case QType::F16:
    case QType::BF16: {
      __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
      size_t i = 0;
      for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(Load16(t, row + 2 * i), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(Load16(t, row + 2 * i + 16), _mm256_loadu_ps(x + i + 8), s1);
      }
      float s = HSum(_mm256_add_ps(s0, s1));
      if (i < n) {
        float buf[16];
        QuantScalar().dequant(t, row + 2 * i, buf, n - i);
        for (size_t j = 0; j < n - i; ++j) s += buf[j] * x[i + j];
      }
      return s;
    }
    case QType::Q8_0: {
      __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
      size_t b = 0;
      for (; b + 2 <= n / 32; b += 2, row += 68, x += 64) {
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(H(row)), Block32(reinterpret_cast<const int8_t*>(row + 2), x), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(H(row + 34)), Block32(reinterpret_cast<const int8_t*>(row + 36), x + 32), acc1);
      }
      if (b < n / 32) acc0 = _mm256_fmadd_ps(_mm256_set1_ps(H(row)), Block32(reinterpret_cast<const int8_t*>(row + 2), x), acc0);
      return HSum(_mm256_add_ps(acc0, acc1));
    }
    case QType::Q4_0: {
      __m256 acc = _mm256_setzero_ps();
      alignas(32) int8_t q[32];
      for (size_t b = 0; b < n / 32; ++b, row += 18, x += 32) {
        Q40Bytes(row + 2, q);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(H(row)), Block32(q, x), acc);
      }
      return HSum(acc);
    }
    case QType::Q4_K:
    case QType::Q6_K: {
      const size_t bb = size_t(QInfo(int(t))->bytes);
      alignas(32) float buf[256];
      float s = 0.f;
      for (size_t b = 0; b < n / 256; ++b, row += bb, x += 256) {
        if (t == QType::Q4_K) DequantQ4K(row, buf);
        else DequantQ6K(row, buf);
        s += DotF32(buf, x, 256);
      }
      return s;
    }
  }
  return 0.f;
}

KVD_AVX2 void Dequant(QType t, const uint8_t* row, float* y, size_t n) {
  switch (t) {
    case QType::F16:
    case QType::BF16: {
      size_t i = 0;
      for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i));
        _mm256_storeu_ps(y + i, t == QType::F16 ? _mm256_cvtph_ps(h)
                                                : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
      }
      if (i < n) QuantScalar().dequant(t, row + 2 * i, y + i, n - i);
      return;
    }
    case QType::Q8_0:
      for (size_t b = 0; b < n / 32; ++b, row += 34, y += 32) {
        const __m256 d = _mm256_set1_ps(H(row));
        const int8_t* q = reinterpret_cast<const int8_t*>(row + 2);
        for (int j = 0; j < 32; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(d, I8x8(q + j)));
      }
      return;
    case QType::Q4_0: {
      alignas(32) int8_t q[32];
      for (size_t b = 0; b < n / 32; ++b, row += 18, y += 32) {
        const __m256 d = _mm256_set1_ps(H(row));
        Q40Bytes(row + 2, q);
        for (int j = 0; j < 32; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(d, I8x8(q + j)));
      }
      return;
    }
    case QType::Q4_K:
      for (size_t b = 0; b < n / 256; ++b, row += 144, y += 256) DequantQ4K(row, y);
      return;
    case QType::Q6_K:
      for (size_t b = 0; b < n / 256; ++b, row += 210, y += 256) DequantQ6K(row, y);
      return;
    default:
      QuantScalar().dequant(t, row, y, n);
  }
}

KVD_AVX2 void Tile(const float* w, int nw, const float* x, int nx, size_t n, float* out, size_t outStride) {
  if (nw != 4 || nx != 4 || n % 8 != 0) {
    for (int j = 0; j < nx; ++j)
      for (int i = 0; i < nw; ++i) out[size_t(j) * outStride + size_t(i)] = DotF32(w + size_t(i) * n, x + size_t(j) * n, n);
    return;
  }
  __m256 acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_setzero_ps();
  for (size_t c = 0; c < n; c += 8) {
    __m256 wv[4], xv[4];
    for (int i = 0; i < 4; ++i) wv[i] = _mm256_loadu_ps(w + size_t(i) * n + c);
    for (int j = 0; j < 4; ++j) xv[j] = _mm256_loadu_ps(x + size_t(j) * n + c);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_fmadd_ps(wv[i], xv[j], acc[i][j]);
  }
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 4; ++i) out[size_t(j) * outStride + size_t(i)] = HSum(acc[i][j]);
}

// 8 partial sums (int32) of q[i] * x[i] over 32 int8 pairs: |q| times x carrying q's sign, so the
// unsigned × signed maddubs applies (|q| ≤ 128, |x| ≤ 127: the i16 pair sums cannot saturate).
KVD_AVX2 inline __m256 DotI8x32(__m256i q, __m256i x) {
  const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

// One block of DotQ8: acc + d_row · d_x · (exact int32 lane sums of the 32 quant products).
KVD_AVX2 inline __m256 BlockQ8(QType t, const uint8_t* row, const int8_t* xq, float xd, __m256 acc) {
  __m256i q;
  if (t == QType::Q8_0) {
    q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2));
  } else {
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(p, 4), p);  // low nibbles, then high
    q = _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
  }
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  return _mm256_fmadd_ps(_mm256_set1_ps(H(row) * xd), DotI8x32(q, x), acc);
}

// Two accumulators (even and odd blocks), unrolled by hand (an indexed accumulator array stays in
// memory): with one FMA chain each block waits on the FMA latency, and a single core must spend
// under ~3 cycles per block to keep up with memory (measured in L1: 33 → 39 GB/s of Q8_0 rows).
KVD_AVX2 float DotQ8(QType t, const uint8_t* row, const int8_t* xq, const float* xd, size_t n) {
  const size_t bb = t == QType::Q8_0 ? 34 : 18, nb = n / 32;
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  size_t b = 0;
  for (; b + 2 <= nb; b += 2, row += 2 * bb, xq += 64) {
    a0 = BlockQ8(t, row, xq, xd[b], a0);
    a1 = BlockQ8(t, row + bb, xq + 32, xd[b + 1], a1);
  }
  if (b < nb) a0 = BlockQ8(t, row, xq, xd[b], a0);
  return HSum(_mm256_add_ps(a0, a1));
}

const QuantKernels kAvx2 = {"avx2", Dequant, Dot, Tile, DotQ8};

}  // namespace

const QuantKernels* QuantAvx2() { return SimdFor(SimdLevel::Avx2) ? &kAvx2 : nullptr; }

}  // namespace model
}  // namespace kvd
