// The DRAM tier's per-fetch bookkeeping (src/storage/dram-store.ts owns the state; these passes run
// over its typed arrays): where each requested chunk lives, its placement for a reader that
// attends it in place, and slot pins. One call per layer-step instead of a JS pass per chunk (a
// decode step names ~10^4 chunks; the JS passes ran cold or deoptimised for most of a short run).
//
// State layout (DramStore): slot s is resident when owner[s] != -1; its bytes lie in arena block
// s / slotsPerBlock at byte (s % slotsPerBlock) * chunkBytes; pins[s] counts readers attending it in
// place (a pinned slot is never evicted). A TieredKv's chain of segments maps global chunk g to the
// segment s with segStart[s] <= g < segStart[s + 1] and local chunk g - segStart[s]; that segment's
// slot map holds the slot of (layer, kv head, local chunk) at (layer * kvHeads + head) * chunks +
// local, or -1 (cache/dram_chain.h).
//
// Nothing here trusts its arguments: every index is checked against the array it reads, and a slot
// map naming a slot that is not resident is E_INTERNAL (the JS state is corrupt), never a read out
// of bounds. Pins change only after every check passed (and roll back on an overflow), so a
// rejected call leaves the tier as it was.
#include <napi.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/args.h"
#include "common/errors.h"
#include "common/registry.h"
#include "common/thread_pool.h"
#include "cache/dram_chain.h"

