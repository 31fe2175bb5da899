// I/O engines (see io_engine.h): planning and coalescing shared by both, the io_uring loop, the
// pread thread pool, and the JS bindings (engine handles, batch reads, cancel flags).
#include "storage/io_engine.h"

#include <errno.h>
#include <fcntl.h>
#include <napi.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#ifdef KVD_HAVE_LIBURING
#include <liburing.h>
#endif

#include "common/args.h"
#include "common/async_work.h"
#include "common/errors.h"
#include "common/handles.h"
#include "common/registry.h"

namespace kvd {

std::string ErrnoText(int err) {
  char buf[256];
  buf[0] = 0;
  // GNU strerror_r returns the message pointer (possibly not buf).
  const char* s = strerror_r(err, buf, sizeof buf);
  return std::string(s ? s : buf) + " (errno " + std::to_string(err) + ")";
}

OpenFile::~OpenFile() {
  if (map) ::munmap(const_cast<uint8_t*>(map), mapBytes);
  if (fd >= 0) ::close(fd);
}

// One physical read. `need` is how many bytes from `offset` must arrive (the last requested byte);
// `length` may be larger (O_DIRECT rounding past end of file is fine as long as `need` arrives).
struct IoEngine::Phys {
  std::shared_ptr<OpenFile> file;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t need = 0;
  uint8_t* target = nullptr;  // direct destination, or null: use a bounce slot
  int slot = -1;
  uint64_t done = 0;
  std::vector<ReadReq> parts;  // requests served by this read (copied out of the slot)
  std::vector<uint32_t> origs; // caller's request index of each part
};

namespace {

uint64_t AlignDown(uint64_t v) { return v & ~(kIoAlign - 1); }
uint64_t AlignUp(uint64_t v) { return (v + kIoAlign - 1) & ~(kIoAlign - 1); }

Error ShortRead(const IoEngine::Phys& p) {
  return Error("E_CORRUPT", "short read: " + p.file->path + " ends at byte " + std::to_string(p.offset + p.done) +
                                ", expected at least " + std::to_string(p.offset + p.need) + " bytes (a truncated file)");
}
Error ReadFailed(const IoEngine::Phys& p, int err) {
  return Error("E_IO", "reading " + p.file->path + " at offset " + std::to_string(p.offset + p.done) + " (" +
                           std::to_string(p.length - p.done) + " bytes): " + ErrnoText(err));
}

}  // namespace

void IoEngine::Complete(Phys& p, uint8_t* slot, Batch& b) {
  for (size_t k = 0; k < p.parts.size(); ++k) {
    const ReadReq& r = p.parts[k];
    if (!r.dest) {  // in-place delivery (never split, so this is the whole request)
      if (b.onDone) (*b.onDone)(p.origs[k], slot + (r.offset - p.offset));
      continue;
    }
    if (!p.target) std::memcpy(r.dest, slot + (r.offset - p.offset), r.length);
    if (b.onDone && b.pending[p.origs[k]].fetch_sub(1) == 1) (*b.onDone)(p.origs[k], nullptr);
  }
}

IoEngine::IoEngine(IoOptions o) : opt_(o), slotBytes_(o.maxIoBytes + 2 * kIoAlign) {}

std::vector<uint8_t*> IoEngine::AllocSlots(int n) {
  std::vector<uint8_t*> slots;
  for (int i = 0; i < n; ++i) {
    void* p = std::aligned_alloc(kIoAlign, slotBytes_);
    if (!p) {
      FreeSlots(slots);
      throw std::bad_alloc();
    }
    // Touched now: the resident set holds the slot from here on, as the memory plan reserves it
    // (a slot first used much later would otherwise show up in the resident set only then).
    std::memset(p, 0, slotBytes_);
    slots.push_back(static_cast<uint8_t*>(p));
    bufferBytes_ += slotBytes_;
  }
  return slots;
}

void IoEngine::FreeSlots(std::vector<uint8_t*>& slots) {
  for (uint8_t* s : slots) std::free(s);
  bufferBytes_ -= slots.size() * slotBytes_;
  slots.clear();
}

namespace {
// Test hook (ioTestHooks({ batchBarrier: n })): every batch, once counted as in flight, waits until
// n batches are in flight at once (or 2 s passed) before it reads, so a test can tell whether an
// engine lets concurrent callers' batches run side by side. 0 = off.
std::atomic<int> g_batchBarrier{0};
}  // namespace

void SetBatchBarrierForTest(int n) { g_batchBarrier = n; }

int32_t IoEngine::Open(const std::string& path, bool direct, bool* directOut) {
  direct = direct && SupportsDirect();
  int flags = O_RDONLY | O_CLOEXEC;
  int fd = ::open(path.c_str(), flags | (direct ? O_DIRECT : 0));
  bool isDirect = direct;
  if (fd < 0 && direct && errno == EINVAL) {  // file system without O_DIRECT (e.g. old tmpfs)
    fd = ::open(path.c_str(), flags);
    isDirect = false;
  }
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) Throw("E_NOT_FOUND", "opening " + path + ": expected an existing file, got " + ErrnoText(err));
    Throw("E_IO", "opening " + path + ": " + ErrnoText(err));
  }
  auto f = std::make_shared<OpenFile>();
  f->fd = fd;
  f->path = path;
  f->direct = isDirect;
  if (directOut) *directOut = isDirect;
  std::lock_guard<std::mutex> g(filesMu_);
  for (size_t i = 0; i < files_.size(); ++i)
    if (!files_[i]) {
      files_[i] = f;
      return int32_t(i);
    }
  files_.push_back(f);
  return int32_t(files_.size() - 1);
}

