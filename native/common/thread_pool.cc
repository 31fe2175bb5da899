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
  // The caller's allowed CPUs at the call (pools that place their wake-ups: WakeOffCallerCpu);
  // what a thread narrowed for a wake-up widens to.
  cpu_set_t callerCpus;
  bool haveCallerCpus = false;
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
  CPU_ZERO(&narrow_);
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

// Runs task i of `job` (claimed by the caller), recording an exception and the job's completion.
void ThreadPool::RunTask(Job& job, size_t i) {
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

// Claims and runs tasks of `job` until none is left.
void ThreadPool::RunTasks(Job& job) {
  for (;;) {
    const size_t i = job.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job.n) return;
    RunTask(job, i);
  }
}

void ThreadPool::WorkerLoop() {
  // Named so that a profiler (or a test reading /proc/self/task/*/comm) can tell pool threads apart.
  pthread_setname_np(pthread_self(), "kvd-pool");
  uint64_t placed = 0;  // placements_ as this thread last widened after
  for (;;) {
    std::shared_ptr<Job> job;
    uint64_t placement = 0;
    cpu_set_t narrow;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++sleeping_;
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      --sleeping_;
      if (stop_) return;
      job = queue_.front();
      if (--job->helpersLeft <= 0 || job->next.load(std::memory_order_relaxed) >= job->n) queue_.pop_front();
      placement = placements_;
      narrow = narrow_;
    }
    // A task first: the caller returns only once it is done, so the widening below can never land
    // after the call, where a host may already have changed the affinity (nothing claimed: the
    // thread stays as it is, and widens when it next works).
    const size_t first = job->next.fetch_add(1, std::memory_order_relaxed);
    if (first >= job->n) continue;
    // Woken off the caller's CPU (WakeOffCallerCpu): this caller's CPUs now (a host's taskset since
    // included) for the work and after, unless the mask is no longer the one this pool set.
    if (placement != placed && job->haveCallerCpus) {
      placed = placement;
      cpu_set_t now;
      if (pthread_getaffinity_np(pthread_self(), sizeof(now), &now) == 0 && CPU_EQUAL(&now, &narrow) &&
          !CPU_EQUAL(&now, &job->callerCpus))
        pthread_setaffinity_np(pthread_self(), sizeof(job->callerCpus), &job->callerCpus);
    }
    RunTask(*job, first);
    RunTasks(*job);
  }
}

// See thread_pool.h. Only when some thread sleeps (an awake one takes the job where it runs); every
// thread's mask is narrowed, and each widens its own when it next claims a task. Not for pools of
// more than kMaxPlacedThreads threads: that costs a system call per thread and wake-up, and there
// the scheduler's wake-up finds an idle CPU among many. A call that fails (say, a CPU its cgroup no
// longer allows) leaves that thread's affinity as it was: placement only affects speed.
void ThreadPool::WakeOffCallerCpu(const Job& job) {
  if (sleeping_ == 0 || !job.haveCallerCpus) return;
  const int cpu = sched_getcpu();
  if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &job.callerCpus)) return;
  cpu_set_t set = job.callerCpus;  // the caller's own CPUs: a host's later restriction is kept
  CPU_CLR(cpu, &set);
  if (CPU_COUNT(&set) == 0) return;
  for (auto& t : threads_) pthread_setaffinity_np(t.native_handle(), sizeof(set), &set);
  narrow_ = set;
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
  if (threads_.size() <= kMaxPlacedThreads)
    job->haveCallerCpus = sched_getaffinity(0, sizeof(job->callerCpus), &job->callerCpus) == 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    WakeOffCallerCpu(*job);
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
