// Hot tier core: slot arenas, chunk → slot map, hit/miss evaluation, admission and eviction
// (lookahead / LRU / LFU), warm-up placement, and the process-global handle registry.
// The JS bindings are in hot_tier_bindings.cc.
#include "cache/hot_tier.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "common/args.h"
#include "common/errors.h"

namespace kvd {
namespace hot {

Eviction ParseEviction(const std::string& s) {
  if (s == "lookahead") return Eviction::Lookahead;
  if (s == "lru") return Eviction::Lru;
  if (s == "lfu") return Eviction::Lfu;
  Throw("E_POLICY", "hot tier eviction: expected 'lookahead', 'lru' or 'lfu', got '" + s + "'");
}

const char* EvictionName(Eviction e) {
  switch (e) {
    case Eviction::Lookahead: return "lookahead";
    case Eviction::Lru: return "lru";
    case Eviction::Lfu: return "lfu";
  }
  return "?";
}

// ---- open-addressing map (linear probing, backward-shift deletion) ----

namespace {
// Reads one byte per cache line of [p, p + bytes): sequential, so the hardware prefetchers stream it.
uint32_t TouchLines(const void* p, size_t bytes) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  uint32_t sum = 0;
  for (size_t i = 0; i < bytes; i += 64) sum += b[i];
  return sum;
}
}  // namespace

void PairState::Touch(size_t lookups, unsigned fields) const {
  if (map.empty() || lookups == 0) return;
  const size_t cap = size_t(capacity);
  size_t bytes = map.size() * sizeof(MapEntry);
  if (fields & kUseFields) bytes += cap * (sizeof(int64_t) * 2);
  if (fields & kRowsField) bytes += cap * sizeof(int32_t);
  if (fields & kMassFields) bytes += cap * (sizeof(float) + sizeof(int64_t));
  // A streamed line costs a few ns, a missed lookup tens (a few misses overlap): pass over at most
  // four lines per lookup.
  if (bytes / 64 > 4 * lookups) return;
  uint32_t sum = TouchLines(map.data(), map.size() * sizeof(MapEntry));
  if (fields & kUseFields) sum += TouchLines(lastUse.data(), cap * sizeof(int64_t)) + TouchLines(uses.data(), cap * sizeof(int64_t));
  if (fields & kRowsField) sum += TouchLines(slotRows.data(), cap * sizeof(int32_t));
  if (fields & kMassFields) sum += TouchLines(mass.data(), cap * sizeof(float)) + TouchLines(massStep.data(), cap * sizeof(int64_t));
  asm volatile("" : : "r"(sum));  // the reads are the point: keep them
}

void PairState::Insert(int32_t chunk, int32_t slot) {
  uint32_t i = Hash(chunk) & mapMask;
  while (map[i].key >= 0) {
    if (map[i].key == chunk) Throw("E_INTERNAL", "hot tier map: chunk " + std::to_string(chunk) + " inserted twice");
    i = (i + 1) & mapMask;
  }
  map[i] = {chunk, slot};
}

void PairState::Erase(int32_t chunk) {
  uint32_t i = Hash(chunk) & mapMask;
  while (map[i].key != chunk) {
    if (map[i].key < 0) Throw("E_INTERNAL", "hot tier map: erase of absent chunk " + std::to_string(chunk));
    i = (i + 1) & mapMask;
  }
  // Backward shift: move later entries of the probe run into the hole when their home allows it.
  uint32_t hole = i;
  for (uint32_t j = (hole + 1) & mapMask; map[j].key >= 0; j = (j + 1) & mapMask) {
    const uint32_t home = Hash(map[j].key) & mapMask;
    // Entry j may move to `hole` iff home is not in the cyclic range (hole, j].
    const bool inRange = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!inRange) {
      map[hole] = map[j];
      hole = j;
    }
  }
  map[hole] = {-1, -1};
}

static uint32_t MapBuckets(int32_t capacity) {
  uint32_t b = 4;
  while (b < uint32_t(capacity) * 2u) b <<= 1;
  return b;
}

// ---- Tier ----

