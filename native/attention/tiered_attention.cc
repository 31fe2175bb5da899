// attendFetched / attendFetchedAsync: exact sparse attention of one layer-step whose KV is spread
// over the places the runtime's memory model keeps it (src/runtime/step.ts): sinks and the open tail
// in small token-major tensors, sealed chunks as page-first pages wherever they are — a TieredKv
// fetch buffer (SSD reads), a DRAM-tier slot read in place, a hot-tier slot — none copied again.
//
// The selection may be finer than the pages: the tiers hold whole chunks of `pageChunkSize` tokens,
// while a token-granular selection (chunkSize 1) names the tokens attended; each selected unit is
// read from the page that holds it (a divisor of the page size never straddles two pages), or from
// the tail tensor when it lies at or after tailBase.
//
// Spans are listed exactly as attendSparse lists them over a contiguous cache — sinks [0, sinkEnd),
// each selected unit clipped to [sinkEnd, tailStart) in ascending id order, then the tail
// [tailStart, tokens) — so with the same rows the output is bit-identical to attendSparse (the
// AttendHeadSpans contract: the result depends on span contents and order, never on where they live).
//
// attendFetched (not the async one) can also make the selection (`select`, with a DRAM tier holding
// every chunk): each kv head's select is a producer task of the attention's pass over the pool
// (AttendSplit's HeadLister), and a head is listed and attended once it is selected — the same
// selection as selectIndex's, so the same bits as selectIndex then attendFetched.
#include <napi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/args.h"
#include "common/async_work.h"
#include "attention/attention.h"
#include "attention/attention_split.h"
#include "attention/query_args.h"
#include "attention/span_lists.h"
#include "common/errors.h"
#include "cache/dram_chain.h"
#include "cache/hot_tier.h"
#include "common/thread_pool.h"
#include "storage/page_spans.h"
#include "common/registry.h"
#include "index/headwise_select.h"

namespace kvd {
namespace {

// Most page buffers one call may name (fetched: a Uint8Array or an array of them).
constexpr size_t kMaxPageBuffers = 256;  // buffer indices are Uint8Array entries
// Most reads one call may wait on (landing): a step issues one per head group.
constexpr uint32_t kMaxLandingReads = 1024;

// Page pointers of one call, one per page entry. Not a std::vector: value-initialising ~10K entries
// per layer-step (and faulting the freed pages back in) showed up on the calling thread's profile.
using PagePtrs = std::unique_ptr<const uint8_t*[]>;

struct FetchedJob {
  std::string what;
  const float* q = nullptr;
  int qHeads = 0, kvHeads = 0, group = 0, dim = 0;
  Dtype dtype = Dtype::F32;
  float scale = 1.f;
  int threads = 1;  // workers of the thread pool (AttendSplit: split by kv head and KV length)
  KvView sinkK, sinkV;  // tokens [0, sink.tokens), sink.tokens >= sinkEnd
  KvView tailK, tailV;  // tokens [tailBase, tailBase + tail.tokens)
  int64_t tailBase = 0;
  int64_t chunkSize = 0, tokens = 0, sinkEnd = 0, tailStart = 0;  // the selection's
  const int32_t* offsets = nullptr;
  const int32_t* chunkIds = nullptr;
  size_t nChunks = 0;
  // Tokens per page (the tiers' chunk), a multiple of the selection's chunkSize.
  int64_t pageChunk = 0;
  // Pages: per kv head the ascending page ids fetchedIds[fetchedOffsets[h] .. fetchedOffsets[h+1]),
  // entry i's page at pagePtrs[i] (inside a buffer kept alive by the call).
  const int32_t* fetchedOffsets = nullptr;
  const int32_t* fetchedIds = nullptr;
  PagePtrs pagePtrs;
  // Optional (dramTier, instead of the page lists): the sealed pages read straight from a DRAM tier
  // that holds every one of them (the memory model without an SSD), page c of kv head h at the slot
  // the tier's slot maps give (cache/dram_chain.h). No per-step placement exists then: the lookup is
  // made here, as each unit's span is listed, prefetched a few units ahead.
  struct DramPages {
    dram::Chain chain;
    int64_t layer = 0;
    std::vector<const uint8_t*> arenas;
    std::vector<size_t> arenaBytes;
    uint32_t perBlock = 1;
    size_t pageBytes = 0;
  };
  std::unique_ptr<DramPages> dram;
  // With dramTier: distinct pages the attended heads read from the DRAM tier, the tail and the hot
  // tier ([dram, tail, hot], the result's pageCounts): the step's traffic without a fetch stage.
  int32_t* pageCounts = nullptr;
  // Optional hot tier (pageChunk-token chunks): a page resident there is read from its slot.
  std::shared_ptr<hot::Tier> tier;
  int hotSeq = 0, hotLayer = 0;
  // Kv heads to attend (`heads`: one 0/1 entry per kv head); empty: every head. The outputs of a
  // head left out (its out / lse rows, its chunkMass entries) are not written, and its pages are not
  // read: a caller attends the heads whose pages are ready while the others' reads are in flight.
  std::vector<uint8_t> heads;
  bool Active(int h) const { return heads.empty() || heads[size_t(h)] != 0; }
  float* out = nullptr;
  float* lse = nullptr;
  float* chunkMass = nullptr;
  // Optional (fetchedMass): per page entry, the sum of chunkMass over the selected units it holds,
  // in unit order (the importance the DRAM tier ranks a fetched chunk by).
  float* pageMass = nullptr;
  // Optional (landing): SSD reads still landing in the fetch buffer. Per read, its flag array `done`
  // (element 0: 0 while the read runs, 1 once it ended with every item landed, else it failed;
  // element 1 + i: 1 once item i landed; release stores by the read's own thread, see
  // native/storage/extent_store.cc). landingOf[h]: (read, flag) of every item holding kv head h's
  // pages. A head is attended once all of them are 1 (ReadGate); `attended` (kv heads) says which were.
  std::vector<const int32_t*> landingEnd;
  std::vector<std::vector<std::pair<uint32_t, const int32_t*>>> landingOf;
  uint8_t* attended = nullptr;
  // How long a head may stay pending (landingTimeoutMs): past it the head is left out as for a
  // failed read, so flags that never come (a stuck read, a caller's mistake) cannot hang the call;
  // the caller attends the head once its read settles.
  std::chrono::milliseconds landingTimeout{30000};
  // Optional (select, with dramTier): the selection is made by this call, kv head by kv head, in
  // the same pass over the pool as the attention (each head's selection a producer task of
  // AttendSplit, its attention taken up as soon as it is made). offsets / chunkIds / nChunks /
  // chunkSize / chunkMass are set by Run from the heads' joined selection (`joined`, `mass`);
  // selectMs: from Run's start until the last head's selection was made.
  std::unique_ptr<HeadwiseSelect> select;
  // With select: whether the result carries the selection's chunkMass (select.chunkMass). The
  // attention computes it either way; copying it out is a 64 KiB array per 128K step.
  bool selectMass = false;
  SelectResult joined;
  std::vector<float> mass;
  double selectMs = 0;
};

// The HeadGate of a call with reads landing (FetchedJob::landingOf), over the call's packed heads.
class ReadGate : public HeadGate {
 public:
  ReadGate(const FetchedJob& job, const std::vector<size_t>& headOf)
      : job_(job), headOf_(headOf), deadline_(std::chrono::steady_clock::now() + job.landingTimeout) {}
  State Of(size_t head) const override {
    for (const auto& [read, flag] : job_.landingOf[headOf_[head]]) {
      if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == 1) continue;
      if (__atomic_load_n(job_.landingEnd[read], __ATOMIC_ACQUIRE) == 0)
        return std::chrono::steady_clock::now() < deadline_ ? kPending : kNever;
      // The read has ended: an item it landed set its flag before the end flag, so look again.
      if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != 1) return kNever;
    }
    return kReady;
  }

 private:
  const FetchedJob& job_;
  const std::vector<size_t>& headOf_;
  std::chrono::steady_clock::time_point deadline_;
};

