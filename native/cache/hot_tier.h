// Hot tier: a bounded arena of chunk slots per (sequence, layer, kv head) that the attention kernels
// read (DESIGN.md §2 "hot tier", kvdrive.txt §5.1).
//
// Layout and ownership. A Tier owns ONE allocation made at creation: for every (sequence, layer,
// kv head) pair `capacity` slots, each holding one chunk's K rows then (separately) its V rows —
// chunkSize × dim elements of the storage dtype, row-major, row stride = dim. Per-pair metadata
// (slot → chunk, chunk → slot open-addressing map, recency / frequency / attention mass) is sized at
// creation too; nothing grows afterwards, so the tier never holds more than Tier::bytes, which is
// checked against the caller's limit (E_BUDGET naming the minimum).
//
// Residency is per sequence and survives across steps. Capacity of a pair = window ×
// ceil(budget / chunkSize) slots (window 0: nothing retained; every selected chunk is streamed from
// the source each step and never admitted).
//
// Thread-safety. Tiers live in a process-global registry and are reached by integer handle from any
// thread (Acquire / Create / Destroy are mutex-protected; Acquire returns a shared_ptr so a tier
// destroyed while a worker still uses it is freed when that worker lets go). Steps on DIFFERENT
// (sequence, layer) pairs may run concurrently; at most one operation per (sequence, layer) at a
// time — enforced: a concurrent second one throws E_CONFIG instead of corrupting the map.
// Per-call scratch (miss list, eviction candidates) lives in thread-local buffers that grow to the
// largest selection seen on that thread and are reused; the tier itself never allocates after
// creation.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/aligned.h"
#include "common/args.h"
#include "attention/attention.h"
#include "common/dtype.h"

namespace kvd {
namespace hot {

enum class Eviction : int { Lookahead = 0, Lru = 1, Lfu = 2 };
Eviction ParseEviction(const std::string& s);
const char* EvictionName(Eviction e);

struct Counters {
  int64_t hits = 0;           // selected chunks found resident
  int64_t misses = 0;         // selected chunks not resident (admitted or streamed)
  int64_t admitted = 0;       // misses copied into a slot
  int64_t streamed = 0;       // misses read from the source without admission (no slot available)
  int64_t bytesAdmitted = 0;  // K+V bytes copied into slots by steps (warm-up excluded)
  int64_t bytesStreamed = 0;  // K+V bytes of streamed misses
  int64_t evictions = 0;
  int64_t warmAdmitted = 0;   // chunks placed by warm-up
  int64_t warmBytes = 0;
  void Add(const Counters& o) {
    hits += o.hits; misses += o.misses; admitted += o.admitted; streamed += o.streamed;
    bytesAdmitted += o.bytesAdmitted; bytesStreamed += o.bytesStreamed; evictions += o.evictions;
    warmAdmitted += o.warmAdmitted; warmBytes += o.warmBytes;
  }
};

// One (sequence, layer, kv head) arena. Slot arrays have `capacity` entries; the map has a power of
// two ≥ 2 × capacity buckets (linear probing, backward-shift deletion: no tombstones).
struct PairState {
  int32_t capacity = 0;
  int32_t resident = 0;
  int64_t step = 0;  // fetches done; lastUse/massStep are in these units
  uint8_t* k = nullptr;  // capacity × chunkSize × dim elements
  uint8_t* v = nullptr;
  std::vector<int32_t> slotChunk;  // -1 = free
  std::vector<int32_t> slotRows;   // rows of the chunk copied so far (≤ chunkSize)
  std::vector<int64_t> lastUse;    // step the chunk was last selected
  std::vector<int64_t> uses;       // times selected since admission (LFU)
  std::vector<float> mass;         // attention mass at massStep
  std::vector<int64_t> massStep;
  std::vector<float> poolScore;    // lookahead pool score of the resident, valid when poolStamp == step
  std::vector<int64_t> poolStamp;
  std::vector<int32_t> freeSlots;  // stack
  // chunk -> slot map. Key and slot share a bucket, so a lookup reads one cache line: a step looks
  // up every selected chunk several times (split, admission, attention, mass), and the map is cold
  // then (the select streamed the index through the caches).
  struct MapEntry {
    int32_t key;  // chunk id, -1 = empty
    int32_t slot;
  };
  std::vector<MapEntry> map;
  uint32_t mapMask = 0;
  Counters total;

