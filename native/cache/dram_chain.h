// A sequence's segment chain as the DRAM tier maps it (src/storage/tiered-kv.ts's DramChain, the
// state src/storage/dram-store.ts owns): global chunk g lies in segment chunkSeg[g], at local chunk
// g - segStart[chunkSeg[g]]; that segment's slot map holds the slot of (layer, kv head h, local
// chunk) at (layer * kvHeads + h) * chunks(segment) + local, or -1 when the chunk is not resident.
// Slot s lies in arena block s / slotsPerBlock at byte (s % slotsPerBlock) * chunkBytes.
//
// Read by the DRAM tier's lookup (dramLocate, dram_tier.cc) and by attention reading a tier that
// holds every chunk straight from its arena (attendFetched's `dramTier`, tiered_attention.cc): one
// parser and one index rule, so the two can never disagree on where a chunk lives.
#pragma once
#include <napi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/args.h"

namespace kvd {
namespace dram {

struct Chain {
  ArrayArg<int32_t> chunkSeg;            // one entry per global chunk of the chain
  ArrayArg<int32_t> segStart;            // segments + 1 entries: 0, then non-decreasing, last = chunkSeg.length
  std::vector<ArrayArg<int32_t>> maps;   // one slot map per segment (empty: read without a tier)

  size_t segments() const { return segStart.length - 1; }
  size_t chunks() const { return chunkSeg.length; }

  // Where the slot of (layer, kv head h, global chunk g) is: g's segment, the entry's index in that
  // segment's map, and whether every index on the way lies inside the chain and the map (callers
  // name the first that does not). g must be in [0, chunks()).
  struct At {
    int32_t seg;
    int64_t key;
    bool inside;
  };
  At Locate(int64_t layer, int kvHeads, int32_t g, int h) const {
    const int32_t s = chunkSeg.data[g];
    if (s < 0 || size_t(s) >= segments()) return {s, -1, false};
    const int64_t n = int64_t(segStart.data[s + 1]) - segStart.data[s];
    const int64_t key = (layer * kvHeads + h) * n + (g - segStart.data[s]);
    const bool mapped = !maps.empty() && key >= 0 && size_t(key) < maps[size_t(s)].length;
    return {s, key, g >= segStart.data[s] && g < segStart.data[s + 1] && mapped};
  }

  // As Locate, with g's segment found from segStart alone, never reading chunkSeg (a read at random
  // per chunk, which a caller walking ascending chunks, as attention does, need not make): `cursor`
  // holds the segment of the caller's previous chunk; ascending chunks move it forwards, a smaller
  // one restarts it. g must be in [0, chunks()). TieredKv builds chunkSeg from segStart, so the two
  // agree; this one cannot be led outside the maps by an inconsistent chunkSeg.
  At LocateAscending(int64_t layer, int kvHeads, int32_t g, int h, size_t& cursor) const {
    const size_t nSeg = segments();
    if (cursor >= nSeg || g < segStart.data[cursor]) cursor = 0;
    while (cursor + 1 < nSeg && g >= segStart.data[cursor + 1]) ++cursor;
    const int32_t s = int32_t(cursor);
    const int64_t n = int64_t(segStart.data[s + 1]) - segStart.data[s];
    const int64_t key = (layer * kvHeads + h) * n + (g - segStart.data[s]);
    const bool mapped = !maps.empty() && key >= 0 && size_t(key) < maps[size_t(s)].length;
    return {s, key, g >= segStart.data[s] && g < segStart.data[s + 1] && mapped};
  }
};

// o.chunkSeg and o.segStart (Int32Arrays), checked against each other; with `withMaps` also o.maps,
// an Array of one Int32Array slot map per segment. Throws E_TYPE / E_SHAPE / E_RANGE naming `what`.
Chain GetChain(const Napi::Object& o, bool withMaps, const std::string& what);

// The message for a chunk whose Locate() is not inside: names the segment, or the map too short.
std::string ChainMiss(const Chain& c, const Chain::At& at, int64_t layer, int h, int32_t g, const std::string& what);

}  // namespace dram
}  // namespace kvd