// Where a span's rows live, for error messages.
enum SpanKind : uint8_t { kSink, kFetched, kTail, kHot, kDram };

// The page (of pageChunk tokens) holding token t >= 0. Pages are a power of two in the runtime (its
// chunk size): a shift then, rather than a 64-bit division per selected unit.
class PageOf {
 public:
  explicit PageOf(int64_t pageChunk) : pc_(pageChunk), shift_(pageChunk > 0 && (pageChunk & (pageChunk - 1)) == 0 ? __builtin_ctzll(uint64_t(pageChunk)) : -1) {}
  int64_t operator()(int64_t t) const { return shift_ >= 0 ? t >> shift_ : t / pc_; }

 private:
  int64_t pc_;
  int shift_;
};

// Units ahead whose DRAM-tier slot-map entry the span listing requests (dramTier): each is a miss
// at random in maps of ~1 MiB per 128K tokens, and each head's listing runs on one thread.
constexpr int32_t kDramLookAhead = 16;

// The page of chunk c of kv head h in job.dram's arena; every index checked (E_RANGE names what).
// `seg`: the segment cursor of the head's walk (dram::Chain::Locate).
const uint8_t* DramPage(const FetchedJob& job, int h, int32_t c, size_t& seg) {
  const FetchedJob::DramPages& d = *job.dram;
  if (c < 0 || int64_t(c) >= d.chain.chunks())
    Throw("E_RANGE", job.what + ": chunk " + std::to_string(c) + " of kv head " + std::to_string(h) +
                         " is selected before tailBase but lies past the DRAM tier's chain (" + std::to_string(d.chain.chunks()) +
                         " chunks)");
  const dram::Chain::At m = d.chain.Locate(d.layer, job.kvHeads, c, h, seg);
  if (!m.inside) Throw("E_RANGE", dram::ChainMiss(d.chain, m, d.layer, h, c, job.what + ".dramTier"));
  const int32_t slot = d.chain.maps[size_t(m.seg)].data[m.key];
  if (slot < 0)
    Throw("E_RANGE", job.what + ": chunk " + std::to_string(c) + " of kv head " + std::to_string(h) +
                         " is selected but not resident in the DRAM tier (dramTier: a tier that holds every sealed chunk)");
  const uint32_t b = uint32_t(slot) / d.perBlock;
  const size_t off = size_t(uint32_t(slot) - b * d.perBlock) * d.pageBytes;
  if (b >= d.arenas.size() || off > d.arenaBytes[b] || d.pageBytes > d.arenaBytes[b] - off)
    Throw("E_RANGE", job.what + ".dramTier.maps[" + std::to_string(m.seg) + "]: slot " + std::to_string(slot) + " of chunk " + std::to_string(c) +
                         " lies outside the arenas (" + std::to_string(d.arenas.size()) + " blocks of " + std::to_string(d.perBlock) +
                         " slots)");
  return d.arenas[b] + off;
}

// AttendSplit's HeadLister over the packed heads of a call (packed head i is kv head headOf[i]).
// With `select` (every head packed, in order), kv head t's selection is producer task t: made on
// whichever worker takes it, a failure kept for the head's listing to throw.
template <typename ListFn>
class PackedLister final : public HeadLister {
 public:
  PackedLister(const std::vector<size_t>& headOf, const std::vector<int64_t>& maxTokens, const ListFn& list, HeadwiseSelect* select)
      : headOf_(headOf), maxTokens_(maxTokens), list_(list), select_(select), selected_(select ? headOf.size() : 0),
        failed_(select ? headOf.size() : 0) {
    for (auto& s : selected_) s.store(0, std::memory_order_relaxed);
  }
  int64_t MaxTokens(size_t head) const override { return maxTokens_[head]; }
  void List(size_t head) const override {
    if (select_ && failed_[head]) std::rethrow_exception(failed_[head]);
    list_(headOf_[head]);
  }
  size_t Producers() const override { return selected_.size(); }
  void Produce(size_t t) const override {
    try {
      select_->Run(int(t));
    } catch (...) {
      failed_[t] = std::current_exception();
    }
    const int64_t at = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
    int64_t last = lastDone_.load(std::memory_order_relaxed);
    while (at > last && !lastDone_.compare_exchange_weak(last, at, std::memory_order_relaxed)) {
    }
    selected_[t].store(1, std::memory_order_release);
  }
  bool Ready(size_t head) const override { return selected_.empty() || selected_[head].load(std::memory_order_acquire) != 0; }
  // steady_clock nanoseconds when the last selection was made (with `select`).
  int64_t LastSelected() const { return lastDone_.load(std::memory_order_relaxed); }

 private:
  const std::vector<size_t>& headOf_;
  const std::vector<int64_t>& maxTokens_;
  const ListFn& list_;
  HeadwiseSelect* select_;
  mutable std::vector<std::atomic<uint8_t>> selected_;
  mutable std::vector<std::exception_ptr> failed_;
  mutable std::atomic<int64_t> lastDone_{0};
};

// `joined`, job.select's selection of every head, as the call's selection (offsets, ids, result mass).
void AdoptSelection(FetchedJob& job, SelectResult joined) {
  job.joined = std::move(joined);
  job.chunkSize = job.joined.chunk;
  job.offsets = job.joined.offsets.data();
  job.chunkIds = job.joined.ids.data();
  job.nChunks = job.joined.ids.size();
  job.mass.assign(job.nChunks, 0.f);
  job.chunkMass = job.mass.data();
}