namespace kvd {
namespace dram {
namespace {

constexpr uint16_t kMaxPins = 0xffff;
// How many entries ahead the passes below prefetch what they will read at random (slot maps, pins,
// heap records): a step's ~3,000 lookups each miss the cache otherwise, one after another.
constexpr size_t kPrefetchAhead = 16;

// The tier's slot state: owner (Int32Array, -1 = free) and optionally pins (Uint16Array), one entry
// per slot.
struct SlotState {
  ArrayArg<int32_t> owner;
  ArrayArg<uint16_t> pins;
  bool hasPins = false;
  size_t capacity() const { return owner.length; }
};

SlotState GetSlotState(const Napi::Object& o, bool needPins, const std::string& what) {
  SlotState s;
  s.owner = GetI32(o.Get("owner"), what + ".owner");
  if (needPins || !o.Get("pins").IsUndefined()) {
    s.pins = GetArray<uint16_t>(o.Get("pins"), napi_uint16_array, what + ".pins");
    ExpectLength(s.pins.length, s.owner.length, what + ".pins (one per slot, as owner)");
    s.hasPins = true;
  }
  return s;
}

// Adds delta (+1 / -1) to the pins of slots[0..n) in one pass (these arrays are ~1 MB and read at
// random: every extra pass is a cache miss per slot). A slot out of range, a pin of a free slot
// (`owner` checked only for +1 with checkOwner), an overflow past 65535 pins or an unpin of an
// unpinned slot throws after rolling back what this call changed.
void ApplyPins(const SlotState& st, const int32_t* slots, size_t n, int delta, bool checkOwner, const std::string& what) {
  const size_t cap = st.capacity();
  for (size_t i = 0; i < n; ++i) {
    // The pins of a step's hits lie at random: fetch a few ahead (checked below when reached).
    if (i + kPrefetchAhead < n && uint32_t(slots[i + kPrefetchAhead]) < cap) __builtin_prefetch(st.pins.data + slots[i + kPrefetchAhead], 1);
    const int32_t s = slots[i];
    const char* code = nullptr;
    std::string error;
    if (s < 0 || size_t(s) >= cap) {
      code = "E_RANGE";
      error = "expected slots in [0, " + std::to_string(cap) + "), got " + std::to_string(s);
    } else if (delta > 0 && checkOwner && st.owner.data[s] == -1) {
      code = "E_RANGE";
      error = "expected a resident slot, got free slot " + std::to_string(s);
    } else if (delta > 0 && st.pins.data[s] == kMaxPins) {
      code = "E_INTERNAL";
      error = "expected fewer than 65535 pins of one slot, got slot " + std::to_string(s) + " at the limit";
    } else if (delta < 0 && st.pins.data[s] == 0) {
      code = "E_INTERNAL";
      error = "expected a pinned slot, got slot " + std::to_string(s) + " with no pin";
    }
    if (code) {
      for (size_t j = 0; j < i; ++j) st.pins.data[slots[j]] = uint16_t(st.pins.data[slots[j]] - delta);
      Throw(code, what + ": " + error);
    }
    st.pins.data[s] = uint16_t(st.pins.data[s] + delta);
  }
}

// dramPins({ owner, pins, slots: Int32Array, delta: 1 | -1 }) -> undefined
Napi::Value DramPins(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "dramPins";
    Napi::Object o = GetOptionsArg(info, 0, what);
    const SlotState st = GetSlotState(o, true, what);
    auto slots = GetI32(o.Get("slots"), what + ".slots");
    const int64_t delta = GetInt(o, "delta", what, -1, 1);
    if (delta == 0) Throw("E_RANGE", what + ".delta: expected 1 (pin) or -1 (unpin), got 0");
    ApplyPins(st, slots.data, slots.length, int(delta), true, what);
    return info.Env().Undefined();
  });
}

// dramLocate({ offsets, chunkIds, kvHeads, layer, segStart, chunkBytes, skip?,
//              maps?, owner?, slotsPerBlock?, pins?, out: { slots, entries, misses, source?, at? } })
//   -> { hits, misses, inDest }
// For every entry i of the per-kv-head chunk lists (global chunk ids) not marked in skip: its slot
// when resident (slots[k] = slot, entries[k] = i for the k-th hit, in entry order), else
// misses[m] = i. With `pins` the hits are pinned. With source / at (Uint8Array / Float64Array, one
// per entry) the placement of a reader in place: a hit at arena block b, byte offset o gets
// source 1 + b, at o; every other entry (misses and skipped ones) source 0 and at = chunkBytes x
// its rank among them (packed in entry order into the caller's buffer). Without `maps` (a chain
// with no DRAM tier; owner, slotsPerBlock and pins are then not read) nothing is a hit.
Napi::Value DramLocate(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "dramLocate";
    Napi::Object o = GetOptionsArg(info, 0, what);
    const int kvHeads = int(GetInt(o, "kvHeads", what, 1, kMaxKvHeads));
    const int64_t layer = GetInt(o, "layer", what, 0, 65535);  // keeps (layer * kvHeads + h) * chunks in 63 bits
    // Without `maps` there is no DRAM tier: every entry not skipped is a miss.
    const bool hasTier = !o.Get("maps").IsUndefined();
    const Chain chain = GetChain(o, hasTier, what);
    // A fetch request's lists: any order within a kv head (TieredKv accepts unsorted requests).
    auto off = GetI32(o.Get("offsets"), what + ".offsets");
    auto ids = GetI32(o.Get("chunkIds"), what + ".chunkIds");
    CheckOffsets(off, size_t(kvHeads), ids.length, what + ".offsets", "kvHeads", "chunkIds");
    CheckIds(off.data, size_t(kvHeads), ids, int64_t(chain.chunks()), false, what + ".chunkIds", "kv head", " (chunks of the segment chain)");
    const size_t n = ids.length;
    ArrayArg<uint8_t> skip;
    const bool hasSkip = !o.Get("skip").IsUndefined();
    if (hasSkip) {
      skip = GetArray<uint8_t>(o.Get("skip"), napi_uint8_array, what + ".skip");
      ExpectLength(skip.length, n, what + ".skip (one per entry)");
    }
    SlotState st;
    int64_t perBlock = 1;
    if (hasTier) {
      st = GetSlotState(o, false, what);
      perBlock = GetInt(o, "slotsPerBlock", what, 1, INT32_MAX);
    }
    const int64_t chunkBytes = GetInt(o, "chunkBytes", what, 1, int64_t(1) << 40);
    if (hasTier && (int64_t(st.capacity()) + perBlock - 1) / perBlock > 255)
      Throw("E_RANGE", what + ".slotsPerBlock: expected at most 255 arena blocks, got " +
                           std::to_string((int64_t(st.capacity()) + perBlock - 1) / perBlock));

    if (!o.Get("out").IsObject()) Throw("E_TYPE", what + ".out: expected { slots, entries, misses, source?, at? }");
    Napi::Object out = o.Get("out").As<Napi::Object>();
    auto oSlots = GetOutArray<int32_t>(out, "slots", napi_int32_array, n, what);
    auto oEntries = GetOutArray<int32_t>(out, "entries", napi_int32_array, n, what);
    auto oMisses = GetOutArray<int32_t>(out, "misses", napi_int32_array, n, what);
    const bool placement = !out.Get("source").IsUndefined();
    ArrayArg<uint8_t> source;
    ArrayArg<double> at;
    if (placement) {
      source = GetOutArray<uint8_t>(out, "source", napi_uint8_array, n, what);
      at = GetOutArray<double>(out, "at", napi_float64_array, n, what);
    }

    const size_t cap = st.capacity();
    size_t hits = 0, misses = 0, inDest = 0;
    // Pass 1, the kv heads in parallel on the addon's pool: each entry's slot (kSkipped, kMissing
    // or the resident slot), checked. The slot-map reads are the call's cost (one cache miss per
    // chunk, prefetched kPrefetchAhead entries ahead within the head); the heads' lists are
    // disjoint ranges of `slotOf`. A failing check throws from its task; the pool rethrows the
    // lowest head's, i.e. the first failing entry in entry order, as one pass would.
    constexpr int32_t kSkipped = -2, kMissing = -1;
    std::vector<int32_t> slotOf(n);
    auto lookUpHead = [&](size_t head) {
      const int h = int(head);
      const int32_t end = off.data[h + 1];
      size_t segAt = 0, segAhead = 0;  // segment cursors of the lookups and of the prefetches ahead
      for (int32_t i = off.data[h]; i < end; ++i) {
        if (hasTier && i + int32_t(kPrefetchAhead) < end) {
          const int32_t j = i + int32_t(kPrefetchAhead);
          if (!hasSkip || !skip.data[j]) {
            const Chain::At m = chain.Locate(layer, kvHeads, ids.data[j], h, segAhead);
            if (m.inside) __builtin_prefetch(chain.maps[size_t(m.seg)].data + m.key);
          }
        }
        if (hasSkip && skip.data[i]) {
          slotOf[size_t(i)] = kSkipped;
          continue;
        }
        int32_t slot = kMissing;
        if (hasTier) {
          const int32_t g = ids.data[i];
          const Chain::At m = chain.Locate(layer, kvHeads, g, h, segAt);
          const int32_t s = m.seg;
          if (!m.inside) Throw("E_RANGE", ChainMiss(chain, m, layer, h, g, what));
          slot = chain.maps[size_t(s)].data[m.key];
          // Bounds only: owner[slot] would be one more cache miss per chunk, and a map naming a slot
          // in range reads tier memory either way (never outside it).
          if (slot >= 0 && size_t(slot) >= cap)
            Throw("E_INTERNAL", what + ": segment " + std::to_string(s) + "'s slot map sends chunk " + std::to_string(g) + " of kv head " +
                                    std::to_string(h) + " to slot " + std::to_string(slot) + ", expected a slot below " + std::to_string(cap));
          if (slot < 0) slot = kMissing;
        }
        slotOf[size_t(i)] = slot;
      }
    };
    ThreadPool::Global().ParallelFor(size_t(kvHeads), lookUpHead);
    // Pass 2, in entry order (sequential writes): hits and misses packed, the placement.
    for (size_t i = 0; i < n; ++i) {
      const int32_t slot = slotOf[i];
      if (slot >= 0) {
        oSlots.data[hits] = slot;
        oEntries.data[hits++] = int32_t(i);
        if (placement) {
          // 32-bit division (slot and perBlock are below 2^31): a 64-bit one costs several times more per chunk.
          const uint32_t block = uint32_t(slot) / uint32_t(perBlock);
          source.data[i] = uint8_t(1 + block);
          at.data[i] = double(int64_t(uint32_t(slot) - block * uint32_t(perBlock)) * chunkBytes);
        }
      } else {
        if (slot == kMissing) oMisses.data[misses++] = int32_t(i);
        if (placement) {
          source.data[i] = 0;
          at.data[i] = double(int64_t(inDest) * chunkBytes);
        }
        ++inDest;
      }
    }
    if (hasTier && st.hasPins) ApplyPins(st, oSlots.data, hits, 1, false, what + " pins");
    return NumbersObject(info.Env(), {{"hits", double(hits)}, {"misses", double(misses)}, {"inDest", double(inDest)}});
  });
}

