// Segment writer (pack + checksum + fsync + atomic rename) and reader (index parse, sparse extent
// reads through an IoEngine with crc32c verification, chunk scatter). Layout: extent_store.h.
#include "storage/extent_store.h"

#include <errno.h>
#include <fcntl.h>
#include <napi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "common/args.h"
#include "common/async_work.h"
#include "storage/crc32c.h"
#include "common/dtype.h"
#include "common/errors.h"
#include "common/handles.h"
#include "storage/io_engine.h"
#include "storage/page_spans.h"
#include "common/registry.h"

namespace kvd {
namespace {

const char kMagic[8] = {'K', 'V', 'D', 'S', 'E', 'G', 0, 1};

// Test hook: when >= 0, segment writes fail with ENOSPC once this many bytes were written in the
// current file (lets tests cover E_NOSPC where no small file system can be mounted).
std::atomic<int64_t> g_failWritesAfter{-1};

template <typename T>
void Put(std::vector<uint8_t>& b, T v) {
  size_t at = b.size();
  b.resize(at + sizeof(T));
  std::memcpy(b.data() + at, &v, sizeof(T));
}
template <typename T>
T Get(const uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return v;
}

uint64_t AlignUp(uint64_t v) { return (v + kIoAlign - 1) & ~(kIoAlign - 1); }

// ------------------------------------------------------------------------------------------------
// Writer

struct Cluster {
  std::vector<int32_t> offsets;  // nClusters + 1
  std::vector<int32_t> chunkIds; // permutation of 0..nChunks-1
};

struct WriteJob {
  std::string path;
  std::vector<KvView> k, v;  // per layer
  int chunkSize = 4;
  std::vector<Cluster> clusters;  // per region (layer * heads + head)
  // results
  uint64_t bytes = 0;
  uint64_t extents = 0;
  uint32_t indexCrc = 0;
};

void WriteAll(int fd, const uint8_t* p, size_t n, uint64_t off, uint64_t& written, const std::string& path) {
  while (n > 0) {
    size_t step = n;
    int64_t lim = g_failWritesAfter.load();
    if (lim >= 0 && int64_t(written + step) > lim) {
      step = size_t(std::max<int64_t>(0, lim - int64_t(written)));
      if (step == 0) {
        errno = ENOSPC;
        goto fail;
      }
    }
    {
      ssize_t r = ::pwrite(fd, p, step, off_t(off));
      if (r < 0) {
        if (errno == EINTR) continue;
        goto fail;
      }
      p += r;
      n -= size_t(r);
      off += uint64_t(r);
      written += uint64_t(r);
      continue;
    }
  fail:
    int err = errno;
    if (err == ENOSPC || err == EDQUOT)
      Throw("E_NOSPC", "writing segment " + path + ": no space left on the device after " + std::to_string(written) +
                           " bytes (" + ErrnoText(err) + ")");
    Throw("E_IO", "writing segment " + path + ": " + ErrnoText(err));
  }
}

void FsyncDir(const std::string& path) {
  std::string dir = path.substr(0, path.find_last_of('/'));
  if (dir.empty()) dir = "/";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) Throw("E_IO", "opening directory " + dir + " to fsync: " + ErrnoText(errno));
  int r = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (r != 0) Throw("E_IO", "fsync of directory " + dir + ": " + ErrnoText(err));
}

void RunWrite(WriteJob& job) {
  const KvView& k0 = job.k[0];
  const int L = int(job.k.size()), H = k0.heads, D = k0.dim, c = job.chunkSize;
  const size_t ds = DtypeSize(k0.dtype);
  const uint64_t rowBytes = uint64_t(D) * ds;
  const uint64_t chunkBytes = 2ull * c * rowBytes;
  const int64_t nChunks = k0.tokens / c;
  const std::string tmp = job.path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    if (err == ENOSPC) Throw("E_NOSPC", "creating segment " + tmp + ": " + ErrnoText(err));
    Throw("E_IO", "creating segment " + tmp + ": " + ErrnoText(err));
  }
  try {
    uint64_t written = 0, at = 0;
    std::vector<uint8_t> buf(size_t(nChunks * chunkBytes));
    std::vector<uint8_t> index;
    for (int l = 0; l < L; ++l) {
      for (int h = 0; h < H; ++h) {
        const Cluster& cl = job.clusters[size_t(l) * H + h];
        at = AlignUp(at);
        const uint64_t regionOffset = at;
        uint8_t* w = buf.data();
        size_t nExt = cl.offsets.size() - 1;
        Put<uint64_t>(index, regionOffset);
        Put<uint32_t>(index, uint32_t(nExt));
        Put<uint32_t>(index, uint32_t(nChunks));
        std::vector<uint32_t> crcs;  // per chunk, layout order
        crcs.reserve(size_t(nChunks));
        for (size_t e = 0; e < nExt; ++e) {
          uint8_t* extStart = w;
          for (int32_t p = cl.offsets[e]; p < cl.offsets[e + 1]; ++p) {
            int64_t j = cl.chunkIds[size_t(p)];
            uint8_t* chunkStart = w;
            for (int t = 0; t < c; ++t, w += rowBytes) std::memcpy(w, job.k[l].Row(j * c + t, h), rowBytes);
            for (int t = 0; t < c; ++t, w += rowBytes) std::memcpy(w, job.v[l].Row(j * c + t, h), rowBytes);
            crcs.push_back(Crc32c(0, chunkStart, chunkBytes));
          }
          uint32_t bytes = uint32_t(w - extStart);
          Put<uint64_t>(index, regionOffset + uint64_t(extStart - buf.data()));
          Put<uint32_t>(index, bytes);
          Put<uint32_t>(index, uint32_t(cl.offsets[e]));
          Put<uint32_t>(index, uint32_t(cl.offsets[e + 1] - cl.offsets[e]));
        }
        for (uint32_t x : crcs) Put<uint32_t>(index, x);
        for (int32_t id : cl.chunkIds) Put<int32_t>(index, id);
        job.extents += nExt;
        WriteAll(fd, buf.data(), size_t(w - buf.data()), at, written, tmp);
        at += uint64_t(w - buf.data());
      }
    }
    at = AlignUp(at);
    const uint64_t indexOffset = at;
    job.indexCrc = Crc32c(0, index.data(), index.size());
    std::vector<uint8_t> footer;
    footer.insert(footer.end(), kMagic, kMagic + 8);
    Put<uint32_t>(footer, kSegmentVersion);
    Put<uint32_t>(footer, uint32_t(k0.dtype));
    Put<uint32_t>(footer, uint32_t(L));
    Put<uint32_t>(footer, uint32_t(H));
    Put<uint32_t>(footer, uint32_t(D));
    Put<uint32_t>(footer, uint32_t(c));
    Put<uint64_t>(footer, uint64_t(k0.tokens));
    Put<uint64_t>(footer, indexOffset);
    Put<uint64_t>(footer, uint64_t(index.size()));
    Put<uint32_t>(footer, job.indexCrc);
    Put<uint32_t>(footer, Crc32c(0, footer.data(), footer.size()));
    index.insert(index.end(), footer.begin(), footer.end());
    WriteAll(fd, index.data(), index.size(), indexOffset, written, tmp);
    job.bytes = indexOffset + index.size();
    if (::fsync(fd) != 0) {
      int err = errno;
      if (err == ENOSPC) Throw("E_NOSPC", "fsync of segment " + tmp + ": " + ErrnoText(err));
      Throw("E_IO", "fsync of segment " + tmp + ": " + ErrnoText(err));
    }
    ::close(fd);
    fd = -1;
    if (::rename(tmp.c_str(), job.path.c_str()) != 0) Throw("E_IO", "renaming " + tmp + " to " + job.path + ": " + ErrnoText(errno));
    FsyncDir(job.path);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
}

// segmentWrite(path, { layers: [{k, v}], chunkSize, clusters?: [{offsets, chunkIds}], extentChunks? })
Napi::Value SegmentWrite(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    Napi::Env env = info.Env();
    if (info.Length() < 2 || !info[0].IsString() || !info[1].IsObject())
      Throw("E_TYPE", "segmentWrite: expected (path: string, spec: object)");
    auto job = std::make_shared<WriteJob>();
    job->path = info[0].As<Napi::String>();
    Napi::Object spec = info[1].As<Napi::Object>();
    job->chunkSize = int(GetInt(spec, "chunkSize", "segment", 1, 1 << 16));
    Napi::Value lv = spec.Get("layers");
    if (!lv.IsArray() || lv.As<Napi::Array>().Length() == 0)
      Throw("E_TYPE", "segment.layers: expected a non-empty array of { k, v } KV tensors");
    Napi::Array layers = lv.As<Napi::Array>();
    std::vector<Napi::Object> keep;
    for (uint32_t l = 0; l < layers.Length(); ++l) {
      Napi::Value e = layers.Get(l);
      if (!e.IsObject()) Throw("E_TYPE", "segment.layers[" + std::to_string(l) + "]: expected { k, v }");
      Napi::Object o = e.As<Napi::Object>();
      std::string w = "segment.layers[" + std::to_string(l) + "]";
      KvView k = GetKvView(o.Get("k"), w + ".k"), v = GetKvView(o.Get("v"), w + ".v");
      const KvView& ref = job->k.empty() ? k : job->k[0];
      for (const KvView* x : {&k, &v}) {
        if (x->dtype != ref.dtype || x->heads != ref.heads || x->dim != ref.dim || x->tokens != ref.tokens)
          Throw("E_SHAPE", w + ": expected every K/V tensor of the segment to be " + std::to_string(ref.tokens) + " tokens x " +
                               std::to_string(ref.heads) + " heads x " + std::to_string(ref.dim) + " " + DtypeName(ref.dtype) +
                               ", got " + std::to_string(x->tokens) + " x " + std::to_string(x->heads) + " x " +
                               std::to_string(x->dim) + " " + DtypeName(x->dtype));
      }
      keep.push_back(k.array);
      keep.push_back(v.array);
      job->k.push_back(k);
      job->v.push_back(v);
    }
    const KvView& k0 = job->k[0];
    const int c = job->chunkSize;
    if (k0.tokens == 0 || k0.tokens % c != 0)
      Throw("E_SHAPE", "segment tokens: expected a positive multiple of chunkSize " + std::to_string(c) + ", got " + std::to_string(k0.tokens));
    const int64_t nChunks = k0.tokens / c;
    if (uint64_t(nChunks) * 2 * c * k0.dim * DtypeSize(k0.dtype) > 0xffffffffull)
      Throw("E_RANGE", "segment: expected one (layer, head) region below 4 GiB, got " + std::to_string(nChunks) + " chunks");
    const size_t regions = job->k.size() * size_t(k0.heads);
    Napi::Value cv = spec.Get("clusters");
    if (cv.IsUndefined()) {
      int64_t per = GetIntOr(spec, "extentChunks", "segment", 1, 1 << 20, 4);
      Cluster d;
      for (int64_t j = 0; j < nChunks; j += per) d.offsets.push_back(int32_t(j));
      d.offsets.push_back(int32_t(nChunks));
      for (int64_t j = 0; j < nChunks; ++j) d.chunkIds.push_back(int32_t(j));
      job->clusters.assign(regions, d);
    } else {
      if (!cv.IsArray() || cv.As<Napi::Array>().Length() != regions)
        Throw("E_SHAPE", "segment.clusters: expected an array of layers*kvHeads = " + std::to_string(regions) +
                             " cluster tables, got " + (cv.IsArray() ? std::to_string(cv.As<Napi::Array>().Length()) : std::string("a non-array")));
      Napi::Array arr = cv.As<Napi::Array>();
      std::vector<uint8_t> seen(static_cast<size_t>(nChunks), 0);
      for (uint32_t r = 0; r < regions; ++r) {
        std::string w = "segment.clusters[" + std::to_string(r) + "] (layer " + std::to_string(r / k0.heads) + ", kv head " +
                        std::to_string(r % k0.heads) + ")";
        Napi::Value e = arr.Get(r);
        if (!e.IsObject()) Throw("E_TYPE", w + ": expected { offsets: Int32Array, chunkIds: Int32Array }");
        auto offs = GetI32(e.As<Napi::Object>().Get("offsets"), w + ".offsets");
        auto ids = GetI32(e.As<Napi::Object>().Get("chunkIds"), w + ".chunkIds");
        ExpectLength(ids.length, size_t(nChunks), w + ".chunkIds (every chunk exactly once)");
        if (offs.length < 2) Throw("E_SHAPE", w + ".offsets: expected nClusters + 1 >= 2 entries, got " + std::to_string(offs.length));
        CheckOffsets(offs, offs.length - 1, ids.length, w + ".offsets", "nClusters", "chunkIds");
        Cluster cl;
        for (size_t i = 0; i < offs.length; ++i) {
          if (i > 0 && offs.data[i] == offs.data[i - 1])
            Throw("E_SHAPE", w + ".offsets: expected no empty cluster, got offsets[" + std::to_string(i - 1) + "] = offsets[" +
                                 std::to_string(i) + "] = " + std::to_string(offs.data[i]));
          cl.offsets.push_back(offs.data[i]);
        }
        std::fill(seen.begin(), seen.end(), 0);
        for (size_t i = 0; i < ids.length; ++i) {
          int32_t id = ids.data[i];
          if (id < 0 || id >= nChunks)
            Throw("E_RANGE", w + ".chunkIds[" + std::to_string(i) + "]: expected a chunk id in [0, " + std::to_string(nChunks) + "), got " + std::to_string(id));
          if (seen[size_t(id)]++) Throw("E_SHAPE", w + ".chunkIds: expected each chunk once, got chunk " + std::to_string(id) + " twice");
          cl.chunkIds.push_back(id);
        }
        job->clusters.push_back(std::move(cl));
      }
    }
    return PromiseWorker::Start(
        env, [job] { RunWrite(*job); },
        [job](Napi::Env env) -> Napi::Value {
          Napi::Object r = Napi::Object::New(env);
          r.Set("bytes", double(job->bytes));
          r.Set("extents", double(job->extents));
          r.Set("indexCrc", double(job->indexCrc));
          return r;
        },
        keep);
  });
}