void Run(FetchedJob& job) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t fixedSpans = (job.sinkEnd > 0 ? 1 : 0) + (job.tokens > job.tailStart ? 1 : 0);
  // Tokens every head attends beside its units: its sinks and its tail (a head's bound adds its units').
  const int64_t fixedTokens = job.sinkEnd + std::max<int64_t>(0, job.tokens - job.tailStart);
  // With select: heads whose selection cannot outgrow one part select inside the attention's pass.
  bool inline_ = false;
  if (job.select) {
    inline_ = fixedTokens + job.select->MaxIdTokens() <= kSinglePartTokens;
    if (!inline_) {
      // Heads that could outgrow one part (a budget near kSinglePartTokens) are cut by their spans:
      // they select first, in a pass of their own, and the call goes on as with a given selection.
      AdoptSelection(job, job.select->SelectAll());
      job.selectMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  const int64_t pc = job.pageChunk, sc = job.chunkSize;
  const PageOf pageOf(pc);
  const size_t es = DtypeSize(job.dtype);
  std::unique_ptr<hot::Tier::LayerLock> lock;
  if (job.tier) lock = std::make_unique<hot::Tier::LayerLock>(*job.tier, job.hotSeq, job.hotLayer);
  SpanLists& rs = ThreadSpanLists();
  const size_t kvHeads = size_t(job.kvHeads);
  // At most the units plus a sink and a tail span per head (inline: room for the most units a
  // head's selection can hold).
  const size_t roomPerHead = inline_ ? size_t(job.select->MaxIds()) + fixedSpans : 0;
  rs.Reserve(inline_ ? roomPerHead * kvHeads : size_t(job.offsets[job.kvHeads] - job.offsets[0]) + 2 * kvHeads, kvHeads);
  Span* const spans = rs.spans.data();
  uint8_t* const kind = rs.source.data();
  int64_t* const firstToken = rs.first.data();
  const size_t headOut = size_t(job.group) * size_t(job.dim);
  // Every head lists one span per selected unit (an empty one for a unit clipped away), plus its
  // sinks and its tail: where each head's spans start is known before any is listed, so the heads
  // are listed in parallel, each by the worker that attends it (the listing looks up each unit's
  // page: in the hot tier's map, the page lists or the DRAM tier's slot maps, misses at random),
  // into the same places, in the same order.
  // Inline, each head's room is known but not its count: head h's spans start at h x room, and its
  // listing sets its count.
  rs.start[0] = 0;
  for (size_t h = 0; h < kvHeads; ++h)
    rs.start[h + 1] = rs.start[h] + (inline_ ? roomPerHead
                                             : job.Active(int(h)) ? fixedSpans + size_t(job.offsets[h + 1] - job.offsets[h]) : 0);
  // Kv head h's selected units: ascending ids of `unit` tokens each.
  struct Units {
    const int32_t* ids;
    int32_t n;
    int64_t unit;
  };
  auto unitsOf = [&](int h) -> Units {
    if (inline_) {
      const SelectResult& r = job.select->Head(h);
      return {r.ids.data(), int32_t(r.ids.size()), r.chunk};
    }
    return {job.chunkIds + job.offsets[h], job.offsets[h + 1] - job.offsets[h], sc};
  };
  // dramTier: distinct pages per source and head, summed over the heads attended below.
  std::vector<std::array<int32_t, 3>> pageCount(job.pageCounts ? kvHeads : 0, {0, 0, 0});
  auto listHead = [&](size_t head) {
    const int h = int(head);
    if (!job.Active(h)) return;
    size_t n = rs.start[head];
    auto add = [&](const Span& sp, SpanKind k, int64_t first) {
      spans[n] = sp;
      kind[n] = k;
      firstToken[n] = first;
      ++n;
    };
    // Units ascend, so the pages holding them do too: one cursor over this head's ascending page
    // ids finds each unit's page (hot-tier residents are simply not among them).
    const int32_t* pageAt = job.dram ? nullptr : job.fetchedIds + job.fetchedOffsets[h];
    const int32_t* const pageEnd = job.dram ? nullptr : job.fetchedIds + job.fetchedOffsets[h + 1];
    if (job.sinkEnd > 0)
      add(Span{job.sinkK.Row(0, h), job.sinkV.Row(0, h), job.sinkEnd, job.sinkK.tokenStride, job.sinkV.tokenStride}, kSink, 0);
    const Units us = unitsOf(h);
    const int64_t su = us.unit;
    const size_t want = rs.start[head] + fixedSpans + size_t(us.n);
    if (want > rs.start[head + 1])  // inline: HeadwiseSelect::Run bounds a head's ids by the room
      Throw("E_INTERNAL", job.what + ": kv head " + std::to_string(h) + " has " + std::to_string(us.n) + " units, room for " +
                              std::to_string(rs.start[head + 1] - rs.start[head] - fixedSpans));
    hot::PairState* pair = job.tier ? &job.tier->Pair(job.hotSeq, job.hotLayer, h) : nullptr;
    if (pair && pair->resident > 0) pair->Touch(size_t(us.n), hot::PairState::kRowsField);
    // dramTier: the last page looked up (consecutive units often share one) and, per source, the
    // last page counted.
    int32_t lastDram = -1;
    const uint8_t* lastDramPage = nullptr;
    size_t segAt = 0, segAhead = 0;  // segment cursors of the lookups and of the prefetches ahead
    // Counted here and stored once below: the heads' counters share a cache line, which the
    // workers would otherwise write back and forth per unit.
    int32_t counted[3] = {-1, -1, -1};
    int32_t counts[3] = {0, 0, 0};
    auto count = [&](int k, int32_t c) {
      if (job.pageCounts && counted[k] != c) {
        counted[k] = c;
        ++counts[k];
      }
    };
    for (int32_t i = 0; i < us.n; ++i) {
      if (job.dram && i + kDramLookAhead < us.n) {
        const int64_t t = std::max(int64_t(us.ids[i + kDramLookAhead]) * su, job.sinkEnd);
        const int64_t c = t < job.tailBase ? pageOf(t) : -1;
        if (c >= 0 && c < job.dram->chain.chunks()) {
          const dram::Chain::At m = job.dram->chain.Locate(job.dram->layer, job.kvHeads, int32_t(c), h, segAhead);
          if (m.inside) __builtin_prefetch(job.dram->chain.maps[size_t(m.seg)].data + m.key);
        }
      }
      const int64_t u = us.ids[i];
      const int64_t a = std::max(u * su, job.sinkEnd);
      const int64_t b = std::min((u + 1) * su, job.tailStart);
      if (b <= a) {  // clipped away entirely: an empty span keeps chunkMass aligned (mass 0)
        add(Span{job.sinkK.data, job.sinkV.data, 0, job.dim, job.dim}, kFetched, 0);
        continue;
      }
      if (a >= job.tailBase) {  // still in the open tail: read in place
        count(1, int32_t(pageOf(a)));
        add(Span{job.tailK.Row(a - job.tailBase, h), job.tailV.Row(a - job.tailBase, h), b - a, job.tailK.tokenStride,
                 job.tailV.tokenStride},
            kTail, a);
        continue;
      }
      if (b > job.tailBase)
        Throw("E_RANGE", job.what + ": selected tokens [" + std::to_string(a) + ", " + std::to_string(b) + ") of kv head " +
                             std::to_string(h) + " straddle tailBase " + std::to_string(job.tailBase) +
                             " (expected tailBase on a selection chunk boundary)");
      const int32_t c = int32_t(pageOf(a));
      const int64_t skip = a - int64_t(c) * pc;  // rows of the page before the unit's first attended row
      if (pair) {
        const int32_t slot = pair->Find(c);
        if (slot >= 0 && pair->slotRows[size_t(slot)] >= skip + (b - a)) {
          const size_t off = (size_t(slot) * job.tier->chunkElems() + size_t(skip) * size_t(job.dim)) * es;
          count(2, c);
          add(Span{pair->k + off, pair->v + off, b - a, job.dim, job.dim}, kHot, a);
          continue;
        }
      }
      if (job.dram) {
        if (c != lastDram) {
          lastDramPage = DramPage(job, h, c, segAt);
          lastDram = c;
        }
        count(0, c);
        add(PageFirstRowsSpan(lastDramPage, skip, b - a, pc, job.dim, job.dtype), kDram, a);
        continue;
      }
      while (pageAt != pageEnd && *pageAt < c) ++pageAt;
      const uint8_t* page = pageAt != pageEnd && *pageAt == c ? job.pagePtrs[size_t(pageAt - job.fetchedIds)] : nullptr;
      if (!page)
        Throw("E_RANGE", job.what + ": chunk " + std::to_string(c) + " of kv head " + std::to_string(h) +
                             " is selected but neither fetched nor resident in the hot tier (chunks of " + std::to_string(pc) +
                             " tokens)");
      add(PageFirstRowsSpan(page, skip, b - a, pc, job.dim, job.dtype), kFetched, a);
    }
    if (job.tokens > job.tailStart) {
      const int64_t at = job.tailStart - job.tailBase;
      add(Span{job.tailK.Row(at, h), job.tailV.Row(at, h), job.tokens - job.tailStart, job.tailK.tokenStride,
               job.tailV.tokenStride},
          kTail, job.tailStart);
    }
    if (job.pageCounts) std::copy(counts, counts + 3, pageCount[head].begin());
    if (n != want)
      Throw("E_INTERNAL", job.what + ": kv head " + std::to_string(h) + " listed " + std::to_string(n - rs.start[head]) + " spans, expected " +
                              std::to_string(want - rs.start[head]));
    if (inline_) rs.heads[head].nSpans = n - rs.start[head];  // every head packed, in order
  };
  // The heads attended, packed (headOf: packed index -> kv head), their spans still to be listed:
  // by the worker that attends each (AttendSplit's HeadLister), so the listing needs no pass of its
  // own on the pool.
  std::vector<size_t> headOf;
  std::vector<int64_t> maxTokens;  // per packed head: every unit whole, sinks and tail
  headOf.reserve(kvHeads);
  maxTokens.reserve(kvHeads);
  for (size_t h = 0; h < kvHeads; ++h) {
    if (!job.Active(int(h))) continue;
    const size_t s0 = rs.start[h], ns = inline_ ? 0 : rs.start[h + 1] - s0;
    rs.heads[headOf.size()] = HeadAttn{job.q + h * headOut, spans + s0, ns, job.out + h * headOut, job.lse + h * size_t(job.group),
                                       rs.mass.data() + s0};
    headOf.push_back(h);
    const int64_t unitTokens = inline_ ? job.select->MaxIdTokens() : int64_t(job.offsets[h + 1] - job.offsets[h]) * sc;
    maxTokens.push_back(fixedTokens + unitTokens);
  }
  const PackedLister<decltype(listHead)> lister(headOf, maxTokens, listHead, inline_ ? job.select.get() : nullptr);
  try {
    // Heads of at most kSinglePartTokens attended tokens are one part each: bit-identical to
    // AttendHeadsSpans at any thread count, and to attendSparse (which splits the same way). Which
    // other heads share the call never changes a head's bits (AttendSplit's grouping).
    if (job.attended) {
      // Reads still landing: each head as soon as its pages are there, in this one call.
      std::vector<uint8_t> done(headOf.size(), 0);
      AttendSplitGated(rs.heads.data(), headOf.size(), job.group, job.dim, job.dtype, job.scale, job.threads,
                       ReadGate(job, headOf), done.data(), &lister);
      std::fill(job.attended, job.attended + kvHeads, uint8_t(0));
      for (size_t i = 0; i < headOf.size(); ++i) job.attended[headOf[i]] = done[i];
    } else {
      AttendSplit(rs.heads.data(), headOf.size(), job.group, job.dim, job.dtype, job.scale, job.threads, &lister);
    }
  } catch (const NonFiniteRowError& ne) {
    const NonFiniteRowError e(headOf[ne.head], ne.span, ne.row, ne.inValue, ne.what());
    const size_t at = rs.start[e.head] + e.span;
    if (e.span >= rs.heads[ne.head].nSpans)  // no row to name: every value finite, the weighted sum overflowed f32
      Throw("E_NONFINITE", job.what + ": v: kv head " + std::to_string(e.head) + ": " + e.what());
    static const char* from[] = {"sink tensor", "fetched chunk", "tail tensor", "hot-tier slot", "DRAM-tier slot"};
    Throw("E_NONFINITE", job.what + ": " + (e.inValue ? "v" : "k") + ": kv head " + std::to_string(e.head) + ", token " +
                             std::to_string(firstToken[at] + e.row) + " (" + from[kind[at]] + "): NaN/Inf in the " +
                             (e.inValue ? "value" : "key") + " row");
  }
  if (inline_) {
    AdoptSelection(job, job.select->Join());
    job.selectMs = std::max(0.0, double(lister.LastSelected() - std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count()) / 1e6);
  }
  if (job.pageCounts) {
    std::fill(job.pageCounts, job.pageCounts + 3, 0);
    for (const auto& c : pageCount)
      for (size_t k = 0; k < 3; ++k) job.pageCounts[k] += c[k];
  }
  std::vector<int32_t> pageIds;
  std::vector<float> pageMass;
  for (int h = 0; h < job.kvHeads; ++h) {
    if (!job.Active(h) || (job.attended && !job.attended[h])) continue;
    const size_t first = job.sinkEnd > 0 ? 1 : 0;
    for (int32_t i = job.offsets[h]; i < job.offsets[h + 1]; ++i)
      job.chunkMass[i] = rs.mass[rs.start[size_t(h)] + first + size_t(i - job.offsets[h])];
    if (job.pageMass) {
      // Units and this head's page ids both ascend: one cursor. Units read from the hot tier or the
      // tail lie in no page entry and add nothing.
      const int32_t p0 = job.fetchedOffsets[h], p1 = job.fetchedOffsets[h + 1];
      std::fill(job.pageMass + p0, job.pageMass + p1, 0.f);
      int32_t k = p0;
      for (int32_t i = job.offsets[h]; i < job.offsets[h + 1] && k < p1; ++i) {
        const int32_t c = int32_t(pageOf(int64_t(job.chunkIds[i]) * job.chunkSize));
        while (k < p1 && job.fetchedIds[k] < c) ++k;
        if (k < p1 && job.fetchedIds[k] == c) job.pageMass[k] += job.chunkMass[i];
      }
    }
    if (!job.tier) continue;
    // Lookahead eviction ranks hot-tier residents by the mass they just received: per page, the
    // sum over the units selected in it.
    pageIds.clear();
    pageMass.clear();
    for (int32_t i = job.offsets[h]; i < job.offsets[h + 1]; ++i) {
      const int32_t c = int32_t(pageOf(int64_t(job.chunkIds[i]) * job.chunkSize));
      if (pageIds.empty() || pageIds.back() != c) {
        pageIds.push_back(c);
        pageMass.push_back(0.f);
      }
      pageMass.back() += job.chunkMass[i];
    }
    job.tier->RecordMass(job.hotSeq, job.hotLayer, h, pageIds.data(), pageMass.data(), int32_t(pageIds.size()));
  }
}

// Where the pages of one call are: o[bufKey] a Uint8Array or an array of at most kMaxPageBuffers of
// them; entry i of the page lists (n entries) at o[atKey][i] bytes (Float64Array) into buffer
// o[inKey][i] (Uint8Array, default 0), or — without atKey — at i * pageBytes of the single buffer.
// Every page must lie inside its buffer (checked here: native code reads them unchecked later).
PagePtrs GetPagePointers(const Napi::Object& o, const char* bufKey, const char* atKey, const char* inKey, size_t n,
                         size_t pageBytes, const std::string& what, std::vector<Napi::Object>& keep) {
  std::vector<ArrayArg<uint8_t>> bufs;
  const Napi::Value bv = o.Get(bufKey);
  if (bv.IsArray()) {
    const Napi::Array arr = bv.As<Napi::Array>();
    if (arr.Length() < 1 || arr.Length() > kMaxPageBuffers)
      Throw("E_SHAPE", what + "." + bufKey + ": expected 1 to " + std::to_string(kMaxPageBuffers) + " Uint8Arrays, got " +
                           std::to_string(arr.Length()));
    for (uint32_t j = 0; j < arr.Length(); ++j)
      bufs.push_back(GetArray<uint8_t>(arr.Get(j), napi_uint8_array, what + "." + bufKey + "[" + std::to_string(j) + "]"));
  } else {
    bufs.push_back(GetArray<uint8_t>(bv, napi_uint8_array, what + "." + bufKey));
  }
  for (const auto& b : bufs) keep.push_back(b.object);
  PagePtrs ptrs(new const uint8_t*[n]);  // every entry is written below
  if (o.Get(atKey).IsUndefined()) {
    if (!o.Get(inKey).IsUndefined()) Throw("E_CONFIG", what + "." + inKey + ": expected it only with " + atKey);
    const uint64_t need = CheckedMul(n, pageBytes, what + "." + bufKey + " size");
    if (bufs[0].length < need)
      Throw("E_SHAPE", what + "." + bufKey + ": expected at least " + std::to_string(need) + " bytes (" + std::to_string(n) +
                           " page-first chunks), got " + std::to_string(bufs[0].length));
    for (size_t i = 0; i < n; ++i) ptrs[i] = bufs[0].data + i * pageBytes;
    return ptrs;
  }
  auto at = GetArray<double>(o.Get(atKey), napi_float64_array, what + "." + atKey);
  ExpectLength(at.length, n, what + "." + atKey + " (one per page entry)");
  keep.push_back(at.object);
  ArrayArg<uint8_t> in;
  const bool hasIn = !o.Get(inKey).IsUndefined();
  if (hasIn) {
    in = GetArray<uint8_t>(o.Get(inKey), napi_uint8_array, what + "." + inKey);
    ExpectLength(in.length, n, what + "." + inKey + " (one per page entry)");
    keep.push_back(in.object);
  }
  for (size_t i = 0; i < n; ++i) {
    const size_t b = hasIn ? in.data[i] : 0;
    if (b >= bufs.size())
      Throw("E_RANGE", what + "." + inKey + "[" + std::to_string(i) + "]: expected a buffer index in [0, " +
                           std::to_string(bufs.size()) + "), got " + std::to_string(b));
    const double d = at.data[i];
    if (!IsIntIn(d, 0, int64_t(1) << 53) || uint64_t(d) > bufs[b].length || pageBytes > bufs[b].length - uint64_t(d))
      Throw("E_RANGE", what + "." + atKey + "[" + std::to_string(i) + "]: expected an integer byte offset with offset + " +
                           std::to_string(pageBytes) + " <= " + std::to_string(bufs[b].length) + " (buffer " + std::to_string(b) +
                           "), got " + Num(d));
    ptrs[i] = bufs[b].data + size_t(d);
  }
  return ptrs;
}

// The hot tier, sequence and layer named by `hot: { handle, sequence?, layer }`, checked against
// the attention's shape.
void GetHot(const Napi::Object& o, const std::string& what, int kvHeads, int dim, Dtype dt, int64_t chunkSize,
            std::shared_ptr<hot::Tier>& tier, int& seq, int& layer) {
  Napi::Value hv = o.Get("hot");
  if (hv.IsUndefined()) return;
  if (!hv.IsObject()) Throw("E_TYPE", what + ".hot: expected { handle, sequence?, layer }");
  Napi::Object h = hv.As<Napi::Object>();
  tier = hot::Acquire(int32_t(GetInt(h, "handle", what + ".hot", 0, int64_t(1) << 30)));
  const hot::TierConfig& c = tier->config();
  if (c.kvHeads != kvHeads || c.dim != dim || c.dtype != dt || c.chunkSize != chunkSize)
    Throw("E_SHAPE", what + ".hot: expected a hot tier of " + std::to_string(kvHeads) + " kv heads x " + std::to_string(dim) +
                         " " + DtypeName(dt) + ", chunk " + std::to_string(chunkSize) + ", got " + std::to_string(c.kvHeads) +
                         " x " + std::to_string(c.dim) + " " + DtypeName(c.dtype) + ", chunk " + std::to_string(c.chunkSize));
  seq = int(GetIntOr(h, "sequence", what + ".hot", 0, c.sequences - 1, 0));
  layer = int(GetInt(h, "layer", what + ".hot", 0, c.layers - 1));
}

// o.dramTier = { segStart, maps, layer, arenas, slotsPerBlock }: a DRAM tier's chain and
// arena blocks (src/storage/tiered-kv.ts residentPages), pages of `pageBytes`. The arrays are kept
// alive for an asynchronous call; each slot is checked against the arenas when it is looked up.
std::unique_ptr<FetchedJob::DramPages> GetDramPages(const Napi::Value& v, size_t pageBytes, const std::string& what,
                                                    std::vector<Napi::Object>& keep) {
  if (!v.IsObject()) Throw("E_TYPE", what + ": expected { segStart, maps, layer, arenas, slotsPerBlock }");
  const Napi::Object o = v.As<Napi::Object>();
  auto d = std::make_unique<FetchedJob::DramPages>();
  d->chain = dram::GetChain(o, true, what);
  keep.push_back(d->chain.segStart.object);
  for (const auto& m : d->chain.maps) keep.push_back(m.object);
  d->layer = GetInt(o, "layer", what, 0, 65535);  // keeps (layer * kvHeads + h) * chunks in 63 bits
  d->perBlock = uint32_t(GetInt(o, "slotsPerBlock", what, 1, INT32_MAX));
  d->pageBytes = pageBytes;
  const Napi::Value av = o.Get("arenas");
  if (!av.IsArray()) Throw("E_TYPE", what + ".arenas: expected an Array of the tier's arena blocks (Uint8Arrays)");
  const Napi::Array arr = av.As<Napi::Array>();
  if (arr.Length() < 1 || arr.Length() > kMaxPageBuffers)
    Throw("E_SHAPE", what + ".arenas: expected 1 to " + std::to_string(kMaxPageBuffers) + " arena blocks, got " + std::to_string(arr.Length()));
  for (uint32_t j = 0; j < arr.Length(); ++j) {
    auto a = GetArray<uint8_t>(arr.Get(j), napi_uint8_array, what + ".arenas[" + std::to_string(j) + "]");
    keep.push_back(a.object);
    d->arenas.push_back(a.data);
    d->arenaBytes.push_back(a.length);
  }
  return d;
}

// The optional kv-head mask o.heads: a Uint8Array of one 0 (skip) / 1 (process) per kv head,
// copied (an asynchronous call must not see later writes); empty when absent (every head).
std::vector<uint8_t> GetHeadMask(const Napi::Object& o, const std::string& what, int kvHeads) {
  std::vector<uint8_t> mask;
  const Napi::Value v = o.Get("heads");
  if (v.IsUndefined()) return mask;
  const auto a = GetArray<uint8_t>(v, napi_uint8_array, what + ".heads");
  ExpectLength(a.length, size_t(kvHeads), what + ".heads (one per kv head)");
  mask.assign(a.data, a.data + a.length);
  for (size_t h = 0; h < mask.size(); ++h)
    if (mask[h] > 1)
      Throw("E_RANGE", what + ".heads[" + std::to_string(h) + "]: expected 0 (skip the kv head) or 1 (process it), got " +
                           std::to_string(mask[h]));
  return mask;
}

void CheckPair(const KvView& k, const KvView& v, const std::string& what) {
  if (v.tokens != k.tokens || v.heads != k.heads || v.dim != k.dim || v.dtype != k.dtype)
    Throw("E_SHAPE", what + ".v: expected the shape and dtype of " + what + ".k (" + std::to_string(k.tokens) + " x " +
                         std::to_string(k.heads) + " x " + std::to_string(k.dim) + " " + DtypeName(k.dtype) + "), got " +
                         std::to_string(v.tokens) + " x " + std::to_string(v.heads) + " x " + std::to_string(v.dim) +
                         " " + DtypeName(v.dtype));
}

// `async`: for attendFetchedAsync (no select: it holds the index's lock on the calling thread).
FetchedJob Prepare(const Napi::CallbackInfo& info, const std::string& what, bool async, std::vector<Napi::Object>& keep,
                   Napi::Object& result) {
  Napi::Env env = info.Env();
  Napi::Object o = GetOptionsArg(info, 0, what, "{ q, qHeads, sink, tail, tailBase, selection, fetched }");
  FetchedJob job;
  job.what = what;
  for (const char* part : {"sink", "tail"}) {
    Napi::Value pv = o.Get(part);
    if (!pv.IsObject()) Throw("E_TYPE", what + "." + part + ": expected { k, v } KV tensors");
    Napi::Object p = pv.As<Napi::Object>();
    KvView k = GetKvView(p.Get("k"), what + "." + part + ".k");
    KvView v = GetKvView(p.Get("v"), what + "." + part + ".v");
    CheckPair(k, v, what + "." + part);
    if (k.tokenStride != int64_t(k.heads) * k.dim || v.tokenStride != int64_t(v.heads) * v.dim)
      Throw("E_CONFIG", what + "." + part + ": expected token-major ('thd') tensors, got layout 'htd'");
    keep.push_back(k.array);
    keep.push_back(v.array);
    if (std::string(part) == "sink") job.sinkK = k, job.sinkV = v;
    else job.tailK = k, job.tailV = v;
  }
  if (job.tailK.heads != job.sinkK.heads || job.tailK.dim != job.sinkK.dim || job.tailK.dtype != job.sinkK.dtype)
    Throw("E_SHAPE", what + ".tail: expected the heads, dim and dtype of sink (" + std::to_string(job.sinkK.heads) + " x " +
                         std::to_string(job.sinkK.dim) + " " + DtypeName(job.sinkK.dtype) + "), got " +
                         std::to_string(job.tailK.heads) + " x " + std::to_string(job.tailK.dim) + " " +
                         DtypeName(job.tailK.dtype));
  job.kvHeads = job.sinkK.heads;
  job.dim = job.sinkK.dim;
  job.dtype = job.sinkK.dtype;
  ReadQueryArgs(o, job, what, keep);
  job.tailBase = GetInt(o, "tailBase", what, 0, kMaxTokens);

  const Napi::Value selv = o.Get("select");
  if (!selv.IsUndefined()) {
    // The selection is made here (FetchedJob::select): its bounds are the index's, checked against
    // the rows this call can read as a given selection's are.
    const std::string sw = what + ".select";
    if (async)
      Throw("E_CONFIG", sw + ": expected a selection (select is for attendFetched: it holds the index's lock on the calling thread)");
    if (!o.Get("selection").IsUndefined()) Throw("E_CONFIG", what + ": expected a selection or a select, got both");
    if (!selv.IsObject()) Throw("E_TYPE", sw + ": expected { handle, budget } (a selection index's handle, tokens per kv head)");
    const Napi::Object so = selv.As<Napi::Object>();
    job.select = std::make_unique<HeadwiseSelect>(GetInt(so, "handle", sw, 0, INT32_MAX), job.q, job.qHeads,
                                                  GetInt(so, "budget", sw, 1, kMaxTokens), sw);
    job.selectMass = GetBoolOr(so, "chunkMass", sw, false);
    const LayerIndex& ix = job.select->index();
    if (ix.heads() != job.kvHeads || ix.dim() != job.dim)
      Throw("E_SHAPE", sw + ".handle: expected an index of " + std::to_string(job.kvHeads) + " kv heads x dim " + std::to_string(job.dim) +
                           " (as sink and tail), got " + std::to_string(ix.heads()) + " x " + std::to_string(ix.dim()));
    job.tokens = ix.tokens();
    job.sinkEnd = ix.sinkEnd();
    job.tailStart = ix.tailStart();
    job.chunkSize = ix.config().chunk;  // ids of a head are of this or of 1 token (a multiple of 1 either way)
    if (job.tokens > job.tailBase + job.tailK.tokens || job.sinkEnd > job.sinkK.tokens || job.tailStart < job.tailBase)
      Throw("E_RANGE", sw + ": expected the index's context (tokens " + std::to_string(job.tokens) + ", sinks to " + std::to_string(job.sinkEnd) +
                           ", tail from " + std::to_string(job.tailStart) + ") within the rows given (sinks " + std::to_string(job.sinkK.tokens) +
                           ", tail [" + std::to_string(job.tailBase) + ", " + std::to_string(job.tailBase + job.tailK.tokens) + "))");
    for (const char* key : {"heads", "hot", "into", "landing", "fetchedMass"})
      if (!o.Get(key).IsUndefined()) Throw("E_CONFIG", what + "." + key + ": expected none with select (it reads a DRAM tier that holds every chunk)");
    if (o.Get("dramTier").IsUndefined()) Throw("E_CONFIG", what + ".dramTier: expected it with select (the pages the selection names)");
  } else {
    SelectionRules rules;
    rules.kvHeads = job.kvHeads;
    rules.maxTokens = job.tailBase + job.tailK.tokens;
    rules.maxSinkEnd = job.sinkK.tokens;
    rules.minTailStart = job.tailBase;
    rules.chunksBeforeTail = true;
    SetSelection(job, GetSelectionArg(o.Get("selection"), rules, what + ".selection"), keep);
  }
  job.pageChunk = GetIntOr(o, "pageChunkSize", what, 1, kMaxChunkSize, job.chunkSize);
  if (job.pageChunk % job.chunkSize != 0)
    Throw("E_CONFIG", what + ".pageChunkSize: expected a multiple of selection.chunkSize " + std::to_string(job.chunkSize) +
                          ", got " + std::to_string(job.pageChunk));

  const size_t pageBytes = PageFirstChunkBytes(int(job.pageChunk), job.dim, job.dtype);
  const bool direct = !o.Get("dramTier").IsUndefined();
  if (direct) {
    for (const char* key : {"fetched", "fetchedOffsets", "fetchedIds", "fetchedAt", "fetchedIn", "fetchedMass", "landing", "landingTimeoutMs"})
      if (!o.Get(key).IsUndefined())
        Throw("E_CONFIG", what + "." + key + ": expected no page lists or reads with dramTier (its pages are read from the tier's arena), got both");
    job.dram = GetDramPages(o.Get("dramTier"), pageBytes, what + ".dramTier", keep);
  }
  ArrayArg<int32_t> fOff, fIds;
  size_t nPages = job.nChunks;
  if (direct) {
    nPages = 0;
  } else if (!o.Get("fetchedOffsets").IsUndefined()) {
    GetChunkLists(o, "fetchedOffsets", "fetchedIds", job.kvHeads, INT32_MAX, what, "", fOff, fIds);
    job.fetchedOffsets = fOff.data;
    job.fetchedIds = fIds.data;
    keep.push_back(fOff.object);
    keep.push_back(fIds.object);
    nPages = fIds.length;
  } else if (job.pageChunk == job.chunkSize) {
    job.fetchedOffsets = job.offsets;
    job.fetchedIds = job.chunkIds;
  } else {
    Throw("E_CONFIG", what + ".fetchedOffsets: expected the page lists (fetchedOffsets, fetchedIds) when pageChunkSize " +
                          std::to_string(job.pageChunk) + " differs from selection.chunkSize " + std::to_string(job.chunkSize));
  }
  if (!direct) job.pagePtrs = GetPagePointers(o, "fetched", "fetchedAt", "fetchedIn", nPages, pageBytes, what, keep);
  GetHot(o, what, job.kvHeads, job.dim, job.dtype, job.pageChunk, job.tier, job.hotSeq, job.hotLayer);

  job.heads = GetHeadMask(o, what, job.kvHeads);
  if (!o.Get("fetchedMass").IsUndefined()) {
    auto pm = GetF32(o.Get("fetchedMass"), what + ".fetchedMass");
    ExpectLength(pm.length, nPages, what + ".fetchedMass (one per page entry)");
    keep.push_back(pm.object);
    job.pageMass = pm.data;
  }

  const Napi::Value lv = o.Get("landing");
  const bool landing = !lv.IsUndefined();
  if (landing) {
    if (!lv.IsArray())
      Throw("E_TYPE", what + ".landing: expected an array of { done: Int32Array, itemHead: Int32Array } (one per read in flight)");
    const Napi::Array reads = lv.As<Napi::Array>();
    if (reads.Length() > kMaxLandingReads)
      Throw("E_SHAPE", what + ".landing: expected at most " + std::to_string(kMaxLandingReads) + " reads, got " +
                           std::to_string(reads.Length()));
    job.landingOf.resize(size_t(job.kvHeads));
    for (uint32_t j = 0; j < reads.Length(); ++j) {
      const std::string at = what + ".landing[" + std::to_string(j) + "]";
      const Napi::Value rv = reads.Get(j);
      if (!rv.IsObject()) Throw("E_TYPE", at + ": expected { done: Int32Array, itemHead: Int32Array }");
      const Napi::Object r = rv.As<Napi::Object>();
      auto done = GetI32(r.Get("done"), at + ".done");
      auto itemHead = GetI32(r.Get("itemHead"), at + ".itemHead");
      if (done.length < 1 + itemHead.length)
        Throw("E_SHAPE", at + ".done: expected at least 1 + " + std::to_string(itemHead.length) +
                             " elements (the end flag, then one per item of itemHead), got " + std::to_string(done.length));
      for (size_t i = 0; i < itemHead.length; ++i) {
        const int32_t h = itemHead.data[i];
        if (h < 0 || h >= job.kvHeads)
          Throw("E_RANGE", at + ".itemHead[" + std::to_string(i) + "]: expected a kv head in [0, " + std::to_string(job.kvHeads) +
                               "), got " + std::to_string(h));
        job.landingOf[size_t(h)].push_back({j, done.data + 1 + i});
      }
      job.landingEnd.push_back(done.data);
      keep.push_back(done.object);
      keep.push_back(itemHead.object);
    }
    job.landingTimeout = std::chrono::milliseconds(GetIntOr(o, "landingTimeoutMs", what, 0, int64_t(1) << 31, 30000));
  } else if (!o.Get("landingTimeoutMs").IsUndefined()) {
    Throw("E_CONFIG", what + ".landingTimeoutMs: expected it only with landing");
  }

  result = Napi::Object::New(env);
  if (direct) {
    Napi::Int32Array counts = Napi::Int32Array::New(env, 3);
    job.pageCounts = counts.Data();
    result.Set("pageCounts", counts);
  }
  if (landing) {
    Napi::Uint8Array attended = Napi::Uint8Array::New(env, size_t(job.kvHeads));
    job.attended = attended.Data();
    result.Set("attended", attended);
  }
  const Napi::Value iv = o.Get("into");
  if (iv.IsUndefined()) {
    auto out = NewF32(env, uint64_t(job.qHeads) * uint64_t(job.dim), what + ".out");
    auto lse = NewF32(env, uint64_t(job.qHeads), what + ".lse");
    job.out = out.Data();
    job.lse = lse.Data();
    result.Set("out", out);
    result.Set("lse", lse);
    if (!job.select) {  // else sized once selected (SetSelected)
      auto mass = NewF32(env, job.nChunks, what + ".chunkMass");
      job.chunkMass = mass.Data();
      result.Set("chunkMass", mass);
    }
  } else {
    // The caller's result arrays (e.g. filled by two calls over complementary head masks).
    if (!iv.IsObject()) Throw("E_TYPE", what + ".into: expected { out, lse, chunkMass } Float32Arrays");
    const Napi::Object into = iv.As<Napi::Object>();
    auto out = GetF32(into.Get("out"), what + ".into.out");
    auto lse = GetF32(into.Get("lse"), what + ".into.lse");
    auto mass = GetF32(into.Get("chunkMass"), what + ".into.chunkMass");
    ExpectLength(out.length, size_t(job.qHeads) * size_t(job.dim), what + ".into.out (qHeads x dim)");
    ExpectLength(lse.length, size_t(job.qHeads), what + ".into.lse (qHeads)");
    ExpectLength(mass.length, job.nChunks, what + ".into.chunkMass (one per selection entry)");
    job.out = out.data;
    job.lse = lse.data;
    job.chunkMass = mass.data;
    result.Set("out", out.object);
    result.Set("lse", lse.object);
    result.Set("chunkMass", mass.object);
  }
  keep.push_back(result);
  return job;
}

// With select: the selection made (and, if asked for, its attention mass) on the result.
void SetSelected(Napi::Env env, Napi::Object& result, const FetchedJob& job) {
  if (job.selectMass) result.Set("chunkMass", ToJs(env, job.mass));
  result.Set("selection", SelectionToJs(env, job.joined, job.select->index()));
  result.Set("bytesScored", Napi::Number::New(env, double(job.joined.bytesScored)));
  result.Set("selectMs", Napi::Number::New(env, job.selectMs));
}

Napi::Value AttendFetched(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    std::vector<Napi::Object> keep;
    Napi::Object result;
    FetchedJob job = Prepare(info, "attendFetched", false, keep, result);
    Run(job);
    if (job.select) SetSelected(info.Env(), result, job);
    return result;
  });
}

