// The addon's one background thread: work that must leave the decode path but not the process (an
// index segment's k-means once the segment fills, native/index/layer_index.cc).
//
//   auto task = std::make_shared<kvd::BackgroundTask>([=] { ... });
//   kvd::BackgroundQueue::Global().Post(task);
//   ...
//   task->Wait();  // where the result is needed
//
// Semantics:
//  - Tasks run one at a time, in the order posted, on a thread scheduled SCHED_IDLE (nice +10
//    where that is refused): it runs on a core no decode thread wants, in the gaps between a step's
//    kernels and during its I/O waits.
//  - Wait() runs the task on the caller when the thread has not started it yet (a queue full of
//    other layers' work never delays a caller beyond its own task), else blocks until it finished.
//    It rethrows the task's exception.
//  - Cancel() is for owners going away: a task not started never runs, a running one is waited for
//    (its function may read memory the owner is about to free). It never throws.
//  - The thread starts when the addon loads (beside the thread pool, so it exists before any "no
//    threads leaked" measurement) and lives for the process; like the pool it is leaked on purpose
//    at exit.
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace kvd {

class BackgroundTask {
 public:
  explicit BackgroundTask(std::function<void()> fn) : fn_(std::move(fn)) {}
  void Wait();
  void Cancel();
  // The task ran to its end (successfully or not).
  bool Finished() const;

 private:
  friend class BackgroundQueue;
  enum class State { kQueued, kRunning, kFinished, kCancelled };
  // queued -> running; false when another thread claimed it or it was cancelled.
  bool Claim();
  // After a successful Claim: runs fn_, keeps its exception, wakes the waiters.
  void Run();

  std::function<void()> fn_;
  std::exception_ptr error_;
  mutable std::mutex mu_;
  std::condition_variable done_;
  State state_ = State::kQueued;
};

class BackgroundQueue {
 public:
  static BackgroundQueue& Global();
  void Post(std::shared_ptr<BackgroundTask> task);
  BackgroundQueue(const BackgroundQueue&) = delete;
  BackgroundQueue& operator=(const BackgroundQueue&) = delete;

 private:
  BackgroundQueue();
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<BackgroundTask>> queue_;
  std::thread thread_;
};

}  // namespace kvd
