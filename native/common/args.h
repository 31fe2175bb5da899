// Argument parsing for bindings: typed arrays without copies, validated shapes, and the KV view.
//
// Ownership: the pointers returned here alias JS memory. A synchronous binding may use them for
// the duration of the call. An AsyncWorker must keep a Napi::Reference (ObjectReference) to each
// typed array for as long as it uses the pointer (see KeepAlive).
#pragma once
#include <napi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <climits>
#include <algorithm>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/errors.h"

namespace kvd {

// A JS number for a message: integers without a fraction, NaN / Infinity spelled as JS does.
inline std::string Num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[32];
  if (v == std::floor(v) && std::fabs(v) < 1e18) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  // Prefer the shortest form that round-trips (0.1, not 0.10000000000000001).
  for (int prec = 1; prec < 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) return buf;
  }
  return s;
}

// ---- limits and checked size arithmetic ----
// Bounds for one layer of a KV cache on one host. They are generous (a 2^40-token context, 4096 kv
// heads, head dim 65536) but keep every product of them a checked 64-bit quantity, and they are
// what the messages quote.
constexpr int64_t kMaxTokens = int64_t(1) << 40;
constexpr int64_t kMaxKvHeads = 4096;
constexpr int64_t kMaxQHeads = 65536;
constexpr int64_t kMaxDim = 65536;
constexpr int64_t kMaxChunkSize = int64_t(1) << 20;
// Largest typed array a binding allocates for its result, in elements (2^31: 8 GiB of f32). Larger
// requests are E_RANGE before any allocation; a smaller one the process cannot get is E_NOMEM.
constexpr uint64_t kMaxOutputElements = uint64_t(1) << 31;

// a * b, or E_RANGE naming `what` when the product does not fit in 63 bits.
inline uint64_t CheckedMul(uint64_t a, uint64_t b, const std::string& what) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r) || r > uint64_t(INT64_MAX))
    Throw("E_RANGE", what + ": expected a size below 2^63, got " + std::to_string(a) + " x " + std::to_string(b) +
                         " (overflows)");
  return r;
}
inline uint64_t CheckedMul(uint64_t a, uint64_t b, uint64_t c, const std::string& what) {
  return CheckedMul(CheckedMul(a, b, what), c, what);
}
// a + b, or E_RANGE when the sum does not fit in 63 bits.
inline uint64_t CheckedAdd(uint64_t a, uint64_t b, const std::string& what) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r) || r > uint64_t(INT64_MAX))
    Throw("E_RANGE", what + ": expected a size below 2^63, got " + std::to_string(a) + " + " + std::to_string(b) + " (overflows)");
  return r;
}

// True when d is an integer in [min, max] (NaN and infinities are not); safe to cast afterwards.
inline bool IsIntIn(double d, int64_t min, int64_t max) {
  return std::isfinite(d) && d == std::floor(d) && d >= double(min) && d <= double(max);
}

inline const char* TypedArrayName(napi_typedarray_type t) {
  switch (t) {
    case napi_float32_array: return "Float32Array";
    case napi_uint16_array: return "Uint16Array";
    case napi_int32_array: return "Int32Array";
    case napi_uint32_array: return "Uint32Array";
    case napi_float64_array: return "Float64Array";
    case napi_uint8_array: return "Uint8Array";
    case napi_int8_array: return "Int8Array";
    default: return "another TypedArray";
  }
}