// Validation errors reject the promise (an async API never throws synchronously).
Napi::Value AttendFetchedAsync(const Napi::CallbackInfo& info) {
  return GuardPromise(info.Env(), "attendFetchedAsync", [&]() -> Napi::Value {
    std::vector<Napi::Object> keep;
    Napi::Object result;
    // Shared, not copied: the work function is copyable and the job owns its page pointers.
    auto job = std::make_shared<FetchedJob>(Prepare(info, "attendFetchedAsync", true, keep, result));
    auto ref = std::make_shared<Napi::ObjectReference>(Napi::Persistent(result));
    return PromiseWorker::Start(
        info.Env(), [job]() { Run(*job); }, [ref](Napi::Env) -> Napi::Value { return ref->Value(); }, keep);
  });
}

// The page source of a hot-tier admission (hotTierAdmitPages, hotTierLandPages): the page-first
// chunks of o.pages / pageOffsets / pageIds / pageAt / pageIn (rows of tokens [0, tokens)) and,
// optionally, the open tail's rows (o.tail, tokens [tailBase, tokens)) for chunks no page holds.
// `landing` (optional, o.pageLanding): one flag per page entry, 1 = still being read.
struct PageSource {
  ArrayArg<int32_t> pOff, pIds;
  PagePtrs ptrs;
  ArrayArg<uint8_t> landing;
  hot::PagedChunks paged;
  KvView tailK, tailV;
  hot::Source src{nullptr, nullptr, nullptr, 0};
};

