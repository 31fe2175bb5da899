// Attention over many kv heads on the thread pool, split by kv head AND by KV length
// (flash-decoding): each head's concatenated token sequence is cut into parts of kPartTokens
// tokens, every part is attended on its own (AttendHeadsSpans), and the partial results are merged
// through their log-sum-exp in part order.
//
// Determinism: the cut points depend only on each head's token count (position kPartTokens * p in
// its concatenated sequence), never on the thread count or on how parts and heads are assigned to
// threads, and parts are merged in ascending order; so the result is bit-identical for every
// thread count, and a selection that lists every token in order reproduces dense attention bit for
// bit. A head of at most kPartTokens tokens is one part: its result is exactly AttendHeadsSpans'
// (what the tiered and hot-tier paths compute for the same spans).
#pragma once
#include <cstddef>

#include "attention/attention.h"

namespace kvd {

// Tokens per part. 8192 tokens x 4 query heads of logits = 128 KiB per head: a part's scratch stays
// in L2 while its values are read, and a 128K dense head splits into 16 parts for the pool.
constexpr int64_t kPartTokens = 8192;

// Runs heads[0, nHeads) (fields as in AttendHeadsSpans; spanMass may be null per head; the
// spanMassByQuery field is ignored) with at most `threads` workers of ThreadPool::Global().
// Outputs are written once per head at the end (no cache line of out / lse / spanMass is written by
// two threads). A NonFiniteRowError names the lowest failing head and, within it, the first failing
// part, with span / row indices of the head's ORIGINAL span list.
void AttendSplit(const HeadAttn* heads, size_t nHeads, int group, int dim, Dtype dt, float scale, int threads);

}  // namespace kvd