void IoEngine::Close(int32_t file) {
  std::lock_guard<std::mutex> g(filesMu_);
  if (file >= 0 && size_t(file) < files_.size()) files_[file].reset();
}

std::shared_ptr<OpenFile> IoEngine::File(int32_t file) const {
  std::lock_guard<std::mutex> g(filesMu_);
  if (file < 0 || size_t(file) >= files_.size() || !files_[file])
    Throw("E_RANGE", "read request: expected an open file id, got " + std::to_string(file));
  return files_[file];
}

IoStats IoEngine::ReadBatch(const std::vector<ReadReq>& in, const std::atomic<bool>* cancel, const DoneFn* onDone) {
  IoStats st;
  // 1. Resolve files and split long requests.
  struct Item {
    ReadReq r;
    std::shared_ptr<OpenFile> f;
    uint32_t orig;
  };
  std::vector<Item> items;
  items.reserve(in.size());
  std::unique_ptr<std::atomic<uint32_t>[]> pending(new std::atomic<uint32_t>[in.size() ? in.size() : 1]);
  std::vector<size_t> empty;
  for (size_t i = 0; i < in.size(); ++i) {
    const ReadReq& r = in[i];
    pending[i] = uint32_t((r.length + opt_.maxIoBytes - 1) / opt_.maxIoBytes);
    if (r.length == 0) {
      empty.push_back(i);
      continue;
    }
    auto f = File(r.file);
    if (!r.dest && r.length > opt_.maxIoBytes)
      Throw("E_RANGE", "read request " + std::to_string(i) + ": in-place delivery expects length <= maxIoBytes " +
                           std::to_string(opt_.maxIoBytes) + ", got " + std::to_string(r.length));
    for (uint64_t at = 0; at < r.length; at += opt_.maxIoBytes) {
      uint64_t len = std::min(opt_.maxIoBytes, r.length - at);
      items.push_back({ReadReq{r.file, r.offset + at, len, r.dest ? r.dest + at : nullptr}, f, uint32_t(i)});
      st.bytesRequested += len;
    }
  }
  if (onDone)
    for (size_t i : empty) (*onDone)(i, nullptr);
  st.requests = items.size();
  if (items.empty()) return st;
  // 2. Sort by (file, offset) and coalesce neighbours.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.r.file != b.r.file ? a.r.file < b.r.file : a.r.offset < b.r.offset;
  });
  std::vector<Phys> ops;
  size_t i = 0;
  while (i < items.size()) {
    Phys p;
    p.file = items[i].f;
    uint64_t s = items[i].r.offset, e = s + items[i].r.length;
    p.parts.push_back(items[i].r);
    p.origs.push_back(items[i].orig);
    size_t j = i + 1;
    while (opt_.coalesce && j < items.size() && items[j].r.file == items[i].r.file &&
           items[j].r.offset <= e + opt_.coalesceGapBytes &&
           std::max(e, items[j].r.offset + items[j].r.length) - s <= opt_.maxIoBytes) {
      e = std::max(e, items[j].r.offset + items[j].r.length);
      p.parts.push_back(items[j].r);
      p.origs.push_back(items[j].orig);
      ++j;
    }
    bool direct = p.file->direct;
    p.offset = direct ? AlignDown(s) : s;
    uint64_t end = direct ? AlignUp(e) : e;
    p.length = end - p.offset;
    p.need = e - p.offset;
    // Straight into caller memory when the parts tile [s, e) in order in both file and memory.
    bool tiles = p.parts[0].dest != nullptr;
    for (size_t k = 1; k < p.parts.size() && tiles; ++k)
      tiles = p.parts[k].offset == p.parts[k - 1].offset + p.parts[k - 1].length &&
              p.parts[k].dest && p.parts[k].dest == p.parts[k - 1].dest + p.parts[k - 1].length;
    if (tiles && direct)
      tiles = p.offset == s && end == e && (reinterpret_cast<uintptr_t>(p.parts[0].dest) % kIoAlign) == 0;
    if (tiles) p.target = p.parts[0].dest;
    ops.push_back(std::move(p));
    i = j;
  }
  // 3. Execute (the engine decides whether concurrent batches wait for each other).
  Batch b;
  b.onDone = onDone;
  b.pending = std::move(pending);
  Run(ops, cancel, st, b);
  return st;
}

