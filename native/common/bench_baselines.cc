// The baselines kernel benchmarks are set against: the memory rooflines (contiguous and scattered
// reads) and the arithmetic one.
//
// memoryRead(buffer, threads?): the memory-read baseline. Streams every byte
// of a typed array once with the active SIMD level (32-bit integer adds: cheaper than any kernel
// arithmetic, so the time is the cost of reading the bytes) and returns the wrapped 32-bit sum of
// its 32-bit words (the tail bytes added individually) so the read cannot be optimised away.
// With threads > 1 the buffer is split into contiguous parts, one per std::thread.
// memoryGather(buffer, rowBytes, rows, threads?) (below): the same for scattered rows.
// computePeak(iterations, threads?) (below): the arithmetic baseline.
// GCC 12's AVX-512 intrinsic headers build "undefined" vectors from self-initialised locals, which
// -Wall reports as uninitialised once inlined here; the values are never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <napi.h>

#include <algorithm>
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

// The optional thread count at info[i]: an integer in [1, 8], 1 when absent.
int ThreadsArg(const Napi::CallbackInfo& info, size_t i, const std::string& what) {
  if (info.Length() <= i || info[i].IsUndefined()) return 1;
  if (!info[i].IsNumber()) Throw("E_TYPE", what + ": threads: expected an integer, got a non-number");
  const double d = info[i].As<Napi::Number>().DoubleValue();
  if (!IsIntIn(d, 1, 8)) Throw("E_RANGE", what + ": threads: expected an integer in [1, 8], got " + Num(d));
  return int(d);
}

// Runs fn(t) for t < threads, each on its own std::thread (the calling thread when threads is 1):
// a baseline runs on exactly as many threads as it is told, not on the shared pool's workers.
template <typename F>
void OnThreads(int threads, F&& fn) {
  if (threads == 1) {
    fn(0);
    return;
  }
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) workers.emplace_back([&fn, t] { fn(t); });
  for (auto& w : workers) w.join();
}

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

// The bytes of the typed array at info[0] (Float32Array, Uint16Array or Uint8Array), viewed in place.
struct Bytes {
  const uint8_t* p;
  size_t n;
};
Bytes BufferArg(const Napi::CallbackInfo& info, const std::string& what) {
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
      Throw("E_DTYPE", what + ": expected a Float32Array, Uint16Array or Uint8Array, got " + TypedArrayNoun(type));
  }
  return {static_cast<const uint8_t*>(data), length * elem};
}

Napi::Value MemoryRead(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "memoryRead";
    const Bytes buf = BufferArg(info, what);
    const int threads = ThreadsArg(info, 1, what);
    const uint8_t* p = buf.p;
    const size_t n = buf.n;
    uint32_t sum = 0;
    // Parts start on 256-byte boundaries (relative to p) so each thread streams whole vectors.
    std::vector<uint32_t> parts(static_cast<size_t>(threads), 0u);
    const size_t step = ((n / size_t(threads)) + 255) & ~size_t(255);
    OnThreads(threads, [&](int t) {
      const size_t a = std::min(n, step * size_t(t)), b = std::min(n, step * size_t(t + 1));
      parts[size_t(t)] = SumBytes(p + a, b - a);
    });
    for (uint32_t s : parts) sum += s;
    return Napi::Number::New(info.Env(), double(sum));
  });
}

// ---- memoryGather: the scattered-read baseline ----
// memoryGather(buffer, rowBytes, rows, threads?): reads the rowBytes bytes of row rows[i] (at byte
// rows[i] * rowBytes) for every i, in list order, each row's lines requested kGatherAheadBytes
// (in whole rows, at least one) before it is summed (SumBytes), and returns the wrapped 32-bit sum.
// A sparse kernel that reads the same rows in the same order cannot do better than this: it is the
// roofline for scattered rows, as memoryRead is for contiguous bytes. With threads > 1 the list is
// split into contiguous parts, one per std::thread. The distance is in bytes, so that small rows
// keep as many lines in flight as large ones: 4 KiB = 16 rows of 256 bytes, where 8, 16, 32 or 64
// rows measured alike on the attention's rows (256-byte rows at random, one thread and two); on
// 64-byte rows in runs of 11 (the select's key-sketch rows) 16 rows ahead was ~1.3x slower than 64
// on one thread, and 128 a little faster than 64 on two (bench/RESULTS.md).
constexpr size_t kGatherAheadBytes = size_t(4) << 10;

