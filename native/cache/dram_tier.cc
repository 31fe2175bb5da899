// The DRAM tier's per-fetch bookkeeping (src/storage/dram-store.ts owns the state; these passes run
// over its typed arrays): where each requested chunk lives, its placement for a reader that
// attends it in place, and slot pins. One call per layer-step instead of a JS pass per chunk (a
// decode step names ~10^4 chunks; the JS passes ran cold or deoptimised for most of a short run).
//
// State layout (DramStore): slot s is resident when owner[s] != -1; its bytes lie in arena block
// s / slotsPerBlock at byte (s % slotsPerBlock) * chunkBytes; pins[s] counts readers attending it in
// place (a pinned slot is never evicted). A TieredKv's chain of segments maps global chunk g to
// segment chunkSeg[g] and local chunk g - segStart[chunkSeg[g]]; that segment's slot map holds the
// slot of (layer, kv head, local chunk) at (layer * kvHeads + head) * chunks + local, or -1.
//
// Nothing here trusts its arguments: every index is checked against the array it reads, and a slot
// map naming a slot that is not resident is E_INTERNAL (the JS state is corrupt), never a read out
// of bounds. Pins change only after every check passed (and roll back on an overflow), so a
// rejected call leaves the tier as it was.
#include <napi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/args.h"
#include "common/errors.h"
#include "common/registry.h"