// Counts a batch in flight from the moment an engine starts serving it (after any wait for a
// ring or for the pread pool) until it returns; keeps the engine's peak.
class IoEngine::InFlight {
 public:
  explicit InFlight(IoEngine& e) : e_(e) {
    const int now = ++e.activeBatches_;
    int peak = e.peakBatches_.load();
    while (now > peak && !e.peakBatches_.compare_exchange_weak(peak, now)) {
    }
    const int want = g_batchBarrier.load();
    if (want > 0) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (e.activeBatches_.load() < want && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~InFlight() { --e_.activeBatches_; }

 private:
  IoEngine& e_;
};

// ---------------------------------------------------------------------------------------------
// pread thread pool

namespace {

class PreadEngine : public IoEngine {
 public:
  explicit PreadEngine(IoOptions o) : IoEngine(o) {
    int n = std::max(1, o.threads);
    bufferBytesMax_ = uint64_t(n) * slotBytes_;
    slots_ = AllocSlots(n);
    for (int t = 0; t < n; ++t) workers_.emplace_back([this, t] { Loop(t); });
  }
  ~PreadEngine() override {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    FreeSlots(slots_);
  }
  const char* Kind() const override { return "pread"; }

 protected:
  // One batch at a time: the pool's threads are its queue depth, shared by nobody else.
  void Run(std::vector<Phys>& ops, const std::atomic<bool>* cancel, IoStats& st, Batch& b) override {
    std::lock_guard<std::mutex> serial(runMu_);
    InFlight counted(*this);
    std::unique_lock<std::mutex> lk(m_);
    batch_ = &b;
    ops_ = &ops;
    cancel_ = cancel;
    next_ = 0;
    failed_ = false;
    error_.reset();
    job_ = IoStats();
    active_ = int(workers_.size());
    ++generation_;
    cv_.notify_all();
    doneCv_.wait(lk, [&] { return active_ == 0; });
    ops_ = nullptr;
    batch_ = nullptr;
    st.Add(job_);
    if (error_) throw *error_;
  }

 private:
  void Loop(int t) {
    uint64_t seen = 0;
    for (;;) {
      std::vector<Phys>* ops;
      Batch* batch;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        ops = ops_;
        batch = batch_;
      }
      IoStats mine;
      for (;;) {
        if (failed_.load()) break;
        if (cancel_ && cancel_->load()) {
          mine.cancelled = true;
          break;
        }
        size_t k = next_.fetch_add(1);
        if (k >= ops->size()) break;
        Phys& p = (*ops)[k];
        uint8_t* buf = p.target ? p.target : slots_[t];
        try {
          while (p.done < p.need) {
            ssize_t r = ::pread(p.file->fd, buf + p.done, p.length - p.done, off_t(p.offset + p.done));
            mine.ios++;
            if (r < 0) {
              if (errno == EINTR || errno == EAGAIN) continue;
              throw ReadFailed(p, errno);
            }
            if (r == 0) throw ShortRead(p);
            p.done += uint64_t(r);
            mine.bytesRead += uint64_t(r);
          }
          if (!p.target) mine.bounced++;
          Complete(p, buf, *batch);
        } catch (const Error& e) {
          std::lock_guard<std::mutex> g(m_);
          if (!error_) error_ = std::make_unique<Error>(e);
          failed_ = true;
          break;
        }
      }
      std::lock_guard<std::mutex> g(m_);
      job_.Add(mine);
      if (--active_ == 0) doneCv_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::vector<uint8_t*> slots_;  // one bounce slot per worker thread
  std::mutex runMu_;             // held by the batch being served
  Batch* batch_ = nullptr;
  std::mutex m_;
  std::condition_variable cv_, doneCv_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  int active_ = 0;
  std::vector<Phys>* ops_ = nullptr;
  const std::atomic<bool>* cancel_ = nullptr;
  std::atomic<size_t> next_{0};
  std::atomic<bool> failed_{false};
  std::unique_ptr<Error> error_;
  IoStats job_;
};

// ---------------------------------------------------------------------------------------------
// io_uring

bool UringDisabledByEnv() {
  const char* e = std::getenv("KVDRIVE_IO_URING_DISABLE");
  return e && std::string(e) == "1";
}

#ifdef KVD_HAVE_LIBURING
// One ring per batch in flight: a batch takes an idle ring (creating one, up to maxBatches, when
// none is idle; waiting when maxBatches are busy), runs its reads on it alone and gives it back.
// Each ring owns its bounce slots, so concurrent batches share nothing but the files; the device
// sees their reads side by side (at most maxBatches x queueDepth in flight).
class UringEngine : public IoEngine {
  struct Ring {
    io_uring ring{};
    std::vector<uint8_t*> slots;  // aligned bounce slots, owned
    bool fixed = false;           // slots registered as fixed buffers
    uint64_t mapBytes = 0;        // the SQ/CQ rings and SQE array mapped into the process
  };

 public:
  // Returns the negative errno of a refused ring setup through `err` (engine unusable then). The
  // first ring is made here, so a kernel that refuses rings is known at creation (pread fallback).
  UringEngine(IoOptions o, int* err) : IoEngine(o) {
    *err = UringDisabledByEnv() ? ENOSYS : 0;
    if (*err) return;
    std::unique_ptr<Ring> r = MakeRing(err);
    if (*err) return;
    // Every ring is made with the same options, so the first one's size is each one's.
    bufferBytesMax_ = uint64_t(std::max(1, opt_.maxBatches)) * (2 * uint64_t(opt_.queueDepth) * slotBytes_ + r->mapBytes);
    fixedActive_ = r->fixed;
    idle_.push_back(r.get());
    rings_.push_back(std::move(r));
  }
  ~UringEngine() override {
    for (auto& r : rings_) DestroyRing(*r);
  }
  const char* Kind() const override { return "io_uring"; }

 protected:
  void Run(std::vector<Phys>& ops, const std::atomic<bool>* cancel, IoStats& st, Batch& b) override {
    Ring& r = Acquire();
    struct Give {
      UringEngine* e;
      Ring* r;
      ~Give() { e->Release(r); }
    } give{this, &r};
    InFlight counted(*this);
    RunOn(r, ops, cancel, st, b);
  }

 private:
  std::unique_ptr<Ring> MakeRing(int* err) {
    auto r = std::make_unique<Ring>();
    *err = -io_uring_queue_init(unsigned(opt_.queueDepth), &r->ring, 0);
    if (*err) return r;
    // With IORING_FEAT_SINGLE_MMAP the SQ and CQ rings share one mapping (liburing then gives both
    // the larger size).
    const bool single = r->ring.features & IORING_FEAT_SINGLE_MMAP;
    r->mapBytes = uint64_t(r->ring.sq.ring_sz) + (single ? 0 : uint64_t(r->ring.cq.ring_sz)) +
                  uint64_t(r->ring.sq.ring_entries) * sizeof(io_uring_sqe);
    bufferBytes_ += r->mapBytes;
    // Twice the queue depth: completed reads keep their slot until copied out, which happens after
    // the ring has been refilled (see RunOn), so a full queue of new reads must still find slots.
    try {
      r->slots = AllocSlots(2 * opt_.queueDepth);
    } catch (...) {
      io_uring_queue_exit(&r->ring);
      bufferBytes_ -= r->mapBytes;
      throw;
    }
    if (opt_.fixedBuffers) {
      std::vector<iovec> iov(r->slots.size());
      for (size_t i = 0; i < r->slots.size(); ++i) iov[i] = {r->slots[i], size_t(slotBytes_)};
      // Fails with ENOMEM under a small RLIMIT_MEMLOCK: plain reads into the same slots then.
      r->fixed = io_uring_register_buffers(&r->ring, iov.data(), unsigned(iov.size())) == 0;
    }
    return r;
  }
  void DestroyRing(Ring& r) {
    if (r.fixed) io_uring_unregister_buffers(&r.ring);
    io_uring_queue_exit(&r.ring);
    bufferBytes_ -= r.mapBytes;
    FreeSlots(r.slots);
  }
  Ring& Acquire() {
    std::unique_lock<std::mutex> lk(ringMu_);
    for (;;) {
      if (!idle_.empty()) {
        Ring* r = idle_.back();
        idle_.pop_back();
        return *r;
      }
      if (int(rings_.size()) < (cap_ ? cap_ : std::max(1, opt_.maxBatches))) {
        int err = 0;
        std::unique_ptr<Ring> r = MakeRing(&err);
        // A ring refused now (e.g. RLIMIT_MEMLOCK or the kernel's ring limit reached): this batch
        // waits for a busy one instead, as with maxBatches reached.
        if (!err) {
          rings_.push_back(std::move(r));
          return *rings_.back();
        }
        if (rings_.empty()) Throw("E_IO", "io_uring_queue_init refused: " + ErrnoText(err));
        cap_ = int(rings_.size());
      }
      ringCv_.wait(lk, [&] { return !idle_.empty(); });
    }
  }
  void Release(Ring* r) {
    {
      std::lock_guard<std::mutex> g(ringMu_);
      idle_.push_back(r);
    }
    ringCv_.notify_one();
  }

  void RunOn(Ring& rg, std::vector<Phys>& ops, const std::atomic<bool>* cancel, IoStats& st, Batch& b) {
    io_uring& ring_ = rg.ring;
    std::vector<uint8_t*>& slots_ = rg.slots;
    const bool fixedActive = rg.fixed;
    std::vector<int> freeSlots;
    for (int s = int(slots_.size()) - 1; s >= 0; --s) freeSlots.push_back(s);
    std::deque<size_t> retry;  // partially read ops to resubmit (they keep their slot)
    size_t next = 0;
    int inflight = 0;
    std::unique_ptr<Error> error;
    auto submit = [&](size_t k) -> bool {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) return false;
      Phys& p = ops[k];
      uint8_t* buf = (p.target ? p.target : slots_[p.slot]) + p.done;
      unsigned len = unsigned(p.length - p.done);
      uint64_t off = p.offset + p.done;
      if (!p.target && fixedActive) io_uring_prep_read_fixed(sqe, p.file->fd, buf, len, off, p.slot);
      else io_uring_prep_read(sqe, p.file->fd, buf, len, off);
      io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(uintptr_t(k)));
      st.ios++;
      inflight++;
      return true;
    };
    auto release = [&](Phys& p) {
      if (p.slot >= 0) freeSlots.push_back(p.slot);
      p.slot = -1;
    };
    // Completed reads are post-processed (bounce copy-out, the caller's onDone: checksums and
    // scatter) only after the ring has been refilled and submitted, so the device stays busy while
    // this thread computes.
    std::vector<size_t> doneList;
    for (;;) {
      while (!error && inflight < opt_.queueDepth) {
        if (!retry.empty()) {
          if (!submit(retry.front())) break;
          retry.pop_front();
          continue;
        }
        if (next >= ops.size()) break;
        if (cancel && cancel->load()) {
          st.cancelled = true;
          break;
        }
        Phys& p = ops[next];
        if (!p.target) {
          if (freeSlots.empty()) break;
          p.slot = freeSlots.back();
          freeSlots.pop_back();
        }
        if (!submit(next)) {
          release(p);
          break;
        }
        ++next;
      }
      if (inflight == 0 && doneList.empty()) break;
      if (inflight > 0) {
        int r = doneList.empty() ? io_uring_submit_and_wait(&ring_, 1) : io_uring_submit(&ring_);
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY && !error)
          error = std::make_unique<Error>("E_IO", "io_uring_submit: " + ErrnoText(-r));
      }
      for (size_t k : doneList) {
        Phys& p = ops[k];
        if (!p.target) st.bounced++;
        Complete(p, p.slot >= 0 ? slots_[p.slot] : nullptr, b);
        release(p);
      }
      doneList.clear();
      io_uring_cqe* cqe;
      while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
        size_t k = size_t(reinterpret_cast<uintptr_t>(io_uring_cqe_get_data(cqe)));
        int res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        inflight--;
        Phys& p = ops[k];
        if (res == -EAGAIN || res == -EINTR) {
          if (!error) retry.push_back(k);
          else release(p);
          continue;
        }
        if (res < 0) {
          if (!error) error = std::make_unique<Error>(ReadFailed(p, -res));
          release(p);
          continue;
        }
        if (res == 0) {
          if (!error) error = std::make_unique<Error>(ShortRead(p));
          release(p);
          continue;
        }
        p.done += uint64_t(res);
        st.bytesRead += uint64_t(res);
        if (p.done >= p.need) doneList.push_back(k);
        else if (!error) retry.push_back(k);
        else release(p);
      }
    }
    if (error) throw *error;
  }


