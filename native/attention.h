// Exact softmax attention over an ordered list of KV spans: the one primitive every attention path
// (dense, sparse over a contiguous cache, hot-tier slots, DRAM pages) is built on.
//
// Determinism contract: the result depends only on the queries, the span contents and the span
// ORDER, never on where spans live. Callers that read the same tokens in the same order from
// different places (contiguous cache vs hot-tier slots vs staged SSD pages) get bit-identical
// outputs; sparse paths list spans in ascending token order so a budget covering the whole context
// reproduces dense attention (same order, same arithmetic).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dtype.h"

namespace kvd {

// `len` consecutive tokens of one kv head. Row t of keys starts at k + t * kStride elements (of
// the span's dtype), likewise for values.
struct Span {
  const void* k;
  const void* v;
  int64_t len;
  int64_t kStride;
  int64_t vStride;
};

// Per-thread scratch reused across calls (logits buffer); never shared between threads.
struct AttnScratch {
  std::vector<float> logits;
};

// One kv head's GQA group: `group` query heads (qGroup: group x dim, f32, contiguous) attend over
// the concatenated spans. Writes:
//   out      group x dim   softmax(q·k * scale) · v
//   lse      group         log-sum-exp of the scaled logits (natural log), so partial results over
//                          disjoint token sets merge exactly (see MergeAttention)
//   spanMass nSpans        (optional, may be null) attention probability mass per span, averaged
//                          over the group's query heads
void AttendHeadSpans(const float* qGroup, int group, int dim, Dtype dt, float scale, const Span* spans,
                     size_t nSpans, float* out, float* lse, float* spanMass, AttnScratch& scratch);

// Merges partial attention (outB, lseB) into (outA, lseA) for `heads` heads of `dim`; both must be
// over disjoint token sets. Result equals attention over the union up to float rounding.
void MergeAttention(float* outA, float* lseA, const float* outB, const float* lseB, int heads, int dim);

}  // namespace kvd
