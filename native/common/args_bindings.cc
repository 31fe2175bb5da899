// checkChunkLists: the chunk-list validator of args.h (CheckOffsets + CheckIds) exposed to
// TypeScript, so TS front doors that take per-kv-head chunk lists check them with the same code and
// messages as the kernels instead of a second copy.
#include <napi.h>

#include <string>

#include "common/args.h"
#include "common/errors.h"
#include "common/registry.h"

namespace kvd {
namespace {

// checkChunkLists({ offsets, chunkIds, kvHeads, maxChunks, what, ascending = true }) -> undefined
Napi::Value CheckChunkListsBinding(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    Napi::Object o = GetOptionsArg(info, 0, "checkChunkLists");
    Napi::Value wv = o.Get("what");
    const std::string what = wv.IsString() ? std::string(wv.As<Napi::String>()) : std::string("chunk lists");
    const int kvHeads = int(GetInt(o, "kvHeads", what, 1, kMaxKvHeads));
    const int64_t maxChunks = GetInt(o, "maxChunks", what, 0, INT32_MAX);
    Napi::Value av = o.Get("ascending");
    const bool ascending = av.IsUndefined() || av.ToBoolean().Value();
    auto off = GetI32(o.Get("offsets"), what + ".offsets");
    auto ids = GetI32(o.Get("chunkIds"), what + ".chunkIds");
    CheckOffsets(off, size_t(kvHeads), ids.length, what + ".offsets");
    CheckIds(off.data, size_t(kvHeads), ids, maxChunks, ascending, what + ".chunkIds", "kv head", "");
    return info.Env().Undefined();
  });
}

void InitArgs(Napi::Env env, Napi::Object exports) {
  exports.Set("checkChunkLists", Napi::Function::New(env, CheckChunkListsBinding));
}

}  // namespace

KVD_REGISTER_MODULE(InitArgs);

}  // namespace kvd