void GetPageSource(const Napi::Object& o, const std::string& what, const hot::TierConfig& c, int64_t tokens,
                   std::vector<Napi::Object>& keep, PageSource& ps) {
  GetChunkLists(o, "pageOffsets", "pageIds", c.kvHeads, INT32_MAX, what, "", ps.pOff, ps.pIds);
  ps.ptrs = GetPagePointers(o, "pages", "pageAt", "pageIn", ps.pIds.length, PageFirstChunkBytes(c.chunkSize, c.dim, c.dtype), what, keep);
  ps.paged = hot::PagedChunks{ps.pOff.data, ps.pIds.data, ps.ptrs.get()};
  if (!o.Get("pageLanding").IsUndefined()) {
    ps.landing = GetArray<uint8_t>(o.Get("pageLanding"), napi_uint8_array, what + ".pageLanding");
    ExpectLength(ps.landing.length, ps.pIds.length, what + ".pageLanding (one flag per page entry)");
    ps.paged.landing = ps.landing.data;
  }
  ps.src = hot::Source{nullptr, nullptr, &ps.paged, tokens};
  // Optional: chunks no page holds that lie wholly at or after tailBase are copied from the open
  // tail's token rows (tail: { k, v } holding tokens [tailBase, tokens)).
  if (!o.Get("tail").IsUndefined()) {
    if (!o.Get("tail").IsObject()) Throw("E_TYPE", what + ".tail: expected { k, v } KV tensors");
    Napi::Object t = o.Get("tail").As<Napi::Object>();
    ps.tailK = GetKvView(t.Get("k"), what + ".tail.k");
    ps.tailV = GetKvView(t.Get("v"), what + ".tail.v");
    CheckPair(ps.tailK, ps.tailV, what + ".tail");
    if (ps.tailK.heads != c.kvHeads || ps.tailK.dim != c.dim || ps.tailK.dtype != c.dtype)
      Throw("E_SHAPE", what + ".tail: expected " + std::to_string(c.kvHeads) + " kv heads x " + std::to_string(c.dim) + " " +
                           DtypeName(c.dtype) + ", got " + std::to_string(ps.tailK.heads) + " x " + std::to_string(ps.tailK.dim) + " " +
                           DtypeName(ps.tailK.dtype));
    ps.src.kBase = GetInt(o, "tailBase", what, 0, tokens);
    if (ps.src.kBase + ps.tailK.tokens < tokens)
      Throw("E_SHAPE", what + ".tail: expected rows of tokens [" + std::to_string(ps.src.kBase) + ", " + std::to_string(tokens) +
                           "), got " + std::to_string(ps.tailK.tokens) + " tokens");
    ps.src.k = &ps.tailK;
    ps.src.v = &ps.tailV;
  }
}

