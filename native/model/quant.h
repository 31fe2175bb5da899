// GGML weight blocks: per-type row kernels behind one run-time dispatch table (scalar reference,
// AVX2+FMA+F16C, and at the AVX-512 level the AVX2 kernels with a 16-lane prefill tile), chosen
// from the process SIMD level (native/cpu.cc). Block layouts are those of GGUF files (src/model/gguf/ggml-types.ts):
//   Q8_0  32 elems / 34 bytes: f16 d, int8 q[32]                       x = d*q
//   Q4_0  32 elems / 18 bytes: f16 d, u8 qs[16] (lo nibble j, hi j+16)  x = d*(q-8)
//   Q4_K 256 elems /144 bytes: f16 d, f16 dmin, u8 scales[12], u8 qs[128]
//   Q6_K 256 elems /210 bytes: u8 ql[128], u8 qh[64], int8 scales[16], f16 d
// A row of n elements (n a multiple of the block size) is n / elems blocks back to back.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvd {
namespace model {

// GGML type codes kvdrive reads.
enum class QType : int { F32 = 0, F16 = 1, Q4_0 = 2, Q8_0 = 8, Q4_K = 12, Q6_K = 14, BF16 = 30 };

struct QTypeInfo {
  int elems;  // per block
  int bytes;  // per block
  const char* name;
};

// Info for a type code; nullptr when kvdrive cannot read it.
const QTypeInfo* QInfo(int code);

inline size_t QRowBytes(QType t, size_t n) {
  const QTypeInfo* i = QInfo(int(t));
  return n / size_t(i->elems) * size_t(i->bytes);
}

struct QuantKernels {
  const char* level;
  // dst[i] = element i of the row, for i < n.
  void (*dequant)(QType t, const uint8_t* row, float* dst, size_t n);
  // sum_i row[i] * x[i] over a row of n elements (x f32).
  float (*dot)(QType t, const uint8_t* row, const float* x, size_t n);
  // Prefill tile: out[j * outStride + i] = sum_c w[i * n + c] * x[j * n + c] for i < nw ≤ 4 decoded
  // weight rows and j < nx ≤ 4 tokens; a full 4 × 4 tile reuses each loaded vector four times.
  void (*tile)(const float* w, int nw, const float* x, int nx, size_t n, float* out, size_t outStride);
  // Decode product of a Q8_0 or Q4_0 row with activations quantized by QuantizeQ8 (llama.cpp's
  // scheme): per 32-element block an exact integer dot of the quants, scaled by both block scales.
  float (*dotQ8)(QType t, const uint8_t* row, const int8_t* xq, const float* xd, size_t n);
};

// Types whose decode products run on Q8_0-quantized activations.
inline bool UsesQ8Activations(QType t) { return t == QType::Q8_0 || t == QType::Q4_0; }

// x (n a multiple of 32) → per block of 32: d = max|x| / 127 (rounded through f16, as a Q8_0 block
// stores it) and q = round(x / d) in [-127, 127]. Same code at every SIMD level.
void QuantizeQ8(const float* x, size_t n, int8_t* q, float* d);

const QuantKernels& QuantScalar();
// nullptr when the CPU lacks AVX2/FMA/F16C.
const QuantKernels* QuantAvx2();
// The AVX2 table with a 16-lane prefill tile; nullptr without the AVX-512 level.
const QuantKernels* QuantAvx512();
// The table for the active SIMD level.
const QuantKernels& Quant();

}  // namespace model
}  // namespace kvd
