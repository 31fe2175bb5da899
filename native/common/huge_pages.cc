// AdviseHugePages (huge_pages.h) and its binding, the one place the addon asks for huge pages:
// the GGUF weights (llama_model.cc), KV held outside the runtime (src/util/kv-array.ts: the GGUF
// host's dense cache, synthetic traces) and the runtime's DRAM-tier arenas (src/storage/dram-store.ts).
// Beside it, alignmentGap: where in a fresh buffer those arrays start so that their rows start on
// cache lines (kv-array.ts).
//
// Why the arenas: attention over a token-granular selection reads ~16K rows of 256 B per
// layer-step at random from them (hundreds of MiB). With 4 KiB pages nearly every row is a TLB
// miss, and under virtualisation each miss is a two-level page walk (bench/RESULTS.md, "Huge pages
// for the DRAM tier's arenas").
#include "common/huge_pages.h"

#include <napi.h>

#include <cstdint>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "common/args.h"
#include "common/errors.h"
#include "common/registry.h"

namespace kvd {

size_t AdviseHugePages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  if (bytes < kHuge || begin > UINTPTR_MAX - bytes) return 0;
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t last = (begin + bytes) & ~(kHuge - 1);
  if (last <= first) return 0;
  return madvise(reinterpret_cast<void*>(first), size_t(last - first), MADV_HUGEPAGE) == 0 ? size_t(last - first) : 0;
#else
  (void)p;
  (void)bytes;
  return 0;
#endif
}

namespace {

// adviseHugePages(view: any TypedArray, shared or not) -> number of bytes advised (see
// AdviseHugePages). For a fresh large array: its memory is still untouched (calloc'd by mmap), so
// its first writes fault in huge pages.
Napi::Value AdviseHugePagesBinding(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    if (info.Length() < 1 || !info[0].IsTypedArray())
      Throw("E_TYPE", std::string("adviseHugePages: expected a TypedArray (a view of the buffer to advise), got ") +
                          (info.Length() < 1 ? "no argument" : info[0].IsArray() ? "a plain Array" : info[0].IsUndefined() ? "undefined" : "a non-TypedArray value"));
    // The data pointer from napi_get_typedarray_info includes the byte offset and works for
    // SharedArrayBuffer-backed views (the DRAM tier's arenas are shared with stage workers).
    napi_typedarray_type type;
    size_t length = 0;
    void* data = nullptr;
    if (napi_get_typedarray_info(info.Env(), info[0], &type, &length, &data, nullptr, nullptr) != napi_ok)
      Throw("E_TYPE", "adviseHugePages: could not read the TypedArray");
    const size_t bytes = info[0].As<Napi::TypedArray>().ByteLength();
    return Napi::Number::New(info.Env(), double(data ? AdviseHugePages(data, bytes) : 0));
  });
}

// alignmentGap(view: any TypedArray, alignment: a power of two in [1, 2^21]) -> bytes from the view's
// first byte to the next address that is a multiple of `alignment` (0 when it already is one).
// JavaScript cannot see addresses, and V8's large buffers start 16 bytes past a page (glibc's mmap'd
// blocks), so every 256-byte KV row of a buffer placed at its start straddles five cache lines.
Napi::Value AlignmentGapBinding(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    if (info.Length() < 1 || !info[0].IsTypedArray())
      Throw("E_TYPE", std::string("alignmentGap: expected a TypedArray (a view of the buffer to place data in), got ") +
                          (info.Length() < 1 ? "no argument" : info[0].IsArray() ? "a plain Array" : info[0].IsUndefined() ? "undefined" : "a non-TypedArray value"));
    if (info.Length() < 2 || !info[1].IsNumber()) Throw("E_TYPE", "alignmentGap: expected an alignment in bytes (a power of two), got a non-number");
    const double a = info[1].As<Napi::Number>().DoubleValue();
    if (!(a >= 1 && a <= double(1 << 21)) || a != double(int64_t(a)) || (int64_t(a) & (int64_t(a) - 1)) != 0)
      Throw("E_RANGE", "alignmentGap: expected an alignment that is a power of two in [1, 2^21], got " + Num(a));
    napi_typedarray_type type;
    size_t length = 0;
    void* data = nullptr;
    if (napi_get_typedarray_info(info.Env(), info[0], &type, &length, &data, nullptr, nullptr) != napi_ok)
      Throw("E_TYPE", "alignmentGap: could not read the TypedArray");
    const uintptr_t mask = uintptr_t(a) - 1;
    return Napi::Number::New(info.Env(), double((uintptr_t(0) - reinterpret_cast<uintptr_t>(data)) & mask));
  });
}

void InitHugePages(Napi::Env env, Napi::Object exports) {
  exports.Set("adviseHugePages", Napi::Function::New(env, AdviseHugePagesBinding));
  exports.Set("alignmentGap", Napi::Function::New(env, AlignmentGapBinding));
}

}  // namespace

KVD_REGISTER_MODULE(InitHugePages);

}  // namespace kvd
