// Diagnostic bindings that run ONE primitive of one named SIMD level (simd.h / attn_simd.h) on
// caller arrays, so tests can check every level against the scalar reference primitive by
// primitive (odd lengths, every dtype, every GQA group size). Not part of the public TS API.
//
//   simdDotF32(level, a, b) -> number
//   simdDotRows(level, qs, nq, row, dtype) -> Float32Array(nq)         n = row.length
//   simdAxpyRow(level, acc, w, row, dtype)                            in place, n = acc.length
//   simdToF32(level, row, dtype) -> Float32Array
//   simdScaleMax(level, x, scale) -> { max, finite }                  x scaled in place
//   simdExpSum(level, x, m) -> number                                 x exponentiated in place
//   simdWeightedRows(level, acc, nq, w, rows, dtype)                  in place, n = acc.length / nq
//   simdLogitsRows(level, qs, nq, rows, dtype) -> Float32Array(nq * nrows), n = qs.length / nq
#include <napi.h>

#include <string>

#include "common/args.h"
#include "attention/attn_simd.h"
#include "common/errors.h"
#include "common/registry.h"
#include "common/simd.h"

namespace kvd {
namespace {

struct Level {
  const SimdKernels* simd;
  const AttnKernels* attn;
};

Level GetLevel(const Napi::Value& v, const std::string& what) {
  if (!v.IsString()) Throw("E_CONFIG", what + ": expected a SIMD level 'scalar', 'avx2' or 'avx512'");
  const std::string s = v.As<Napi::String>();
  SimdLevel l;
  if (s == "scalar") l = SimdLevel::Scalar;
  else if (s == "avx2") l = SimdLevel::Avx2;
  else if (s == "avx512") l = SimdLevel::Avx512;
  else Throw("E_CONFIG", what + ": expected a SIMD level 'scalar', 'avx2' or 'avx512', got '" + s + "'");
  const SimdKernels* k = SimdFor(l);
  if (!k) Throw("E_CONFIG", what + ": SIMD level '" + s + "' is not supported by this CPU or build");
  const AttnKernels* a = l == SimdLevel::Avx512 ? Avx512AttnKernels()
                         : l == SimdLevel::Avx2 ? Avx2AttnKernels()
                                                : &ScalarAttnKernels();
  return {k, a};
}

// A row in storage dtype: Float32Array for f32, Uint16Array (bits) for f16/bf16.
struct RowArg {
  const void* data;
  size_t length;
  Dtype dtype;
};

RowArg GetRow(const Napi::Value& row, const Napi::Value& dtype, const std::string& what) {
  if (!dtype.IsString()) Throw("E_DTYPE", what + ": dtype: expected 'f32', 'f16' or 'bf16'");
  RowArg r;
  r.dtype = ParseDtype(dtype.As<Napi::String>());
  if (r.dtype == Dtype::F32) {
    auto a = GetF32(row, what + ": row");
    r.data = a.data;
    r.length = a.length;
  } else {
    auto a = GetArray<uint16_t>(row, napi_uint16_array, what + ": row (" + DtypeName(r.dtype) + " bits)");
    r.data = a.data;
    r.length = a.length;
  }
  return r;
}

size_t GetCount(const Napi::Value& v, const std::string& what, size_t min, size_t max) {
  if (!v.IsNumber()) Throw("E_TYPE", what + ": expected an integer, got a non-number");
  const double d = v.As<Napi::Number>().DoubleValue();
  if (!IsIntIn(d, int64_t(min), int64_t(max)))
    Throw("E_RANGE", what + ": expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " + Num(d));
  return size_t(d);
}

float GetFloat(const Napi::Value& v, const std::string& what) {
  if (!v.IsNumber()) Throw("E_TYPE", what + ": expected a number, got a non-number");
  return float(v.As<Napi::Number>().DoubleValue());
}

Napi::Value DotF32(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "simdDotF32";
    Level l = GetLevel(info[0], what);
    auto a = GetF32(info[1], what + ": a");
    auto b = GetF32(info[2], what + ": b");
    ExpectLength(b.length, a.length, what + ": b (a.length)");
    return Napi::Number::New(info.Env(), l.simd->dot_f32(a.data, b.data, a.length));
  });
}

Napi::Value DotRows(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "simdDotRows";
    Level l = GetLevel(info[0], what);
    auto qs = GetF32(info[1], what + ": qs");
    const size_t nq = GetCount(info[2], what + ": nq", 1, 64);
    RowArg row = GetRow(info[3], info[4], what);
    ExpectLength(qs.length, nq * row.length, what + ": qs (nq*row.length)");
    auto out = Napi::Float32Array::New(info.Env(), nq);
    l.simd->dot_rows(qs.data, nq, row.data, row.dtype, row.length, out.Data());
    return out;
  });
}

Napi::Value AxpyRow(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "simdAxpyRow";
    Level l = GetLevel(info[0], what);
    auto acc = GetF32(info[1], what + ": acc");
    const float w = GetFloat(info[2], what + ": w");
    RowArg row = GetRow(info[3], info[4], what);
    ExpectLength(row.length, acc.length, what + ": row (acc.length)");
    l.simd->axpy_row(acc.data, w, row.data, row.dtype, row.length);
    return info.Env().Undefined();
  });
}

