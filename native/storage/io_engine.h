// Batched file reads for the SSD tier: an io_uring engine (liburing, when the build found it), a
// pread thread-pool engine chosen at run time when io_uring is missing or refused, and a
// memory-mapped engine (asked for by name: read-only mappings, bytes taken from the page cache).
//
// A batch is a list of (file, offset, length, dest) reads; ReadBatch returns when all are done (or
// throws after draining what is in flight). Before submission the batch is planned:
//  - requests longer than maxIoBytes are split;
//  - requests are sorted by (file, offset) and neighbours (gap <= coalesceGapBytes, merged size <=
//    maxIoBytes) are merged into one physical read;
//  - a physical read goes straight into the caller's memory when that is possible (its requests are
//    contiguous in the file and in memory, and, for O_DIRECT files, offset/length/address are
//    aligned), else into a bounce slot (aligned, registered with the ring as a fixed buffer) and the
//    requested bytes are copied out on completion.
// At most queueDepth physical reads are in flight per batch.
//
// Memory an engine owns (what the runtime's memory plan reserves inside dramBudget; BufferBytesMax):
//  - io_uring: per ring, 2 x queueDepth bounce slots of maxIoBytes + 2 * kIoAlign bytes plus the
//    ring's SQ/CQ mappings; the first ring at creation, one more per batch in flight beyond the rings
//    made so far (up to maxBatches), each kept until the engine is destroyed;
//  - pread: one slot per pool thread, at creation, until destroyed;
//  - mmap: no slots (its mapped page-cache pages are the files', not counted here).
// Slots are touched when allocated (and pinned when registered as fixed buffers), so the resident
// set holds what BufferBytes() says from the start, never more than BufferBytesMax().
//
// Errors: E_IO with the errno text and file name; E_CORRUPT when the file ends before a requested
// byte (short read); E_RANGE for an unknown file id. Engines are thread-safe. Batches from
// concurrent callers run concurrently on the io_uring engine (up to maxBatches, one ring each, so
// a step's reads never queue behind another step's whole batch) and the mmap engine; the pread
// engine's thread pool serves one batch at a time (its threads are the queue depth).
#pragma once
#include <atomic>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kvd {

constexpr uint64_t kIoAlign = 4096;  // O_DIRECT alignment for offset, length and buffer address

enum class IoKind { Auto, Uring, Pread, Mmap };

// The defaults here are the binding's too (ioEngine options, src/storage/io-engine.ts documents them).
struct IoOptions {
  IoKind kind = IoKind::Auto;
  int queueDepth = 32;                   // physical reads in flight per batch (uring) / worker threads (pread)
  int maxBatches = 4;                    // batches in flight at once (uring: one ring + bounce slots each)
  int threads = 32;                      // pread pool size (the binding: min(queueDepth, 64) unless given)
  uint64_t maxIoBytes = 256 << 10;       // largest physical read after coalescing
  uint64_t coalesceGapBytes = 0;         // merge neighbours separated by at most this many bytes
  bool coalesce = true;
  bool fixedBuffers = true;              // register bounce slots with the ring (uring only)
};

// dest == nullptr asks for in-place delivery: the bytes are read into a (registered) bounce slot
// and handed to onDone(i, pointer) without a copy; the pointer is valid only during that call.
// Such requests must not exceed maxIoBytes (they are never split).
struct ReadReq {
  int32_t file;
  uint64_t offset;
  uint64_t length;
  uint8_t* dest;
};

struct IoStats {
  uint64_t requests = 0;       // logical requests after splitting
  uint64_t ios = 0;            // physical reads submitted (including resubmissions of partial reads)
  uint64_t bytesRequested = 0; // sum of request lengths
  uint64_t bytesRead = 0;      // bytes transferred from files (>= requested with gaps/alignment)
  uint64_t bounced = 0;        // physical reads that went through a bounce slot
  bool cancelled = false;      // stopped early because the cancel flag was raised
  void Add(const IoStats& o) {
    requests += o.requests; ios += o.ios; bytesRequested += o.bytesRequested; bytesRead += o.bytesRead;
    bounced += o.bounced; cancelled = cancelled || o.cancelled;
  }
};

struct OpenFile {
  int fd = -1;
  std::string path;
  bool direct = false;
  // The mmap engine's read-only mapping of the file's first mapBytes bytes (null until first read).
  std::mutex mapMu;
  const uint8_t* map = nullptr;
  uint64_t mapBytes = 0;
  ~OpenFile();
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  virtual const char* Kind() const = 0;
  const IoOptions& Options() const { return opt_; }
  // Why Auto did not get io_uring ("" when it did or was not asked for).
  const std::string& FallbackReason() const { return fallbackReason_; }
  bool FixedBuffersActive() const { return fixedActive_; }

