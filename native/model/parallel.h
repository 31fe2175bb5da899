// A small persistent thread pool for the model's matrix products: ParallelFor(n, threads, fn) splits
// [0, n) into `threads` contiguous ranges and runs fn(begin, end) on each, the calling thread taking
// the first. Worker threads are started once (hardware_concurrency - 1 of them) and sleep between
// calls. This is the one place the model code reaches threads, so a project-wide pool can replace
// it by changing only this header.
//
// Calls are serialised (one ParallelFor at a time per process); fn must not throw and must not call
// ParallelFor itself.
#pragma once
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvd {
namespace model {

class ModelPool {
 public:
  static ModelPool& Get() {
    static ModelPool* pool = new ModelPool();  // never destroyed: workers live as long as the process
    return *pool;
  }

  int MaxThreads() const { return int(workers_.size()) + 1; }

  void Run(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn) {
    threads = std::max(1, std::min<int>(threads, MaxThreads()));
    if (n <= 0) return;
    if (threads == 1 || n == 1) {
      fn(0, n);
      return;
    }
    std::lock_guard<std::mutex> serial(call_mu_);
    {
      std::lock_guard<std::mutex> g(mu_);
      fn_ = &fn;
      n_ = n;
      parts_ = threads;
      pending_ = threads - 1;
      ++generation_;
    }
    cv_.notify_all();
    fn(0, Split(0));
    std::unique_lock<std::mutex> g(mu_);
    done_cv_.wait(g, [&] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  ModelPool() {
    const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i < hw; ++i) workers_.emplace_back([this, i] { Loop(i); });
    for (auto& w : workers_) w.detach();
  }

  int64_t Split(int part) const { return n_ * (part + 1) / parts_; }

  void Loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t, int64_t)>* fn;
      int64_t begin, end;
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return generation_ != seen; });
        seen = generation_;
        if (index >= parts_) continue;
        fn = fn_;
        begin = n_ * index / parts_;
        end = Split(index);
      }
      (*fn)(begin, end);
      {
        std::lock_guard<std::mutex> g(mu_);
        if (--pending_ == 0) done_cv_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex call_mu_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 1;
  int pending_ = 0;
  uint64_t generation_ = 0;
};

inline void ParallelFor(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  ModelPool::Get().Run(n, threads, fn);
}

}  // namespace model
}  // namespace kvd
