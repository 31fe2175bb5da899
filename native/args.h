// Argument parsing for bindings: typed arrays without copies, validated shapes, and the KV view.
//
// Ownership: the pointers returned here alias JS memory. A synchronous binding may use them for
// the duration of the call. An AsyncWorker must keep a Napi::Reference (ObjectReference) to each
// typed array for as long as it uses the pointer (see KeepAlive).
#pragma once
#include <napi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dtype.h"
#include "errors.h"

namespace kvd {

inline std::string Num(double v) {
  std::string s = std::to_string(v);
  if (s.find('.') != std::string::npos) {
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
  }
  return s;
}

inline const char* TypedArrayName(napi_typedarray_type t) {
  switch (t) {
    case napi_float32_array: return "Float32Array";
    case napi_uint16_array: return "Uint16Array";
    case napi_int32_array: return "Int32Array";
    case napi_uint32_array: return "Uint32Array";
    case napi_float64_array: return "Float64Array";
    case napi_uint8_array: return "Uint8Array";
    default: return "another TypedArray";
  }
}

// A typed array view (no copy). `length` is in elements.
template <typename T>
struct ArrayArg {
  T* data = nullptr;
  size_t length = 0;
  Napi::Object object;  // the JS TypedArray, for references in async workers
};

template <typename T>
inline ArrayArg<T> GetArray(const Napi::Value& v, napi_typedarray_type want, const std::string& what) {
  if (!v.IsTypedArray())
    Throw("E_TYPE", what + ": expected a " + TypedArrayName(want) + ", got " +
                        (v.IsArray() ? "a plain Array" : v.IsUndefined() ? "undefined" : "a non-TypedArray value"));
  Napi::TypedArray ta = v.As<Napi::TypedArray>();
  if (ta.TypedArrayType() != want)
    Throw("E_DTYPE", what + ": expected a " + std::string(TypedArrayName(want)) + ", got a " +
                         TypedArrayName(ta.TypedArrayType()));
  ArrayArg<T> a;
  // napi_get_typedarray_info's data pointer already includes the byte offset and works for
  // SharedArrayBuffer-backed arrays too (pipeline workers share KV and arenas that way).
  napi_typedarray_type type;
  size_t length = 0;
  void* data = nullptr;
  napi_status st = napi_get_typedarray_info(v.Env(), v, &type, &length, &data, nullptr, nullptr);
  if (st != napi_ok) Throw("E_TYPE", what + ": could not read the TypedArray");
  a.data = static_cast<T*>(data);
  a.length = length;
  a.object = ta;
  return a;
}

inline ArrayArg<float> GetF32(const Napi::Value& v, const std::string& what) {
  return GetArray<float>(v, napi_float32_array, what);
}
inline ArrayArg<int32_t> GetI32(const Napi::Value& v, const std::string& what) {
  return GetArray<int32_t>(v, napi_int32_array, what);
}

inline void ExpectLength(size_t got, size_t want, const std::string& what) {
  if (got != want)
    Throw("E_SHAPE", what + ": expected " + std::to_string(want) + " elements, got " + std::to_string(got));
}

inline int64_t GetInt(const Napi::Object& o, const char* key, const std::string& what, int64_t min, int64_t max) {
  Napi::Value v = o.Get(key);
  if (!v.IsNumber()) Throw("E_TYPE", what + "." + key + ": expected an integer, got " + (v.IsUndefined() ? "undefined" : "a non-number"));
  double d = v.As<Napi::Number>().DoubleValue();
  if (d != double(int64_t(d)) || d < double(min) || d > double(max))
    Throw("E_RANGE", what + "." + key + ": expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
                         "], got " + Num(d));
  return int64_t(d);
}

inline int64_t GetIntOr(const Napi::Object& o, const char* key, const std::string& what, int64_t min, int64_t max, int64_t dflt) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return dflt;
  return GetInt(o, key, what, min, max);
}

// Head h's chunk ids ids[offsets[h] .. offsets[h+1]) are each in [0, maxChunks) and strictly
// ascending (so unique). `offsets` must already be valid for `ids` (see CheckChunkLists); `what`
// names the Selection and `rangeNote` is appended to the out-of-range message.
inline void CheckChunkIds(const int32_t* off, const ArrayArg<int32_t>& ids, int kvHeads, int64_t maxChunks,
                          const std::string& what, const std::string& rangeNote) {
  for (int h = 0; h < kvHeads; ++h) {
    for (int32_t i = off[h]; i < off[h + 1]; ++i) {
      const int64_t c = ids.data[i];
      if (c < 0 || c >= maxChunks)
        Throw("E_RANGE", what + ".chunkIds[" + std::to_string(i) + "] (kv head " + std::to_string(h) +
                             "): expected a chunk id in [0, " + std::to_string(maxChunks) + ")" + rangeNote +
                             ", got " + std::to_string(c));
      if (i > off[h] && c <= ids.data[i - 1])
        Throw("E_RANGE", what + ".chunkIds[" + std::to_string(i) + "] (kv head " + std::to_string(h) +
                             "): expected ascending unique chunk ids, got " + std::to_string(c) + " after " +
                             std::to_string(ids.data[i - 1]));
    }
  }
}

