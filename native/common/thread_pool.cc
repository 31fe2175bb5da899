// ThreadPool (thread_pool.h): a queue of jobs; each job hands out task indices through an atomic
// counter to its caller and to at most maxWorkers - 1 pool threads.
#include "common/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <exception>

#include "common/registry.h"

namespace kvd {

struct ThreadPool::Job {
  const std::function<void(size_t)>* fn = nullptr;
  size_t n = 0;
  std::atomic<size_t> next{0};  // next unclaimed index
  std::atomic<size_t> done{0};  // finished tasks
  int helpersLeft = 0;          // pool threads that may still join (guarded by the pool mutex)
  std::mutex mu;                // guards error/errorAt and the completion wait
  std::condition_variable finished;
  std::exception_ptr error;
  size_t errorAt = 0;
};

int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? int(hc) : 1;
}

ThreadPool& ThreadPool::Global() {
  // Leaked on purpose: pool threads must not be joined from static destructors at process exit
  // (a worker_thread's isolate may still be inside a task).
  static ThreadPool* pool = new ThreadPool(std::min(AvailableCpus(), kMaxThreads) - 1);
  return *pool;
}

ThreadPool::ThreadPool(int threads) {
  CPU_ZERO(&wide_);
  threads_.reserve(size_t(std::max(0, threads)));
  for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

// Claims and runs tasks of `job` until none is left.
void ThreadPool::RunTasks(Job& job) {
  for (;;) {
    const size_t i = job.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job.n) return;
    try {
      (*job.fn)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.mu);
      if (!job.error || i < job.errorAt) {
        job.error = std::current_exception();
        job.errorAt = i;
      }
    }
    if (job.done.fetch_add(1, std::memory_order_acq_rel) + 1 == job.n) {
      std::lock_guard<std::mutex> lock(job.mu);
      job.finished.notify_all();
    }
  }
}

void ThreadPool::WorkerLoop() {
  // Named so that a profiler (or a test reading /proc/self/task/*/comm) can tell pool threads apart.
  pthread_setname_np(pthread_self(), "kvd-pool");
  uint64_t placed = 0;  // placements_ as this thread last saw it
  cpu_set_t wide;
  bool widen = false;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++sleeping_;
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      --sleeping_;
      if (stop_) return;
      job = queue_.front();
      if (--job->helpersLeft <= 0 || job->next.load(std::memory_order_relaxed) >= job->n) queue_.pop_front();
      // Woken off the caller's CPU (WakeOffCallerCpu): the caller's CPUs again for the work and after.
      if (placements_ != placed) {
        placed = placements_;
        wide = wide_;
        widen = true;
      }
    }
    if (widen) {
      widen = false;
      pthread_setaffinity_np(pthread_self(), sizeof(wide), &wide);
    }
    RunTasks(*job);
  }
}

// See thread_pool.h. Only when some thread sleeps (an awake one takes the job where it runs); every
// thread's mask is narrowed, and each widens its own when it next claims a job. Not for pools of
// more than kMaxPlacedThreads threads: that costs a system call per thread and wake-up, and there
// the scheduler's wake-up finds an idle CPU among many. A failure (the CPU set changed since the
// pool started) leaves the affinity as it was: placement only affects speed.
void ThreadPool::WakeOffCallerCpu() {
  if (sleeping_ == 0 || threads_.size() > kMaxPlacedThreads) return;
  const int cpu = sched_getcpu();
  cpu_set_t mine;  // the caller's own CPUs: a host's later restriction is kept, not undone
  if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof(mine), &mine) != 0 || !CPU_ISSET(cpu, &mine)) return;
  cpu_set_t set = mine;
  CPU_CLR(cpu, &set);
  if (CPU_COUNT(&set) == 0) return;
  for (auto& t : threads_) pthread_setaffinity_np(t.native_handle(), sizeof(set), &set);
  wide_ = mine;
  ++placements_;
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn, int maxWorkers) {
  if (n == 0) return;
  int workers = Size();
  if (maxWorkers > 0) workers = std::min(workers, maxWorkers);
  workers = int(std::min<size_t>(size_t(workers), n));
  if (workers <= 1) {
    // In order on the caller; the lowest failing index is the first to throw.
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n = n;
  job->helpersLeft = workers - 1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    WakeOffCallerCpu();
    queue_.push_back(job);
  }
  if (workers - 1 == 1) cv_.notify_one();
  else cv_.notify_all();
  RunTasks(*job);
  {
    std::unique_lock<std::mutex> lock(job->mu);
    job->finished.wait(lock, [&] { return job->done.load(std::memory_order_acquire) == n; });
  }
  {
    // Every task is done: drop the job from the queue if no helper took its last slot.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) queue_.erase(it);
  }
  if (job->error) std::rethrow_exception(job->error);
}

namespace {
// Starts the pool threads when the addon loads (see thread_pool.h); exports nothing.
void InitThreadPool(Napi::Env, Napi::Object) { ThreadPool::Global(); }
}  // namespace

KVD_REGISTER_MODULE(InitThreadPool);

}  // namespace kvd
