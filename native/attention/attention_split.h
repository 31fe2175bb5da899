// Attention over many kv heads on the thread pool, split by kv head AND by KV length
// (flash-decoding): a head of more than kSinglePartTokens tokens has its concatenated token
// sequence cut into parts of kPartTokens tokens, every part is attended on its own
// (AttendHeadsSpans), and the partial results are merged through their log-sum-exp in part order.
//
// Determinism: the cut points depend only on each head's token count (none up to
// kSinglePartTokens, else position kPartTokens * p in its concatenated sequence), never on the
// thread count or on how parts and heads are assigned to threads, and parts are merged in
// ascending order; so the result is bit-identical for every thread count, and a selection that
// lists every token in order reproduces dense attention bit for bit. A head of at most
// kSinglePartTokens tokens is one part: its result is exactly AttendHeadsSpans' (what the tiered
// and hot-tier paths compute for the same spans).
#pragma once
#include <cstddef>

#include "attention/attention.h"

namespace kvd {

// A head of at most this many tokens is attended as one part (a sparse selection: budget, sinks
// and tail), so splitting never changes a sparse head's arithmetic, and two such heads of a GQA
// group of 4 keep their logits (2 x 128 KiB) in L2.
constexpr int64_t kSinglePartTokens = 8192;
// Tokens per part of a longer head (dense attention and its long selections). Long heads come many
// parts to a work item with all of a call's heads together (they read a token-major cache as one
// stream): at 2,048 tokens an item's logits (8 kv heads x 4 query heads x 2,048 x 4 B = 256 KiB)
// stay in L2 between the keys pass, the softmax and the values pass. With 8,192 (1 MiB) they did
// not: dense 128K on two threads took 0.91-0.95 of the time at 2,048 (also at 1,024 and 4,096;
// bench/kernels-ab.ts, bench/RESULTS.md).
constexpr int64_t kPartTokens = 2048;

// A call whose span lists are built per call (attendFetched looks each selected unit's page up as it
// lists it) can leave a head's listing to the worker that attends it: the listing then needs no
// pass of its own on the pool (one wake-up of the pool's threads and one wait for the slower of
// them fewer per call), and the worker reads the spans it has just written from its own cache.
// heads[h].spans must point at room for heads[h].nSpans spans (the count is known before listing).
class HeadLister {
 public:
  virtual ~HeadLister() = default;
  // At least the tokens head h holds once listed (spans' lengths summed). A head whose bound is at
  // most kSinglePartTokens is one part whatever its listing says, so it is listed inside its work
  // item; the others are listed, on the pool, before any head is cut into parts.
  virtual int64_t MaxTokens(size_t head) const = 0;
  // Writes heads[h].spans[0, nSpans) (a head within one part may set its nSpans here, the room
  // heads[h].spans points at permitting). Called once per head (a gated head left out: never), on
  // a worker of the pool; an exception it throws is the call's (the lowest failing work item's).
  virtual void List(size_t head) const = 0;
  // Producer tasks (default none), for callers whose spans depend on work done per head first
  // (attendFetched's `select`: each kv head's selection). They run in the same pass over the pool
  // as the work items, handed out before any item: a worker with no producer left takes an item
  // whose heads are all Ready, so the last producers overlap the first heads' attention. Every head
  // must then be within one part by MaxTokens (E_INTERNAL otherwise). Produce must not throw (a
  // failure is List's to report, once the head is Ready), and every head must become Ready once
  // the producers have run, whatever they met.
  virtual size_t Producers() const { return 0; }
  virtual void Produce(size_t task) const { (void)task; }
  virtual bool Ready(size_t head) const { (void)head; return true; }
};

// Runs heads[0, nHeads) (fields as in AttendHeadsSpans; spanMass may be null per head; the
// spanMassByQuery field is ignored) with at most `threads` workers of ThreadPool::Global().
// Outputs are written once per head at the end (no cache line of out / lse / spanMass is written by
// two threads). A NonFiniteRowError names the lowest failing head and, within it, the first failing
// part, with span / row indices of the head's ORIGINAL span list.
// With `lister`, the heads' spans are listed by it first (HeadLister), the result unchanged.
void AttendSplit(const HeadAttn* heads, size_t nHeads, int group, int dim, Dtype dt, float scale, int threads,
                 const HeadLister* lister = nullptr);

// Which heads' rows are there yet, for a call made while some are still being read (the runtime's
// SSD step: one call over every kv head while the reads land, instead of one call per batch of
// landed heads, each waiting for its slowest head). State(h) for head h of the call (its index in
// `heads`): kReady once every row of the head can be read, kPending while some are on their way
// (ask again), kNever when some never will be (the read failed): the head is left out. A head goes
// from kPending to kReady or kNever and stays there. Called from the pool's workers concurrently.
class HeadGate {
 public:
  enum State { kPending = 0, kReady = 1, kNever = 2 };
  virtual ~HeadGate() = default;
  virtual State Of(size_t head) const = 0;
};

// AttendSplit that attends each head once `gate` says its rows are there: every (part, head) is a
// work item, and a worker takes whichever unclaimed item is ready (sleeping briefly while none is),
// so the workers stay busy while the rest land and no head waits for a batch. Heads the gate calls
// kNever are not attended: attended[h] is set to 1 for each head attended, 0 for the others (whose
// out / lse / spanMass are not written). A head's bits are those of AttendSplit (same parts, same
// merge order), whichever worker took it and when.
void AttendSplitGated(const HeadAttn* heads, size_t nHeads, int group, int dim, Dtype dt, float scale, int threads,
                      const HeadGate& gate, uint8_t* attended, const HeadLister* lister = nullptr);

}  // namespace kvd