// ------------------------------------------------------------------------------------------------
// Reader

struct Extent {
  uint64_t offset;
  uint32_t bytes, firstPos, chunks;
};
struct Region {
  uint64_t offset = 0;
  std::vector<Extent> extents;
  std::vector<uint32_t> crcs;      // layout position -> crc32c of that chunk's bytes
  std::vector<int32_t> order;      // layout position -> chunk id
  std::vector<int32_t> posOf;      // chunk id -> layout position
  std::vector<uint32_t> extentOf;  // layout position -> extent index
};
struct Segment {
  std::shared_ptr<IoEngine> engine;
  int32_t file = -1;
  std::string path;
  bool direct = false;
  Dtype dtype = Dtype::F32;
  int layers = 0, heads = 0, dim = 0, chunkSize = 0;
  int64_t tokens = 0, chunks = 0;
  uint64_t chunkBytes = 0, fileBytes = 0;
  std::vector<Region> regions;
  ~Segment() {
    if (engine && file >= 0) engine->Close(file);
  }
};

HandleRegistry<Segment>& Segments() {
  static HandleRegistry<Segment> r("segment");
  return r;
}

[[noreturn]] void Corrupt(const std::string& path, const std::string& what) {
  Throw("E_CORRUPT", "segment " + path + ": " + what);
}

