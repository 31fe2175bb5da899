// A sequence's segment chain as the DRAM tier maps it (src/storage/tiered-kv.ts's DramChain, the
// state src/storage/dram-store.ts owns): global chunk g lies in the segment s with segStart[s] <= g
// < segStart[s + 1], at local chunk g - segStart[s]; that segment's slot map holds the slot of
// (layer, kv head h, local chunk) at (layer * kvHeads + h) * chunks(s) + local, or -1 when the chunk
// is not resident. Slot n lies in arena block n / slotsPerBlock at byte (n % slotsPerBlock) *
// chunkBytes.
//
// Read by the DRAM tier's lookup (dramLocate, dram_tier.cc) and by attention reading a tier that
// holds every chunk straight from its arena (attendFetched's `dramTier`, tiered_attention.cc): one
// parser and one index rule, so the two can never disagree on where a chunk lives.
#pragma once
#include <napi.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/args.h"

namespace kvd {
namespace dram {

struct Chain {
  ArrayArg<int32_t> segStart;           // segments + 1 entries: 0, then non-decreasing
  std::vector<ArrayArg<int32_t>> maps;  // one slot map per segment (empty: read without a tier)

  size_t segments() const { return segStart.length - 1; }
  int64_t chunks() const { return segStart.data[segments()]; }

  // Where the slot of (layer, kv head h, global chunk g) is: g's segment, the entry's index in that
  // segment's map, and whether that index lies inside the map (callers name it when it does not).
  // g must be in [0, chunks()). The segment is found from `cursor`, the segment of the caller's
  // previous chunk: a walk over ascending chunks (a kv head's selection, attention's and the
  // fetches' order) moves it forwards without reading anything per chunk but segStart, which stays
  // in cache; any other chunk costs a binary search.
  struct At {
    int32_t seg;
    int64_t key;
    bool inside;
  };
  At Locate(int64_t layer, int kvHeads, int32_t g, int h, size_t& cursor) const {
    const int32_t* st = segStart.data;
    const size_t nSeg = segments();
    if (!(cursor < nSeg && g >= st[cursor] && g < st[cursor + 1])) {
      if (cursor + 1 < nSeg && g >= st[cursor + 1] && g < st[cursor + 2]) ++cursor;
      else cursor = size_t(std::upper_bound(st, st + nSeg + 1, g) - st) - 1;
    }
    const int32_t s = int32_t(cursor);
    const int64_t key = (layer * kvHeads + h) * (int64_t(st[s + 1]) - st[s]) + (g - st[s]);
    return {s, key, !maps.empty() && key >= 0 && size_t(key) < maps[size_t(s)].length};
  }
};

// o.segStart (an Int32Array, checked: starts at 0, non-decreasing) and, with `withMaps`, o.maps, an
// Array of one Int32Array slot map per segment. Throws E_TYPE / E_SHAPE / E_RANGE naming `what`.
Chain GetChain(const Napi::Object& o, bool withMaps, const std::string& what);

// The message for a chunk whose Locate() is not inside: the segment's map too short for it.
std::string ChainMiss(const Chain& c, const Chain::At& at, int64_t layer, int h, int32_t g, const std::string& what);

}  // namespace dram
}  // namespace kvd