  static uint32_t Hash(int32_t chunk) {
    const uint32_t x = uint32_t(chunk) * 0x9E3779B1u;
    return x ^ (x >> 15);
  }
  // Brings the map (and the per-slot arrays named by `fields`, SlotFields bits) into cache with one
  // sequential pass, before a loop of `lookups` lookups. Their buckets and slots are scattered and
  // the pair's arrays are cold at each step (the select streamed the index through the caches), so
  // each lookup would miss; a sequential pass over a few tens of KiB costs a few microseconds. Skipped
  // when the arrays hold many more lines than the loop would miss.
  enum SlotFields : unsigned { kUseFields = 1, kRowsField = 2, kMassFields = 4 };
  void Touch(size_t lookups, unsigned fields) const;
  // The slot holding `chunk`, or -1 (inline: every lookup of a step's loops goes through here).
  int32_t Find(int32_t chunk) const {
    if (map.empty()) return -1;
    for (uint32_t i = Hash(chunk) & mapMask;; i = (i + 1) & mapMask) {
      if (map[i].key == chunk) return map[i].slot;
      if (map[i].key < 0) return -1;
    }
  }
  void Insert(int32_t chunk, int32_t slot);
  void Erase(int32_t chunk);
};

struct TierConfig {
  int sequences = 1, layers = 1, kvHeads = 1, dim = 1, chunkSize = 4;
  int64_t budget = 0;  // tokens selected per (layer, kv head) per step
  Dtype dtype = Dtype::F32;
  Eviction eviction = Eviction::Lookahead;
  std::vector<int32_t> windows;  // layers × kvHeads
  int64_t maxBytes = 0;
};

// Page-first chunks staged for one layer step, wherever each lives (a TieredKv fetch buffer, a
// DRAM-tier slot read in place): per kv head h the ascending chunk ids ids[offsets[h] ..
// offsets[h+1]); entry i's page (chunkSize K rows, then chunkSize V rows, dim elements each) starts
// at ptrs[i] (validated by the caller: every page lies inside a buffer it keeps alive).
struct PagedChunks {
  const int32_t* offsets = nullptr;
  const int32_t* ids = nullptr;
  const uint8_t* const* ptrs = nullptr;
  // Optional, one per entry: 1 = the page's bytes are still being read (an SSD read in flight).
  // Tier::Fetch given a `landing` list decides residency as usual but leaves the copy of such a
  // page for Tier::Land once it has landed.
  const uint8_t* landing = nullptr;
  // The entry of (head, chunk), or -1 when no entry holds it.
  int64_t Entry(int head, int32_t chunk) const;
  // The page of (head, chunk), or null when no entry holds it.
  const uint8_t* Page(int head, int32_t chunk) const;
};

// The source a step copies misses from: one layer's K and V (token rows [kBase, kBase + k->tokens),
// any layout), or, when `paged` is set, page-first chunks holding rows of tokens [0, pagedTokens),
// with k / v (when set) serving the chunks no page holds that lie wholly at or after kBase (the
// runtime's open tail, read in place).
struct Source {
  const KvView* k;
  const KvView* v;
  const PagedChunks* paged = nullptr;
  int64_t pagedTokens = 0;
  int64_t kBase = 0;
  int64_t Tokens() const { return paged ? pagedTokens : k->tokens; }
};

// One kv head's part of a Selection (src/index/selection.ts), already validated.
struct HeadSelection {
  const int32_t* ids = nullptr;  // ascending
  int32_t n = 0;
  const int32_t* poolIds = nullptr;  // lookahead pool, best first (may be null)
  const float* poolScores = nullptr;
  int32_t poolN = 0;
};

class Tier {
 public:
  explicit Tier(const TierConfig& c);
  const TierConfig& config() const { return cfg_; }
  int64_t bytes() const { return bytes_; }
  int32_t slotsPerStep() const { return perStep_; }
  int32_t Capacity(int layer, int head) const { return cfg_.windows[size_t(layer) * cfg_.kvHeads + head] * perStep_; }
  PairState& Pair(int seq, int layer, int head) {
    return pairs_[(size_t(seq) * cfg_.layers + layer) * cfg_.kvHeads + head];
  }
  size_t chunkElems() const { return size_t(cfg_.chunkSize) * size_t(cfg_.dim); }

