// CRC-32C: SSE4.2 path (8 bytes per crc32 instruction) with run-time detection, table fallback.
#include "crc32c.h"

#include <napi.h>

#include <cstring>

#include "args.h"
#include "errors.h"
#include "registry.h"

namespace kvd {
namespace {

struct Table {
  uint32_t t[256];
  Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};
const Table& Tab() {
  static const Table t;
  return t;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cHw(uint32_t crc, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = uint32_t(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return ~c32;
}
bool HasSse42() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
  }();
  return has;
}
#endif

Napi::Value Crc32cBinding(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto a = GetArray<uint8_t>(info[0], napi_uint8_array, "crc32c(data)");
    bool portable = info.Length() > 1 && info[1].IsBoolean() && info[1].As<Napi::Boolean>().Value();
    uint32_t c = portable ? Crc32cPortable(0, a.data, a.length) : Crc32c(0, a.data, a.length);
    return Napi::Number::New(info.Env(), double(c));
  });
}

void InitCrc32c(Napi::Env env, Napi::Object exports) {
  exports.Set("crc32c", Napi::Function::New(env, Crc32cBinding));
}

}  // namespace

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const uint32_t* t = Tab().t;
  uint32_t c = ~crc;
  while (n--) c = t[(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}

uint32_t Crc32c(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (HasSse42()) return Crc32cHw(crc, data, n);
#endif
  return Crc32cPortable(crc, data, n);
}

KVD_REGISTER_MODULE(InitCrc32c);

}  // namespace kvd