  std::mutex ringMu_;
  std::condition_variable ringCv_;
  std::vector<std::unique_ptr<Ring>> rings_;  // every ring made, owned
  std::vector<Ring*> idle_;                   // rings no batch holds
  int cap_ = 0;                               // rings the kernel allowed, once it refused one (0: not yet)
};
#endif

HandleRegistry<IoEngine>& Engines() {
  static HandleRegistry<IoEngine> r("I/O engine");
  return r;
}
HandleRegistry<std::atomic<bool>>& CancelFlags() {
  static HandleRegistry<std::atomic<bool>> r("cancel flag");
  return r;
}

}  // namespace

bool UringBuilt() {
#ifdef KVD_HAVE_LIBURING
  return true;
#else
  return false;
#endif
}

std::string UringProbe() {
#ifdef KVD_HAVE_LIBURING
  if (UringDisabledByEnv()) return "io_uring disabled by KVDRIVE_IO_URING_DISABLE=1 (simulates ENOSYS)";
  io_uring ring;
  int r = io_uring_queue_init(2, &ring, 0);
  if (r < 0) return "io_uring_queue_init refused: " + ErrnoText(-r);
  io_uring_queue_exit(&ring);
  return "";
#else
  return "this build has no io_uring engine (liburing was not found at build time)";
#endif
}

