// Per-thread storage for the span lists an attention call builds before it runs (attendSparse,
// attendFetched): one Span per selected unit per kv head (2048+ per head at a token-granular
// budget), with each span's first token and source (for error messages) and its attention mass.
//
// Allocating those lists afresh every call cost more than the attention itself: glibc trims the
// freed top of the heap between calls, so every call page-faulted ~1 MB of fresh pages back in.
// The storage only grows and is never shared between threads (a call builds and consumes its lists
// on one thread: the JS thread, or the libuv worker of an async call); it is not re-entrant.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention/attention.h"

namespace kvd {

struct SpanLists {
  static constexpr size_t kKeepSpans = size_t(1) << 18;  // ~14 MB of lists (a budget of 32K units x 8 heads)

  std::vector<Span> spans;      // head h's spans at [start[h], start[h + 1])
  std::vector<int64_t> first;   // first token of each span
  std::vector<uint8_t> source;  // caller-defined source of each span (which tensor / tier)
  std::vector<float> mass;      // attention mass of each span
  std::vector<size_t> start;    // nHeads + 1
  std::vector<HeadAttn> heads;  // nHeads

  // Room for `spanCap` spans over `nHeads` kv heads (contents are left to the caller to write).
  // Storage grown past kKeepSpans by one huge call is given back at the next smaller call, so a
  // thread does not hold it for good.
  void Reserve(size_t spanCap, size_t nHeads) {
    if (spans.size() > kKeepSpans && spanCap <= kKeepSpans) *this = SpanLists();
    Grow(spans, spanCap);
    Grow(first, spanCap);
    Grow(source, spanCap);
    Grow(mass, spanCap);
    Grow(start, nHeads + 1);
    Grow(heads, nHeads);
  }

 private:
  template <typename T>
  static void Grow(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
  }
};

// This thread's lists.
inline SpanLists& ThreadSpanLists() {
  thread_local SpanLists lists;
  return lists;
}

}  // namespace kvd
