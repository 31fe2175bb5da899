// GetChain / ChainMiss (dram_chain.h).
#include "cache/dram_chain.h"

#include "common/errors.h"

namespace kvd {
namespace dram {

Chain GetChain(const Napi::Object& o, bool withMaps, const std::string& what) {
  Chain c;
  c.segStart = GetI32(o.Get("segStart"), what + ".segStart");
  if (c.segStart.length == 0 || c.segStart.data[0] != 0)
    Throw("E_RANGE", what + ".segStart: expected segments + 1 entries starting at 0, got " +
                         (c.segStart.length ? "first entry " + std::to_string(c.segStart.data[0]) : std::string("an empty array")));
  const size_t nSeg = c.segments();
  for (size_t s = 0; s < nSeg; ++s)
    if (c.segStart.data[s + 1] < c.segStart.data[s])
      Throw("E_RANGE", what + ".segStart: expected non-decreasing, got " + std::to_string(c.segStart.data[s + 1]) + " after " +
                           std::to_string(c.segStart.data[s]));
  if (withMaps) {
    if (!o.Get("maps").IsArray()) Throw("E_TYPE", what + ".maps: expected an Array of Int32Array slot maps, one per segment");
    const Napi::Array arr = o.Get("maps").As<Napi::Array>();
    ExpectLength(arr.Length(), nSeg, what + ".maps (one per segment)");
    c.maps.resize(nSeg);
    for (size_t s = 0; s < nSeg; ++s) c.maps[s] = GetI32(arr.Get(uint32_t(s)), what + ".maps[" + std::to_string(s) + "]");
  }
  return c;
}

std::string ChainMiss(const Chain& c, const Chain::At& at, int64_t layer, int h, int32_t g, const std::string& what) {
  return what + ".maps[" + std::to_string(at.seg) + "]: expected a slot map holding layer " + std::to_string(layer) + ", kv head " +
         std::to_string(h) + ", chunk " + std::to_string(g) + " (entry " + std::to_string(at.key) + "), got " +
         std::to_string(c.maps.empty() ? 0 : c.maps[size_t(at.seg)].length) + " entries";
}

}  // namespace dram
}  // namespace kvd