// dramHeapRefresh({ records: Float32Array, heap: Int32Array, slots: Int32Array, entries: Int32Array,
//                   scores: Float32Array, out: { slots: Int32Array, scores: Float32Array } }) -> decreases
// The cold half of the DRAM tier's per-step score refresh (src/storage/slot-heap.ts owns the heap):
// slot slots[k] gets score scores[entries[k]]. `records` holds 3 words per slot (score f32, heap key
// f32, heap position i32 or -1), `heap` the slot at each position and `keys` its key there. Updates that need no sift —
// the slot is not in the heap, or the score is not below its key (a lazy increase) — are applied
// here; the others (decreases: the key must drop and the slot sift up) are written to out in order
// and applied by the caller's heap, whose sift reads the records and parents this pass has just
// brought into cache. Why native: the ~3,000 slots a layer-step refreshes lie at random in a
// ~3 MB record array that attention has just evicted from cache; one after another each update is a
// cache miss (~70 ns), while here the loads are prefetched a few slots ahead and overlap.
// Every slot, entry and score is checked before anything is written.
Napi::Value DramHeapRefresh(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "dramHeapRefresh";
    Napi::Object o = GetOptionsArg(info, 0, what);
    auto rec = GetF32(o.Get("records"), what + ".records");
    auto heap = GetI32(o.Get("heap"), what + ".heap");
    auto keys = GetF32(o.Get("keys"), what + ".keys");
    auto slots = GetI32(o.Get("slots"), what + ".slots");
    auto entries = GetI32(o.Get("entries"), what + ".entries");
    auto scores = GetF32(o.Get("scores"), what + ".scores");
    // offset (optional, default 0): slot k's new score is f32(offset + scores[entries[k]]), the sum
    // in double rounded once (the DRAM tier's GreedyDual L + score, without a copy of the scores).
    const Napi::Value ov = o.Get("offset");
    double offset = 0;
    if (!ov.IsUndefined()) {
      if (!ov.IsNumber() || !std::isfinite(ov.As<Napi::Number>().DoubleValue()))
        Throw("E_TYPE", what + ".offset: expected a finite number, got " + (ov.IsNumber() ? Num(ov.As<Napi::Number>().DoubleValue()) : std::string("a non-number")));
      offset = ov.As<Napi::Number>().DoubleValue();
    }
    auto given = [&](int32_t e) { return float(offset + double(scores.data[e])); };
    if (rec.length % 3 != 0)
      Throw("E_SHAPE", what + ".records: expected 3 words per slot (score, key, position), got " + std::to_string(rec.length) + " words");
    const size_t cap = rec.length / 3;
    ExpectLength(heap.length, cap, what + ".heap (one position per slot)");
    ExpectLength(keys.length, cap, what + ".keys (one per heap position)");
    const size_t n = slots.length;
    ExpectLength(entries.length, n, what + ".entries (one per slot)");
    if (!o.Get("out").IsObject()) Throw("E_TYPE", what + ".out: expected { slots: Int32Array, scores: Float32Array }");
    Napi::Object out = o.Get("out").As<Napi::Object>();
    auto oSlots = GetOutArray<int32_t>(out, "slots", napi_int32_array, n, what);
    auto oScores = GetOutArray<float>(out, "scores", napi_float32_array, n, what);
    for (size_t k = 0; k < n; ++k) {
      const int32_t slot = slots.data[k], e = entries.data[k];
      if (slot < 0 || size_t(slot) >= cap)
        Throw("E_RANGE", what + ".slots[" + std::to_string(k) + "]: expected a slot in [0, " + std::to_string(cap) + "), got " + std::to_string(slot));
      if (e < 0 || size_t(e) >= scores.length)
        Throw("E_RANGE", what + ".entries[" + std::to_string(k) + "]: expected an index into the " + std::to_string(scores.length) +
                             " scores, got " + std::to_string(e));
      if (!std::isfinite(given(e)))
        Throw("E_NONFINITE", what + ".scores[entries[" + std::to_string(k) + "]]" + (offset != 0 ? " + offset" : "") +
                                 ": expected a finite number, got " + Num(given(e)));
    }
    float* r = rec.data;
    // Word 3s+2 of a record is an i32 (JS writes it through an Int32Array over the same buffer).
    auto pos = [r](size_t word) {
      int32_t v;
      std::memcpy(&v, r + word, sizeof v);
      return v;
    };
    for (size_t k = 0; k < n && k < kPrefetchAhead; ++k) __builtin_prefetch(r + 3 * size_t(slots.data[k]), 1);
    size_t dec = 0;
    for (size_t k = 0; k < n; ++k) {
      if (k + kPrefetchAhead < n) __builtin_prefetch(r + 3 * size_t(slots.data[k + kPrefetchAhead]), 1);
      const size_t b = 3 * size_t(slots.data[k]);
      const float score = given(entries.data[k]);
      r[b] = score;
      const int32_t at = pos(b + 2);
      if (at < 0) {
        r[b + 1] = score;
      } else if (score < r[b + 1]) {
        oSlots.data[dec] = slots.data[k];
        oScores.data[dec++] = score;
        // The sift (SlotHeap.up, 4-ary) compares with the parent's key first and moves the parent
        // down: its key and heap entry now, its record (position written) below.
        if (at > 0 && size_t(at) < cap) {
          __builtin_prefetch(keys.data + (at - 1) / 4);
          __builtin_prefetch(heap.data + (at - 1) / 4);
        }
      }
    }
    for (size_t j = 0; j < dec; ++j) {
      const int32_t at = pos(3 * size_t(oSlots.data[j]) + 2);
      if (at <= 0 || size_t(at) >= cap) continue;
      const int32_t parent = heap.data[(at - 1) / 4];
      if (parent >= 0 && size_t(parent) < cap) __builtin_prefetch(r + 3 * size_t(parent));
    }
    return Napi::Number::New(info.Env(), double(dec));
  });
}

void InitDramTier(Napi::Env env, Napi::Object exports) {
  exports.Set("dramLocate", Napi::Function::New(env, DramLocate, "dramLocate"));
  exports.Set("dramPins", Napi::Function::New(env, DramPins, "dramPins"));
  exports.Set("dramHeapRefresh", Napi::Function::New(env, DramHeapRefresh, "dramHeapRefresh"));
}

}  // namespace

KVD_REGISTER_MODULE(InitDramTier);

}  // namespace dram
}  // namespace kvd
