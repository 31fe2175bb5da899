// Storage dtypes of KV data. Data is stored as f32, IEEE binary16 (f16) or bfloat16 (bf16) and
// always computed in f32. f16/bf16 elements are uint16_t bit patterns.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "common/errors.h"

namespace kvd {

enum class Dtype : int { F32 = 0, F16 = 1, BF16 = 2 };

inline size_t DtypeSize(Dtype d) { return d == Dtype::F32 ? 4 : 2; }

inline const char* DtypeName(Dtype d) {
  switch (d) {
    case Dtype::F32: return "f32";
    case Dtype::F16: return "f16";
    case Dtype::BF16: return "bf16";
  }
  return "?";
}

inline Dtype ParseDtype(const std::string& s) {
  if (s == "f32") return Dtype::F32;
  if (s == "f16") return Dtype::F16;
  if (s == "bf16") return Dtype::BF16;
  Throw("E_DTYPE", "expected dtype 'f32', 'f16' or 'bf16', got '" + s + "'");
}

inline float Bf16ToF32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN (quiet bit forced).
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float F16ToF32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; ++e; } while ((man & 0x400u) == 0);
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | (exp + 127 - 15) << 23 | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, with overflow to Inf and gradual underflow.
inline uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow (incl. Inf)
  if (absu < 0x38800000u) {  // subnormal or zero in f16
    if (absu < 0x33000000u) return uint16_t(sign);
    uint32_t e = absu >> 23;
    uint32_t m = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 - (e - 112)
    uint32_t half = 1u << (shift - 1);
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = absu - 0x38000000u;  // rebias exponent 127 -> 15
  uint32_t lsb = (r >> 13) & 1u;
  r += 0xfffu + lsb;
  return uint16_t(sign | (r >> 13));
}

inline float LoadElem(const void* base, Dtype d, size_t i) {
  switch (d) {
    case Dtype::F32: return static_cast<const float*>(base)[i];
    case Dtype::F16: return F16ToF32(static_cast<const uint16_t*>(base)[i]);
    case Dtype::BF16: return Bf16ToF32(static_cast<const uint16_t*>(base)[i]);
  }
  return 0.f;
}

}  // namespace kvd