std::shared_ptr<Segment> OpenSegment(std::shared_ptr<IoEngine> engine, const std::string& path, bool direct) {
  auto s = std::make_shared<Segment>();
  s->path = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) Throw("E_NOT_FOUND", "segment " + path + ": expected an existing file, got " + ErrnoText(err));
    Throw("E_IO", "opening segment " + path + ": " + ErrnoText(err));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat stt;
  if (::fstat(fd, &stt) != 0) Throw("E_IO", "stat of segment " + path + ": " + ErrnoText(errno));
  s->fileBytes = uint64_t(stt.st_size);
  auto readAt = [&](uint8_t* dst, uint64_t n, uint64_t off, const char* what) {
    uint64_t got = 0;
    while (got < n) {
      ssize_t r = ::pread(fd, dst + got, n - got, off_t(off + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) Throw("E_IO", "reading " + std::string(what) + " of segment " + path + ": " + ErrnoText(errno));
      if (r == 0) Corrupt(path, std::string("truncated while reading its ") + what);
      got += uint64_t(r);
    }
  };
  if (s->fileBytes < kSegmentFooterBytes)
    Corrupt(path, "expected at least a 64-byte footer, got a " + std::to_string(s->fileBytes) + "-byte file (truncated)");
  uint8_t foot[kSegmentFooterBytes];
  readAt(foot, kSegmentFooterBytes, s->fileBytes - kSegmentFooterBytes, "footer");
  if (std::memcmp(foot, kMagic, 8) != 0) Corrupt(path, "footer magic missing (truncated or not a kvdrive segment)");
  const uint8_t* p = foot + 8;
  uint32_t version = Get<uint32_t>(p);
  if (version != kSegmentVersion)
    Throw("E_VERSION", "segment " + path + ": expected segment format version " + std::to_string(kSegmentVersion) + ", got " +
                           std::to_string(version) +
                           (version == 1 ? " (version 1 kept one checksum per extent, so a partial read could not be verified; "
                                           "re-create the store: segments are rebuilt from the KV by prefill)"
                                         : ""));
  uint32_t dt = Get<uint32_t>(p);
  s->layers = int(Get<uint32_t>(p));
  s->heads = int(Get<uint32_t>(p));
  s->dim = int(Get<uint32_t>(p));
  s->chunkSize = int(Get<uint32_t>(p));
  s->tokens = int64_t(Get<uint64_t>(p));
  uint64_t indexOffset = Get<uint64_t>(p), indexBytes = Get<uint64_t>(p);
  uint32_t indexCrc = Get<uint32_t>(p), footerCrc = Get<uint32_t>(p);
  if (Crc32c(0, foot, 60) != footerCrc) Corrupt(path, "footer checksum mismatch");
  // The same limits as a KV view the writer accepts (args.h), so no size below can overflow.
  if (dt > 2 || s->chunkSize <= 0 || s->chunkSize > (1 << 16) || s->heads <= 0 || s->heads > kMaxKvHeads || s->layers <= 0 ||
      s->layers > 65536 || s->dim <= 0 || s->dim > kMaxDim || s->tokens < 0 || s->tokens > kMaxTokens)
    Corrupt(path, "footer fields out of range (dtype " + std::to_string(dt) + ", layers " + std::to_string(s->layers) + ", heads " +
                      std::to_string(s->heads) + ", dim " + std::to_string(s->dim) + ", chunkSize " + std::to_string(s->chunkSize) +
                      ", tokens " + std::to_string(s->tokens) + ")");
  s->dtype = Dtype(dt);
  s->chunks = s->tokens / s->chunkSize;
  s->chunkBytes = 2ull * s->chunkSize * s->dim * DtypeSize(s->dtype);
  if (indexOffset > s->fileBytes || indexBytes > s->fileBytes || indexOffset + indexBytes + kSegmentFooterBytes != s->fileBytes)
    Corrupt(path, "expected index offset " + std::to_string(indexOffset) + " + index bytes " + std::to_string(indexBytes) +
                      " + the footer to be the file size, got a " + std::to_string(s->fileBytes) + "-byte file (truncated or extended)");
  // Each region takes at least 16 index bytes: bound the region table before allocating it.
  if (uint64_t(s->layers) * uint64_t(s->heads) > indexBytes / 16) Corrupt(path, "index ends early (fewer bytes than regions)");
  std::vector<uint8_t> index(indexBytes);
  readAt(index.data(), indexBytes, indexOffset, "index");
  if (Crc32c(0, index.data(), index.size()) != indexCrc) Corrupt(path, "index checksum mismatch");
  p = index.data();
  const uint8_t* end = index.data() + index.size();
  s->regions.resize(size_t(s->layers) * s->heads);
  for (size_t r = 0; r < s->regions.size(); ++r) {
    Region& g = s->regions[r];
    if (end - p < 16) Corrupt(path, "index ends early");
    g.offset = Get<uint64_t>(p);
    uint32_t nExt = Get<uint32_t>(p), nCh = Get<uint32_t>(p);
    if (nCh != uint64_t(s->chunks) || uint64_t(end - p) < uint64_t(nExt) * 20 + uint64_t(nCh) * 8) Corrupt(path, "index region sizes inconsistent");
    g.extents.resize(nExt);
    // Every layout position lies in exactly one extent (reads compute offsets inside it).
    g.extentOf.assign(nCh, UINT32_MAX);
    for (uint32_t e = 0; e < nExt; ++e) {
      Extent& x = g.extents[e];
      x.offset = Get<uint64_t>(p);
      x.bytes = Get<uint32_t>(p);
      x.firstPos = Get<uint32_t>(p);
      x.chunks = Get<uint32_t>(p);
      if (x.firstPos + uint64_t(x.chunks) > nCh || uint64_t(x.bytes) != uint64_t(x.chunks) * s->chunkBytes ||
          x.offset > indexOffset || x.bytes > indexOffset - x.offset)
        Corrupt(path, "index extent " + std::to_string(e) + " of region " + std::to_string(r) + " out of range");
      for (uint32_t q = x.firstPos; q < x.firstPos + x.chunks; ++q) {
        if (g.extentOf[q] != UINT32_MAX)
          Corrupt(path, "index extents " + std::to_string(g.extentOf[q]) + " and " + std::to_string(e) + " of region " +
                            std::to_string(r) + " overlap at chunk position " + std::to_string(q));
        g.extentOf[q] = e;
      }
    }
    for (uint32_t q = 0; q < nCh; ++q)
      if (g.extentOf[q] == UINT32_MAX)
        Corrupt(path, "index region " + std::to_string(r) + ": chunk position " + std::to_string(q) + " lies in no extent");
    g.crcs.resize(nCh);
    for (uint32_t q = 0; q < nCh; ++q) g.crcs[q] = Get<uint32_t>(p);
    g.order.resize(nCh);
    g.posOf.assign(nCh, -1);
    for (uint32_t q = 0; q < nCh; ++q) {
      int32_t id = Get<int32_t>(p);
      if (id < 0 || id >= int64_t(nCh) || g.posOf[size_t(id)] >= 0) Corrupt(path, "index chunk order is not a permutation");
      g.order[q] = id;
      g.posOf[size_t(id)] = int32_t(q);
    }
  }
  s->engine = engine;
  s->file = engine->Open(path, direct, &s->direct);
  return s;
}

