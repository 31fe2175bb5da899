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
//  - A sleeping pool thread is woken off its caller's CPU: just before the wake-up its affinity
//    becomes the caller's allowed CPUs minus the one it runs on, and once it has claimed a task it
//    takes the caller's CPUs back (it never works pinned; one that found no task left sleeps
//    narrowed until it next works; a mask changed by someone else meanwhile is left alone).
//    Woken plainly, the pool's thread was queued on the caller's own CPU ~9 times in 10 on a
//    2-vCPU VM (the scheduler's wake-affine choice) and, in a decode step after a dense pass,
//    started its first task 100-270 us after the call, once it preempted the caller or was moved
//    (bench/RESULTS.md). A no-op where the caller may run on one CPU only, and in pools of more
//    than kMaxPlacedThreads threads (a system call per thread and wake-up; many idle CPUs there).
// Pool size: the CPUs this process may run on (sched_getaffinity), capped at kMaxThreads; the pool
// holds size - 1 threads, the caller being the last worker. Threads start when the addon loads
// (so they exist before any "no threads leaked" measurement) and live for the process.
#pragma once
#include <sched.h>

#include <condition_variable>
#include <cstdint>
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
  void WakeOffCallerCpu(const Job& job);  // see the header comment; under mu_
  static constexpr size_t kMaxPlacedThreads = 4;
  static void RunTask(Job& job, size_t i);
  static void RunTasks(Job& job);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;  // jobs that still have unclaimed tasks or helper slots
  bool stop_ = false;
  std::vector<std::thread> threads_;
  // Guarded by mu_: threads inside their condition wait; wake-ups that narrowed the threads'
  // affinity, and the mask the last one set (a woken thread whose mask is still that one widens
  // it to its job's caller's CPUs).
  int sleeping_ = 0;
  uint64_t placements_ = 0;
  cpu_set_t narrow_;
};

// CPUs this process may run on (affinity mask), at least 1.
int AvailableCpus();

}  // namespace kvd