uint32_t GatherRows(const uint8_t* p, size_t rowBytes, const int32_t* rows, size_t n) {
  const size_t ahead = std::max<size_t>(1, kGatherAheadBytes / rowBytes);
  auto request = [&](size_t i) {
    const uint8_t* r = p + size_t(rows[i]) * rowBytes;
    for (size_t o = 0; o < rowBytes; o += 64) __builtin_prefetch(r + o, 0, 3);
  };
  for (size_t i = 0; i < std::min(n, ahead); ++i) request(i);
  uint32_t s = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i + ahead < n) request(i + ahead);
    s += SumBytes(p + size_t(rows[i]) * rowBytes, rowBytes);
  }
  return s;
}

Napi::Value MemoryGather(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "memoryGather";
    const Bytes buf = BufferArg(info, what + ": buffer");
    const size_t bytes = buf.n;
    if (info.Length() < 2 || !info[1].IsNumber())
      Throw("E_TYPE", what + ": rowBytes: expected an integer in [1, 1048576], got a non-number");
    const double rb = info[1].As<Napi::Number>().DoubleValue();
    if (!IsIntIn(rb, 1, 1 << 20)) Throw("E_RANGE", what + ": rowBytes: expected an integer in [1, 1048576], got " + Num(rb));
    const size_t rowBytes = size_t(rb);
    if (info.Length() < 3) Throw("E_TYPE", what + ": rows: expected an Int32Array of row indices, got undefined");
    auto list = GetI32(info[2], what + ".rows");
    const int64_t nRows = int64_t(bytes / rowBytes);
    // Every index checked before any row is read, on a copy: the caller's array may be shared with
    // a thread that changes it after the check.
    std::vector<int32_t> rows(list.data, list.data + list.length);
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i] < 0 || rows[i] >= nRows)
        Throw("E_RANGE", what + ".rows[" + std::to_string(i) + "]: expected a row index in [0, " + std::to_string(nRows) +
                             ") (buffer of " + std::to_string(bytes) + " bytes, rows of " + std::to_string(rowBytes) + "), got " +
                             std::to_string(rows[i]));
    const int threads = ThreadsArg(info, 3, what);
    const uint8_t* p = buf.p;
    std::vector<uint32_t> parts(static_cast<size_t>(threads), 0u);
    const size_t per = (rows.size() + size_t(threads) - 1) / size_t(threads);
    OnThreads(threads, [&](int t) {
      const size_t a = std::min(rows.size(), per * size_t(t)), b = std::min(rows.size(), per * size_t(t + 1));
      parts[size_t(t)] = GatherRows(p, rowBytes, rows.data() + a, b - a);
    });
    uint32_t sum = 0;
    for (uint32_t v : parts) sum += v;
    return Napi::Number::New(info.Env(), double(sum));
  });
}

// ---- computePeak: the arithmetic baseline ----
// Twelve independent chains of a = a * x + y at the active SIMD level: enough chains to cover the
// multiply-add latency, so the time is the core's multiply-add throughput (the roofline a
// compute-bound kernel such as dense attention on one thread is held to). x < 1 and y > 0 keep
// every value near 1 (no overflow, no subnormals). Each chain is a named variable: an array of
// vectors was spilled to the stack by GCC at some optimisation levels, which measures the stores.
// One body for every level (KVD_PEAK_BODY), the chains' sum left in `s`.
constexpr int kPeakChains = 12;