// Reusable per-thread staging memory for runs larger than maxIoBytes (reads run on libuv pool threads; reusing
// avoids page-faulting fresh memory on every step). Grows to the largest step seen on the thread.
struct Staging {
  uint8_t* p = nullptr;
  size_t cap = 0;
  ~Staging() { std::free(p); }
  uint8_t* Get(size_t n) {
    if (n > cap) {
      std::free(p);
      cap = AlignUp(std::max<size_t>(n, cap * 3 / 2));
      p = static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, cap));
      if (!p) {
        cap = 0;
        throw std::bad_alloc();
      }
    }
    return p;
  }
};
thread_local Staging t_staging;

struct ReadItem {
  std::shared_ptr<Segment> seg;
  int region;
  const int32_t* ids;
  size_t n;
  uint8_t* dest;          // base of the caller's buffer
  const double* destOfs;  // n byte offsets into dest, one per chunk
};

struct ReadResult {
  IoStats io;
  // extents/extentBytes: the whole extents the requested chunks lie in (what a whole-extent read
  // would transfer; kept to show what chunk-granular reads save). runs: reads after coalescing.
  uint64_t extents = 0, extentBytes = 0, chunks = 0, payloadBytes = 0, runs = 0;
};

// Reads only the requested chunks: each distinct (segment, region, layout position) once, sorted
// by file offset, neighbours merged into one run when no whole untouched 4 KiB page (plus the
// engine's coalesceGapBytes) lies between them, so O_DIRECT's page alignment never reads a page
// twice. Every chunk is verified against its own crc32c before any of its bytes are copied out.
// itemDone (optional, one int32 per item): item i's flag is set to 1 (a release store) the moment
// every chunk of item i has been verified and copied out, while the rest of the batch is still
// being read, so a caller can use that item's chunks early; a flag stays 0 if the batch fails or is
// cancelled before its item landed.
void RunRead(std::vector<ReadItem>& items, const std::atomic<bool>* cancel, ReadResult& res, int32_t* itemDone = nullptr) {
  struct Need {
    Segment* seg;
    int region;
    uint32_t pos;        // layout position of the chunk in its region
    uint64_t offset;     // file offset of the chunk
    uint64_t stage = 0;  // byte offset of the chunk inside its run
  };
  std::vector<Need> needs;
  std::vector<uint32_t> needOfChunk;  // per requested chunk (items concatenated)
  // Layout position -> need index within one item, via per-thread mark arrays (entries reset after
  // each item). Items naming the same (segment, layer, head) twice read shared chunks twice:
  // correct, merely redundant (TieredKv sends one item per (segment, head)).
  thread_local std::vector<int32_t> mark;
  thread_local std::vector<uint8_t> extSeen;
  for (size_t i = 0; i < items.size(); ++i) {
    ReadItem& it = items[i];
    Region& g = it.seg->regions[size_t(it.region)];
    if (mark.size() < g.order.size()) mark.assign(g.order.size(), -1);
    if (extSeen.size() < g.extents.size()) extSeen.assign(g.extents.size(), 0);
    const size_t firstNeed = needs.size();
    for (size_t j = 0; j < it.n; ++j) {
      const uint32_t q = uint32_t(g.posOf[size_t(it.ids[j])]);
      if (mark[q] < 0) {
        mark[q] = int32_t(needs.size());
        const uint32_t e = g.extentOf[q];
        const Extent& x = g.extents[e];
        needs.push_back(Need{it.seg.get(), it.region, q, x.offset + uint64_t(q - x.firstPos) * it.seg->chunkBytes});
        if (!extSeen[e]) {
          extSeen[e] = 1;
          res.extents++;
          res.extentBytes += x.bytes;
        }
      }
      needOfChunk.push_back(uint32_t(mark[q]));
    }
    for (size_t q = firstNeed; q < needs.size(); ++q) {
      mark[needs[q].pos] = -1;
      extSeen[g.extentOf[needs[q].pos]] = 0;
    }
    res.chunks += it.n;
    res.payloadBytes += it.n * it.seg->chunkBytes;
  }
  // Per item, its copies still to make (itemDone only); an item with no chunk has landed already.
  std::unique_ptr<std::atomic<uint32_t>[]> itemLeft;
  if (itemDone) {
    itemLeft.reset(new std::atomic<uint32_t>[items.size()]);
    for (size_t i = 0; i < items.size(); ++i) {
      itemLeft[i].store(uint32_t(items[i].n), std::memory_order_relaxed);
      if (items[i].n == 0) __atomic_store_n(&itemDone[i], 1, __ATOMIC_RELEASE);
    }
  }
  if (needs.empty()) return;
  // Destinations grouped by need (CSR): a chunk requested twice is read once and copied twice.
  std::vector<uint32_t> copyStart(needs.size() + 1, 0);
  for (uint32_t n : needOfChunk) copyStart[n + 1]++;
  for (size_t n = 0; n < needs.size(); ++n) copyStart[n + 1] += copyStart[n];
  std::vector<uint8_t*> copyDest(needOfChunk.size());
  std::vector<uint32_t> copyItem(itemDone ? needOfChunk.size() : 0);  // the item each copy belongs to
  {
    std::vector<uint32_t> fill(copyStart.begin(), copyStart.end() - 1);
    size_t k = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      ReadItem& it = items[i];
      for (size_t j = 0; j < it.n; ++j, ++k) {
        const uint32_t c = fill[needOfChunk[k]]++;
        copyDest[c] = it.dest + uint64_t(it.destOfs[j]);
        if (itemDone) copyItem[c] = uint32_t(i);
      }
    }
  }
  // Sort by file position and group neighbours into runs; each run is one read.
  std::vector<uint32_t> ord(needs.size());
  for (uint32_t i = 0; i < ord.size(); ++i) ord[i] = i;
  std::sort(ord.begin(), ord.end(), [&](uint32_t a, uint32_t b) {
    if (needs[a].seg != needs[b].seg) return needs[a].seg < needs[b].seg;
    return needs[a].offset < needs[b].offset;
  });
  IoEngine& eng = *items[0].seg->engine;
  const uint64_t maxIo = eng.Options().maxIoBytes, gap = eng.Options().coalesceGapBytes;
  const bool coalesce = eng.Options().coalesce;
  struct Run {
    Segment* seg;
    uint64_t start, end;  // file span of the run's chunks (the engine aligns O_DIRECT reads)
    size_t first, last;   // range in ord
  };
  std::vector<Run> runs;
  for (size_t i = 0; i < ord.size();) {
    Need& a = needs[ord[i]];
    const uint64_t cb = a.seg->chunkBytes;
    uint64_t s = a.offset, e = s + cb;
    size_t j = i + 1;
    while (coalesce && j < ord.size() && needs[ord[j]].seg == a.seg) {
      const Need& b = needs[ord[j]];
      // Same or next page (nothing skipped that alignment would not read anyway), or within the gap.
      const bool near = (b.offset & ~(kIoAlign - 1)) <= AlignUp(e) || b.offset <= e + gap;
      if (!near || b.offset + cb - s > maxIo) break;
      e = b.offset + cb;
      ++j;
    }
    for (size_t q = i; q < j; ++q) needs[ord[q]].stage = needs[ord[q]].offset - s;
    runs.push_back(Run{a.seg, s, e, i, j});
    i = j;
  }
  res.runs = runs.size();
  // In-place delivery: each run is read into a registered bounce slot of the engine and verified
  // and scattered from there (no staging copy). A run is at most maxIoBytes unless one chunk alone
  // is larger; such a run is read into thread-local staging instead.
  uint64_t bigTotal = 0;
  for (const Run& r : runs)
    if (r.end - r.start > maxIo) bigTotal += AlignUp(r.end - r.start);
  uint8_t* stage = bigTotal ? t_staging.Get(bigTotal) : nullptr;
  std::vector<ReadReq> reqs;
  std::vector<uint8_t*> runDest(runs.size(), nullptr);
  reqs.reserve(runs.size());
  uint64_t at = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    uint8_t* d = nullptr;
    if (runs[r].end - runs[r].start > maxIo) {
      d = stage + at;
      at += AlignUp(runs[r].end - runs[r].start);
    }
    runDest[r] = d;
    reqs.push_back(ReadReq{runs[r].seg->file, runs[r].start, runs[r].end - runs[r].start, d});
  }
  // As each run lands: verify its chunks' checksums and scatter them (overlaps the remaining I/O).
  // The first corruption is kept and thrown after the batch drained; a corrupt chunk is never copied.
  std::mutex errMu;
  std::unique_ptr<Error> corrupt;
  IoEngine::DoneFn onDone = [&](size_t r, const uint8_t* data) {
    const uint8_t* base = data ? data : runDest[r];
    for (size_t q = runs[r].first; q < runs[r].last; ++q) {
      uint32_t ni = ord[q];
      const Need& n = needs[ni];
      const Region& g = n.seg->regions[size_t(n.region)];
      const uint64_t cb = n.seg->chunkBytes;
      const uint8_t* src = base + n.stage;
      const uint32_t want = g.crcs[n.pos], got = Crc32c(0, src, cb);
      if (got != want) {
        std::lock_guard<std::mutex> lk(errMu);
        if (!corrupt) {
          char buf[96];
          std::snprintf(buf, sizeof buf, "stored crc32c %08x, computed %08x", want, got);
          corrupt = std::make_unique<Error>(
              "E_CORRUPT", "segment " + n.seg->path + ": chunk checksum mismatch in layer " + std::to_string(n.region / n.seg->heads) +
                               ", kv head " + std::to_string(n.region % n.seg->heads) + ", extent " + std::to_string(g.extentOf[n.pos]) +
                               ", chunk " + std::to_string(g.order[n.pos]) + " (bytes " + std::to_string(n.offset) + ".." +
                               std::to_string(n.offset + cb) + "): " + buf);
        }
        continue;
      }
      for (uint32_t c = copyStart[ni]; c < copyStart[ni + 1]; ++c) {
        std::memcpy(copyDest[c], src, cb);
        // The item's last copy made (by whichever thread made it): its flag, after its bytes.
        if (itemDone && itemLeft[copyItem[c]].fetch_sub(1, std::memory_order_acq_rel) == 1)
          __atomic_store_n(&itemDone[copyItem[c]], 1, __ATOMIC_RELEASE);
      }
    }
  };
  try {
    res.io = eng.ReadBatch(reqs, cancel, &onDone);
  } catch (const Error& e) {
    if (e.code != "E_CORRUPT") throw;
    // A short read: name the first requested chunk that lies beyond the file's current end.
    for (uint32_t ni : ord) {
      const Need& n = needs[ni];
      const uint64_t cb = n.seg->chunkBytes;
      struct stat st;
      if (::stat(n.seg->path.c_str(), &st) == 0 && n.offset + cb > uint64_t(st.st_size))
        Throw("E_CORRUPT", "segment " + n.seg->path + ": chunk " + std::to_string(n.seg->regions[size_t(n.region)].order[n.pos]) + " of layer " +
                               std::to_string(n.region / n.seg->heads) + ", kv head " + std::to_string(n.region % n.seg->heads) + " (bytes " +
                               std::to_string(n.offset) + ".." + std::to_string(n.offset + cb) + ") is truncated: " + e.what());
    }
    throw;
  }
  if (corrupt) throw *corrupt;
}

