// Addon entry point: runs every registered module init (see registry.h).
#include "common/registry.h"

namespace kvd {
std::vector<ModuleInit>& ModuleInits() {
  static std::vector<ModuleInit> inits;  // function-local: safe against static-init order
  return inits;
}
}  // namespace kvd

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  for (auto fn : kvd::ModuleInits()) fn(env, exports);
  return exports;
}

NODE_API_MODULE(kvdrive, Init)
