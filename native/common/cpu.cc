// Run-time CPU feature detection and SIMD level selection.
//
// Level order: KVDRIVE_SIMD env (scalar|avx2|avx512) if set and supported, else the best the CPU
// supports. setSimdLevel() lets tests force each level (and the scalar fallback) in one process.
#include <cstdlib>
#include <string>

#include "common/registry.h"
#include "common/simd.h"

namespace kvd {

// Defined in simd_avx2.cc / simd_avx512.cc when those files exist; weak so the build works while
// only the scalar table is implemented.
extern const SimdKernels* Avx2Kernels() __attribute__((weak));
extern const SimdKernels* Avx512Kernels() __attribute__((weak));

namespace {

struct Features {
  bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512fp16, avx512bf16;
};

Features Detect() {
  __builtin_cpu_init();
  Features f{};
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = __builtin_cpu_supports("f16c");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512fp16 = __builtin_cpu_supports("avx512fp16");
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  return f;
}

const Features& Cpu() {
  static const Features f = Detect();
  return f;
}

const SimdKernels* g_active = nullptr;

const char* LevelName(SimdLevel l) {
  switch (l) {
    case SimdLevel::Scalar: return "scalar";
    case SimdLevel::Avx2: return "avx2";
    case SimdLevel::Avx512: return "avx512";
  }
  return "?";
}

const SimdKernels* Best() {
  if (auto k = SimdFor(SimdLevel::Avx512)) return k;
  if (auto k = SimdFor(SimdLevel::Avx2)) return k;
  return &ScalarKernels();
}

const SimdKernels* Initial() {
  const char* env = std::getenv("KVDRIVE_SIMD");
  if (env && *env) {
    std::string s(env);
    if (s == "scalar") return &ScalarKernels();
    if (s == "avx2" && SimdFor(SimdLevel::Avx2)) return SimdFor(SimdLevel::Avx2);
    if (s == "avx512" && SimdFor(SimdLevel::Avx512)) return SimdFor(SimdLevel::Avx512);
  }
  return Best();
}

Napi::Value CpuFeatures(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const Features& f = Cpu();
  Napi::Object o = Napi::Object::New(env);
  o.Set("avx2", f.avx2);
  o.Set("fma", f.fma);
  o.Set("f16c", f.f16c);
  o.Set("avx512f", f.avx512f);
  o.Set("avx512bw", f.avx512bw);
  o.Set("avx512fp16", f.avx512fp16);
  o.Set("avx512bf16", f.avx512bf16);
  Napi::Array levels = Napi::Array::New(env);
  uint32_t i = 0;
  for (SimdLevel l : {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512})
    if (SimdFor(l)) levels.Set(i++, LevelName(l));
  o.Set("levels", levels);
  o.Set("active", LevelName(Simd().level));
  return o;
}

Napi::Value SetSimdLevel(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    if (info.Length() < 1 || !info[0].IsString())
      Throw("E_CONFIG", "setSimdLevel expects 'scalar', 'avx2', 'avx512' or 'best'");
    std::string s = info[0].As<Napi::String>();
    const SimdKernels* k = nullptr;
    if (s == "best") k = Best();
    else if (s == "scalar") k = &ScalarKernels();
    else if (s == "avx2") k = SimdFor(SimdLevel::Avx2);
    else if (s == "avx512") k = SimdFor(SimdLevel::Avx512);
    else Throw("E_CONFIG", "expected SIMD level 'scalar', 'avx2', 'avx512' or 'best', got '" + s + "'");
    if (!k) Throw("E_CONFIG", "SIMD level '" + s + "' is not supported by this CPU or build; see cpuFeatures().levels");
    g_active = k;
    return Napi::String::New(info.Env(), LevelName(k->level));
  });
}

void InitCpu(Napi::Env env, Napi::Object exports) {
  Simd();  // choose the level on the JS thread, before any worker thread reads it
  exports.Set("cpuFeatures", Napi::Function::New(env, CpuFeatures));
  exports.Set("setSimdLevel", Napi::Function::New(env, SetSimdLevel));
}

}  // namespace

const SimdKernels* SimdFor(SimdLevel level) {
  const Features& f = Cpu();
  switch (level) {
    case SimdLevel::Scalar: return &ScalarKernels();
    case SimdLevel::Avx2:
      return (f.avx2 && f.fma && f.f16c && Avx2Kernels) ? Avx2Kernels() : nullptr;
    case SimdLevel::Avx512:
      return (f.avx512f && f.avx512bw && f.avx512vl && Avx512Kernels) ? Avx512Kernels() : nullptr;
  }
  return nullptr;
}

const SimdKernels& Simd() {
  if (!g_active) g_active = Initial();
  return *g_active;
}

KVD_REGISTER_MODULE(InitCpu);

}  // namespace kvd