int64_t Tier::RequiredBytes(const TierConfig& c, int64_t* slotBytesOut, int64_t* metaBytesOut) {
  // Checked arithmetic: a configuration whose size does not fit in 63 bits is E_RANGE, never a
  // wrapped (small or negative) size that would pass the maxBytes check.
  const std::string what = "hot tier size";
  const uint64_t perStep = uint64_t((c.budget + c.chunkSize - 1) / c.chunkSize);
  const uint64_t chunkBytes = CheckedMul(uint64_t(c.chunkSize) * uint64_t(c.dim), DtypeSize(c.dtype) * 2, what);  // K and V
  uint64_t slots = 0, meta = 0;
  for (int l = 0; l < c.layers; ++l)
    for (int h = 0; h < c.kvHeads; ++h) {
      const uint64_t cap = CheckedMul(uint64_t(c.windows[size_t(l) * c.kvHeads + h]), perStep, what);
      // slotChunk, slotRows, freeSlots (int32), lastUse, uses, massStep, poolStamp (int64), mass, poolScore (float)
      const uint64_t perSlotMeta = 4 * 3 + 8 * 4 + 4 * 2;
      const uint64_t m = cap > 0 ? uint64_t(MapBuckets(int32_t(cap))) * 8 : 0;
      slots = CheckedAdd(slots, cap, what);
      meta = CheckedAdd(meta, CheckedAdd(CheckedMul(cap, perSlotMeta, what), m, what), what);
    }
  const uint64_t seqs = uint64_t(c.sequences), pairs = CheckedMul(seqs, uint64_t(c.layers), uint64_t(c.kvHeads), what);
  slots = CheckedMul(slots, seqs, what);
  meta = CheckedAdd(CheckedMul(meta, seqs, what), CheckedMul(sizeof(PairState), pairs, what), what);
  meta = CheckedAdd(meta, seqs * uint64_t(c.layers), what);  // busy flags
  const uint64_t slotBytes = CheckedMul(slots, chunkBytes, what);
  if (slotBytesOut) *slotBytesOut = int64_t(slotBytes);
  if (metaBytesOut) *metaBytesOut = int64_t(meta);
  return int64_t(CheckedAdd(slotBytes, meta, what));
}

Tier::Tier(const TierConfig& c) : cfg_(c) {
  perStep_ = int32_t((c.budget + c.chunkSize - 1) / c.chunkSize);
  int64_t slotBytes = 0, metaBytes = 0;
  bytes_ = RequiredBytes(c, &slotBytes, &metaBytes);
  if (bytes_ > c.maxBytes) {
    // The smallest configuration that still retains one step's chunks everywhere (window ×1).
    TierConfig one = c;
    std::fill(one.windows.begin(), one.windows.end(), 1);
    const int64_t minOne = RequiredBytes(one);
    Throw("E_BUDGET", "hot tier: the requested windows need " + std::to_string(bytes_) + " bytes (" +
                          std::to_string(slotBytes) + " of K/V slots + " + std::to_string(metaBytes) +
                          " of metadata); expected maxBytes >= " + std::to_string(bytes_) + ", got " +
                          std::to_string(c.maxBytes) + " (window ×1 everywhere needs " + std::to_string(minOne) +
                          ")");
  }
  arena_ = NewLineBytes(size_t(slotBytes) > 0 ? size_t(slotBytes) : 1);
  busy_.reset(new std::atomic<uint8_t>[size_t(c.sequences) * c.layers]);
  for (size_t i = 0; i < size_t(c.sequences) * c.layers; ++i) busy_[i].store(0);
  pairs_.resize(size_t(c.sequences) * c.layers * c.kvHeads);
  const size_t half = chunkElems() * DtypeSize(c.dtype);  // one chunk's K (or V) bytes
  uint8_t* at = arena_.get();
  for (int s = 0; s < c.sequences; ++s)
    for (int l = 0; l < c.layers; ++l)
      for (int h = 0; h < c.kvHeads; ++h) {
        PairState& p = Pair(s, l, h);
        p.capacity = Capacity(l, h);
        const size_t cap = size_t(p.capacity);
        p.k = at;
        p.v = at + cap * half;
        at += cap * half * 2;
        p.slotChunk.assign(cap, -1);
        p.slotRows.assign(cap, 0);
        p.lastUse.assign(cap, 0);
        p.uses.assign(cap, 0);
        p.mass.assign(cap, 0.f);
        p.massStep.assign(cap, -1);
        p.poolScore.assign(cap, 0.f);
        p.poolStamp.assign(cap, -1);
        p.freeSlots.resize(cap);
        for (size_t i = 0; i < cap; ++i) p.freeSlots[i] = int32_t(cap - 1 - i);  // pop gives slot 0 first
        if (cap > 0) {
          const uint32_t b = MapBuckets(p.capacity);
          p.map.assign(b, PairState::MapEntry{-1, -1});
          p.mapMask = b - 1;
        }
      }
}

