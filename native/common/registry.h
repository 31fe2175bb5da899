// Module registry: every native/*.cc file that exposes functions registers one init function with
// KVD_REGISTER_MODULE, so adding a kernel file never requires editing addon.cc (and parallel work on
// different kernels never conflicts there). Order of registration is unspecified; modules must not
// depend on each other's exports.
#pragma once
#include <napi.h>
#include <vector>

namespace kvd {

using ModuleInit = void (*)(Napi::Env env, Napi::Object exports);

std::vector<ModuleInit>& ModuleInits();

struct ModuleRegistrar {
  explicit ModuleRegistrar(ModuleInit fn) { ModuleInits().push_back(fn); }
};

}  // namespace kvd

#define KVD_REGISTER_MODULE(fn) static ::kvd::ModuleRegistrar kvd_registrar_##fn(fn)