// The type with its article, as an error message says it: "a Float32Array", "an Int32Array".
inline std::string TypedArrayNoun(napi_typedarray_type t) {
  const std::string name = TypedArrayName(t);
  if (name.rfind("another", 0) == 0) return name;
  return (name[0] == 'I' ? "an " : "a ") + name;
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
    Throw("E_TYPE", what + ": expected " + TypedArrayNoun(want) + ", got " +
                        (v.IsArray() ? "a plain Array" : v.IsUndefined() ? "undefined" : "a non-TypedArray value"));
  Napi::TypedArray ta = v.As<Napi::TypedArray>();
  if (ta.TypedArrayType() != want)
    Throw("E_DTYPE", what + ": expected " + TypedArrayNoun(want) + ", got " + TypedArrayNoun(ta.TypedArrayType()));
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

// A caller-owned output array out[key] (a TypedArray of `type`) of at least minLength elements:
// E_SHAPE otherwise, before the binding writes anything. `what` names the binding.
template <typename T>
inline ArrayArg<T> GetOutArray(const Napi::Object& out, const char* key, napi_typedarray_type type, size_t minLength,
                               const std::string& what) {
  auto a = GetArray<T>(out.Get(key), type, what + ".out." + key);
  if (a.length < minLength)
    Throw("E_SHAPE", what + ".out." + key + ": expected at least " + std::to_string(minLength) + " elements, got " +
                         std::to_string(a.length));
  return a;
}

// A result object of named numbers, e.g. { hits, misses } (counts below 2^53).
inline Napi::Object NumbersObject(Napi::Env env, std::initializer_list<std::pair<const char*, double>> fields) {
  Napi::Object r = Napi::Object::New(env);
  for (const auto& f : fields) r.Set(f.first, f.second);
  return r;
}

// An integer JS number in [min, max]; `what` names it.
inline int64_t GetIntValue(const Napi::Value& v, const std::string& what, int64_t min, int64_t max,
                           const char* code = "E_RANGE") {
  if (!v.IsNumber()) Throw("E_TYPE", what + ": expected an integer, got " + (v.IsUndefined() ? "undefined" : "a non-number"));
  const double d = v.As<Napi::Number>().DoubleValue();
  if (!IsIntIn(d, min, max))
    Throw(code, what + ": expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " + Num(d));
  return int64_t(d);
}

// A registry handle passed as argument i: an integer (E_TYPE when absent or not a number).
inline int64_t HandleArg(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsNumber())
    Throw("E_TYPE", std::string(what) + ": expected an integer handle, got " + (info.Length() <= i ? "nothing" : "a non-number"));
  return GetIntValue(info[i], std::string(what) + " handle", -(int64_t(1) << 53), int64_t(1) << 53);
}

// What a JS value is, for "got ..." in messages.
inline const char* KindOf(const Napi::Value& v) {
  if (v.IsUndefined()) return "undefined";
  if (v.IsNull()) return "null";
  if (v.IsTypedArray()) return "a typed array";
  if (v.IsArray()) return "an array";
  if (v.IsObject()) return "an object";
  if (v.IsNumber()) return "a number";
  if (v.IsString()) return "a string";
  if (v.IsBoolean()) return "a boolean";
  return "another kind of value";
}

// Argument i of a binding as its options object: a plain object (an array or typed array would read
// every field as undefined and report a confusing missing field). `fields` names what it holds for
// the message, e.g. "{ q, qHeads, k, v, ... }".
inline Napi::Object GetOptionsArg(const Napi::CallbackInfo& info, size_t i, const std::string& what, const char* fields = nullptr) {
  const bool given = info.Length() > i;
  if (!given || !info[i].IsObject() || info[i].IsTypedArray() || info[i].IsArray())
    Throw("E_TYPE", what + ": expected an options object" + (fields ? std::string(" ") + fields : std::string()) + ", got " +
                        (given ? KindOf(info[i]) : "nothing"));
  return info[i].As<Napi::Object>();
}

inline int64_t GetInt(const Napi::Object& o, const char* key, const std::string& what, int64_t min, int64_t max) {
  return GetIntValue(o.Get(key), what + "." + key, min, max);
}

inline int64_t GetIntOr(const Napi::Object& o, const char* key, const std::string& what, int64_t min, int64_t max, int64_t dflt) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return dflt;
  return GetInt(o, key, what, min, max);
}

// o[key] as a boolean, dflt when absent (E_TYPE for any other value).
inline bool GetBoolOr(const Napi::Object& o, const char* key, const std::string& what, bool dflt) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return dflt;
  if (!v.IsBoolean()) Throw("E_TYPE", what + "." + key + ": expected a boolean, got a " + (v.IsNumber() ? "number" : "non-boolean"));
  return v.As<Napi::Boolean>().Value();
}