Tier::LayerLock::LayerLock(Tier& t, int seq, int layer, Wait wait) : flag_(&t.busy_[size_t(seq) * t.cfg_.layers + layer]) {
  // busy_ values: 0 free, 1 held by an operation (a layer step), 2 held by a reader (stats,
  // residents, check). A reader waits for whoever holds the pair. An operation waits out a reader
  // (it holds the pair for a few microseconds, and must not make a step fail), but finding another
  // operation there is a caller error: two steps of one (sequence, layer) at once.
  const uint8_t mine = wait == Wait::kYes ? 2 : 1;
  for (;;) {
    uint8_t expected = 0;
    if (flag_->compare_exchange_weak(expected, mine, std::memory_order_acquire)) return;
    if (wait == Wait::kNo && expected == 1)
      Throw("E_CONFIG", "hot tier: sequence " + std::to_string(seq) + ", layer " + std::to_string(layer) +
                            " is in use by another thread; expected one operation per (sequence, layer) at a time");
    std::this_thread::yield();
  }
}

Tier::LayerLock::~LayerLock() { flag_->store(0, std::memory_order_release); }

void Tier::ResetSequence(int seq) {
  for (int l = 0; l < cfg_.layers; ++l) {
    LayerLock lock(*this, seq, l);
    for (int h = 0; h < cfg_.kvHeads; ++h) {
      PairState& p = Pair(seq, l, h);
      const size_t cap = size_t(p.capacity);
      std::fill(p.slotChunk.begin(), p.slotChunk.end(), -1);
      std::fill(p.slotRows.begin(), p.slotRows.end(), 0);
      std::fill(p.lastUse.begin(), p.lastUse.end(), 0);
      std::fill(p.uses.begin(), p.uses.end(), 0);
      std::fill(p.mass.begin(), p.mass.end(), 0.f);
      std::fill(p.massStep.begin(), p.massStep.end(), -1);
      std::fill(p.poolScore.begin(), p.poolScore.end(), 0.f);
      std::fill(p.poolStamp.begin(), p.poolStamp.end(), -1);
      p.freeSlots.resize(cap);
      for (size_t i = 0; i < cap; ++i) p.freeSlots[i] = int32_t(cap - 1 - i);  // same order as at creation
      std::fill(p.map.begin(), p.map.end(), PairState::MapEntry{-1, -1});
      p.resident = 0;
      p.step = 0;
    }
  }
}

int64_t PagedChunks::Entry(int head, int32_t chunk) const {
  const int32_t* a = ids + offsets[head];
  const int32_t* b = ids + offsets[head + 1];
  const int32_t* at = std::lower_bound(a, b, chunk);
  return at != b && *at == chunk ? int64_t(at - ids) : -1;
}

const uint8_t* PagedChunks::Page(int head, int32_t chunk) const {
  const int64_t e = Entry(head, chunk);
  return e >= 0 ? ptrs[e] : nullptr;
}