// hotTierAdmitPages({ hot: { handle, sequence?, layer }, selection, tokens, pages, pageOffsets,
// pageIds, pageAt?, pageIn?, tail?, tailBase?, heads? }): the hot tier's F stage for one layer with the misses' rows taken from page-first
// chunks staged by the storage tiers (pages hold at least every selected chunk not resident; rows
// exist for tokens [0, tokens)), for the kv heads of the `heads` mask (default every head; each
// kv head's residents are its own, so heads admitted in separate calls end as in one). Hits are marked used, residents evicted (lookahead: by attention
// mass, the selection's pool protected), misses admitted. Returns the step's counters summed over
// kv heads.
Napi::Value HotTierAdmitPages(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "hotTierAdmitPages";
    Napi::Object o = GetOptionsArg(info, 0, what);
    std::shared_ptr<hot::Tier> tier;
    int seq = 0, layer = 0;
    Napi::Value hv = o.Get("hot");
    if (!hv.IsObject()) Throw("E_TYPE", what + ".hot: expected { handle, sequence?, layer }");
    tier = hot::Acquire(int32_t(GetInt(hv.As<Napi::Object>(), "handle", what + ".hot", 0, int64_t(1) << 30)));
    const hot::TierConfig& c = tier->config();
    GetHot(o, what, c.kvHeads, c.dim, c.dtype, c.chunkSize, tier, seq, layer);
    const int64_t tokens = GetInt(o, "tokens", what, 0, kMaxTokens);
    const std::string sw = what + ".selection";
    SelectionRules rules;
    rules.kvHeads = c.kvHeads;
    rules.chunkSize = c.chunkSize;
    rules.chunksBeforeTail = true;
    rules.pool = true;
    const SelectionArg sel = GetSelectionArg(o.Get("selection"), rules, sw);
    const int64_t tailStart = sel.tailStart;
    if (tailStart > tokens)
      Throw("E_RANGE", sw + ".tailStart: expected at most tokens " + std::to_string(tokens) + " (the rows the pages hold), got " +
                           std::to_string(tailStart));
    const ArrayArg<int32_t>& off = sel.offsets;
    const ArrayArg<int32_t>& ids = sel.chunkIds;
    std::vector<Napi::Object> keep;
    PageSource ps;
    GetPageSource(o, what, c, tokens, keep, ps);
    const bool deferLanding = ps.paged.landing != nullptr;
    const std::vector<uint8_t> heads = GetHeadMask(o, what, c.kvHeads);
    hot::Tier::LayerLock lock(*tier, seq, layer);
    // Kv heads admit on the addon's pool: each head's residents, slots and arena are its own, and
    // the copies of its misses (scattered pages, ~1 KiB blocks) were a single thread's memory
    // latency. Counters are summed in head order; an error is the lowest failing head's.
    std::vector<int> active;
    for (int h = 0; h < c.kvHeads; ++h)
      if (heads.empty() || heads[size_t(h)]) active.push_back(h);
    std::vector<hot::Counters> perHead(active.size());
    std::vector<std::vector<int32_t>> landing(deferLanding ? active.size() : 0);
    ThreadPool::Global().ParallelFor(active.size(), [&](size_t i) {
      const int h = active[i];
      hot::HeadSelection hs;
      hs.ids = ids.data + off.data[h];
      hs.n = off.data[h + 1] - off.data[h];
      if (sel.hasPool) {
        const int32_t* po = sel.poolOffsets.data;
        hs.poolIds = sel.poolIds.data + po[h];
        hs.poolScores = sel.poolScores.data + po[h];
        hs.poolN = po[h + 1] - po[h];
      }
      perHead[i] = tier->Fetch(seq, layer, h, hs, tailStart, ps.src, deferLanding ? &landing[i] : nullptr);
    });
    hot::Counters total;
    for (const hot::Counters& ch : perHead) total.Add(ch);
    Napi::Env env = info.Env();
    Napi::Object r = Napi::Object::New(env);
    r.Set("hits", double(total.hits));
    r.Set("misses", double(total.misses));
    r.Set("admitted", double(total.admitted));
    r.Set("streamed", double(total.streamed));
    r.Set("evictions", double(total.evictions));
    r.Set("bytesAdmitted", double(total.bytesAdmitted));
    if (deferLanding) {
      // The copies left for hotTierLandPages: (kv head, slot, chunk, from row) quads, heads in order.
      size_t quads = 0;
      for (const auto& l : landing) quads += l.size() / 3;
      Napi::Int32Array out = Napi::Int32Array::New(env, 4 * quads);
      size_t k = 0;
      for (size_t i = 0; i < active.size(); ++i)
        for (size_t t = 0; t + 2 < landing[i].size(); t += 3) {
          out[k++] = active[i];
          out[k++] = landing[i][t];
          out[k++] = landing[i][t + 1];
          out[k++] = landing[i][t + 2];
        }
      r.Set("landing", out);
    }
    return r;
  });
}