namespace kvd {
namespace dram {
namespace {

constexpr uint16_t kMaxPins = 0xffff;

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

// dramLocate({ offsets, chunkIds, kvHeads, layer, chunkSeg, segStart, chunkBytes, skip?,
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
    auto chunkSeg = GetI32(o.Get("chunkSeg"), what + ".chunkSeg");
    auto segStart = GetI32(o.Get("segStart"), what + ".segStart");
    // A fetch request's lists: any order within a kv head (TieredKv accepts unsorted requests).
    auto off = GetI32(o.Get("offsets"), what + ".offsets");
    auto ids = GetI32(o.Get("chunkIds"), what + ".chunkIds");
    CheckOffsets(off, size_t(kvHeads), ids.length, what + ".offsets", "kvHeads", "chunkIds");
    CheckIds(off.data, size_t(kvHeads), ids, int64_t(chunkSeg.length), false, what + ".chunkIds", "kv head", " (chunks of the segment chain)");
    const size_t n = ids.length;
    const size_t nSeg = segStart.length > 0 ? segStart.length - 1 : 0;
    if (segStart.length == 0 || segStart.data[0] != 0)
      Throw("E_RANGE", what + ".segStart: expected segments + 1 entries starting at 0, got " +
                           (segStart.length ? "first entry " + std::to_string(segStart.data[0]) : std::string("an empty array")));
    for (size_t s = 0; s < nSeg; ++s)
      if (segStart.data[s + 1] < segStart.data[s])
        Throw("E_RANGE", what + ".segStart: expected non-decreasing, got " + std::to_string(segStart.data[s + 1]) + " after " +
                             std::to_string(segStart.data[s]));
    if (size_t(segStart.data[nSeg]) != chunkSeg.length)
      Throw("E_SHAPE", what + ".chunkSeg: expected segStart's last entry " + std::to_string(segStart.data[nSeg]) +
                           " elements, got " + std::to_string(chunkSeg.length));
    // Without `maps` there is no DRAM tier: every entry not skipped is a miss.
    const bool hasTier = !o.Get("maps").IsUndefined();
    Napi::Array mapsArr;
    if (hasTier) {
      if (!o.Get("maps").IsArray()) Throw("E_TYPE", what + ".maps: expected an Array of Int32Array slot maps, one per segment");
      mapsArr = o.Get("maps").As<Napi::Array>();
      ExpectLength(mapsArr.Length(), nSeg, what + ".maps (one per segment)");
    }
    std::vector<ArrayArg<int32_t>> maps(hasTier ? nSeg : 0);
    for (size_t s = 0; s < maps.size(); ++s) maps[s] = GetI32(mapsArr.Get(uint32_t(s)), what + ".maps[" + std::to_string(s) + "]");
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
    for (int h = 0; h < kvHeads; ++h) {
      for (int32_t i = off.data[h]; i < off.data[h + 1]; ++i) {
        int32_t slot = -1;
        if (hasTier && (!hasSkip || !skip.data[i])) {
          const int32_t g = ids.data[i];
          const int32_t s = chunkSeg.data[g];
          if (s < 0 || size_t(s) >= nSeg)
            Throw("E_RANGE", what + ".chunkSeg[" + std::to_string(g) + "]: expected a segment in [0, " + std::to_string(nSeg) + "), got " + std::to_string(s));
          const int64_t chunks = int64_t(segStart.data[s + 1]) - segStart.data[s];
          const int64_t key = (layer * kvHeads + h) * chunks + (g - segStart.data[s]);
          if (g < segStart.data[s] || g >= segStart.data[s + 1] || size_t(key) >= maps[size_t(s)].length)
            Throw("E_RANGE", what + ".maps[" + std::to_string(s) + "]: expected a slot map holding layer " + std::to_string(layer) +
                                 ", kv head " + std::to_string(h) + ", chunk " + std::to_string(g) + " (entry " + std::to_string(key) +
                                 "), got " + std::to_string(maps[size_t(s)].length) + " entries");
          slot = maps[size_t(s)].data[key];
          // Bounds only: owner[slot] would be one more cache miss per chunk, and a map naming a slot
          // in range reads tier memory either way (never outside it).
          if (slot >= 0 && size_t(slot) >= cap)
            Throw("E_INTERNAL", what + ": segment " + std::to_string(s) + "'s slot map sends chunk " + std::to_string(g) + " of kv head " +
                                    std::to_string(h) + " to slot " + std::to_string(slot) + ", expected a slot below " + std::to_string(cap));
        }
        if (slot >= 0) {
          oSlots.data[hits] = slot;
          oEntries.data[hits++] = i;
          if (placement) {
            // 32-bit division (slot and perBlock are below 2^31): a 64-bit one costs several times more per chunk.
            const uint32_t block = uint32_t(slot) / uint32_t(perBlock);
            source.data[i] = uint8_t(1 + block);
            at.data[i] = double(int64_t(uint32_t(slot) - block * uint32_t(perBlock)) * chunkBytes);
          }
        } else {
          if (!hasSkip || !skip.data[i]) oMisses.data[misses++] = i;
          if (placement) {
            source.data[i] = 0;
            at.data[i] = double(int64_t(inDest) * chunkBytes);
          }
          ++inDest;
        }
      }
    }
    if (hasTier && st.hasPins) ApplyPins(st, oSlots.data, hits, 1, false, what + " pins");
    return NumbersObject(info.Env(), {{"hits", double(hits)}, {"misses", double(misses)}, {"inDest", double(inDest)}});
  });
}

// The DRAM tier's importance heap (src/storage/slot-heap.ts owns its memory; every operation on it
// runs here): an indexed binary min-heap over slot ids with lazy increases. Per slot one 12-byte
// record [score f32, key f32, heap position i32 (-1: not in the heap)]; heap[0, size) holds slots.
// key <= score always: decreases re-key at once, increases only write the score and are applied
// when the slot reaches the top (Peek). Every index read from the arrays is bounds-checked (a corrupt
// heap is E_INTERNAL, never a read out of bounds). The comparisons are those of the JS heap this
// replaced, in the same order, so ties break the same way.
struct HeapRec {
  float score;
  float key;
  int32_t pos;
};
static_assert(sizeof(HeapRec) == 12, "a heap record is 3 x 4 bytes");

