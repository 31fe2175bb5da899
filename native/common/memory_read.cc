// memoryRead(buffer, threads?): the memory-read baseline for kernel benchmarks. Streams every byte
// of a typed array once with the active SIMD level (32-bit integer adds: cheaper than any kernel
// arithmetic, so the time is the cost of reading the bytes) and returns the wrapped 32-bit sum of
// its 32-bit words (the tail bytes added individually) so the read cannot be optimised away.
// With threads > 1 the buffer is split into contiguous parts, one per std::thread.
// GCC 12's AVX-512 intrinsic headers build "undefined" vectors from self-initialised locals, which
// -Wall reports as uninitialised once inlined here; the values are never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <napi.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/args.h"
#include "common/errors.h"
#include "common/registry.h"
#include "common/simd.h"

namespace kvd {
namespace {

uint32_t SumScalar(const uint8_t* p, size_t n) {
  uint32_t s = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint32_t w;
    std::memcpy(&w, p + i, 4);
    s += w;
  }
  for (; i < n; ++i) s += p[i];
  return s;
}

__attribute__((target("avx2"))) uint32_t SumAvx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a0 = _mm256_add_epi32(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi32(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi32(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi32(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  __m256i a = _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3));
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a);
  uint32_t s = 0;
  for (uint32_t l : lanes) s += l;
  return s + SumScalar(p + i, n - i);
}

__attribute__((target("avx512f"))) uint32_t SumAvx512(const uint8_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    a0 = _mm512_add_epi32(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi32(a1, _mm512_loadu_si512(p + i + 64));
    a2 = _mm512_add_epi32(a2, _mm512_loadu_si512(p + i + 128));
    a3 = _mm512_add_epi32(a3, _mm512_loadu_si512(p + i + 192));
  }
  __m512i a = _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3));
  return uint32_t(_mm512_reduce_add_epi32(a)) + SumScalar(p + i, n - i);
}

uint32_t SumBytes(const uint8_t* p, size_t n) {
  // Simd() only ever holds a level the CPU supports (cpu.cc), so the target code is safe to run.
  switch (Simd().level) {
    case SimdLevel::Avx512: return SumAvx512(p, n);
    case SimdLevel::Avx2: return SumAvx2(p, n);
    case SimdLevel::Scalar: break;
  }
  return SumScalar(p, n);
}

Napi::Value MemoryRead(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "memoryRead";
    if (info.Length() < 1 || !info[0].IsTypedArray())
      Throw("E_TYPE", what + ": expected a Float32Array, Uint16Array or Uint8Array, got " +
                          (info.Length() < 1 || info[0].IsUndefined() ? "undefined" : "a non-TypedArray value"));
    napi_typedarray_type type;
    size_t length = 0;
    void* data = nullptr;
    if (napi_get_typedarray_info(info.Env(), info[0], &type, &length, &data, nullptr, nullptr) != napi_ok)
      Throw("E_TYPE", what + ": could not read the TypedArray");
    size_t elem = 0;
    switch (type) {
      case napi_float32_array: elem = 4; break;
      case napi_uint16_array: elem = 2; break;
      case napi_uint8_array: elem = 1; break;
      default:
        Throw("E_DTYPE", what + ": expected a Float32Array, Uint16Array or Uint8Array, got a " + TypedArrayName(type));
    }
    int threads = 1;
    if (info.Length() >= 2 && !info[1].IsUndefined()) {
      if (!info[1].IsNumber()) Throw("E_TYPE", what + ": threads: expected an integer, got a non-number");
      const double d = info[1].As<Napi::Number>().DoubleValue();
      if (!IsIntIn(d, 1, 8)) Throw("E_RANGE", what + ": threads: expected an integer in [1, 8], got " + Num(d));
      threads = int(d);
    }
    const uint8_t* p = static_cast<const uint8_t*>(data);
    const size_t n = length * elem;
    uint32_t sum = 0;
    if (threads == 1) {
      sum = SumBytes(p, n);
    } else {
      // Parts start on 256-byte boundaries (relative to p) so each thread streams whole vectors.
      std::vector<uint32_t> parts(static_cast<size_t>(threads), 0u);
      std::vector<std::thread> workers;
      const size_t step = ((n / size_t(threads)) + 255) & ~size_t(255);
      for (int t = 0; t < threads; ++t) {
        const size_t a = std::min(n, step * size_t(t)), b = std::min(n, step * size_t(t + 1));
        workers.emplace_back([&, t, a, b] { parts[size_t(t)] = SumBytes(p + a, b - a); });
      }
      for (auto& w : workers) w.join();
      for (uint32_t s : parts) sum += s;
    }
    return Napi::Number::New(info.Env(), double(sum));
  });
}

void InitMemoryRead(Napi::Env env, Napi::Object exports) {
  exports.Set("memoryRead", Napi::Function::New(env, MemoryRead));
}

}  // namespace

KVD_REGISTER_MODULE(InitMemoryRead);

}  // namespace kvd
