// A select made one kv head at a time by the caller's own tasks: attendFetched's `select`, where
// each kv head's attention starts as soon as that head's selection is made, in the same pass over
// the thread pool as the other heads' selects (no second wake-up of the pool, no wait for the
// slower thread between the select and the attention).
//
// The index is the one registered as `handle` (selectIndex's, SelectionIndex.handle()): held alive
// and read-locked for the object's life, as a selectIndex call holds it, so an extend or a build
// waits until the attention is done. The select is the keyless one the runtime makes (no keys, no
// pool): the same LayerIndex::SelectHead, so the same ids as selectIndex for every head.
#pragma once
#include <napi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "index/layer_index.h"

namespace kvd {

class HeadwiseSelect {
 public:
  // q: qHeads x the index's dim (qHeads a multiple of its kv heads, values finite: the caller's
  // checks), kept by the caller until Join. Throws E_CLOSED (no such handle), E_CONFIG (never
  // built, or a build in progress) or E_BUDGET (budget < 1).
  HeadwiseSelect(int64_t handle, const float* q, int qHeads, int64_t budget, const std::string& what);
  ~HeadwiseSelect();
  HeadwiseSelect(const HeadwiseSelect&) = delete;
  HeadwiseSelect& operator=(const HeadwiseSelect&) = delete;

  const LayerIndex& index() const { return *index_; }
  // Bounds on any head's selection before it is made (the select fills at most `budget` tokens per
  // kv head; only the context's first chunk can be shorter than a chunk): ids, and the tokens they
  // cover counting each id as a whole unit.
  int64_t MaxIds() const { return budget_; }
  int64_t MaxIdTokens() const { return budget_ + index_->config().chunk; }
  // Kv head h's selection; distinct heads may run concurrently (each on its thread's scratch).
  // Checks the result against the bounds above (E_INTERNAL).
  void Run(int h);
  const SelectResult& Head(int h) const { return parts_[size_t(h)].r; }
  // Every head's selection, concatenated as LayerIndex::Select returns it (call once all ran).
  SelectResult Join();
  // Instead of Run per head and Join: LayerIndex::Select itself (every head on the pool, then
  // joined), for a caller that does not overlap the heads with anything.
  SelectResult SelectAll() const { return index_->Select(q_, qHeads_, budget_, 0); }

 private:
  struct Held;  // the registry's reference and the read lock (index.cc)
  std::unique_ptr<Held> held_;
  const LayerIndex* index_ = nullptr;
  const float* q_;
  int qHeads_;
  int64_t budget_;
  std::vector<LayerIndex::HeadSelection> parts_;
};

// A selection as JS sees it (what selectIndex returns, and attendFetched's `selection` with
// `select`): { chunkSize, tokens, sinkEnd, tailStart, offsets, chunkIds } of `r` on `index`.
Napi::Object SelectionToJs(Napi::Env env, const SelectResult& r, const LayerIndex& index);

}  // namespace kvd