class Heap {
 public:
  Heap(const Napi::Object& o, const std::string& what) {
    auto rec = GetI32(o.Get("rec"), what + ".rec");
    auto heap = GetI32(o.Get("heap"), what + ".heap");
    auto size = GetI32(o.Get("size"), what + ".size");
    ExpectLength(rec.length, 3 * heap.length, what + ".rec (3 words per slot of heap)");
    ExpectLength(size.length, 1, what + ".size");
    cap_ = heap.length;
    if (size.data[0] < 0 || size_t(size.data[0]) > cap_)
      Throw("E_INTERNAL", what + ".size: expected a heap size in [0, " + std::to_string(cap_) + "], got " + std::to_string(size.data[0]));
    rec_ = reinterpret_cast<HeapRec*>(rec.data);
    heap_ = heap.data;
    size_ = size.data;
  }
  size_t capacity() const { return cap_; }
  int32_t Size() const { return *size_; }
  bool Has(int32_t slot) const { return rec_[slot].pos >= 0; }
  float ScoreOf(int32_t slot) const { return rec_[slot].score; }

  // The slot with the smallest score (stale tops re-keyed first), or -1 when empty.
  int32_t Peek() {
    while (*size_ > 0) {
      const int32_t top = SlotAt(0);
      HeapRec& r = rec_[top];
      if (r.key == r.score) return top;
      r.key = r.score;
      Down(0);
    }
    return -1;
  }
  void Insert(int32_t slot, double score) {
    if (rec_[slot].pos >= 0 || size_t(*size_) >= cap_)
      Throw("E_INTERNAL", "DRAM tier heap: insert of slot " + std::to_string(slot) + ", expected a slot not in the heap and room for it");
    HeapRec& r = rec_[slot];
    r.score = float(score);
    r.key = float(score);
    const int32_t i = (*size_)++;
    heap_[i] = slot;
    r.pos = i;
    Up(i);
  }
  // A slot's score; for a slot not in the heap only the score (and key) is kept, for a later insert.
  void Update(int32_t slot, double score) {
    HeapRec& r = rec_[slot];
    r.score = float(score);
    const int32_t i = r.pos;
    if (i < 0) {
      r.key = float(score);
      return;
    }
    CheckPos(i, slot);
    if (score < double(r.key)) {
      r.key = float(score);
      Up(i);
    }
  }
  void Remove(int32_t slot) {
    const int32_t i = rec_[slot].pos;
    if (i < 0) return;
    CheckPos(i, slot);
    const int32_t last = SlotAt(--(*size_));
    rec_[slot].pos = -1;
    if (i == *size_) return;
    heap_[i] = last;
    rec_[last].pos = i;
    Up(i);
    Down(rec_[last].pos);
  }

 private:
  int32_t SlotAt(int32_t i) const {
    const int32_t s = heap_[i];
    if (s < 0 || size_t(s) >= cap_)
      Throw("E_INTERNAL", "DRAM tier heap: position " + std::to_string(i) + " holds slot " + std::to_string(s) + ", expected one in [0, " +
                              std::to_string(cap_) + ")");
    return s;
  }
  void CheckPos(int32_t i, int32_t slot) const {
    if (i >= *size_)
      Throw("E_INTERNAL", "DRAM tier heap: slot " + std::to_string(slot) + " at position " + std::to_string(i) + ", expected one below the size " +
                              std::to_string(*size_));
  }
  void Up(int32_t i) {
    const int32_t slot = SlotAt(i);
    const float k = rec_[slot].key;
    while (i > 0) {
      const int32_t p = (i - 1) >> 1;
      const int32_t ps = SlotAt(p);
      if (rec_[ps].key <= k) break;
      heap_[i] = ps;
      rec_[ps].pos = i;
      i = p;
    }
    heap_[i] = slot;
    rec_[slot].pos = i;
  }
  void Down(int32_t i) {
    const int32_t n = *size_;
    const int32_t slot = SlotAt(i);
    const float k = rec_[slot].key;
    for (;;) {
      int32_t c = 2 * i + 1;
      if (c >= n) break;
      int32_t cs = SlotAt(c);
      if (c + 1 < n) {
        const int32_t c2 = SlotAt(c + 1);
        if (rec_[c2].key < rec_[cs].key) {
          ++c;
          cs = c2;
        }
      }
      if (rec_[cs].key >= k) break;
      heap_[i] = cs;
      rec_[cs].pos = i;
      i = c;
    }
    heap_[i] = slot;
    rec_[slot].pos = i;
  }