  // Bytes the configuration needs (slots + metadata); used for the budget check before allocating.
  static int64_t RequiredBytes(const TierConfig& c, int64_t* slotBytes = nullptr, int64_t* metaBytes = nullptr);

  // Hit/miss evaluation, eviction and admission for one kv head; returns that head's step counters.
  // tailStart: the selection's tail start (rows of a chunk below it are needed; a resident chunk
  // admitted before those rows existed is topped up).
  // `landing` (optional): when the source's pages say some are still being read, the copies from
  // them are not made; they are appended to `landing` as (slot, chunk, from row) triples for Land,
  // and the slot holds no rows until then (a reader falls back to the page). Counters are those of
  // the copies made at once.
  Counters Fetch(int seq, int layer, int head, const HeadSelection& sel, int64_t tailStart, const Source& src,
                 std::vector<int32_t>* landing = nullptr);
  // Makes the copies a Fetch left (triples as it wrote them, n triples) once their pages landed, or
  // with `drop` frees those slots instead (the reads failed: the chunks leave the tier). E_INTERNAL
  // when a slot no longer holds its chunk. Returns the bytes copied.
  int64_t Land(int seq, int layer, int head, const int32_t* triples, size_t n, const Source& src, bool drop);
  // Places chunks (best first) into free slots until the arena is full; returns chunks placed.
  int32_t Warm(int seq, int layer, int head, const int32_t* order, int32_t n, const Source& src);
  // Empties every (layer, kv head) arena of sequence `seq` so its handle can serve a new sequence:
  // all slots free, map empty, step clock back to 0. Cumulative counters (`total`) are kept: they
  // count per handle since creation, so tier-wide stats never lose a closed sequence's traffic.
  // Takes each layer's lock (E_CONFIG when an operation on that sequence is running).
  void ResetSequence(int seq);
  // Records the attention mass of the selected chunks of this step (for lookahead eviction).
  void RecordMass(int seq, int layer, int head, const int32_t* ids, const float* mass, int32_t n);

  // Exclusive use of one (sequence, layer) for the duration of an operation. An operation that
  // finds another operation on the pair throws E_CONFIG, and waits out a reader; a reader (stats,
  // residents, check) passes `wait` and yields until whoever holds the pair releases it.
  enum class Wait { kNo, kYes };
  class LayerLock {
   public:
    LayerLock(Tier& t, int seq, int layer, Wait wait = Wait::kNo);
    ~LayerLock();
   private:
    std::atomic<uint8_t>* flag_;
  };

  // Consistency check of every pair (tests): each resident chunk in exactly one slot, the map and
  // the slots agree, resident ≤ capacity, free list exact. Returns "" or the first violation.
  // Takes each layer's lock (waiting).
  std::string Check();

 private:
  // Copies rows of chunk `chunk` available in the source (from row `from`) into `slot`.
  // With `landing`, a copy from a page still being read is recorded there instead (see Fetch).
  int64_t CopyRows(PairState& p, int head, int32_t slot, int32_t chunk, int32_t from, const Source& src,
                   std::vector<int32_t>* landing = nullptr);

  TierConfig cfg_;
  int32_t perStep_ = 0;
  int64_t bytes_ = 0;
  LineBytes arena_;  // slots on cache lines: attention reads their rows at random
  std::vector<PairState> pairs_;
  std::unique_ptr<std::atomic<uint8_t>[]> busy_;  // sequences × layers
};

// Process-global registry.
int32_t Register(std::shared_ptr<Tier> t);
std::shared_ptr<Tier> Acquire(int32_t handle);  // throws E_CLOSED for unknown / destroyed handles
bool Unregister(int32_t handle);

}  // namespace hot
}  // namespace kvd