Napi::Object SegmentInfo(Napi::Env env, const Segment& s) {
  Napi::Object r = Napi::Object::New(env);
  r.Set("dtype", DtypeName(s.dtype));
  r.Set("layers", s.layers);
  r.Set("kvHeads", s.heads);
  r.Set("headDim", s.dim);
  r.Set("chunkSize", s.chunkSize);
  r.Set("tokens", double(s.tokens));
  r.Set("chunks", double(s.chunks));
  r.Set("chunkBytes", double(s.chunkBytes));
  r.Set("fileBytes", double(s.fileBytes));
  r.Set("direct", s.direct);
  uint64_t ext = 0;
  for (const Region& g : s.regions) ext += g.extents.size();
  r.Set("extents", double(ext));
  return r;
}

// segmentOpen(engineHandle, path, direct) -> { handle, ...info }
Napi::Value SegmentOpenB(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto eng = EngineByHandle(HandleArg(info, 0, "segmentOpen"));
    if (info.Length() < 2 || !info[1].IsString()) Throw("E_TYPE", "segmentOpen: expected a path string");
    bool direct = info.Length() > 2 && info[2].IsBoolean() && info[2].As<Napi::Boolean>().Value();
    auto s = OpenSegment(eng, info[1].As<Napi::String>(), direct);
    Napi::Object r = SegmentInfo(info.Env(), *s);
    r.Set("handle", Segments().Add(s));
    return r;
  });
}