int64_t Tier::CopyRows(PairState& p, int head, int32_t slot, int32_t chunk, int32_t from, const Source& src,
                       std::vector<int32_t>* landing) {
  const int64_t first = int64_t(chunk) * cfg_.chunkSize;
  const int64_t avail = std::min<int64_t>(cfg_.chunkSize, src.Tokens() - first);
  const size_t es = DtypeSize(cfg_.dtype);
  const size_t rowBytes = size_t(cfg_.dim) * es;
  uint8_t* kd = p.k + size_t(slot) * chunkElems() * es;
  uint8_t* vd = p.v + size_t(slot) * chunkElems() * es;
  const int64_t entry = src.paged ? src.paged->Entry(head, chunk) : -1;
  const uint8_t* page = entry >= 0 ? src.paged->ptrs[entry] : nullptr;
  const bool fromRows = !page && src.k && first >= src.kBase;
  if (src.paged && !page && !fromRows)
    Throw("E_RANGE", "hot tier: chunk " + std::to_string(chunk) + " of kv head " + std::to_string(head) +
                         " must be admitted but the page source does not hold it");
  const int64_t copied = std::max<int64_t>(0, avail - from);
  if (page && copied > 0 && landing && src.paged->landing && src.paged->landing[entry]) {
    // Still being read: Land copies it (the slot's rows stay as they are until then).
    landing->insert(landing->end(), {slot, chunk, from});
    return copied * int64_t(rowBytes) * 2;
  }
  if (page && copied > 0) {
    // A page holds the chunk's K rows, then its V rows, each block contiguous like the slot's: one
    // copy per block.
    const size_t bytes = size_t(copied) * rowBytes;
    std::memcpy(kd + size_t(from) * rowBytes, page + size_t(from) * rowBytes, bytes);
    std::memcpy(vd + size_t(from) * rowBytes, page + size_t(cfg_.chunkSize + from) * rowBytes, bytes);
  } else {
    // Token rows (a layer's KV or the open tail): one K and one V row per token.
    for (int64_t r = from; r < avail; ++r) {
      std::memcpy(kd + size_t(r) * rowBytes, src.k->Row(first + r - src.kBase, head), rowBytes);
      std::memcpy(vd + size_t(r) * rowBytes, src.v->Row(first + r - src.kBase, head), rowBytes);
    }
  }
  if (avail > p.slotRows[size_t(slot)]) p.slotRows[size_t(slot)] = int32_t(avail);
  return copied * int64_t(rowBytes) * 2;
}

// Key by which residents are evicted, smallest first. Protected = currently selected (never a
// victim). Lookahead: residents outside the lookahead pool first, by their attention mass at the
// latest attended step (0 if not attended then), ties by recency; then pool members by ascending
// selection score. LRU: least recently selected. LFU: fewest selections, ties by recency.
struct VictimKey {
  int tier;      // 0 evicted before 1
  double score;  // ascending
  int64_t last;  // ascending
  int32_t chunk;
  int32_t slot;
  bool operator<(const VictimKey& o) const {
    if (tier != o.tier) return tier < o.tier;
    if (score != o.score) return score < o.score;
    if (last != o.last) return last < o.last;
    return chunk < o.chunk;
  }
};

