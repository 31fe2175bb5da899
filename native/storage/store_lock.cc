// The exclusive lock of an SSD store directory: one open store (one runtime, in any process) writes
// a directory at a time. Two would each rewrite the manifest from their own copy (losing the other's
// segments) and delete the other's half-written files as leftovers.
//
// flock(2) on <dir>/LOCK, LOCK_EX | LOCK_NB. An flock belongs to the open file description, so a
// second open in the same process conflicts as one in another process does, and the kernel drops it
// when the holder exits however it exits: a crash leaves no stale lock to clean by hand. The file
// itself stays (it is empty); only the descriptor is the lock.
//
// storeUnlock closes only descriptors storeLock returned and has not released, so a wrong number
// cannot close an unrelated descriptor of the process.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <mutex>
#include <set>
#include <string>

#include "common/errors.h"
#include "common/registry.h"
#include "storage/io_engine.h"

namespace kvd {
namespace {

std::mutex& LocksMutex() {
  static std::mutex m;
  return m;
}
std::set<int>& HeldLocks() {
  static std::set<int> held;
  return held;
}

// storeLock(path) -> descriptor holding the lock. E_BUSY when another open holds it.
Napi::Value StoreLock(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    if (info.Length() < 1 || !info[0].IsString()) Throw("E_TYPE", "storeLock: expected the lock file's path as a string");
    const std::string path = info[0].As<Napi::String>();
    if (path.empty() || path.find('\0') != std::string::npos)
      Throw("E_CONFIG", "storeLock: expected a non-empty path without NUL characters, got \"" + path + "\"");
    int fd;
    do fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      const int err = errno;
      Throw(err == ENOENT ? "E_NOT_FOUND" : err == ENOSPC || err == EDQUOT ? "E_NOSPC" : "E_IO",
            "opening the store lock " + path + ": " + ErrnoText(err));
    }
    int r;
    do r = ::flock(fd, LOCK_EX | LOCK_NB);
    while (r != 0 && errno == EINTR);
    if (r != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK)
        Throw("E_BUSY", "store lock " + path +
                            ": expected a store no other runtime has open, got one held by another open store (in this "
                            "process or another): close that runtime first, or give this one another directory");
      Throw("E_IO", "locking " + path + ": " + ErrnoText(err));
    }
    std::lock_guard<std::mutex> g(LocksMutex());
    HeldLocks().insert(fd);
    return Napi::Number::New(info.Env(), fd);
  });
}

// storeUnlock(fd): releases a lock storeLock returned (closing its descriptor).
Napi::Value StoreUnlock(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    if (info.Length() < 1 || !info[0].IsNumber()) Throw("E_TYPE", "storeUnlock: expected a descriptor storeLock returned (a number)");
    const double d = info[0].As<Napi::Number>().DoubleValue();
    const int fd = d >= 0 && d <= double(INT_MAX) && d == double(int(d)) ? int(d) : -1;
    {
      std::lock_guard<std::mutex> g(LocksMutex());
      if (fd < 0 || HeldLocks().erase(fd) == 0)
        Throw("E_RANGE", "storeUnlock: expected a descriptor storeLock returned and not yet released, got " + std::to_string(d));
    }
    ::close(fd);  // drops the flock
    return info.Env().Undefined();
  });
}

void InitStoreLock(Napi::Env env, Napi::Object exports) {
  exports.Set("storeLock", Napi::Function::New(env, StoreLock));
  exports.Set("storeUnlock", Napi::Function::New(env, StoreUnlock));
}

}  // namespace

KVD_REGISTER_MODULE(InitStoreLock);

}  // namespace kvd
