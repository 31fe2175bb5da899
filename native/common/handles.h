// Process-global handle registry: native objects (I/O engines, open segments, cancel tokens) are
// reached by a small integer from any JS thread or worker, since every worker_thread loads the same
// addon image and shares these globals. Lookups return shared_ptr so an object stays alive while an
// AsyncWorker uses it even if JS releases the handle meanwhile.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/errors.h"

namespace kvd {

template <typename T>
class HandleRegistry {
 public:
  explicit HandleRegistry(const char* kind) : kind_(kind) {}
  int32_t Add(std::shared_ptr<T> obj) {
    std::lock_guard<std::mutex> g(mu_);
    int32_t id = next_++;
    map_[id] = std::move(obj);
    return id;
  }
  // Throws E_CLOSED for an unknown or released handle.
  std::shared_ptr<T> Get(int64_t id) const {
    std::lock_guard<std::mutex> g(mu_);
    auto it = id == int64_t(int32_t(id)) ? map_.find(int32_t(id)) : map_.end();
    if (it == map_.end())
      Throw("E_CLOSED", std::string(kind_) + " handle " + std::to_string(id) + ": expected an open handle, got a closed or unknown one");
    return it->second;
  }
  bool Remove(int64_t id) {
    std::lock_guard<std::mutex> g(mu_);
    return id == int64_t(int32_t(id)) && map_.erase(int32_t(id)) > 0;
  }
  size_t Size() const {
    std::lock_guard<std::mutex> g(mu_);
    return map_.size();
  }

 private:
  const char* kind_;
  mutable std::mutex mu_;
  int32_t next_ = 1;
  std::unordered_map<int32_t, std::shared_ptr<T>> map_;
};

}  // namespace kvd
