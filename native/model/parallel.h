// The model code's one way to threads: ParallelFor(n, parts, fn) splits [0, n) into `parts`
// contiguous ranges and runs fn(begin, end) on each, on the addon's persistent pool
// (native/thread_pool.h; the calling thread works too). Range boundaries depend only on n and parts,
// so a product's rows are always summed by the same code in the same order, whatever thread ran them.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>

#include "common/thread_pool.h"

namespace kvd {
namespace model {

// Threads a model call can use at most (pool threads + the caller).
inline int MaxThreads() { return ThreadPool::Global().Size(); }

inline void ParallelFor(int64_t n, int parts, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  parts = int(std::max<int64_t>(1, std::min<int64_t>({int64_t(parts), int64_t(MaxThreads()), n})));
  if (parts == 1) {
    fn(0, n);
    return;
  }
  ThreadPool::Global().ParallelFor(
      size_t(parts), [&](size_t p) { fn(n * int64_t(p) / parts, n * int64_t(p + 1) / parts); }, parts);
}

}  // namespace model
}  // namespace kvd