// ---------------------------------------------------------------------------------------------
// Memory-mapped reads

namespace {

// Reads by copying from read-only mappings of the files (PROT_READ, MAP_SHARED, one per file,
// made on first use): no read syscalls and no bounce slots — in-place requests (dest == nullptr)
// get a pointer into the mapping, so the extent store verifies and scatters straight from the page
// cache. Page faults do the I/O, synchronously on the calling thread; MADV_WILLNEED over every
// range of the batch first lets the kernel read ahead for all of them at once.
//
// Touching a mapped page past the file's end raises SIGBUS, which would kill the process. So before
// a batch touches any page, each file's current size is taken (fstat) and a read reaching past it
// fails like a short read (E_CORRUPT); a file that grew gets a new mapping. Only a file truncated
// by another process while the batch copies could still fault: the store's segment files are
// immutable once written (rewritten only under a new name), which is what this mode relies on.
class MmapEngine : public IoEngine {
 public:
  explicit MmapEngine(IoOptions o) : IoEngine(o) {}
  const char* Kind() const override { return "mmap"; }

 protected:
  bool SupportsDirect() const override { return false; }

  // Concurrent batches need nothing shared: each touches its own ops and the read-only mappings.
  void Run(std::vector<Phys>& ops, const std::atomic<bool>* cancel, IoStats& st, Batch& b) override {
    InFlight counted(*this);
    const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
    for (Phys& p : ops) {
      Mapped(p);  // every size checked before any page is touched
      const uint64_t a = p.offset & ~(page - 1);
      ::madvise(const_cast<uint8_t*>(p.file->map) + a, p.offset + p.need - a, MADV_WILLNEED);
    }
    for (Phys& p : ops) {
      if (cancel && cancel->load()) {
        st.cancelled = true;
        return;
      }
      uint8_t* src = const_cast<uint8_t*>(p.file->map) + p.offset;  // read-only: Complete only reads it
      if (p.target) std::memcpy(p.target, src, p.need);
      p.done = p.need;
      st.ios++;
      st.bytesRead += p.need;
      Complete(p, src, b);
    }
  }