  // Opens `path` read-only (O_DIRECT when asked and supported by the file system and the engine;
  // returns whether O_DIRECT is in effect through `directOut`). Returns a file id for ReadReq.
  int32_t Open(const std::string& path, bool direct, bool* directOut = nullptr);
  void Close(int32_t file);
  std::shared_ptr<OpenFile> File(int32_t file) const;

  // Reads every request fully. `cancel` (optional) is polled before each submission: when raised,
  // nothing more is submitted, in-flight reads are drained and stats.cancelled is set.
  // `onDone(i, data)` (optional) runs as soon as request i's bytes are in place, while other reads
  // are still in flight (consumers verify and scatter there, overlapping with I/O); `data` is the
  // in-place pointer for dest == nullptr requests, else nullptr (the bytes are at dest). It runs on
  // the submitting thread (io_uring) or on pool threads concurrently (pread) and must not throw.
  using DoneFn = std::function<void(size_t, const uint8_t*)>;
  IoStats ReadBatch(const std::vector<ReadReq>& reqs, const std::atomic<bool>* cancel = nullptr, const DoneFn* onDone = nullptr);

  // Most batches that were in flight at the same time since the engine was created.
  int PeakConcurrentBatches() const { return peakBatches_.load(); }
  // Bytes of bounce slots and rings allocated now, and the most this engine's options let it
  // allocate (see the header comment); both 0 for mmap.
  uint64_t BufferBytes() const { return bufferBytes_.load(); }
  uint64_t BufferBytesMax() const { return bufferBytesMax_; }

  struct Phys;  // a planned physical read (defined in io_engine.cc)

  // What one ReadBatch call owns while it runs (engines keep no per-batch state of their own, so
  // batches of concurrent callers cannot see each other's callbacks or counters).
  struct Batch {
    const DoneFn* onDone = nullptr;
    std::unique_ptr<std::atomic<uint32_t>[]> pending;  // pieces left per caller request
  };

 protected:
  explicit IoEngine(IoOptions o);
  // Whether O_DIRECT means anything to this engine (the mmap engine reads through the page cache).
  virtual bool SupportsDirect() const { return true; }
  // n aligned bounce slots of slotBytes_ (maxIoBytes + 2 * kIoAlign), touched, counted in
  // BufferBytes(), owned by the caller: free them with FreeSlots.
  std::vector<uint8_t*> AllocSlots(int n);
  void FreeSlots(std::vector<uint8_t*>& slots);
  virtual void Run(std::vector<Phys>& ops, const std::atomic<bool>* cancel, IoStats& st, Batch& b) = 0;
  // A physical read finished: copy its parts out of the bounce slot (when it used one) and notify
  // the batch's requests whose last piece this was.
  static void Complete(Phys& p, uint8_t* slot, Batch& b);
  class InFlight;  // RAII: counts a batch in flight while an engine serves it (defined in io_engine.cc)

  IoOptions opt_;
  std::string fallbackReason_;
  bool fixedActive_ = false;
  uint64_t slotBytes_ = 0;
  uint64_t bufferBytesMax_ = 0;          // set by each engine's constructor from its options
  std::atomic<uint64_t> bufferBytes_{0};  // slots (and rings) allocated now
  std::atomic<int> activeBatches_{0}, peakBatches_{0};
  mutable std::mutex filesMu_;
  std::vector<std::shared_ptr<OpenFile>> files_;  // index = file id
 public:
  void SetFallbackReason(std::string why) { fallbackReason_ = std::move(why); }
};

// Creates an engine. Auto: io_uring if built and the kernel accepts the ring, else pread (reason in
// FallbackReason()). Uring forced: E_CONFIG when not built, E_IO when the kernel refuses.
std::shared_ptr<IoEngine> CreateIoEngine(const IoOptions& o);
// Whether this build has the io_uring engine, and whether the kernel accepts a ring now ("" if so).
bool UringBuilt();
std::string UringProbe();

// Test hook: batches wait until n are in flight at once (2 s at most) before reading; 0 = off.
// Reachable from JS only through ioTestHooks, which exists only with KVDRIVE_TEST_HOOKS=1 (extent_store.cc).
void SetBatchBarrierForTest(int n);

// Process-global engine lookup by handle (see handles.h).
std::shared_ptr<IoEngine> EngineByHandle(int64_t h);

// Cancel flags reachable by handle, raised from JS to stop a read early (prefetch cancellation).
std::shared_ptr<std::atomic<bool>> CancelFlagByHandle(int64_t h);

// Error text for errno (strerror_r, thread-safe).
std::string ErrnoText(int err);

}  // namespace kvd