// hotTierLandPages({ hot, tokens, pages, pageOffsets, pageIds, pageAt?, pageIn?, tail?, tailBase?,
// landing: Int32Array, drop? }): the copies a hotTierAdmitPages with pageLanding left (its result's
// `landing` quads: kv head, slot, chunk, from row), made now that their pages have landed (the same
// page lists, whose bytes are now all there), or with drop: true the slots freed instead (the reads
// failed). Kv heads on the addon's pool. Returns { bytes } copied.
Napi::Value HotTierLandPages(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "hotTierLandPages";
    Napi::Object o = GetOptionsArg(info, 0, what);
    Napi::Value hv = o.Get("hot");
    if (!hv.IsObject()) Throw("E_TYPE", what + ".hot: expected { handle, sequence?, layer }");
    std::shared_ptr<hot::Tier> tier = hot::Acquire(int32_t(GetInt(hv.As<Napi::Object>(), "handle", what + ".hot", 0, int64_t(1) << 30)));
    const hot::TierConfig& c = tier->config();
    int seq = 0, layer = 0;
    GetHot(o, what, c.kvHeads, c.dim, c.dtype, c.chunkSize, tier, seq, layer);
    const int64_t tokens = GetInt(o, "tokens", what, 0, kMaxTokens);
    std::vector<Napi::Object> keep;
    PageSource ps;
    GetPageSource(o, what, c, tokens, keep, ps);
    ps.paged.landing = nullptr;  // every page has landed now
    auto quads = GetI32(o.Get("landing"), what + ".landing");
    if (quads.length % 4 != 0) Throw("E_SHAPE", what + ".landing: expected (kv head, slot, chunk, from) quads, got " + std::to_string(quads.length) + " numbers");
    const bool drop = !o.Get("drop").IsUndefined() && o.Get("drop").ToBoolean().Value();
    // Per kv head, its triples (heads ascend in a hotTierAdmitPages result; any order is accepted).
    std::vector<std::vector<int32_t>> perHead(size_t(c.kvHeads));
    for (size_t q = 0; q < quads.length / 4; ++q) {
      const int32_t h = quads.data[4 * q];
      if (h < 0 || h >= c.kvHeads)
        Throw("E_RANGE", what + ".landing[" + std::to_string(4 * q) + "]: expected a kv head in [0, " + std::to_string(c.kvHeads) + "), got " + std::to_string(h));
      perHead[size_t(h)].insert(perHead[size_t(h)].end(), {quads.data[4 * q + 1], quads.data[4 * q + 2], quads.data[4 * q + 3]});
    }
    hot::Tier::LayerLock lock(*tier, seq, layer);
    std::vector<int64_t> bytes(size_t(c.kvHeads), 0);
    ThreadPool::Global().ParallelFor(size_t(c.kvHeads), [&](size_t h) {
      if (!perHead[h].empty()) bytes[h] = tier->Land(seq, layer, int(h), perHead[h].data(), perHead[h].size() / 3, ps.src, drop);
    });
    int64_t total = 0;
    for (int64_t b : bytes) total += b;
    return NumbersObject(info.Env(), {{"bytes", double(total)}});
  });
}

void InitTieredAttention(Napi::Env env, Napi::Object exports) {
  exports.Set("hotTierAdmitPages", Napi::Function::New(env, HotTierAdmitPages, "hotTierAdmitPages"));
  exports.Set("hotTierLandPages", Napi::Function::New(env, HotTierLandPages, "hotTierLandPages"));
  exports.Set("attendFetched", Napi::Function::New(env, AttendFetched, "attendFetched"));
  exports.Set("attendFetchedAsync", Napi::Function::New(env, AttendFetchedAsync, "attendFetchedAsync"));
}

}  // namespace

KVD_REGISTER_MODULE(InitTieredAttention);

}  // namespace kvd
