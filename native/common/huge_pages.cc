// AdviseHugePages (huge_pages.h) and its binding, the one place the addon asks for huge pages:
// the GGUF weights (llama_model.cc), KV held outside the runtime (src/util/kv-array.ts: the GGUF
// host's dense cache, synthetic traces) and the runtime's DRAM-tier arenas (src/storage/dram-store.ts).
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

void InitHugePages(Napi::Env env, Napi::Object exports) {
  exports.Set("adviseHugePages", Napi::Function::New(env, AdviseHugePagesBinding));
}

}  // namespace

KVD_REGISTER_MODULE(InitHugePages);

}  // namespace kvd
