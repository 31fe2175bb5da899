// AttendSplit (attention_split.h): cut every head into parts, attend (part, block of heads) work
// items on the pool, merge each head's parts in order on the calling thread.
#include "attention/attention_split.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "common/thread_pool.h"

namespace kvd {
namespace {

// One part of one head: its spans (pieces of the head's spans) and where each piece came from.
// A head that is a single part uses its own span list in place (`whole`: piece i is span i).
struct Part {
  std::vector<Span> spans;
  std::vector<size_t> origSpan;  // index in the head's span list
  std::vector<int64_t> rowOff;   // first row of the piece within that span
  const Span* whole = nullptr;
  size_t wholeN = 0;

  const Span* data() const { return whole ? whole : spans.data(); }
  size_t size() const { return whole ? wholeN : spans.size(); }
  size_t Orig(size_t i) const { return whole ? i : origSpan[i]; }
  int64_t RowOff(size_t i) const { return whole ? 0 : rowOff[i]; }
};

// One part for a head of at most kSinglePartTokens tokens; else the head's spans cut at positions
// kPartTokens * p of its concatenated sequence (at least one part, possibly empty).
std::vector<Part> CutParts(const HeadAttn& head, size_t esz) {
  int64_t total = 0;
  for (size_t s = 0; s < head.nSpans; ++s) total += std::max<int64_t>(0, head.spans[s].len);
  std::vector<Part> parts(1);
  if (total <= kSinglePartTokens) {
    parts[0].whole = head.spans;
    parts[0].wholeN = head.nSpans;
    return parts;
  }
  int64_t room = kPartTokens;
  for (size_t s = 0; s < head.nSpans; ++s) {
    const Span& sp = head.spans[s];
    int64_t row = 0;
    if (sp.len <= 0) {  // kept, so every original span has a piece (its mass slot) in some part
      parts.back().spans.push_back(sp);
      parts.back().origSpan.push_back(s);
      parts.back().rowOff.push_back(0);
      continue;
    }
    while (row < sp.len) {
      if (room == 0) {
        parts.emplace_back();
        room = kPartTokens;
      }
      const int64_t n = std::min(room, sp.len - row);
      const uint8_t* k = static_cast<const uint8_t*>(sp.k) + row * sp.kStride * int64_t(esz);
      const uint8_t* v = static_cast<const uint8_t*>(sp.v) + row * sp.vStride * int64_t(esz);
      Part& p = parts.back();
      p.spans.push_back(Span{k, v, n, sp.kStride, sp.vStride});
      p.origSpan.push_back(s);
      p.rowOff.push_back(row);
      row += n;
      room -= n;
    }
  }
  return parts;
}

// Partial results of one (head, part).
struct PartOut {
  std::vector<float> out, lse, mass, massByQuery;
  bool failed = false;
  size_t span = 0;  // original span index / row of the failure
  int64_t row = 0;
  bool inValue = false;
  std::string msg;
};

// A spin-wait hint (x86 `pause`: the sibling hyperthread gets the core meanwhile).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

AttnScratch& ThreadScratch() {
  thread_local AttnScratch s;
  return s;
}

// How long a gated worker sleeps when no unclaimed head is ready: a sleep, not a spin, so that on
// a host with as many cores as workers the thread landing the reads gets a core.
constexpr auto kGateSleep = std::chrono::microseconds(20);

// AttendSplit and AttendSplitGated (gate and attended null for the former).
void Split(const HeadAttn* heads, size_t nHeads, int group, int dim, Dtype dt, float scale, int threads, const HeadGate* gate,
           uint8_t* attended, const HeadLister* lister) {
  if (nHeads == 0) return;
  const size_t esz = DtypeSize(dt);
  const size_t headOut = size_t(group) * size_t(dim);
  const int workers = std::max(1, std::min(threads, ThreadPool::Global().Size()));
  // With a lister: heads listed by the worker attending them (deferred, one part each whatever
  // they list), and the others listed now, since cutting a head needs its spans.
  std::vector<uint8_t> deferred(nHeads, 0);
  const size_t producers = lister ? lister->Producers() : 0;
  if (lister) {
    std::vector<size_t> now;
    for (size_t h = 0; h < nHeads; ++h) {
      if (lister->MaxTokens(h) <= kSinglePartTokens) deferred[h] = 1;
      else now.push_back(h);
    }
    if (producers > 0 && !now.empty())
      Throw("E_INTERNAL", "attention: head " + std::to_string(now[0]) + " may hold " + std::to_string(lister->MaxTokens(now[0])) +
                              " tokens, expected at most " + std::to_string(kSinglePartTokens) + " with producer tasks (its spans are listed in one part)");
    if (!now.empty()) ThreadPool::Global().ParallelFor(now.size(), [&](size_t i) { lister->List(now[i]); }, workers);
  }
  std::vector<std::vector<Part>> parts(nHeads);
  size_t maxParts = 1;
  for (size_t h = 0; h < nHeads; ++h) {
    if (deferred[h]) {
      parts[h].resize(1);  // its span count once listed (the item that lists it sets it)
      parts[h][0].whole = heads[h].spans;
    } else {
      parts[h] = CutParts(heads[h], esz);
    }
    maxParts = std::max(maxParts, parts[h].size());
  }
  std::vector<std::vector<PartOut>> res(nHeads);
  for (size_t h = 0; h < nHeads; ++h) {
    res[h].resize(parts[h].size());
    const bool multi = parts[h].size() > 1;
    for (size_t p = 0; p < parts[h].size(); ++p) {
      PartOut& r = res[h][p];
      r.out.resize(headOut);
      r.lse.resize(size_t(group));
      if (heads[h].spanMass && !deferred[h]) {
        if (multi) r.massByQuery.resize(size_t(group) * parts[h][p].size());
        else r.mass.resize(parts[h][p].size());
      }
    }
  }

  // Work items: (part p, a block of the heads that have a part p). All heads of a part together
  // read a token-major cache as one stream; when there are fewer parts than ~2 items per worker,
  // heads are split into blocks so every worker gets some. Grouping never changes a head's bits.
  // Gated, every head is an item of its own: a worker then never waits on a block-mate still being read.
  const size_t blocks =
      gate ? nHeads : std::min(nHeads, std::max<size_t>(1, (size_t(2 * workers) + maxParts - 1) / maxParts));
  struct Item {
    size_t part;
    std::vector<size_t> heads;
  };
  std::vector<Item> items;
  for (size_t p = 0; p < maxParts; ++p) {
    std::vector<size_t> have;
    for (size_t h = 0; h < nHeads; ++h)
      if (p < parts[h].size()) have.push_back(h);
    const size_t nb = std::min(blocks, have.size());
    for (size_t b = 0; b < nb; ++b) {
      Item it{p, {}};
      for (size_t i = have.size() * b / nb; i < have.size() * (b + 1) / nb; ++i) it.heads.push_back(have[i]);
      items.push_back(std::move(it));
    }
  }

  // Gated: item claims (0 free, 1 taken) and the items left out (their head will never be there).
  // ParallelFor runs the body once per item, and each run claims exactly one item, so a run always
  // finds one unclaimed: it takes the first whose head is ready, or whose head never will be (to
  // skip it), else sleeps and looks again.
  // With producers, items are claimed the same way, an item being ready once the lister says
  // every head of it is; the wait is for a producer running on another worker, short, so spun.
  const bool claiming = gate || producers > 0;
  std::unique_ptr<std::atomic<uint8_t>[]> claimed(claiming ? new std::atomic<uint8_t>[items.size()] : nullptr);
  std::vector<uint8_t> skipped(claiming ? items.size() : 0, 0);
  for (size_t i = 0; claiming && i < items.size(); ++i) claimed[i].store(0, std::memory_order_relaxed);
  auto stateOf = [&](const Item& it) {
    if (producers > 0)
      for (size_t h : it.heads)
        if (!lister->Ready(h)) return HeadGate::kPending;
    return gate ? gate->Of(it.heads[0]) : HeadGate::kReady;
  };
  auto claim = [&]() -> size_t {
    for (unsigned round = 0;; ++round) {
      for (size_t j = 0; j < items.size(); ++j) {
        if (claimed[j].load(std::memory_order_relaxed)) continue;
        const HeadGate::State st = stateOf(items[j]);
        if (st == HeadGate::kPending) continue;
        uint8_t free = 0;
        if (!claimed[j].compare_exchange_strong(free, 1, std::memory_order_acq_rel)) continue;
        if (st == HeadGate::kNever) skipped[j] = 1;
        return j;
      }
      if (gate) std::this_thread::sleep_for(kGateSleep);
      else if (round % 64 == 63) std::this_thread::yield();
      else CpuRelax();
    }
  };
  ThreadPool::Global().ParallelFor(
      producers + items.size(),
      [&](size_t i) {
        if (i < producers) {
          lister->Produce(i);
          return;
        }
        i -= producers;
        if (claiming) {
          i = claim();
          if (skipped[i]) return;
        }
        const Item& it = items[i];
        for (size_t h : it.heads) {
          if (!deferred[h]) continue;
          // A deferred head is one part, in exactly one item: listed here, then sized.
          lister->List(h);
          parts[h][0].wholeN = heads[h].nSpans;
          if (heads[h].spanMass) res[h][0].mass.resize(heads[h].nSpans);
        }
        std::vector<HeadAttn> calls;
        calls.reserve(it.heads.size());
        for (size_t h : it.heads) {
          const Part& part = parts[h][it.part];
          PartOut& r = res[h][it.part];
          calls.push_back(HeadAttn{heads[h].qGroup, part.data(), part.size(), r.out.data(), r.lse.data(),
                                   r.mass.empty() ? nullptr : r.mass.data(),
                                   r.massByQuery.empty() ? nullptr : r.massByQuery.data()});
        }
        try {
          AttendHeadsSpans(calls.data(), calls.size(), group, dim, dt, scale, ThreadScratch());
        } catch (const NonFiniteRowError& e) {
          const size_t h = it.heads[e.head];
          const Part& part = parts[h][it.part];
          PartOut& r = res[h][it.part];
          r.failed = true;
          r.inValue = e.inValue;
          r.msg = e.what();
          if (e.span < part.size()) {
            r.span = part.Orig(e.span);
            r.row = part.RowOff(e.span) + e.row;
          } else {
            r.span = heads[h].nSpans;  // no row to name (overflow)
          }
        }
        // A logits buffer grown for a huge part is not kept by this thread (> 256 MiB).
        AttnScratch& s = ThreadScratch();
        if (s.logits.capacity() > (size_t(64) << 20)) std::vector<float>().swap(s.logits);
      },
      workers);

  // Gated: a head with a part left out is not attended at all (none of its outputs are written).
  std::vector<uint8_t> out(nHeads, 1);
  for (size_t i = 0; gate && i < items.size(); ++i)
    if (skipped[i]) out[items[i].heads[0]] = 0;
  if (attended) std::copy(out.begin(), out.end(), attended);

  // The lowest failing head, and its first failing part.
  for (size_t h = 0; h < nHeads; ++h)
    for (const PartOut& r : res[h]) {
      if (!out[h]) break;
      if (!r.failed) continue;
      if (r.span >= heads[h].nSpans) throw NonFiniteRowError(h, heads[h].nSpans, 0, r.inValue, r.msg);
      const std::string what = r.inValue ? "attention output is not finite: NaN/Inf in the value row"
                                         : "attention logit is not finite (NaN/Inf in the key row, or q·k overflowed)";
      throw NonFiniteRowError(h, r.span, r.row, r.inValue,
                              what + " at row " + std::to_string(r.row) + " of span " + std::to_string(r.span));
    }

  // Merge each head's parts in ascending order.
  for (size_t h = 0; h < nHeads; ++h) {
    if (!out[h]) continue;
    std::vector<PartOut>& rs = res[h];
    std::copy(rs[0].out.begin(), rs[0].out.end(), heads[h].out);
    std::copy(rs[0].lse.begin(), rs[0].lse.end(), heads[h].lse);
    for (size_t p = 1; p < rs.size(); ++p)
      MergeAttention(heads[h].out, heads[h].lse, rs[p].out.data(), rs[p].lse.data(), group, dim);
    float* mass = heads[h].spanMass;
    if (!mass) continue;
    if (rs.size() == 1) {
      std::copy(rs[0].mass.begin(), rs[0].mass.end(), mass);
      continue;
    }
    // Per query head j, a part's relative masses scale by exp(lse_part_j - lse_j); a span cut
    // across parts sums its pieces.
    std::vector<double> acc(heads[h].nSpans, 0.0);
    for (size_t p = 0; p < rs.size(); ++p) {
      const Part& part = parts[h][p];
      const size_t n = part.size();
      for (int j = 0; j < group; ++j) {
        const float lp = rs[p].lse[size_t(j)];
        if (lp == -INFINITY) continue;
        const double w = std::exp(double(lp) - double(heads[h].lse[j]));
        for (size_t i = 0; i < n; ++i) acc[part.Orig(i)] += w * double(rs[p].massByQuery[size_t(j) * n + i]);
      }
    }
    for (size_t s = 0; s < heads[h].nSpans; ++s) mass[s] = float(acc[s] / group);
  }
}

}  // namespace

void AttendSplit(const HeadAttn* heads, size_t nHeads, int group, int dim, Dtype dt, float scale, int threads,
                 const HeadLister* lister) {
  Split(heads, nHeads, group, dim, dt, scale, threads, nullptr, nullptr, lister);
}

void AttendSplitGated(const HeadAttn* heads, size_t nHeads, int group, int dim, Dtype dt, float scale, int threads,
                      const HeadGate& gate, uint8_t* attended, const HeadLister* lister) {
  Split(heads, nHeads, group, dim, dt, scale, threads, &gate, attended, lister);
}

}  // namespace kvd