Napi::Value ToF32(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "simdToF32";
    Level l = GetLevel(info[0], what);
    RowArg row = GetRow(info[1], info[2], what);
    auto out = Napi::Float32Array::New(info.Env(), row.length);
    l.simd->to_f32(out.Data(), row.data, row.dtype, row.length);
    return out;
  });
}

Napi::Value ScaleMax(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "simdScaleMax";
    Level l = GetLevel(info[0], what);
    auto x = GetF32(info[1], what + ": x");
    const float scale = GetFloat(info[2], what + ": scale");
    bool finite = true;
    const float m = l.attn->scale_max(x.data, x.length, scale, &finite);
    Napi::Object r = Napi::Object::New(info.Env());
    r.Set("max", m);
    r.Set("finite", finite);
    return r;
  });
}

Napi::Value ExpSum(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "simdExpSum";
    Level l = GetLevel(info[0], what);
    auto x = GetF32(info[1], what + ": x");
    const float m = GetFloat(info[2], what + ": m");
    for (size_t i = 0; i < x.length; ++i)
      if (!(x.data[i] <= m)) Throw("E_RANGE", what + ": x: expected every element <= m, got x[" + std::to_string(i) + "] = " + Num(x.data[i]));
    return Napi::Number::New(info.Env(), l.attn->exp_sum(x.data, x.length, m));
  });
}

Napi::Value WeightedRows(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "simdWeightedRows";
    Level l = GetLevel(info[0], what);
    auto acc = GetF32(info[1], what + ": acc");
    const size_t nq = GetCount(info[2], what + ": nq", 1, 64);
    auto w = GetF32(info[3], what + ": w");
    RowArg rows = GetRow(info[4], info[5], what);
    if (acc.length % nq) Throw("E_SHAPE", what + ": acc: expected a multiple of nq elements, got " + std::to_string(acc.length));
    const size_t n = acc.length / nq;
    if (n == 0 || rows.length % n) Throw("E_SHAPE", what + ": rows: expected a multiple of n = " + std::to_string(n) + " elements, got " + std::to_string(rows.length));
    const size_t nrows = rows.length / n;
    ExpectLength(w.length, nq * nrows, what + ": w (nq*nrows)");
    std::vector<const void*> ptrs(nrows);
    for (size_t r = 0; r < nrows; ++r) ptrs[r] = static_cast<const uint8_t*>(rows.data) + r * n * DtypeSize(rows.dtype);
    // Prefetch hints for a "next tile" (the same rows again) exercise that code path too.
    l.attn->weighted_rows(acc.data, nq, w.data, nrows, ptrs.data(), nrows, rows.dtype, n, ptrs.data(), nrows, PrefetchTo::L1);
    return info.Env().Undefined();
  });
}

Napi::Value LogitsRows(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "simdLogitsRows";
    Level l = GetLevel(info[0], what);
    auto qs = GetF32(info[1], what + ": qs");
    const size_t nq = GetCount(info[2], what + ": nq", 1, 64);
    RowArg rows = GetRow(info[3], info[4], what);
    if (qs.length % nq) Throw("E_SHAPE", what + ": qs: expected a multiple of nq elements, got " + std::to_string(qs.length));
    const size_t n = qs.length / nq;
    if (n == 0 || rows.length % n) Throw("E_SHAPE", what + ": rows: expected a multiple of n = " + std::to_string(n) + " elements, got " + std::to_string(rows.length));
    const size_t nrows = rows.length / n;
    std::vector<const void*> ptrs(nrows);
    for (size_t r = 0; r < nrows; ++r) ptrs[r] = static_cast<const uint8_t*>(rows.data) + r * n * DtypeSize(rows.dtype);
    auto L = Napi::Float32Array::New(info.Env(), nq * nrows);
    l.attn->logits_rows(qs.data, nq, ptrs.data(), nrows, rows.dtype, n, L.Data(), nrows, ptrs.data(), nrows, PrefetchTo::L1);
    return L;
  });
}

void InitSimdBindings(Napi::Env env, Napi::Object exports) {
  exports.Set("simdDotF32", Napi::Function::New(env, DotF32));
  exports.Set("simdDotRows", Napi::Function::New(env, DotRows));
  exports.Set("simdAxpyRow", Napi::Function::New(env, AxpyRow));
  exports.Set("simdToF32", Napi::Function::New(env, ToF32));
  exports.Set("simdScaleMax", Napi::Function::New(env, ScaleMax));
  exports.Set("simdExpSum", Napi::Function::New(env, ExpSum));
  exports.Set("simdWeightedRows", Napi::Function::New(env, WeightedRows));
  exports.Set("simdLogitsRows", Napi::Function::New(env, LogitsRows));
}

}  // namespace

KVD_REGISTER_MODULE(InitSimdBindings);

}  // namespace kvd