Counters Tier::Fetch(int seq, int layer, int head, const HeadSelection& sel, int64_t tailStart, const Source& src,
                     std::vector<int32_t>* landing) {
  PairState& p = Pair(seq, layer, head);
  Counters st;
  const int64_t latest = p.step;  // the step whose attention mass is "current" for eviction
  const int64_t now = p.step + 1;
  const int64_t c = cfg_.chunkSize;
  const int64_t rowBytes2 = int64_t(cfg_.dim) * int64_t(DtypeSize(cfg_.dtype)) * 2;  // one K row + one V row
  thread_local std::vector<int32_t> missIdx;
  missIdx.clear();
  p.Touch(size_t(sel.n), PairState::kUseFields | PairState::kRowsField);
  // 1. Hits: mark as used now (protects them from eviction this step), refresh rows that did not
  //    exist yet when the chunk was admitted.
  for (int32_t i = 0; i < sel.n; ++i) {
    const int32_t chunk = sel.ids[i];
    const int32_t slot = p.Find(chunk);
    if (slot < 0) {
      missIdx.push_back(i);
      continue;
    }
    ++st.hits;
    p.lastUse[size_t(slot)] = now;
    ++p.uses[size_t(slot)];
    const int64_t need = std::min<int64_t>(c, tailStart - int64_t(chunk) * c);
    if (need > p.slotRows[size_t(slot)]) st.bytesAdmitted += CopyRows(p, head, slot, chunk, p.slotRows[size_t(slot)], src, landing);
  }
  st.misses = int64_t(missIdx.size());
  // 2. Evict just enough residents (never one selected now) to place the misses that can fit.
  const int64_t placeable = std::min<int64_t>(st.misses, int64_t(p.capacity) - st.hits);
  int64_t toEvict = placeable - int64_t(p.freeSlots.size());
  if (toEvict > 0) {
    // Mark residents that are in this step's lookahead pool (score kept in the slot).
    if (cfg_.eviction == Eviction::Lookahead)
      for (int32_t i = 0; i < sel.poolN; ++i) {
        const int32_t slot = p.Find(sel.poolIds[i]);
        if (slot < 0) continue;
        p.poolScore[size_t(slot)] = sel.poolScores[i];
        p.poolStamp[size_t(slot)] = now;
      }
    thread_local std::vector<VictimKey> keys;
    keys.clear();
    for (int32_t s = 0; s < p.capacity; ++s) {
      const int32_t chunk = p.slotChunk[size_t(s)];
      if (chunk < 0 || p.lastUse[size_t(s)] == now) continue;
      VictimKey k{0, 0.0, p.lastUse[size_t(s)], chunk, s};
      switch (cfg_.eviction) {
        case Eviction::Lookahead: {
          if (p.poolStamp[size_t(s)] == now) {
            k.tier = 1;
            k.score = p.poolScore[size_t(s)];
          } else {
            k.score = p.massStep[size_t(s)] == latest ? double(p.mass[size_t(s)]) : 0.0;
          }
          break;
        }
        case Eviction::Lru: break;
        case Eviction::Lfu: k.score = double(p.uses[size_t(s)]); break;
      }
      keys.push_back(k);
    }
    if (int64_t(keys.size()) < toEvict) Throw("E_INTERNAL", "hot tier: fewer evictable residents than needed");
    // The toEvict smallest keys as a set (keys are totally ordered: chunk ids are distinct).
    std::nth_element(keys.begin(), keys.begin() + (toEvict - 1), keys.end());
    for (int64_t i = 0; i < toEvict; ++i) {
      const VictimKey& k = keys[size_t(i)];
      p.Erase(k.chunk);
      p.slotChunk[size_t(k.slot)] = -1;
      p.slotRows[size_t(k.slot)] = 0;
      p.freeSlots.push_back(k.slot);
      --p.resident;
      ++st.evictions;
    }
  }
  // 3. Admit misses in ascending chunk order while slots last; the rest are streamed.
  for (int32_t i : missIdx) {
    const int32_t chunk = sel.ids[i];
    if (p.freeSlots.empty()) {
      // Read from the source for this step only: the rows that exist, like an admission would copy.
      const int64_t rows = std::max<int64_t>(0, std::min<int64_t>(c, src.Tokens() - int64_t(chunk) * c));
      ++st.streamed;
      st.bytesStreamed += rows * rowBytes2;
      continue;
    }
    const int32_t slot = p.freeSlots.back();
    p.freeSlots.pop_back();
    p.slotChunk[size_t(slot)] = chunk;
    p.slotRows[size_t(slot)] = 0;
    p.lastUse[size_t(slot)] = now;
    p.uses[size_t(slot)] = 1;
    p.massStep[size_t(slot)] = -1;
    p.Insert(chunk, slot);
    ++p.resident;
    ++st.admitted;
    st.bytesAdmitted += CopyRows(p, head, slot, chunk, 0, src, landing);
  }
  p.step = now;
  p.total.Add(st);
  return st;
}

int64_t Tier::Land(int seq, int layer, int head, const int32_t* triples, size_t n, const Source& src, bool drop) {
  PairState& p = Pair(seq, layer, head);
  int64_t bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t slot = triples[3 * i], chunk = triples[3 * i + 1], from = triples[3 * i + 2];
    if (chunk < 0 || slot < 0 || slot >= p.capacity || p.slotChunk[size_t(slot)] != chunk || from < 0 || from > cfg_.chunkSize)
      Throw("E_INTERNAL", "hot tier: a landing copy names slot " + std::to_string(slot) + " for chunk " + std::to_string(chunk) +
                              " of kv head " + std::to_string(head) + " (rows from " + std::to_string(from) +
                              "), expected a slot that Fetch gave that chunk and nothing changed since");
    if (drop) {
      p.Erase(chunk);
      p.slotChunk[size_t(slot)] = -1;
      p.slotRows[size_t(slot)] = 0;
      p.freeSlots.push_back(slot);
      --p.resident;
      continue;
    }
    bytes += CopyRows(p, head, slot, chunk, from, src);
  }
  return bytes;
}