 private:
  // Maps p's file when needed so that [p.offset, p.offset + p.need) is mapped; E_CORRUPT when the
  // file is shorter than that now, E_IO when fstat / mmap fail.
  static void Mapped(Phys& p) {
    OpenFile& f = *p.file;
    std::lock_guard<std::mutex> g(f.mapMu);
    struct stat sb;
    if (::fstat(f.fd, &sb) != 0) Throw("E_IO", "fstat " + f.path + ": " + ErrnoText(errno));
    const uint64_t size = uint64_t(sb.st_size);
    const uint64_t end = p.offset + p.need;
    if (end > size) {
      p.done = size > p.offset ? size - p.offset : 0;
      throw ShortRead(p);
    }
    if (f.map && f.mapBytes >= end) return;
    if (f.map) ::munmap(const_cast<uint8_t*>(f.map), f.mapBytes);
    f.map = nullptr;
    f.mapBytes = 0;
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, f.fd, 0);
    if (m == MAP_FAILED) Throw("E_IO", "mmap " + f.path + " (" + std::to_string(size) + " bytes): " + ErrnoText(errno));
    f.map = static_cast<const uint8_t*>(m);
    f.mapBytes = size;
  }
};

}  // namespace

std::shared_ptr<IoEngine> CreateIoEngine(const IoOptions& o) {
  if (o.kind == IoKind::Pread) return std::make_shared<PreadEngine>(o);
  if (o.kind == IoKind::Mmap) return std::make_shared<MmapEngine>(o);
#ifdef KVD_HAVE_LIBURING
  int err = 0;
  auto u = std::make_shared<UringEngine>(o, &err);
  if (!err) return u;
  std::string why = UringDisabledByEnv() ? "io_uring disabled by KVDRIVE_IO_URING_DISABLE=1 (simulates ENOSYS)"
                                         : "io_uring_queue_init refused: " + ErrnoText(err);
  if (o.kind == IoKind::Uring) Throw("E_IO", "io_uring engine: " + why);
  auto p = std::make_shared<PreadEngine>(o);
  p->SetFallbackReason(why);
  return p;
#else
  if (o.kind == IoKind::Uring)
    Throw("E_CONFIG", "io_uring engine: expected a build with liburing, got one without (install liburing-dev and rebuild, or use engine 'pread'/'auto')");
  auto p = std::make_shared<PreadEngine>(o);
  p->SetFallbackReason("this build has no io_uring engine (liburing was not found at build time)");
  return p;
#endif
}

std::shared_ptr<IoEngine> EngineByHandle(int64_t h) { return Engines().Get(h); }
std::shared_ptr<std::atomic<bool>> CancelFlagByHandle(int64_t h) { return CancelFlags().Get(h); }

// ---------------------------------------------------------------------------------------------
// Bindings