  HeapRec* rec_ = nullptr;
  int32_t* heap_ = nullptr;
  int32_t* size_ = nullptr;
  size_t cap_ = 0;
};

// Slots of `slots` checked against the heap's capacity (all before any change).
void CheckSlots(const ArrayArg<int32_t>& slots, size_t cap, const std::string& what) {
  for (size_t k = 0; k < slots.length; ++k)
    if (slots.data[k] < 0 || size_t(slots.data[k]) >= cap)
      Throw("E_RANGE", what + "[" + std::to_string(k) + "]: expected a slot in [0, " + std::to_string(cap) + "), got " + std::to_string(slots.data[k]));
}

// Scores given as a Float64Array or a Float32Array (what the callers hold), read as doubles.
struct Scores {
  const double* f64 = nullptr;
  const float* f32 = nullptr;
  size_t length = 0;
  double operator[](size_t i) const { return f64 ? f64[i] : double(f32[i]); }
};
Scores GetScores(const Napi::Value& v, const std::string& what) {
  Scores s;
  if (v.IsTypedArray() && v.As<Napi::TypedArray>().TypedArrayType() == napi_float32_array) {
    auto a = GetF32(v, what);
    s.f32 = a.data;
    s.length = a.length;
  } else {
    auto a = GetArray<double>(v, napi_float64_array, what);
    s.f64 = a.data;
    s.length = a.length;
  }
  return s;
}

// slotHeap({ rec, heap, size, op, slots?, scores?, entries? }) -> number
// op 0: peek (returns the least important slot, stale tops re-keyed, or -1); 1: insert slots[k]
// with scores[k]; 2: update, slots[k] gets scores[entries ? entries[k] : k] (in order); 3: remove
// slots. Every slot, entry and score is checked before anything changes. Returns the peeked slot or
// the heap's size after the operation.
Napi::Value SlotHeapOp(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "slotHeap";
    Napi::Object o = GetOptionsArg(info, 0, what, "{ rec, heap, size, op, slots?, scores?, entries? }");
    Heap h(o, what);
    const int64_t op = GetInt(o, "op", what, 0, 3);
    if (op == 0) return Napi::Number::New(info.Env(), double(h.Peek()));
    auto slots = GetI32(o.Get("slots"), what + ".slots");
    CheckSlots(slots, h.capacity(), what + ".slots");
    if (op == 3) {
      for (size_t k = 0; k < slots.length; ++k) h.Remove(slots.data[k]);
    } else {
      const Scores scores = GetScores(o.Get("scores"), what + ".scores");
      const bool hasEntries = !o.Get("entries").IsUndefined();
      ArrayArg<int32_t> entries;
      if (hasEntries) {
        entries = GetI32(o.Get("entries"), what + ".entries");
        ExpectLength(entries.length, slots.length, what + ".entries (one per slot)");
      } else {
        ExpectLength(scores.length, slots.length, what + ".scores (one per slot)");
      }
      for (size_t k = 0; k < slots.length; ++k) {
        const int64_t e = hasEntries ? entries.data[k] : int64_t(k);
        if (e < 0 || size_t(e) >= scores.length)
          Throw("E_RANGE", what + ".entries[" + std::to_string(k) + "]: expected an index in [0, " + std::to_string(scores.length) + "), got " + std::to_string(e));
        if (!std::isfinite(scores[size_t(e)]))
          Throw("E_NONFINITE", what + (hasEntries ? ".scores[entries[" + std::to_string(k) + "]] (score " + std::to_string(e) + ")" : ".scores[" + std::to_string(k) + "]") +
                                   ": expected a finite number, got " + Num(scores[size_t(e)]));
        if (op == 1 && h.Has(slots.data[k]))
          Throw("E_INTERNAL", what + ".slots[" + std::to_string(k) + "]: expected a slot not in the heap, got slot " + std::to_string(slots.data[k]));
      }
      if (op == 1) {
        std::vector<int32_t> sorted(slots.data, slots.data + slots.length);
        std::sort(sorted.begin(), sorted.end());
        if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
          Throw("E_INTERNAL", what + ".slots: expected distinct slots to insert, got slot " + std::to_string(*std::adjacent_find(sorted.begin(), sorted.end())) + " twice");
        if (size_t(h.Size()) + slots.length > h.capacity())
          Throw("E_INTERNAL", what + ".slots: expected room for " + std::to_string(slots.length) + " more slots, got a heap of " + std::to_string(h.Size()) + " of " +
                                  std::to_string(h.capacity()));
      }
      for (size_t k = 0; k < slots.length; ++k) {
        const double score = scores[hasEntries ? size_t(entries.data[k]) : k];
        if (op == 1) h.Insert(slots.data[k], score);
        else h.Update(slots.data[k], score);
      }
    }
    return Napi::Number::New(info.Env(), double(h.Size()));
  });
}