// A JS Float32Array / Int32Array of n elements for a result. Sizes beyond kMaxOutputElements are
// E_RANGE; an allocation V8 refuses (a RangeError in JS) becomes E_NOMEM, never an untyped error.
template <typename A>
inline A NewResultArray(Napi::Env env, uint64_t n, const std::string& what) {
  if (n > kMaxOutputElements)
    Throw("E_RANGE", what + ": expected a result of at most 2^31 elements, got " + std::to_string(n) + " elements");
  try {
    return A::New(env, size_t(n));
  } catch (const Napi::Error&) {
    Throw("E_NOMEM", what + ": could not allocate a result of " + std::to_string(n) + " elements (out of memory)");
  }
}
inline Napi::Float32Array NewF32(Napi::Env env, uint64_t n, const std::string& what) {
  return NewResultArray<Napi::Float32Array>(env, n, what);
}

// ---- one validator per kind of argument ----

// CSR offsets of `parts` lists over `n` items: parts+1 entries, offsets[0] = 0, non-decreasing,
// offsets[parts] = n. Checked in full before anyone indexes with them. `what` names the offsets.
inline void CheckOffsets(const ArrayArg<int32_t>& off, size_t parts, size_t n, const std::string& what,
                         const char* partsName = "kvHeads", const char* idsName = "chunkIds") {
  ExpectLength(off.length, parts + 1, what + " (" + partsName + "+1)");
  const int32_t* o = off.data;
  if (o[0] != 0) Throw("E_RANGE", what + "[0]: expected 0, got " + std::to_string(o[0]));
  for (size_t p = 0; p < parts; ++p)
    if (o[p + 1] < o[p])
      Throw("E_RANGE", what + ": expected non-decreasing offsets, got offsets[" + std::to_string(p + 1) + "] = " +
                           std::to_string(o[p + 1]) + " < offsets[" + std::to_string(p) + "] = " + std::to_string(o[p]));
  if (int64_t(o[parts]) != int64_t(n))
    Throw("E_SHAPE", what + "[" + partsName + "]: expected " + idsName + ".length (" + std::to_string(n) + "), got " +
                         std::to_string(o[parts]));
}

// Ids of CSR lists (offsets already checked by CheckOffsets): each in [0, maxId) and, when
// `ascending`, strictly ascending within its list (so unique). `what` names the id array, `list`
// what one list is ("kv head", "item"), `rangeNote` is appended to the out-of-range message.
inline void CheckIds(const int32_t* off, size_t parts, const ArrayArg<int32_t>& ids, int64_t maxId, bool ascending,
                     const std::string& what, const char* list, const std::string& rangeNote) {
  for (size_t p = 0; p < parts; ++p) {
    for (int32_t i = off[p]; i < off[p + 1]; ++i) {
      const int64_t c = ids.data[i];
      if (c < 0 || c >= maxId)
        Throw("E_RANGE", what + "[" + std::to_string(i) + "] (" + list + " " + std::to_string(p) + "): expected a chunk id in [0, " +
                             std::to_string(maxId) + ")" + rangeNote + ", got " + std::to_string(c));
      if (ascending && i > off[p] && c <= ids.data[i - 1])
        Throw("E_RANGE", what + "[" + std::to_string(i) + "] (" + list + " " + std::to_string(p) +
                             "): expected ascending unique chunk ids, got " + std::to_string(c) + " after " +
                             std::to_string(ids.data[i - 1]));
    }
  }
}

// Per-kv-head chunk lists (CSR, see src/index/selection.ts): offsets has kvHeads+1 entries from 0 to
// ids.length, non-decreasing; head h's ids ids[offsets[h] .. offsets[h+1]) are each in
// [0, maxChunks) and strictly ascending. `what` names the pair (e.g. "attendSparse.selection") and
// `offKey` / `idKey` its fields.
inline void CheckChunkLists(const ArrayArg<int32_t>& offsets, const ArrayArg<int32_t>& ids, int kvHeads,
                            int64_t maxChunks, const std::string& what, const std::string& rangeNote,
                            const char* offKey = "offsets", const char* idKey = "chunkIds") {
  CheckOffsets(offsets, size_t(kvHeads), ids.length, what + "." + offKey, "kvHeads", idKey);
  CheckIds(offsets.data, size_t(kvHeads), ids, maxChunks, true, what + "." + idKey, "kv head", rangeNote);
}