// Validates a Selection's per-kv-head chunk lists (CSR layout, see src/index/selection.ts):
// offsets has kvHeads+1 entries starting at 0, non-decreasing, ending at ids.length; head h's ids
// are ids[offsets[h] .. offsets[h+1]), each in [0, maxChunks), strictly ascending (so unique).
// `what` names the Selection (e.g. "attendSparse.selection"); `rangeNote` is appended to the
// out-of-range message to say where maxChunks comes from (e.g. " for 96 tokens of chunk size 32").
inline void CheckChunkLists(const ArrayArg<int32_t>& offsets, const ArrayArg<int32_t>& ids, int kvHeads,
                            int64_t maxChunks, const std::string& what, const std::string& rangeNote) {
  ExpectLength(offsets.length, size_t(kvHeads) + 1, what + ".offsets (kvHeads+1)");
  const int32_t* off = offsets.data;
  if (off[0] != 0) Throw("E_RANGE", what + ".offsets[0]: expected 0, got " + std::to_string(off[0]));
  for (int h = 0; h < kvHeads; ++h)
    if (off[h + 1] < off[h])
      Throw("E_RANGE", what + ".offsets: expected non-decreasing offsets, got offsets[" + std::to_string(h + 1) +
                           "] = " + std::to_string(off[h + 1]) + " < offsets[" + std::to_string(h) +
                           "] = " + std::to_string(off[h]));
  if (size_t(off[kvHeads]) != ids.length)
    Throw("E_SHAPE", what + ".offsets[kvHeads]: expected chunkIds.length (" + std::to_string(ids.length) + "), got " +
                         std::to_string(off[kvHeads]));
  CheckChunkIds(off, ids, kvHeads, maxChunks, what, rangeNote);
}

// A KV tensor of one layer: `tokens` rows, each `heads` x `dim` elements, in storage dtype.
// JS shape: { data: Float32Array | Uint16Array, dtype: 'f32'|'f16'|'bf16', tokens, heads, dim }.
// Element (t, h, i) is at data[t * tokenStride + h * headStride + i]; token-major [T, H, D] gives
// tokenStride = H*D, headStride = D (the trace layout). Optional `layout: 'htd'` means [H, T, D].
struct KvView {
  const void* data = nullptr;
  Dtype dtype = Dtype::F32;
  int64_t tokens = 0;
  int heads = 0;
  int dim = 0;
  int64_t tokenStride = 0;  // elements
  int64_t headStride = 0;   // elements
  Napi::Object array;       // keep-alive handle for async use

  const void* Row(int64_t t, int h) const {
    return static_cast<const uint8_t*>(data) + (t * tokenStride + h * headStride) * int64_t(DtypeSize(dtype));
  }
};

inline KvView GetKvView(const Napi::Value& v, const std::string& what) {
  if (!v.IsObject()) Throw("E_TYPE", what + ": expected a KV tensor object { data, dtype, tokens, heads, dim }");
  Napi::Object o = v.As<Napi::Object>();
  KvView kv;
  Napi::Value dt = o.Get("dtype");
  if (!dt.IsString()) Throw("E_DTYPE", what + ".dtype: expected 'f32', 'f16' or 'bf16'");
  kv.dtype = ParseDtype(dt.As<Napi::String>());
  kv.tokens = GetInt(o, "tokens", what, 0, int64_t(1) << 40);
  kv.heads = int(GetInt(o, "heads", what, 1, 4096));
  kv.dim = int(GetInt(o, "dim", what, 1, 65536));
  if (kv.dtype == Dtype::F32) {
    auto a = GetF32(o.Get("data"), what + ".data");
    kv.data = a.data;
    ExpectLength(a.length, size_t(kv.tokens) * kv.heads * kv.dim, what + ".data (tokens*heads*dim)");
    kv.array = a.object;
  } else {
    auto a = GetArray<uint16_t>(o.Get("data"), napi_uint16_array, what + ".data (" + DtypeName(kv.dtype) + " bits)");
    kv.data = a.data;
    ExpectLength(a.length, size_t(kv.tokens) * kv.heads * kv.dim, what + ".data (tokens*heads*dim)");
    kv.array = a.object;
  }
  Napi::Value layout = o.Get("layout");
  std::string lay = layout.IsString() ? std::string(layout.As<Napi::String>()) : "thd";
  if (lay == "thd") {
    kv.tokenStride = int64_t(kv.heads) * kv.dim;
    kv.headStride = kv.dim;
  } else if (lay == "htd") {
    kv.tokenStride = kv.dim;
    kv.headStride = kv.tokens * kv.dim;
  } else {
    Throw("E_CONFIG", what + ".layout: expected 'thd' or 'htd', got '" + lay + "'");
  }
  return kv;
}

}  // namespace kvd
