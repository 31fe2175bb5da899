// CRC-32C: SSE4.2 path (8 bytes per crc32 instruction) with run-time detection, table fallback.
#include "storage/crc32c.h"

#include <napi.h>

#include <cstring>
#include <utility>

#include "common/args.h"
#include "common/errors.h"
#include "common/registry.h"

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

// Shift operators for the 3-way hardware CRC (Mark Adler's construction, public domain): a table
// that advances a CRC over `len` zero bytes, so three independent crc32 streams over adjacent
// blocks can be combined. Three streams hide the crc32 instruction's 3-cycle latency (~3x faster).
constexpr size_t kLong = 8192, kShort = 256;

uint32_t Gf2Times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  while (vec) {
    if (vec & 1) sum ^= *mat;
    vec >>= 1;
    mat++;
  }
  return sum;
}
void Gf2Square(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; n++) square[n] = Gf2Times(mat, mat[n]);
}
// Operator for `len` zero bytes (len a power of two).
void ZerosOp(uint32_t* even, size_t len) {
  uint32_t odd[32];
  odd[0] = 0x82F63B78u;
  uint32_t row = 1;
  for (int n = 1; n < 32; n++) {
    odd[n] = row;
    row <<= 1;
  }
  Gf2Square(even, odd);  // 2 zero bits
  Gf2Square(odd, even);  // 4 zero bits
  do {
    Gf2Square(even, odd);
    len >>= 1;
    if (len == 0) return;
    Gf2Square(odd, even);
    len >>= 1;
  } while (len);
  for (int n = 0; n < 32; n++) even[n] = odd[n];
}
struct ShiftTable {
  uint32_t z[4][256];
  explicit ShiftTable(size_t len) {
    uint32_t op[32];
    ZerosOp(op, len);
    for (uint32_t n = 0; n < 256; n++) {
      z[0][n] = Gf2Times(op, n);
      z[1][n] = Gf2Times(op, n << 8);
      z[2][n] = Gf2Times(op, n << 16);
      z[3][n] = Gf2Times(op, n << 24);
    }
  }
  uint32_t Shift(uint32_t crc) const {
    return z[0][crc & 0xff] ^ z[1][(crc >> 8) & 0xff] ^ z[2][(crc >> 16) & 0xff] ^ z[3][crc >> 24];
  }
};
const ShiftTable& LongShift() {
  static const ShiftTable t(kLong);
  return t;
}
const ShiftTable& ShortShift() {
  static const ShiftTable t(kShort);
  return t;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cHw(uint32_t crc, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t c0 = uint32_t(~crc);
  auto load = [](const uint8_t* q) {
    uint64_t v;
    std::memcpy(&v, q, 8);
    return v;
  };
  for (const auto& [block, table] : {std::pair<size_t, const ShiftTable*>{kLong, &LongShift()}, {kShort, &ShortShift()}}) {
    while (n >= 3 * block) {
      uint64_t c1 = 0, c2 = 0;
      const uint8_t* end = p + block;
      do {
        c0 = __builtin_ia32_crc32di(c0, load(p));
        c1 = __builtin_ia32_crc32di(c1, load(p + block));
        c2 = __builtin_ia32_crc32di(c2, load(p + 2 * block));
        p += 8;
      } while (p < end);
      c0 = table->Shift(uint32_t(c0)) ^ uint32_t(c1);
      c0 = table->Shift(uint32_t(c0)) ^ uint32_t(c2);
      p += 2 * block;
      n -= 3 * block;
    }
  }
  while (n >= 8) {
    c0 = __builtin_ia32_crc32di(c0, load(p));
    p += 8;
    n -= 8;
  }
  uint32_t c32 = uint32_t(c0);
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
  LongShift();  // build the shift tables once, before any worker thread needs them
  ShortShift();
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