#define KVD_PEAK_BODY(VEC, SET1, FMA, ADD)                                                      \
  const VEC x = SET1(0.999999f), y = SET1(1e-6f);                                              \
  VEC a0 = SET1(1.000f), a1 = SET1(1.001f), a2 = SET1(1.002f), a3 = SET1(1.003f);             \
  VEC a4 = SET1(1.004f), a5 = SET1(1.005f), a6 = SET1(1.006f), a7 = SET1(1.007f);             \
  VEC a8 = SET1(1.008f), a9 = SET1(1.009f), a10 = SET1(1.010f), a11 = SET1(1.011f);           \
  for (int64_t n = 0; n < iters; ++n) {                                                        \
    a0 = FMA(a0, x, y), a1 = FMA(a1, x, y), a2 = FMA(a2, x, y), a3 = FMA(a3, x, y);            \
    a4 = FMA(a4, x, y), a5 = FMA(a5, x, y), a6 = FMA(a6, x, y), a7 = FMA(a7, x, y);            \
    a8 = FMA(a8, x, y), a9 = FMA(a9, x, y), a10 = FMA(a10, x, y), a11 = FMA(a11, x, y);        \
  }                                                                                            \
  const VEC s = ADD(ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7))),         \
                    ADD(ADD(a8, a9), ADD(a10, a11)));

inline float MulAdd(float a, float x, float y) { return a * x + y; }
inline float Add(float a, float b) { return a + b; }
inline float Set1(float v) { return v; }

double PeakScalar(int64_t iters) {
  KVD_PEAK_BODY(float, Set1, MulAdd, Add)
  return double(s);
}

__attribute__((target("avx2,fma"))) double PeakAvx2(int64_t iters) {
  KVD_PEAK_BODY(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps)
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  double t = 0;
  for (float l : lanes) t += l;
  return t;
}

__attribute__((target("avx512f"))) double PeakAvx512(int64_t iters) {
  KVD_PEAK_BODY(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps)
  return double(_mm512_reduce_add_ps(s));
}

#undef KVD_PEAK_BODY

// computePeak(iterations, threads?) -> { flops, sum }: `iterations` rounds of the twelve chains on
// each of `threads` std::threads; flops counts a multiply-add as 2 (the attention benchmarks' unit).
Napi::Value ComputePeak(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "computePeak";
    if (info.Length() < 1 || !info[0].IsNumber())
      Throw("E_TYPE", what + ": iterations: expected an integer in [1, 1e8], got " + (info.Length() < 1 ? std::string("nothing") : std::string("a non-number")));
    const double it = info[0].As<Napi::Number>().DoubleValue();
    if (!IsIntIn(it, 1, 100000000)) Throw("E_RANGE", what + ": iterations: expected an integer in [1, 1e8], got " + Num(it));
    const int threads = ThreadsArg(info, 1, what);
    const int64_t iters = int64_t(it);
    const SimdLevel level = Simd().level;
    const int lanes = level == SimdLevel::Avx512 ? 16 : level == SimdLevel::Avx2 ? 8 : 1;
    auto run = [level, iters]() {
      switch (level) {
        case SimdLevel::Avx512: return PeakAvx512(iters);
        case SimdLevel::Avx2: return PeakAvx2(iters);
        case SimdLevel::Scalar: break;
      }
      return PeakScalar(iters);
    };
    std::vector<double> sums(size_t(threads), 0.0);
    OnThreads(threads, [&](int t) { sums[size_t(t)] = run(); });
    double sum = 0;
    for (double v : sums) sum += v;
    Napi::Object out = Napi::Object::New(info.Env());
    out.Set("flops", double(iters) * kPeakChains * lanes * 2 * threads);
    out.Set("sum", sum);
    return out;
  });
}

void InitBenchBaselines(Napi::Env env, Napi::Object exports) {
  exports.Set("memoryRead", Napi::Function::New(env, MemoryRead));
  exports.Set("memoryGather", Napi::Function::New(env, MemoryGather));
  exports.Set("computePeak", Napi::Function::New(env, ComputePeak));
}

}  // namespace

KVD_REGISTER_MODULE(InitBenchBaselines);

}  // namespace kvd