int32_t Tier::Warm(int seq, int layer, int head, const int32_t* order, int32_t n, const Source& src) {
  PairState& p = Pair(seq, layer, head);
  int32_t placed = 0;
  for (int32_t i = 0; i < n && !p.freeSlots.empty(); ++i) {
    const int32_t chunk = order[i];
    if (p.Find(chunk) >= 0) continue;
    const int32_t slot = p.freeSlots.back();
    p.freeSlots.pop_back();
    p.slotChunk[size_t(slot)] = chunk;
    p.slotRows[size_t(slot)] = 0;
    p.lastUse[size_t(slot)] = p.step;
    p.uses[size_t(slot)] = 0;
    p.massStep[size_t(slot)] = -1;
    p.Insert(chunk, slot);
    ++p.resident;
    p.total.warmBytes += CopyRows(p, head, slot, chunk, 0, src);
    ++p.total.warmAdmitted;
    ++placed;
  }
  return placed;
}

void Tier::RecordMass(int seq, int layer, int head, const int32_t* ids, const float* mass, int32_t n) {
  PairState& p = Pair(seq, layer, head);
  p.Touch(size_t(std::max(n, 0)), PairState::kMassFields);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t slot = p.Find(ids[i]);
    if (slot < 0) continue;  // streamed chunk: not resident, nothing to rank
    p.mass[size_t(slot)] = mass[i];
    p.massStep[size_t(slot)] = p.step;
  }
}

std::string Tier::Check() {
  for (size_t pi = 0; pi < pairs_.size(); ++pi) {
    const size_t seqLayer = pi / size_t(cfg_.kvHeads);
    LayerLock lock(*this, int(seqLayer / size_t(cfg_.layers)), int(seqLayer % size_t(cfg_.layers)), Wait::kYes);
    const PairState& p = pairs_[pi];
    const std::string at = "pair " + std::to_string(pi) + ": ";
    int32_t resident = 0;
    std::unordered_map<int32_t, int32_t> seen;
    for (int32_t s = 0; s < p.capacity; ++s) {
      const int32_t chunk = p.slotChunk[size_t(s)];
      if (chunk < 0) continue;
      ++resident;
      if (!seen.emplace(chunk, s).second)
        return at + "chunk " + std::to_string(chunk) + " in slots " + std::to_string(seen[chunk]) + " and " + std::to_string(s);
      if (p.Find(chunk) != s) return at + "map sends chunk " + std::to_string(chunk) + " to slot " + std::to_string(p.Find(chunk)) + ", not " + std::to_string(s);
    }
    if (resident != p.resident) return at + "resident count " + std::to_string(p.resident) + " but " + std::to_string(resident) + " occupied slots";
    if (resident > p.capacity) return at + "resident " + std::to_string(resident) + " > capacity " + std::to_string(p.capacity);
    if (int32_t(p.freeSlots.size()) + resident != p.capacity) return at + "free list size " + std::to_string(p.freeSlots.size()) + " + resident != capacity";
    for (int32_t s : p.freeSlots)
      if (p.slotChunk[size_t(s)] >= 0) return at + "slot " + std::to_string(s) + " is both free and occupied";
    int32_t mapped = 0;
    for (const PairState::MapEntry& e : p.map)
      if (e.key >= 0) {
        ++mapped;
        const int32_t s = e.slot;
        if (s < 0 || s >= p.capacity || p.slotChunk[size_t(s)] != e.key) return at + "map entry for chunk " + std::to_string(e.key) + " points at a slot holding another chunk";
      }
    if (mapped != resident) return at + "map holds " + std::to_string(mapped) + " entries for " + std::to_string(resident) + " residents";
  }
  return "";
}

// ---- registry ----

namespace {
std::mutex g_mu;
std::unordered_map<int32_t, std::shared_ptr<Tier>>& Tiers() {
  static std::unordered_map<int32_t, std::shared_ptr<Tier>> m;
  return m;
}
int32_t g_next = 1;
}  // namespace

int32_t Register(std::shared_ptr<Tier> t) {
  std::lock_guard<std::mutex> lock(g_mu);
  const int32_t h = g_next++;
  Tiers().emplace(h, std::move(t));
  return h;
}

std::shared_ptr<Tier> Acquire(int32_t handle) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = Tiers().find(handle);
  if (it == Tiers().end())
    Throw("E_CLOSED", "hot tier handle " + std::to_string(handle) + ": expected a live hot tier, got a destroyed or unknown handle");
  return it->second;
}

bool Unregister(int32_t handle) {
  std::shared_ptr<Tier> dying;  // freed outside the lock
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = Tiers().find(handle);
  if (it == Tiers().end()) return false;
  dying = std::move(it->second);
  Tiers().erase(it);
  return true;
}

}  // namespace hot
}  // namespace kvd