// Reads o[offKey] and o[idKey] (Int32Arrays) and checks them with CheckChunkLists.
inline void GetChunkLists(const Napi::Object& o, const char* offKey, const char* idKey, int kvHeads, int64_t maxChunks,
                          const std::string& what, const std::string& rangeNote, ArrayArg<int32_t>& off,
                          ArrayArg<int32_t>& ids) {
  off = GetI32(o.Get(offKey), what + "." + offKey);
  ids = GetI32(o.Get(idKey), what + "." + idKey);
  CheckChunkLists(off, ids, kvHeads, maxChunks, what, rangeNote, offKey, idKey);
}

// Byte offsets (a Float64Array, one per block) of blocks of `blockBytes` inside a buffer of
// `bufBytes`: each a non-negative integer with offset + blockBytes <= bufBytes.
inline void CheckByteOffsets(const double* offs, size_t n, uint64_t blockBytes, uint64_t bufBytes, const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    const double d = offs[i];
    if (!IsIntIn(d, 0, int64_t(1) << 53) || uint64_t(d) > bufBytes || blockBytes > bufBytes - uint64_t(d))
      Throw("E_RANGE", what + "[" + std::to_string(i) + "]: expected an integer byte offset with offset + " +
                           std::to_string(blockBytes) + " <= " + std::to_string(bufBytes) + " (the buffer), got " + Num(d));
  }
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

// The one KV-view parser. tokens*heads*dim is computed with checked arithmetic and must equal the
// data array's length, so every Row(t, h) with t < tokens, h < heads lies inside the array.
inline KvView GetKvView(const Napi::Value& v, const std::string& what) {
  if (!v.IsObject() || v.IsTypedArray() || v.IsArray())
    Throw("E_TYPE", what + ": expected a KV tensor object { data, dtype, tokens, heads, dim }");
  Napi::Object o = v.As<Napi::Object>();
  KvView kv;
  Napi::Value dt = o.Get("dtype");
  if (!dt.IsString()) Throw("E_DTYPE", what + ".dtype: expected dtype 'f32', 'f16' or 'bf16', got a non-string");
  const std::string dts = dt.As<Napi::String>();
  if (dts == "f32") kv.dtype = Dtype::F32;
  else if (dts == "f16") kv.dtype = Dtype::F16;
  else if (dts == "bf16") kv.dtype = Dtype::BF16;
  else Throw("E_DTYPE", what + ".dtype: expected dtype 'f32', 'f16' or 'bf16', got '" + dts.substr(0, 40) + "'");
  kv.tokens = GetInt(o, "tokens", what, 0, kMaxTokens);
  kv.heads = int(GetInt(o, "heads", what, 1, kMaxKvHeads));
  kv.dim = int(GetInt(o, "dim", what, 1, kMaxDim));
  // tokens <= 2^40, heads <= 2^12, dim <= 2^16: the product can exceed 64 bits, so it is checked; an
  // overflowing product matches no array length (E_SHAPE below).
  uint64_t want = 0;
  const bool overflow = __builtin_mul_overflow(uint64_t(kv.tokens), uint64_t(kv.heads) * uint64_t(kv.dim), &want);
  const std::string dataWhat = what + ".data" + (kv.dtype == Dtype::F32 ? std::string() : " (" + std::string(DtypeName(kv.dtype)) + " bits)");
  size_t length = 0;
  if (kv.dtype == Dtype::F32) {
    auto a = GetF32(o.Get("data"), dataWhat);
    kv.data = a.data;
    length = a.length;
    kv.array = a.object;
  } else {
    auto a = GetArray<uint16_t>(o.Get("data"), napi_uint16_array, dataWhat);
    kv.data = a.data;
    length = a.length;
    kv.array = a.object;
  }
  if (overflow || uint64_t(length) != want)
    Throw("E_SHAPE", what + ".data (tokens*heads*dim = " + std::to_string(kv.tokens) + "*" + std::to_string(kv.heads) + "*" +
                         std::to_string(kv.dim) + "): expected " + (overflow ? std::string("more than 2^64") : std::to_string(want)) +
                         " elements, got " + std::to_string(length));
  Napi::Value layout = o.Get("layout");
  if (!layout.IsUndefined() && !layout.IsString()) Throw("E_CONFIG", what + ".layout: expected 'thd' or 'htd', got a non-string");
  const std::string lay = layout.IsString() ? std::string(layout.As<Napi::String>()) : "thd";
  if (lay == "thd") {
    kv.tokenStride = int64_t(kv.heads) * kv.dim;
    kv.headStride = kv.dim;
  } else if (lay == "htd") {
    kv.tokenStride = kv.dim;
    kv.headStride = kv.tokens * kv.dim;
  } else {
    Throw("E_CONFIG", what + ".layout: expected 'thd' or 'htd', got '" + lay.substr(0, 40) + "'");
  }
  return kv;
}