Napi::Value SegmentRelease(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    return Napi::Boolean::New(info.Env(), Segments().Remove(HandleArg(info, 0, "segmentRelease")));
  });
}

std::shared_ptr<Segment> RegionArgs(const Napi::CallbackInfo& info, const char* what, int* region) {
  auto s = Segments().Get(HandleArg(info, 0, what));
  int64_t l = HandleArg(info, 1, what), h = HandleArg(info, 2, what);
  if (l < 0 || l >= s->layers || h < 0 || h >= s->heads)
    Throw("E_RANGE", std::string(what) + ": expected layer in [0, " + std::to_string(s->layers) + ") and kv head in [0, " +
                         std::to_string(s->heads) + "), got layer " + std::to_string(l) + ", kv head " + std::to_string(h));
  *region = int(l * s->heads + h);
  return s;
}

// segmentExtents(handle, layer, kvHead) -> { offsets, bytes, firstPos, chunks, order } (layout inspection)
Napi::Value SegmentExtents(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    Napi::Env env = info.Env();
    int region;
    auto s = RegionArgs(info, "segmentExtents", &region);
    const Region& g = s->regions[size_t(region)];
    size_t n = g.extents.size();
    auto offs = Napi::Float64Array::New(env, n);
    auto bytes = Napi::Float64Array::New(env, n);
    auto first = Napi::Int32Array::New(env, n);
    auto cnt = Napi::Int32Array::New(env, n);
    for (size_t e = 0; e < n; ++e) {
      offs[e] = double(g.extents[e].offset);
      bytes[e] = double(g.extents[e].bytes);
      first[e] = int32_t(g.extents[e].firstPos);
      cnt[e] = int32_t(g.extents[e].chunks);
    }
    auto order = Napi::Int32Array::New(env, g.order.size());
    std::memcpy(order.Data(), g.order.data(), g.order.size() * 4);
    Napi::Object r = Napi::Object::New(env);
    r.Set("offsets", offs);
    r.Set("bytes", bytes);
    r.Set("firstPos", first);
    r.Set("chunks", cnt);
    r.Set("order", order);
    r.Set("file", s->file);
    return r;
  });
}