namespace {

Napi::Value EngineCreate(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    Napi::Env env = info.Env();
    Napi::Object o = info.Length() > 0 && info[0].IsObject() ? info[0].As<Napi::Object>() : Napi::Object::New(env);
    const std::string what = "ioEngine options";
    IoOptions opt;
    Napi::Value k = o.Get("kind");
    if (!k.IsUndefined()) {
      std::string s = k.IsString() ? std::string(k.As<Napi::String>()) : "";
      if (s == "auto") opt.kind = IoKind::Auto;
      else if (s == "uring" || s == "io_uring") opt.kind = IoKind::Uring;
      else if (s == "pread") opt.kind = IoKind::Pread;
      else if (s == "mmap") opt.kind = IoKind::Mmap;
      else Throw("E_CONFIG", what + ".kind: expected 'auto', 'uring', 'pread' or 'mmap', got '" + s + "'");
    }
    opt.queueDepth = int(GetIntOr(o, "queueDepth", what, 1, 4096, opt.queueDepth));
    opt.threads = int(GetIntOr(o, "threads", what, 1, 256, std::min(opt.queueDepth, 64)));
    opt.maxBatches = int(GetIntOr(o, "maxBatches", what, 1, 64, opt.maxBatches));
    opt.maxIoBytes = uint64_t(GetIntOr(o, "maxIoBytes", what, int64_t(kIoAlign), int64_t(64) << 20, int64_t(opt.maxIoBytes)));
    if (opt.maxIoBytes % kIoAlign) Throw("E_CONFIG", what + ".maxIoBytes: expected a multiple of 4096, got " + std::to_string(opt.maxIoBytes));
    opt.coalesceGapBytes = uint64_t(GetIntOr(o, "coalesceGapBytes", what, 0, int64_t(opt.maxIoBytes), 0));
    opt.coalesce = GetBoolOr(o, "coalesce", what, true);
    opt.fixedBuffers = GetBoolOr(o, "fixedBuffers", what, true);
    auto e = CreateIoEngine(opt);
    int32_t h = Engines().Add(e);
    Napi::Object r = Napi::Object::New(env);
    r.Set("handle", h);
    r.Set("kind", e->Kind());
    r.Set("fallbackReason", e->FallbackReason());
    r.Set("fixedBuffers", e->FixedBuffersActive());
    r.Set("queueDepth", opt.queueDepth);
    r.Set("threads", opt.threads);
    r.Set("maxBatches", opt.maxBatches);
    r.Set("maxIoBytes", double(opt.maxIoBytes));
    r.Set("coalesce", opt.coalesce);
    r.Set("coalesceGapBytes", double(opt.coalesceGapBytes));
    r.Set("bufferBytes", double(e->BufferBytesMax()));
    return r;
  });
}

Napi::Value EngineRelease(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    return Napi::Boolean::New(info.Env(), Engines().Remove(HandleArg(info, 0, "ioEngineRelease")));
  });
}

Napi::Value EngineOpen(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto e = EngineByHandle(HandleArg(info, 0, "ioEngineOpen"));
    if (info.Length() < 2 || !info[1].IsString()) Throw("E_TYPE", "ioEngineOpen: expected a path string");
    bool direct = info.Length() > 2 && info[2].IsBoolean() && info[2].As<Napi::Boolean>().Value();
    bool isDirect = false;
    int32_t f = e->Open(info[1].As<Napi::String>(), direct, &isDirect);
    Napi::Object r = Napi::Object::New(info.Env());
    r.Set("file", f);
    r.Set("direct", isDirect);
    return r;
  });
}

// ioEngineDropCache(handle, file): asks the kernel to drop the file's clean pages from the page cache
// (posix_fadvise DONTNEED), so the next buffered or memory-mapped read of it comes from the device:
// how benchmarks compare cold reads across engines without touching the whole machine's cache.
Napi::Value EngineDropCache(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto e = EngineByHandle(HandleArg(info, 0, "ioEngineDropCache"));
    auto f = e->File(int32_t(HandleArg(info, 1, "ioEngineDropCache(file)")));
    const int r = ::posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
    if (r != 0) Throw("E_IO", "posix_fadvise(DONTNEED) " + f->path + ": " + ErrnoText(r));
    return info.Env().Undefined();
  });
}

Napi::Value EngineCloseFile(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto e = EngineByHandle(HandleArg(info, 0, "ioEngineCloseFile"));
    e->Close(int32_t(HandleArg(info, 1, "ioEngineCloseFile(file)")));
    return info.Env().Undefined();
  });
}

Napi::Object StatsObject(Napi::Env env, const IoStats& s) {
  Napi::Object r = Napi::Object::New(env);
  r.Set("requests", double(s.requests));
  r.Set("ios", double(s.ios));
  r.Set("bytesRequested", double(s.bytesRequested));
  r.Set("bytesRead", double(s.bytesRead));
  r.Set("bounced", double(s.bounced));
  r.Set("cancelled", s.cancelled);
  return r;
}

