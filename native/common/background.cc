// BackgroundQueue / BackgroundTask (background.h).
#include "common/background.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/registry.h"

namespace kvd {

bool BackgroundTask::Claim() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kQueued) return false;
  state_ = State::kRunning;
  return true;
}

void BackgroundTask::Run() {
  std::exception_ptr error;
  try {
    fn_();
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = error;
    state_ = State::kFinished;
    fn_ = nullptr;  // what it captured goes now, not when the last owner lets go
  }
  done_.notify_all();
}

void BackgroundTask::Wait() {
  if (Claim()) {
    Run();
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return state_ == State::kFinished || state_ == State::kCancelled; });
  }
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

void BackgroundTask::Cancel() {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ == State::kQueued) {
    state_ = State::kCancelled;
    fn_ = nullptr;
    return;
  }
  done_.wait(lock, [&] { return state_ != State::kRunning; });
}

bool BackgroundTask::Finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kFinished;
}

BackgroundQueue& BackgroundQueue::Global() {
  // Leaked on purpose, like ThreadPool::Global: the thread must not be joined from static
  // destructors at process exit.
  static BackgroundQueue* queue = new BackgroundQueue();
  return *queue;
}

BackgroundQueue::BackgroundQueue() : thread_([this] { Loop(); }) {}

void BackgroundQueue::Post(std::shared_ptr<BackgroundTask> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void BackgroundQueue::Loop() {
  // Below the decode threads: SCHED_IDLE runs only on a core nothing else wants (the gaps between a
  // decode step's kernels, its I/O waits); where that is refused, nice +10 (Linux applies
  // setpriority to one thread given its tid). Failing both only costs the ordering, not correctness.
  sched_param idle{};
  if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle) != 0) (void)setpriority(PRIO_PROCESS, id_t(syscall(SYS_gettid)), 10);
  for (;;) {
    std::shared_ptr<BackgroundTask> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty(); });
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    if (task->Claim()) task->Run();
  }
}

namespace {
// Starts the thread when the addon loads (see background.h); exports nothing.
void InitBackgroundQueue(Napi::Env, Napi::Object) { BackgroundQueue::Global(); }
}  // namespace

KVD_REGISTER_MODULE(InitBackgroundQueue);

}  // namespace kvd