// segmentRead({ segments, layers, heads: Int32Array per item, itemOffsets: Int32Array (items+1),
//   chunkIds: Int32Array, dest: Uint8Array, destOffsets: Float64Array per chunk, done? }, cancel?) -> Promise
// Chunk k (page-first, chunkBytes) lands at dest + destOffsets[k]: scattered straight into the
// caller's buffer, no intermediate copy beyond the extent staging.
// done (optional): an Int32Array (over a SharedArrayBuffer) whose element 0 the read's own thread
// sets the moment it ends (a release store): 1 when every chunk has landed in dest, verified; 2
// when it failed or was cancelled. The promise settles only once the JS thread runs its callback,
// which can be a whole attention call later; a caller that polls `done` (Atomics.load) can read
// the pages as soon as they are there. Left 0 while the read runs. With at least 1 + items
// elements, element 1 + i is set to 1 as soon as every chunk of item i has landed (verified),
// while other items are still being read (left 0 if the read fails first).
Napi::Value SegmentRead(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsObject()) Throw("E_TYPE", "segmentRead: expected a request object");
    Napi::Object o = info[0].As<Napi::Object>();
    auto segs = GetI32(o.Get("segments"), "segmentRead.segments");
    auto layers = GetI32(o.Get("layers"), "segmentRead.layers");
    auto heads = GetI32(o.Get("heads"), "segmentRead.heads");
    auto io = GetI32(o.Get("itemOffsets"), "segmentRead.itemOffsets");
    auto ids = GetI32(o.Get("chunkIds"), "segmentRead.chunkIds");
    auto dest = GetArray<uint8_t>(o.Get("dest"), napi_uint8_array, "segmentRead.dest");
    auto dofs = GetArray<double>(o.Get("destOffsets"), napi_float64_array, "segmentRead.destOffsets");
    const size_t n = segs.length;
    ExpectLength(layers.length, n, "segmentRead.layers");
    ExpectLength(heads.length, n, "segmentRead.heads");
    ExpectLength(dofs.length, ids.length, "segmentRead.destOffsets (one per chunk)");
    // Every offset is checked before any item's range is read (items index chunkIds through them).
    CheckOffsets(io, n, ids.length, "segmentRead.itemOffsets", "items");
    ArrayArg<int32_t> done;
    if (!o.Get("done").IsUndefined()) {
      done = GetI32(o.Get("done"), "segmentRead.done");
      if (done.length < 1) Throw("E_SHAPE", "segmentRead.done: expected an Int32Array of at least 1 element, got 0");
      // Per-item flags are all or nothing: a flag array too short for the items would leave some
      // items unflagged, and a caller polling them would wait forever.
      if (done.length > 1 && done.length - 1 < n)
        Throw("E_SHAPE", "segmentRead.done: expected 1 element (the end flag) or at least 1 + " + std::to_string(n) +
                             " (one landing flag per item), got " + std::to_string(done.length));
    }
    std::vector<ReadItem> items(n);
    std::shared_ptr<IoEngine> eng;
    for (size_t i = 0; i < n; ++i) {
      auto s = Segments().Get(segs.data[i]);
      if (!eng) eng = s->engine;
      else if (eng != s->engine) Throw("E_CONFIG", "segmentRead: expected all segments of one read to share an I/O engine");
      std::string w = "segmentRead item " + std::to_string(i) + " (" + s->path + ")";
      if (layers.data[i] < 0 || layers.data[i] >= s->layers || heads.data[i] < 0 || heads.data[i] >= s->heads)
        Throw("E_RANGE", w + ": expected layer in [0, " + std::to_string(s->layers) + ") and kv head in [0, " + std::to_string(s->heads) +
                             "), got layer " + std::to_string(layers.data[i]) + ", kv head " + std::to_string(heads.data[i]));
      const int32_t* p = ids.data + io.data[i];
      const size_t cnt = size_t(io.data[i + 1] - io.data[i]);
      for (size_t j = 0; j < cnt; ++j)
        if (p[j] < 0 || p[j] >= s->chunks)
          Throw("E_RANGE", w + ": expected chunk ids in [0, " + std::to_string(s->chunks) + "), got " + std::to_string(p[j]));
      const double* dp = dofs.data + io.data[i];
      CheckByteOffsets(dp, cnt, s->chunkBytes, dest.length, w + " destOffsets");
      items[i] = ReadItem{s, layers.data[i] * s->heads + heads.data[i], p, cnt, dest.data, dp};
    }
    std::shared_ptr<std::atomic<bool>> cancel;
    if (info.Length() > 1 && info[1].IsNumber()) cancel = CancelFlagByHandle(HandleArg(info, 1, "segmentRead(cancel)"));
    auto res = std::make_shared<ReadResult>();
    auto itemsP = std::make_shared<std::vector<ReadItem>>(std::move(items));
    int32_t* doneAt = done.data;
    int32_t* itemDone = done.data && done.length > 1 ? done.data + 1 : nullptr;
    std::vector<Napi::Object> keep = {dest.object, ids.object, dofs.object};
    if (doneAt) keep.push_back(done.object);
    return PromiseWorker::Start(
        env,
        [itemsP, cancel, res, doneAt, itemDone] {
          // The signal is stored whichever way RunRead ends (2 unless it returned a complete read).
          struct Signal {
            int32_t* at;
            int32_t value = 2;
            ~Signal() {
              if (at) __atomic_store_n(at, value, __ATOMIC_RELEASE);
            }
          } signal{doneAt};
          RunRead(*itemsP, cancel.get(), *res, itemDone);
          if (!res->io.cancelled) signal.value = 1;
        },
        [res, itemsP](Napi::Env env) -> Napi::Value {
          Napi::Object r = Napi::Object::New(env);
          r.Set("chunks", double(res->chunks));
          r.Set("payloadBytes", double(res->payloadBytes));
          r.Set("extents", double(res->extents));
          r.Set("extentBytes", double(res->extentBytes));
          r.Set("runs", double(res->runs));
          r.Set("ios", double(res->io.ios));
          r.Set("bytesRead", double(res->io.bytesRead));
          r.Set("cancelled", res->io.cancelled);
          return r;
        },
        keep);
  });
}