// ioEngineRead(handle, {files, offsets, lengths, dest, destOffsets}, cancelHandle?) -> Promise<stats>
Napi::Value EngineRead(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    Napi::Env env = info.Env();
    auto e = EngineByHandle(HandleArg(info, 0, "ioEngineRead"));
    if (info.Length() < 2 || !info[1].IsObject()) Throw("E_TYPE", "ioEngineRead: expected a request object");
    Napi::Object o = info[1].As<Napi::Object>();
    auto files = GetI32(o.Get("files"), "ioEngineRead.files");
    auto offs = GetArray<double>(o.Get("offsets"), napi_float64_array, "ioEngineRead.offsets");
    auto lens = GetArray<double>(o.Get("lengths"), napi_float64_array, "ioEngineRead.lengths");
    auto dofs = GetArray<double>(o.Get("destOffsets"), napi_float64_array, "ioEngineRead.destOffsets");
    auto dest = GetArray<uint8_t>(o.Get("dest"), napi_uint8_array, "ioEngineRead.dest");
    ExpectLength(offs.length, files.length, "ioEngineRead.offsets");
    ExpectLength(lens.length, files.length, "ioEngineRead.lengths");
    ExpectLength(dofs.length, files.length, "ioEngineRead.destOffsets");
    std::vector<ReadReq> reqs(files.length);
    for (size_t i = 0; i < files.length; ++i) {
      double off = offs.data[i], len = lens.data[i], d = dofs.data[i];
      if (!IsIntIn(off, 0, int64_t(1) << 53) || !IsIntIn(len, 0, int64_t(1) << 53) || !IsIntIn(d, 0, int64_t(1) << 53))
        Throw("E_RANGE", "ioEngineRead request " + std::to_string(i) + ": expected non-negative integer offset/length/destOffset, got " +
                             Num(off) + "/" + Num(len) + "/" + Num(d));
      if (uint64_t(d) > dest.length || uint64_t(len) > dest.length - uint64_t(d))
        Throw("E_RANGE", "ioEngineRead request " + std::to_string(i) + ": expected destOffset+length <= dest.byteLength " +
                             std::to_string(dest.length) + ", got " + Num(d + len));
      e->File(files.data[i]);  // validates the id now, on the JS thread
      reqs[i] = ReadReq{files.data[i], uint64_t(off), uint64_t(len), dest.data + uint64_t(d)};
    }
    std::shared_ptr<std::atomic<bool>> cancel;
    if (info.Length() > 2 && info[2].IsNumber()) cancel = CancelFlagByHandle(HandleArg(info, 2, "ioEngineRead(cancel)"));
    auto stats = std::make_shared<IoStats>();
    return PromiseWorker::Start(
        env, [e, reqs, cancel, stats] { *stats = e->ReadBatch(reqs, cancel.get()); },
        [stats](Napi::Env env) -> Napi::Value { return StatsObject(env, *stats); }, {dest.object});
  });
}

Napi::Value UringAvailable(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    Napi::Object r = Napi::Object::New(info.Env());
    std::string why = UringProbe();
    r.Set("built", UringBuilt());
    r.Set("usable", why.empty());
    r.Set("reason", why);
    return r;
  });
}

Napi::Value CancelCreate(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    return Napi::Number::New(info.Env(), CancelFlags().Add(std::make_shared<std::atomic<bool>>(false)));
  });
}
Napi::Value CancelRaise(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    CancelFlagByHandle(HandleArg(info, 0, "cancelFlagRaise"))->store(true);
    return info.Env().Undefined();
  });
}
Napi::Value CancelRelease(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    return Napi::Boolean::New(info.Env(), CancelFlags().Remove(HandleArg(info, 0, "cancelFlagRelease")));
  });
}
// ioEngineStats(handle): { peakBatches: most batches in flight at once since creation, bufferBytes:
// bounce slots and rings allocated now }.
Napi::Value EngineStats(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto e = EngineByHandle(HandleArg(info, 0, "ioEngineStats"));
    Napi::Object r = Napi::Object::New(info.Env());
    r.Set("peakBatches", e->PeakConcurrentBatches());
    r.Set("bufferBytes", double(e->BufferBytes()));
    return r;
  });
}

Napi::Value IoHandleCounts(const Napi::CallbackInfo& info) {
  Napi::Object r = Napi::Object::New(info.Env());
  r.Set("engines", double(Engines().Size()));
  r.Set("cancelFlags", double(CancelFlags().Size()));
  return r;
}

void InitIoEngine(Napi::Env env, Napi::Object exports) {
  exports.Set("ioEngineCreate", Napi::Function::New(env, EngineCreate));
  exports.Set("ioEngineRelease", Napi::Function::New(env, EngineRelease));
  exports.Set("ioEngineOpen", Napi::Function::New(env, EngineOpen));
  exports.Set("ioEngineCloseFile", Napi::Function::New(env, EngineCloseFile));
  exports.Set("ioEngineDropCache", Napi::Function::New(env, EngineDropCache));
  exports.Set("ioEngineRead", Napi::Function::New(env, EngineRead));
  exports.Set("ioEngineStats", Napi::Function::New(env, EngineStats));
  exports.Set("ioUringAvailable", Napi::Function::New(env, UringAvailable));
  exports.Set("cancelFlagCreate", Napi::Function::New(env, CancelCreate));
  exports.Set("cancelFlagRaise", Napi::Function::New(env, CancelRaise));
  exports.Set("cancelFlagRelease", Napi::Function::New(env, CancelRelease));
  exports.Set("ioHandleCounts", Napi::Function::New(env, IoHandleCounts));
}

}  // namespace

KVD_REGISTER_MODULE(InitIoEngine);

}  // namespace kvd