// ---- the Selection (src/index/selection.ts), parsed once for every kernel that takes one ----

// What a caller allows of a Selection.
struct SelectionRules {
  int kvHeads = 1;
  int64_t maxTokens = kMaxTokens;  // selection.tokens <= this (rows the caller can read)
  int64_t chunkSize = 0;           // > 0: selection.chunkSize must equal it
  int64_t maxSinkEnd = kMaxTokens; // sinkEnd <= min(tokens, this)
  int64_t minTailStart = 0;        // tailStart >= max(sinkEnd, this)
  bool chunksBeforeTail = false;   // chunk ids < ceil(tailStart / chunkSize) instead of ceil(tokens / chunkSize)
  bool pool = false;               // parse the optional lookahead pool (poolOffsets, poolIds, poolScores)
};

struct SelectionArg {
  int64_t chunkSize = 0, tokens = 0, sinkEnd = 0, tailStart = 0, maxChunks = 0;
  ArrayArg<int32_t> offsets, chunkIds;
  bool hasPool = false;
  ArrayArg<int32_t> poolOffsets, poolIds;  // per kv head, any order, ids < maxChunks
  ArrayArg<float> poolScores;              // finite, one per pool id
  // Keep-alive handles of every array above (for async use).
  void Keep(std::vector<Napi::Object>& keep) const {
    keep.push_back(offsets.object);
    keep.push_back(chunkIds.object);
    if (hasPool) keep.insert(keep.end(), {poolOffsets.object, poolIds.object, poolScores.object});
  }
};

// Parses and checks a Selection object { chunkSize, tokens, sinkEnd, tailStart, offsets, chunkIds,
// poolOffsets?, poolIds?, poolScores? }: 0 <= sinkEnd <= tailStart <= tokens, chunk lists as
// CheckChunkLists says. `what` names the Selection (e.g. "attendSparse.selection").
inline SelectionArg GetSelectionArg(const Napi::Value& sv, const SelectionRules& r, const std::string& what) {
  if (!sv.IsObject() || sv.IsTypedArray() || sv.IsArray())
    Throw("E_TYPE", what + ": expected a Selection object { chunkSize, tokens, sinkEnd, tailStart, offsets, chunkIds }");
  Napi::Object sel = sv.As<Napi::Object>();
  SelectionArg s;
  s.chunkSize = GetInt(sel, "chunkSize", what, 1, kMaxChunkSize);
  if (r.chunkSize > 0 && s.chunkSize != r.chunkSize)
    Throw("E_SHAPE", what + ".chunkSize: expected the hot tier's chunk size " + std::to_string(r.chunkSize) + ", got " +
                         std::to_string(s.chunkSize));
  const int64_t maxTokens = std::min(r.maxTokens, kMaxTokens);
  s.tokens = GetInt(sel, "tokens", what, 0, maxTokens);
  s.sinkEnd = GetInt(sel, "sinkEnd", what, 0, std::min(s.tokens, r.maxSinkEnd));
  const int64_t minTail = std::max(s.sinkEnd, r.minTailStart);
  if (minTail > s.tokens)
    Throw("E_RANGE", what + ".tokens: expected at least " + std::to_string(minTail) + " (sinkEnd and the tail's first token), got " +
                         std::to_string(s.tokens));
  s.tailStart = GetInt(sel, "tailStart", what, minTail, s.tokens);
  const int64_t end = r.chunksBeforeTail ? s.tailStart : s.tokens;
  s.maxChunks = (end + s.chunkSize - 1) / s.chunkSize;
  const std::string note = r.chunksBeforeTail ? " (chunks before tailStart " + std::to_string(s.tailStart) + ")"
                                              : " for " + std::to_string(s.tokens) + " tokens of chunk size " + std::to_string(s.chunkSize);
  GetChunkLists(sel, "offsets", "chunkIds", r.kvHeads, s.maxChunks, what, note, s.offsets, s.chunkIds);
  if (r.pool && !sel.Get("poolOffsets").IsUndefined()) {
    s.hasPool = true;
    s.poolOffsets = GetI32(sel.Get("poolOffsets"), what + ".poolOffsets");
    s.poolIds = GetI32(sel.Get("poolIds"), what + ".poolIds");
    s.poolScores = GetF32(sel.Get("poolScores"), what + ".poolScores");
    CheckOffsets(s.poolOffsets, size_t(r.kvHeads), s.poolIds.length, what + ".poolOffsets", "kvHeads", "poolIds");
    CheckIds(s.poolOffsets.data, size_t(r.kvHeads), s.poolIds, s.maxChunks, false, what + ".poolIds", "kv head", note);
    ExpectLength(s.poolScores.length, s.poolIds.length, what + ".poolScores (one per pool id)");
    for (size_t i = 0; i < s.poolScores.length; ++i)
      if (!std::isfinite(s.poolScores.data[i]))
        Throw("E_NONFINITE", what + ".poolScores[" + std::to_string(i) + "]: expected a finite score, got " + Num(s.poolScores.data[i]));
  }
  return s;
}

