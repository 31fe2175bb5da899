// Scalar GGML block kernels: the reference the AVX2 table is tested against (through the model
// forward tests, every weight type at every SIMD level) and what a CPU without AVX2 runs.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/dtype.h"
#include "model/quant.h"
#include "common/simd.h"

namespace kvd {
namespace model {
namespace {

inline float H(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}

// Q4_K: the 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
inline void ScaleMinK4(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void DequantQ4K(const uint8_t* b, float* y) {
  const float d = H(b), dmin = H(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* q = b + 16;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
    int s1, m1, s2, m2;
    ScaleMinK4(is, sc, s1, m1);
    ScaleMinK4(is + 1, sc, s2, m2);
    const float d1 = d * s1, o1 = dmin * m1, d2 = d * s2, o2 = dmin * m2;
    for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - o1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - o2;
  }
}

void DequantQ6K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = H(b + 208);
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
  }
}

void Dequant(QType t, const uint8_t* row, float* y, size_t n) {
  switch (t) {
    case QType::F32: std::memcpy(y, row, n * 4); return;
    case QType::F16:
      for (size_t i = 0; i < n; ++i) y[i] = H(row + 2 * i);
      return;
    case QType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        y[i] = Bf16ToF32(h);
      }
      return;
    case QType::Q8_0:
      for (size_t b = 0; b < n / 32; ++b, row += 34) {
        const float d = H(row);
        const int8_t* q = reinterpret_cast<const int8_t*>(row + 2);
        for (int j = 0; j < 32; ++j) *y++ = d * q[j];
      }
      return;
    case QType::Q4_0:
      for (size_t b = 0; b < n / 32; ++b, row += 18, y += 32) {
        const float d = H(row);
        for (int j = 0; j < 16; ++j) {
          y[j] = d * (int(row[2 + j] & 0xF) - 8);
          y[j + 16] = d * (int(row[2 + j] >> 4) - 8);
        }
      }
      return;
    case QType::Q4_K:
      for (size_t b = 0; b < n / 256; ++b, row += 144, y += 256) DequantQ4K(row, y);
      return;
    case QType::Q6_K:
      for (size_t b = 0; b < n / 256; ++b, row += 210, y += 256) DequantQ6K(row, y);
      return;
  }
}

// Decodes one block at a time into a small buffer and accumulates the products in order.
float Dot(QType t, const uint8_t* row, const float* x, size_t n) {
  const QTypeInfo* info = QInfo(int(t));
  const size_t be = t == QType::F32 || t == QType::F16 || t == QType::BF16 ? 256 : size_t(info->elems);
  const size_t bb = be / size_t(info->elems) * size_t(info->bytes);
  float buf[256];
  float s = 0.f;
  size_t i = 0;
  for (; i + be <= n; i += be, row += bb) {
    Dequant(t, row, buf, be);
    for (size_t j = 0; j < be; ++j) s += buf[j] * x[i + j];
  }
  if (i < n) {  // only the one-element types have a partial tail
    Dequant(t, row, buf, n - i);
    for (size_t j = 0; j < n - i; ++j) s += buf[j] * x[i + j];
  }
  return s;
}

void Tile(const float* w, int nw, const float* x, int nx, size_t n, float* out, size_t outStride) {
  for (int j = 0; j < nx; ++j)
    for (int i = 0; i < nw; ++i) {
      float s = 0.f;
      for (size_t c = 0; c < n; ++c) s += w[size_t(i) * n + c] * x[size_t(j) * n + c];
      out[size_t(j) * outStride + size_t(i)] = s;
    }
}

float DotQ8(QType t, const uint8_t* row, const int8_t* xq, const float* xd, size_t n) {
  float s = 0.f;
  for (size_t b = 0; b < n / 32; ++b, xq += 32) {
    int32_t isum = 0;
    if (t == QType::Q8_0) {
      const int8_t* q = reinterpret_cast<const int8_t*>(row + 2);
      for (int j = 0; j < 32; ++j) isum += int32_t(q[j]) * xq[j];
    } else {
      for (int j = 0; j < 16; ++j)
        isum += (int32_t(row[2 + j] & 0xF) - 8) * xq[j] + (int32_t(row[2 + j] >> 4) - 8) * xq[j + 16];
    }
    s += H(row) * xd[b] * float(isum);
    row += t == QType::Q8_0 ? 34 : 18;
  }
  return s;
}

const QuantKernels kScalar = {"scalar", Dequant, Dot, Tile, DotQ8};

}  // namespace

void QuantizeQ8(const float* x, size_t n, int8_t* q, float* d) {
  for (size_t b = 0; b < n / 32; ++b, x += 32, q += 32) {
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float db = F16ToF32(F32ToF16(amax / 127.f));
    const float id = db > 0.f ? 1.f / db : 0.f;
    for (int j = 0; j < 32; ++j) q[j] = int8_t(std::max(-127.f, std::min(127.f, std::nearbyint(x[j] * id))));
    d[b] = db;
  }
}

const QTypeInfo* QInfo(int code) {
  static const QTypeInfo f32{1, 4, "F32"}, f16{1, 2, "F16"}, bf16{1, 2, "BF16"}, q80{32, 34, "Q8_0"},
      q40{32, 18, "Q4_0"}, q4k{256, 144, "Q4_K"}, q6k{256, 210, "Q6_K"};
  switch (code) {
    case 0: return &f32;
    case 1: return &f16;
    case 30: return &bf16;
    case 8: return &q80;
    case 2: return &q40;
    case 12: return &q4k;
    case 14: return &q6k;
  }
  return nullptr;
}

const QuantKernels& QuantScalar() { return kScalar; }

const QuantKernels& Quant() {
  if (Simd().level == SimdLevel::Avx512) {
    if (const QuantKernels* k = QuantAvx512()) return *k;
  }
  if (Simd().level != SimdLevel::Scalar) {
    if (const QuantKernels* k = QuantAvx2()) return *k;
  }
  return kScalar;
}

}  // namespace model
}  // namespace kvd