// dramPut({ heap: { rec, heap, size }, owner, slotKey, pins, free, freeTop, maps, ordinal, keys,
//           scores, src, srcOffsets, arenas, slotsPerBlock, chunkBytes })
//   -> { admitted, rejected, evicted, aside? }
// The DRAM tier's admission of one segment's chunks (DramStore.put), in one pass: candidate i
// (slot-map index keys[i] of segment `ordinal`, whose map is maps[ordinal]; importance scores[i],
// page-first bytes at src[srcOffsets[i]]) gets its score refreshed when resident; otherwise a slot:
// a free one (free[0, freeTop) is a stack), or the least important resident chunk's, evicted when it
// scores below the newcomer (a pinned one there is taken out of the heap and returned in `aside`,
// an Int32Array, for the caller to restore once unpinned; the newcomer is rejected when
// the top scores at least as much). An admitted chunk's bytes are copied into its arena slot at
// once. State: owner[s] (segment ordinal, -1 free), slotKey[s] (its slot-map index), pins[s];
// maps[o]: segment o's slot map (an empty array once removed). Every argument is checked before
// anything changes.
Napi::Value DramPut(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "dramPut";
    Napi::Object o = GetOptionsArg(info, 0, what);
    if (!o.Get("heap").IsObject()) Throw("E_TYPE", what + ".heap: expected { rec, heap, size }");
    Heap h(o.Get("heap").As<Napi::Object>(), what + ".heap");
    const size_t cap = h.capacity();
    const SlotState st = GetSlotState(o, true, what);
    ExpectLength(st.capacity(), cap, what + ".owner (one per heap slot)");
    auto slotKey = GetI32(o.Get("slotKey"), what + ".slotKey");
    ExpectLength(slotKey.length, cap, what + ".slotKey (one per slot)");
    auto freeArr = GetI32(o.Get("free"), what + ".free");
    ExpectLength(freeArr.length, cap, what + ".free (one per slot)");
    auto freeTop = GetI32(o.Get("freeTop"), what + ".freeTop");
    ExpectLength(freeTop.length, 1, what + ".freeTop");
    if (freeTop.data[0] < 0 || size_t(freeTop.data[0]) > cap)
      Throw("E_INTERNAL", what + ".freeTop: expected a count in [0, " + std::to_string(cap) + "], got " + std::to_string(freeTop.data[0]));
    if (!o.Get("maps").IsArray()) Throw("E_TYPE", what + ".maps: expected an Array of Int32Array slot maps, one per segment ordinal");
    Napi::Array mapsArr = o.Get("maps").As<Napi::Array>();
    const uint32_t nMaps = mapsArr.Length();
    const int64_t ordinal = GetInt(o, "ordinal", what, 0, int64_t(nMaps) - 1);
    std::vector<ArrayArg<int32_t>> maps(nMaps);
    std::vector<uint8_t> mapLoaded(nMaps, 0);
    auto mapOf = [&](int64_t ord) -> ArrayArg<int32_t>& {
      if (ord < 0 || ord >= int64_t(nMaps)) Throw("E_INTERNAL", what + ": a resident slot owned by segment ordinal " + std::to_string(ord) + ", expected one below " + std::to_string(nMaps));
      if (!mapLoaded[size_t(ord)]) {
        maps[size_t(ord)] = GetI32(mapsArr.Get(uint32_t(ord)), what + ".maps[" + std::to_string(ord) + "]");
        mapLoaded[size_t(ord)] = 1;
      }
      return maps[size_t(ord)];
    };
    ArrayArg<int32_t>& map = mapOf(ordinal);
    auto keys = GetI32(o.Get("keys"), what + ".keys");
    const size_t n = keys.length;
    const Scores scores = GetScores(o.Get("scores"), what + ".scores");
    ExpectLength(scores.length, n, what + ".scores (one per key)");
    auto src = GetArray<uint8_t>(o.Get("src"), napi_uint8_array, what + ".src");
    auto srcOffsets = GetArray<double>(o.Get("srcOffsets"), napi_float64_array, what + ".srcOffsets");
    ExpectLength(srcOffsets.length, n, what + ".srcOffsets (one per key)");
    const int64_t chunkBytes = GetInt(o, "chunkBytes", what, 1, int64_t(1) << 40);
    const int64_t perBlock = GetInt(o, "slotsPerBlock", what, 1, INT32_MAX);
    if (!o.Get("arenas").IsArray()) Throw("E_TYPE", what + ".arenas: expected an Array of Uint8Array arena blocks");
    Napi::Array arenasArr = o.Get("arenas").As<Napi::Array>();
    const size_t nBlocks = (cap + size_t(perBlock) - 1) / size_t(perBlock);
    ExpectLength(arenasArr.Length(), nBlocks, what + ".arenas (one per block of slotsPerBlock slots)");
    std::vector<ArrayArg<uint8_t>> arenas(nBlocks);
    for (size_t b = 0; b < nBlocks; ++b) {
      arenas[b] = GetArray<uint8_t>(arenasArr.Get(uint32_t(b)), napi_uint8_array, what + ".arenas[" + std::to_string(b) + "]");
      const size_t slotsHere = std::min(size_t(perBlock), cap - b * size_t(perBlock));
      if (uint64_t(arenas[b].length) < uint64_t(slotsHere) * uint64_t(chunkBytes))
        Throw("E_SHAPE", what + ".arenas[" + std::to_string(b) + "]: expected at least " + std::to_string(uint64_t(slotsHere) * uint64_t(chunkBytes)) +
                             " bytes, got " + std::to_string(arenas[b].length));
    }
    for (size_t i = 0; i < n; ++i) {
      if (keys.data[i] < 0 || size_t(keys.data[i]) >= map.length)
        Throw("E_RANGE", what + ".keys[" + std::to_string(i) + "]: expected a slot-map index in [0, " + std::to_string(map.length) + "), got " + std::to_string(keys.data[i]));
      if (!std::isfinite(scores[i]))
        Throw("E_NONFINITE", what + ".scores[" + std::to_string(i) + "]: expected a finite number, got " + Num(scores[i]));
      const double off = srcOffsets.data[i];
      if (!(off >= 0) || off != std::floor(off) || off + double(chunkBytes) > double(src.length))
        Throw("E_RANGE", what + ".srcOffsets[" + std::to_string(i) + "]: expected an integer offset with offset + " + std::to_string(chunkBytes) +
                             " <= src.length " + std::to_string(src.length) + ", got " + Num(off));
    }

    int32_t* owner = st.owner.data;
    uint16_t* pins = st.pins.data;
    int32_t& top = freeTop.data[0];
    size_t admitted = 0, rejected = 0, evicted = 0;
    std::vector<int32_t> aside;
    auto checkSlot = [&](int32_t s, const char* from) {
      if (s < 0 || size_t(s) >= cap)
        Throw("E_INTERNAL", what + ": " + from + " names slot " + std::to_string(s) + ", expected one in [0, " + std::to_string(cap) + ")");
    };
    // A resident slot back to the free stack (its owner's map entry cleared, out of the heap).
    auto release = [&](int32_t s) {
      ArrayArg<int32_t>& m = mapOf(owner[s]);
      const int32_t k = slotKey.data[s];
      if (k < 0 || size_t(k) >= m.length)
        Throw("E_INTERNAL", what + ": slot " + std::to_string(s) + " keyed " + std::to_string(k) + ", expected an index of its segment's slot map (" + std::to_string(m.length) + " entries)");
      m.data[k] = -1;
      owner[s] = -1;
      h.Remove(s);
      if (size_t(top) >= cap) Throw("E_INTERNAL", what + ": free stack overflow");
      freeArr.data[top++] = s;
    };
    for (size_t i = 0; i < n; ++i) {
      const int32_t k = keys.data[i];
      const double score = scores[i];
      const int32_t existing = map.data[k];
      if (existing >= 0) {
        checkSlot(existing, "a slot map");
        h.Update(existing, score);
        continue;
      }
      int32_t slot = -1;
      if (top > 0) {
        slot = freeArr.data[--top];
        checkSlot(slot, "the free stack");
      } else {
        int32_t victim = h.Peek();
        // A pinned chunk at the top (attended in place by a step) would refuse every admission: set
        // aside, out of the heap, until the caller finds it unpinned.
        while (victim >= 0 && pins[victim] != 0 && double(h.ScoreOf(victim)) < score) {
          h.Remove(victim);
          aside.push_back(victim);
          victim = h.Peek();
        }
        if (victim >= 0 && double(h.ScoreOf(victim)) < score && pins[victim] == 0) {
          release(victim);
          ++evicted;
          slot = freeArr.data[--top];
        }
      }
      if (slot < 0) {
        ++rejected;
        continue;
      }
      owner[slot] = int32_t(ordinal);
      slotKey.data[slot] = k;
      map.data[k] = slot;
      h.Insert(slot, score);
      const size_t b = size_t(slot) / size_t(perBlock);
      std::memcpy(arenas[b].data + uint64_t(size_t(slot) - b * size_t(perBlock)) * uint64_t(chunkBytes), src.data + uint64_t(srcOffsets.data[i]),
                  size_t(chunkBytes));
      ++admitted;
    }
    Napi::Object res = NumbersObject(info.Env(), {{"admitted", double(admitted)}, {"rejected", double(rejected)}, {"evicted", double(evicted)}});
    if (!aside.empty()) {
      Napi::Int32Array a = Napi::Int32Array::New(info.Env(), aside.size());
      std::memcpy(a.Data(), aside.data(), aside.size() * sizeof(int32_t));
      res.Set("aside", a);
    }
    return res;
  });
}

void InitDramTier(Napi::Env env, Napi::Object exports) {
  exports.Set("slotHeap", Napi::Function::New(env, SlotHeapOp, "slotHeap"));
  exports.Set("dramPut", Napi::Function::New(env, DramPut, "dramPut"));
  exports.Set("dramLocate", Napi::Function::New(env, DramLocate, "dramLocate"));
  exports.Set("dramPins", Napi::Function::New(env, DramPins, "dramPins"));
}

}  // namespace

KVD_REGISTER_MODULE(InitDramTier);

}  // namespace dram
}  // namespace kvd
