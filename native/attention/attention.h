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

#include "common/aligned.h"
#include "common/dtype.h"
#include "common/errors.h"

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

// Per-thread scratch reused across calls (logits; scattered rows copied together, see
// attention.cc); never shared between threads.
struct AttnScratch {
  std::vector<float> logits;
  LineVector<uint8_t> gathered;  // rows copied on whole cache lines
};

// One kv head's GQA group: `group` query heads (qGroup: group x dim, f32, contiguous) attend over
// the concatenated spans. Writes:
//   out      group x dim   softmax(q·k * scale) · v
//   lse      group         log-sum-exp of the scaled logits (natural log), so partial results over
//                          disjoint token sets merge exactly (see MergeAttention)
//   spanMass nSpans        (optional, may be null) attention probability mass per span, averaged
//                          over the group's query heads
// Spans with len 0 are allowed (mass 0). With no tokens at all, out = 0 and lse = -inf (the
// identity of MergeAttention). Throws NonFiniteRowError on NaN/Inf in an attended k or v row.
void AttendHeadSpans(const float* qGroup, int group, int dim, Dtype dt, float scale, const Span* spans,
                     size_t nSpans, float* out, float* lse, float* spanMass, AttnScratch& scratch);

// Several kv heads at once, each with its own queries, spans and outputs (fields as in
// AttendHeadSpans). The passes interleave the heads tile by tile, so a token-major cache (all
// heads of a token adjacent) is read as one stream instead of once per head with a stride; every
// head's arithmetic is exactly that of AttendHeadSpans on its own spans, so outputs are
// bit-identical however heads are grouped into calls (or threads).
struct HeadAttn {
  const float* qGroup;  // group x dim
  const Span* spans;
  size_t nSpans;
  float* out;       // group x dim
  float* lse;       // group
  float* spanMass;  // nSpans, or null
  // Optional (may be null): group x nSpans, row j = the mass of each span under query head j alone
  // (sum over the span of that head's probabilities), so partial results over disjoint token sets
  // can be re-weighted per query head when they are merged (see attention_split.h).
  float* spanMassByQuery = nullptr;
};
void AttendHeadsSpans(const HeadAttn* heads, size_t nHeads, int group, int dim, Dtype dt, float scale,
                      AttnScratch& scratch);

// Raised (code E_NONFINITE) by the functions above / AttentionProbsHeadSpans when a scaled logit is
// NaN/Inf (NaN/Inf in a key row, or q·k overflow) or an output is (NaN/Inf in a value row). It
// names the row as (head index in the call, span index, row within span) so callers that know
// which kv head and tokens the spans are can re-throw naming those. The check costs nothing on the
// normal path: logits are tested while the max is taken, outputs once per head; the culprit row is
// searched for only after a failure. With several heads, the lowest failing head is reported.
struct NonFiniteRowError : Error {
  size_t head;
  size_t span;
  int64_t row;
  bool inValue;  // true: a value row (output not finite); false: a key row (logit not finite)
  NonFiniteRowError(size_t h, size_t s, int64_t r, bool v, const std::string& msg)
      : Error("E_NONFINITE", msg), head(h), span(s), row(r), inValue(v) {}
};

// Softmax probabilities only (no values): probs[j * total + t] = softmax_t(q_j·k_t * scale) for the
// group's query heads j over the concatenated spans (total = sum of span lengths), same arithmetic
// and order as AttendHeadSpans. For evaluation (recall of attention mass, oracle top-K) and
// importance scoring.
void AttentionProbsHeadSpans(const float* qGroup, int group, int dim, Dtype dt, float scale, const Span* spans,
                             size_t nSpans, float* probs);

// Merges partial attention (outB, lseB) into (outA, lseA) for `heads` heads of `dim`; both must be
// over disjoint token sets. Result equals attention over the union up to float rounding.
void MergeAttention(float* outA, float* lseA, const float* outB, const float* lseB, int heads, int dim);

}  // namespace kvd
