// fetchSplit: the first pass of a layer-step's fetch stage (src/pipeline/step.ts). One call per
// (sequence, layer) step replaces a JS pass per selected unit and a hot-tier residents() array per
// kv head:
//
//   1. widens the selection to the tiers' chunks (pageChunkSize tokens, a multiple of the
//      selection's chunkSize): per kv head the ascending distinct chunks holding a selected unit
//      that start before tailStart (a selection already at page granularity is copied as is);
//   2. splits those chunks into hot-tier residents (looked up in the tier's chunk -> slot map under
//      the layer's lock, read-only), chunks still in the open tail (at or after `sealed`) and the
//      rest, which the storage tiers must serve: their ids per kv head (tierOffsets / tierIds) and
//      each one's entry in the chunk lists (tierEntry).
//
// Every output goes to caller-owned Int32Arrays (reused across steps: nothing is allocated per
// call). The selection is validated in full first (GetSelectionArg); output arrays too short are
// E_SHAPE before anything is written.
#include <napi.h>

#include <memory>
#include <string>

#include "cache/hot_tier.h"
#include "common/args.h"
#include "common/errors.h"
#include "common/registry.h"

namespace kvd {
namespace hot {
namespace {

// fetchSplit({ selection, kvHeads, headBase?, pageChunkSize, sealed, hot?: { handle, sequence?, layer },
//              out: { chunkOffsets, chunkIds, tierOffsets, tierIds, tierEntry } })
//   -> { chunks, hot, tail, tier }
// sealed: tokens of the sealed prefix (a multiple of pageChunkSize); chunk c is a tier chunk when
// c * pageChunkSize < sealed and it is not resident in the hot tier.
Napi::Value FetchSplit(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "fetchSplit";
    Napi::Object o = GetOptionsArg(info, 0, what);
    const int kvHeads = int(GetInt(o, "kvHeads", what, 1, kMaxKvHeads));
    // The selection's kv heads are heads [headBase, headBase + kvHeads) of the hot tier (a step
    // selecting head group by head group splits each group as it is selected).
    const int headBase = int(GetIntOr(o, "headBase", what, 0, kMaxKvHeads - 1, 0));
    SelectionRules rules;
    rules.kvHeads = kvHeads;
    const SelectionArg sel = GetSelectionArg(o.Get("selection"), rules, what + ".selection");
    const int64_t pc = GetInt(o, "pageChunkSize", what, 1, kMaxChunkSize);
    if (pc % sel.chunkSize != 0)
      Throw("E_CONFIG", what + ".pageChunkSize: expected a multiple of selection.chunkSize " + std::to_string(sel.chunkSize) +
                            ", got " + std::to_string(pc));
    const int64_t f = pc / sel.chunkSize;
    const uint32_t f32 = uint32_t(f);
    const int64_t sealed = GetInt(o, "sealed", what, 0, sel.tokens);
    if (sealed % pc != 0)
      Throw("E_CONFIG", what + ".sealed: expected a multiple of pageChunkSize " + std::to_string(pc) + ", got " + std::to_string(sealed));
    const int64_t sealedChunks = sealed / pc;

    std::shared_ptr<Tier> tier;
    int seq = 0, layer = 0;
    Napi::Value hv = o.Get("hot");
    if (!hv.IsUndefined()) {
      if (!hv.IsObject()) Throw("E_TYPE", what + ".hot: expected { handle, sequence?, layer }");
      Napi::Object h = hv.As<Napi::Object>();
      tier = Acquire(int32_t(GetInt(h, "handle", what + ".hot", 0, int64_t(1) << 30)));
      const TierConfig& c = tier->config();
      if (c.kvHeads < headBase + kvHeads || c.chunkSize != pc)
        Throw("E_SHAPE", what + ".hot: expected a hot tier of at least " + std::to_string(headBase + kvHeads) +
                             " kv heads (headBase + kvHeads) and chunk " + std::to_string(pc) + " (pageChunkSize), got " +
                             std::to_string(c.kvHeads) + " kv heads and chunk " + std::to_string(c.chunkSize));
      seq = int(GetIntOr(h, "sequence", what + ".hot", 0, c.sequences - 1, 0));
      layer = int(GetInt(h, "layer", what + ".hot", 0, c.layers - 1));
    }

    if (!o.Get("out").IsObject()) Throw("E_TYPE", what + ".out: expected { chunkOffsets, chunkIds, tierOffsets, tierIds, tierEntry }");
    Napi::Object out = o.Get("out").As<Napi::Object>();
    // At most one chunk per selected unit.
    const size_t n = sel.chunkIds.length;
    auto cOff = GetOutArray<int32_t>(out, "chunkOffsets", napi_int32_array, size_t(kvHeads) + 1, what);
    auto cIds = GetOutArray<int32_t>(out, "chunkIds", napi_int32_array, n, what);
    auto tOff = GetOutArray<int32_t>(out, "tierOffsets", napi_int32_array, size_t(kvHeads) + 1, what);
    auto tIds = GetOutArray<int32_t>(out, "tierIds", napi_int32_array, n, what);
    auto tEnt = GetOutArray<int32_t>(out, "tierEntry", napi_int32_array, n, what);

    // Hot-tier residency is read under the layer's lock, as a reader (the step that called this
    // is the only operation on the pair; a concurrent stats() is waited out).
    std::unique_ptr<Tier::LayerLock> lock;
    if (tier) lock = std::make_unique<Tier::LayerLock>(*tier, seq, layer, Tier::Wait::kYes);
    const int32_t* off = sel.offsets.data;
    const int32_t* ids = sel.chunkIds.data;
    int32_t nc = 0, nt = 0, nHot = 0, nTail = 0;
    cOff.data[0] = 0;
    tOff.data[0] = 0;
    for (int h = 0; h < kvHeads; ++h) {
      const PairState* p = tier ? &tier->Pair(seq, layer, headBase + h) : nullptr;
      const bool anyHot = p && p->resident > 0;
      int64_t last = -1;
      if (anyHot) p->Touch(size_t(off[h + 1] - off[h]), 0);
      for (int32_t i = off[h]; i < off[h + 1]; ++i) {
        // Ids are validated non-negative int32 and f <= 2^20: a 32-bit division (a 64-bit one costs
        // several times more per unit).
        const int64_t c = int64_t(uint32_t(ids[i]) / f32);
        // A page-granular selection is taken whole; a finer one keeps the chunks before its tail.
        if (f > 1 && (c == last || c * pc >= sel.tailStart)) continue;
        last = c;
        const int32_t entry = nc;
        cIds.data[nc++] = int32_t(c);
        if (anyHot && p->Find(int32_t(c)) >= 0) {
          ++nHot;
        } else if (c >= sealedChunks) {
          ++nTail;
        } else {
          tIds.data[nt] = int32_t(c);
          tEnt.data[nt++] = entry;
        }
      }
      cOff.data[h + 1] = nc;
      tOff.data[h + 1] = nt;
    }
    return NumbersObject(info.Env(), {{"chunks", double(nc)}, {"hot", double(nHot)}, {"tail", double(nTail)}, {"tier", double(nt)}});
  });
}

void InitFetchSplit(Napi::Env env, Napi::Object exports) {
  exports.Set("fetchSplit", Napi::Function::New(env, FetchSplit, "fetchSplit"));
}

}  // namespace

KVD_REGISTER_MODULE(InitFetchSplit);

}  // namespace hot
}  // namespace kvd
