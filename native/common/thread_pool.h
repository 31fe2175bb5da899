// The addon's one persistent thread pool: every parallel native kernel (attention, index select and
// build, model forward passes) runs its tasks here instead of starting threads per call.
//
//   kvd::ThreadPool::Global().ParallelFor(n, [&](size_t i) { ... }, maxWorkers);
//
// Semantics:
//  - fn(i) runs exactly once for every i < n; ParallelFor returns when all have finished. The
//    calling thread claims tasks too, so a call always makes progress even when every pool thread
//    is busy with other callers' work (concurrent calls from the JS thread, libuv workers and
//    worker_threads are fine; nested calls from inside a task are fine as well).
//  - maxWorkers caps the threads working on this call, the caller included (0: no cap beyond the
//    pool). 1 runs every task on the caller, in index order.
//  - Which thread runs which index is unspecified: a task must write only its own outputs, and
//    results that must not depend on the thread count must not depend on that assignment.
//  - If tasks throw, the exception of the LOWEST failing index is rethrown once all tasks are done
//    (so the reported error does not depend on scheduling); the others are dropped.
//  - Pool threads stay off the CPU of the thread that last called ParallelFor (their affinity is the
//    process's CPUs minus that one, re-set only when a caller arrives from another CPU). Woken by
//    the caller, a pool thread was otherwise queued on the caller's own CPU ~9 times in 10 on a
//    2-vCPU VM (the scheduler's wake-affine choice), and started its first task ~260 us late,
//    when it preempted the caller or was moved (bench/RESULTS.md). A no-op with one allowed CPU.
// Pool size: the CPUs this process may run on (sched_getaffinity), capped at kMaxThreads; the pool
// holds size - 1 threads, the caller being the last worker. Threads start when the addon loads
// (so they exist before any "no threads leaked" measurement) and live for the process.
#pragma once
#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kvd {

class ThreadPool {
 public:
  static constexpr int kMaxThreads = 64;

  // The process-wide pool (created on first use).
  static ThreadPool& Global();

  // Workers a call can use at most: pool threads + the caller.
  int Size() const { return int(threads_.size()) + 1; }

  void ParallelFor(size_t n, const std::function<void(size_t)>& fn, int maxWorkers = 0);

  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

 private:
  explicit ThreadPool(int threads);
  struct Job;
  void WorkerLoop();
  void KeepOffCallerCpu();
  static void RunTasks(Job& job);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;  // jobs that still have unclaimed tasks or helper slots
  bool stop_ = false;
  std::vector<std::thread> threads_;
  cpu_set_t cpus_;                 // the process's CPUs when the pool started
  std::atomic<int> offCpu_{-1};    // the CPU the pool threads' affinity leaves out (-1: none yet)
};

// CPUs this process may run on (affinity mask), at least 1.
int AvailableCpus();

}  // namespace kvd