// The test-only knobs (failWritesAfterBytes above, the I/O engines' batchBarrier) are process-global:
// a production process must not reach them by accident. ioTestHooks works only in a process whose
// environment had KVDRIVE_TEST_HOOKS=1 when the addon was loaded (vitest.config.ts sets it for the
// test suite); anywhere else it throws E_CONFIG saying how to enable it, and the knobs stay off.
// Read once, at load (InitExtentStore), so setting the variable later changes nothing.
bool TestHooksEnabled() {
  static const bool on = [] {
    const char* e = std::getenv("KVDRIVE_TEST_HOOKS");
    return e != nullptr && std::string(e) == "1";
  }();
  return on;
}

Napi::Value TestHooks(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    if (!TestHooksEnabled())
      Throw("E_CONFIG", "ioTestHooks: expected a process started with KVDRIVE_TEST_HOOKS=1 (test-only knobs; set it in the environment before the addon is loaded), got it unset or not '1'");
    if (info.Length() > 0 && info[0].IsObject()) {
      Napi::Object o = info[0].As<Napi::Object>();
      g_failWritesAfter = GetIntOr(o, "failWritesAfterBytes", "ioTestHooks", -1, int64_t(1) << 50, -1);
      SetBatchBarrierForTest(int(GetIntOr(o, "batchBarrier", "ioTestHooks", 0, 64, 0)));
    }
    Napi::Object r = Napi::Object::New(info.Env());
    r.Set("failWritesAfterBytes", double(g_failWritesAfter.load()));
    r.Set("segments", double(Segments().Size()));
    return r;
  });
}

// copyChunks(src: Uint8Array, srcOffsets: Float64Array, dest: Uint8Array, destOffsets: Float64Array,
//   bytes) -- gathers n fixed-size blocks (DRAM tier hits, staged prefetches) in one call.
Napi::Value CopyChunks(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto src = GetArray<uint8_t>(info[0], napi_uint8_array, "copyChunks(src)");
    auto so = GetArray<double>(info[1], napi_float64_array, "copyChunks(srcOffsets)");
    auto dst = GetArray<uint8_t>(info[2], napi_uint8_array, "copyChunks(dest)");
    auto dofs = GetArray<double>(info[3], napi_float64_array, "copyChunks(destOffsets)");
    ExpectLength(dofs.length, so.length, "copyChunks(destOffsets)");
    if (info.Length() < 5 || !info[4].IsNumber()) Throw("E_TYPE", "copyChunks(bytes): expected a block size in bytes");
    const double b = info[4].As<Napi::Number>().DoubleValue();
    if (!IsIntIn(b, 0, int64_t(1) << 53)) Throw("E_RANGE", "copyChunks(bytes): expected a non-negative integer, got " + Num(b));
    CheckByteOffsets(so.data, so.length, uint64_t(b), src.length, "copyChunks(srcOffsets)");
    CheckByteOffsets(dofs.data, dofs.length, uint64_t(b), dst.length, "copyChunks(destOffsets)");
    for (size_t i = 0; i < so.length; ++i)
      std::memmove(dst.data + uint64_t(dofs.data[i]), src.data + uint64_t(so.data[i]), size_t(b));
    return info.Env().Undefined();
  });
}

// fetchBufferSpans(buf: Uint8Array, first, n, chunkSize, dim, dtype) -> Float64Array of
// [kOffset, vOffset, len, kStride, vStride] per span, byte offsets into buf: lets tests check the
// native span accessor (page_spans.h) against the TypeScript layout (chunkRows).
Napi::Value FetchBufferSpansB(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto buf = GetArray<uint8_t>(info[0], napi_uint8_array, "fetchBufferSpans(buf)");
    Napi::Object o = Napi::Object::New(info.Env());
    const char* names[] = {"first", "n", "chunkSize", "dim"};
    for (int i = 0; i < 4; ++i) o.Set(names[i], info[size_t(i) + 1]);
    int64_t first = GetInt(o, "first", "fetchBufferSpans", 0, int64_t(1) << 40);
    int64_t n = GetInt(o, "n", "fetchBufferSpans", 0, int64_t(1) << 40);
    int c = int(GetInt(o, "chunkSize", "fetchBufferSpans", 1, 1 << 16));
    int d = int(GetInt(o, "dim", "fetchBufferSpans", 1, 1 << 16));
    if (info.Length() < 6 || !info[5].IsString()) Throw("E_DTYPE", "fetchBufferSpans(dtype): expected 'f32', 'f16' or 'bf16'");
    Dtype dt = ParseDtype(info[5].As<Napi::String>());
    if (CheckedMul(uint64_t(first + n), PageFirstChunkBytes(c, d, dt), "fetchBufferSpans size") > buf.length)
      Throw("E_RANGE", "fetchBufferSpans: expected entries within the buffer (" + std::to_string(buf.length) + " bytes)");
    std::vector<Span> spans;
    FetchBufferSpans(buf.data, size_t(first), size_t(n), c, d, dt, spans);
    auto r = Napi::Float64Array::New(info.Env(), spans.size() * 5);
    for (size_t i = 0; i < spans.size(); ++i) {
      r[i * 5 + 0] = double(static_cast<const uint8_t*>(spans[i].k) - buf.data);
      r[i * 5 + 1] = double(static_cast<const uint8_t*>(spans[i].v) - buf.data);
      r[i * 5 + 2] = double(spans[i].len);
      r[i * 5 + 3] = double(spans[i].kStride);
      r[i * 5 + 4] = double(spans[i].vStride);
    }
    return r;
  });
}

void InitExtentStore(Napi::Env env, Napi::Object exports) {
  exports.Set("fetchBufferSpans", Napi::Function::New(env, FetchBufferSpansB));
  exports.Set("copyChunks", Napi::Function::New(env, CopyChunks));
  exports.Set("segmentWrite", Napi::Function::New(env, SegmentWrite));
  exports.Set("segmentOpen", Napi::Function::New(env, SegmentOpenB));
  exports.Set("segmentRelease", Napi::Function::New(env, SegmentRelease));
  exports.Set("segmentExtents", Napi::Function::New(env, SegmentExtents));
  exports.Set("segmentRead", Napi::Function::New(env, SegmentRead));
  TestHooksEnabled();  // fixes the answer at load time
  exports.Set("ioTestHooks", Napi::Function::New(env, TestHooks));
}

}  // namespace

KVD_REGISTER_MODULE(InitExtentStore);

}  // namespace kvd