// Copies a parsed Selection into a kernel job's fields of the same names (chunkSize, tokens,
// sinkEnd, tailStart, offsets, chunkIds, nChunks) and keeps its arrays alive.
template <typename Job>
inline void SetSelection(Job& job, const SelectionArg& s, std::vector<Napi::Object>& keep) {
  job.chunkSize = s.chunkSize;
  job.tokens = s.tokens;
  job.sinkEnd = s.sinkEnd;
  job.tailStart = s.tailStart;
  job.offsets = s.offsets.data;
  job.chunkIds = s.chunkIds.data;
  job.nChunks = s.chunkIds.length;
  s.Keep(keep);
}

// A copy of v as a new Float32Array (float) or Int32Array (int32_t).
template <typename T>
Napi::TypedArray ToJs(Napi::Env env, const std::vector<T>& v) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, int32_t>, "ToJs: float or int32_t elements");
  if constexpr (std::is_same_v<T, float>) {
    auto a = Napi::Float32Array::New(env, v.size());
    std::copy(v.begin(), v.end(), a.Data());
    return a;
  } else {
    auto a = Napi::Int32Array::New(env, v.size());
    std::copy(v.begin(), v.end(), a.Data());
    return a;
  }
}

// Query vectors: a Float32Array of qHeads*dim finite values (qHeads a multiple of kvHeads).
inline ArrayArg<float> GetQuery(const Napi::Object& o, int qHeads, int dim, const std::string& what) {
  auto q = GetF32(o.Get("q"), what + ".q");
  ExpectLength(q.length, size_t(qHeads) * size_t(dim), what + ".q (qHeads*dim)");
  for (size_t i = 0; i < q.length; ++i)
    if (!std::isfinite(q.data[i]))
      Throw("E_NONFINITE", what + ".q: query head " + std::to_string(i / size_t(dim)) + " holds NaN/Inf (at element " +
                               std::to_string(i % size_t(dim)) + "); expected finite values, got " + Num(q.data[i]));
  return q;
}

// qHeads: an integer multiple of kvHeads in [1, kMaxQHeads].
inline int GetQHeads(const Napi::Object& o, int kvHeads, const std::string& what) {
  const int qHeads = int(GetInt(o, "qHeads", what, 1, kMaxQHeads));
  if (qHeads % kvHeads != 0)
    Throw("E_SHAPE", what + ".qHeads: expected a multiple of the kv heads (" + std::to_string(kvHeads) + "), got " +
                         std::to_string(qHeads));
  return qHeads;
}

// The softmax scale: 1/sqrt(dim) when absent, else a finite number > 0 (and > 0 as a float).
inline float GetScaleArg(const Napi::Object& o, int dim, const std::string& what) {
  Napi::Value s = o.Get("scale");
  if (s.IsUndefined()) return 1.f / std::sqrt(float(dim));
  if (!s.IsNumber()) Throw("E_TYPE", what + ".scale: expected a number, got a non-number");
  const double d = s.As<Napi::Number>().DoubleValue();
  if (!std::isfinite(d) || d <= 0 || float(d) == 0.f || !std::isfinite(float(d)))
    Throw("E_RANGE", what + ".scale: expected a finite number > 0, got " + Num(d));
  return float(d);
}

}  // namespace kvd
