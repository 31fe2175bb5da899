// Forward-pass operations of LlamaModel (see llama_model.h).
#include "model/llama_model.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/errors.h"
#include "common/huge_pages.h"
#include "model/parallel.h"
#include "common/simd.h"

namespace kvd {
namespace model {

LlamaModel::LlamaModel(const std::string& path, Placement placement) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Throw(errno == ENOENT ? "E_NOT_FOUND" : "E_IO", "GGUF model " + path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
    ::close(fd);
    Throw("E_IO", "GGUF model " + path + ": cannot stat or empty");
  }
  bytes_ = size_t(st.st_size);
  if (placement == Placement::kMapped) {
    // MAP_POPULATE maps every page now: decode reads all weights per token, and taking the page
    // faults at load keeps them out of the first tokens' timings.
    region_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    regionBytes_ = bytes_;
    const int err = errno;
    ::close(fd);
    if (region_ == MAP_FAILED) {
      region_ = nullptr;
      Throw("E_IO", "GGUF model " + path + ": mmap failed (" + std::strerror(err) + ")");
    }
    map_ = region_;
    return;
  }
  // Huge pages: an anonymous mapping with room to start on a 2 MiB boundary, advised for THP
  // (madvise failing — no THP in this kernel — leaves 4 KiB pages, same contents), filled with
  // pread (each huge page is faulted in once, by the first write) and then made read-only.
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t len = (bytes_ + kHuge - 1) / kHuge * kHuge;
  regionBytes_ = len + kHuge;
  region_ = ::mmap(nullptr, regionBytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region_ == MAP_FAILED) {
    const int err = errno;
    region_ = nullptr;
    ::close(fd);
    Throw("E_IO", "GGUF model " + path + ": expected " + std::to_string(regionBytes_) + " bytes of memory for the weights (weights: 'huge-pages'), got " +
                      std::strerror(err) + "; weights: 'mmap' reads them in place");
  }
  uint8_t* dst = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(region_) + kHuge - 1) & ~uintptr_t(kHuge - 1));
  AdviseHugePages(dst, len);
  size_t done = 0;
  while (done < bytes_) {
    const ssize_t n = ::pread(fd, dst + done, std::min(bytes_ - done, size_t(64) << 20), off_t(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "unexpected end of file";
      ::close(fd);
      ::munmap(region_, regionBytes_);
      region_ = nullptr;
      Throw("E_IO", "GGUF model " + path + ": expected " + std::to_string(bytes_) + " bytes, read " + std::to_string(done) + " (" + why + ")");
    }
    done += size_t(n);
  }
  ::close(fd);
  ::mprotect(dst, len, PROT_READ);
  map_ = dst;
}

LlamaModel::~LlamaModel() {
  if (region_) ::munmap(region_, regionBytes_);
}

// Per-thread scratch that keeps its capacity between calls: prefill activations are megabytes, and a
// fresh allocation per call would be mapped, zeroed and page-faulted again every time. Slot 5 is
// the one matrix-product workers use (each on its own thread); the others are the caller's.
float* Scratch(int slot, size_t n) {
  thread_local std::vector<float> bufs[6];
  std::vector<float>& b = bufs[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

void MatMul(const Weight& w, const float* x, int64_t T, float* y, int threads) {
  const QuantKernels& K = Quant();
  // Enough rows per part that a part's start-up cost stays small against its reads.
  const int parts = w.rows * w.cols >= (int64_t(1) << 15) ? threads : 1;
  // Decode products of Q8_0 / Q4_0 rows use the activations quantized once to Q8_0 (integer dots).
  // The calling thread's buffers, passed to the workers as plain pointers (a thread_local named
  // inside the lambda would be each worker's own).
  thread_local std::vector<int8_t> xqBuf;
  thread_local std::vector<float> xdBuf;
  const bool q8 = T == 1 && UsesQ8Activations(w.type);
  const int8_t* xq = nullptr;
  const float* xd = nullptr;
  if (q8) {
    if (xqBuf.size() < size_t(w.cols)) xqBuf.resize(size_t(w.cols));
    if (xdBuf.size() < size_t(w.cols) / 32) xdBuf.resize(size_t(w.cols) / 32);
    QuantizeQ8(x, size_t(w.cols), xqBuf.data(), xdBuf.data());
    xq = xqBuf.data();
    xd = xdBuf.data();
  }
  ParallelFor(w.rows, parts, [&](int64_t r0, int64_t r1) {
    if (q8) {
      for (int64_t r = r0; r < r1; ++r) y[r] = K.dotQ8(w.type, w.data + size_t(r) * w.rowBytes, xq, xd, size_t(w.cols));
      return;
    }
    if (T == 1) {
      for (int64_t r = r0; r < r1; ++r) y[r] = K.dot(w.type, w.data + size_t(r) * w.rowBytes, x, size_t(w.cols));
      return;
    }
    // Prefill: decode 4 weight rows at a time and multiply them with 4 tokens at a time (the tile
    // reuses every loaded vector 4 times), so each weight row is read once per chunk.
    const size_t n = size_t(w.cols);
    float* buf = Scratch(5, 4 * n);
    for (int64_t r = r0; r < r1; r += 4) {
      const int nw = int(std::min<int64_t>(4, r1 - r));
      for (int i = 0; i < nw; ++i) K.dequant(w.type, w.data + size_t(r + i) * w.rowBytes, buf + size_t(i) * n, n);
      for (int64_t t = 0; t < T; t += 4)
        K.tile(buf, nw, x + t * w.cols, int(std::min<int64_t>(4, T - t)), n, y + t * w.rows + r, size_t(w.rows));
    }
  });
}

void RmsNorm(const float* x, const std::vector<float>& g, float eps, int64_t T, float* out) {
  const size_t n = g.size();
  for (int64_t t = 0; t < T; ++t, x += n, out += n) {
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    const float scale = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
    for (size_t i = 0; i < n; ++i) out[i] = x[i] * scale * g[i];
  }
}

namespace {

void AddBias(float* y, const std::vector<float>& b, int64_t T) {
  if (b.empty()) return;
  for (int64_t t = 0; t < T; ++t)
    for (size_t i = 0; i < b.size(); ++i) y[t * int64_t(b.size()) + int64_t(i)] += b[i];
}

// Rotates the first ropeDim dims of each of `heads` heads of T rows (row t at position pos0 + t).
void Rope(const ModelDims& d, const std::vector<float>& invFreq, float* v, int heads, int64_t pos0, int64_t T) {
  const int half = d.ropeDim / 2;
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t t = 0; t < T; ++t) {
    const double pos = double(pos0 + t);
    for (int i = 0; i < half; ++i) {
      const double a = pos * double(invFreq[size_t(i)]);
      cs[size_t(i)] = float(std::cos(a));
      sn[size_t(i)] = float(std::sin(a));
    }
    for (int h = 0; h < heads; ++h) {
      float* p = v + (t * heads + h) * d.headSize;
      for (int i = 0; i < half; ++i) {
        const int a = d.ropeNeox ? i : 2 * i;
        const int b = d.ropeNeox ? i + half : 2 * i + 1;
        const float x0 = p[a], x1 = p[b];
        p[a] = x0 * cs[size_t(i)] - x1 * sn[size_t(i)];
        p[b] = x0 * sn[size_t(i)] + x1 * cs[size_t(i)];
      }
    }
  }
}

}  // namespace

void LlamaModel::Embed(const int32_t* tokens, int64_t T, float* x) const {
  for (int64_t t = 0; t < T; ++t)
    Quant().dequant(tokEmbd.type, tokEmbd.data + size_t(tokens[t]) * tokEmbd.rowBytes, x + t * d.dim, size_t(d.dim));
}

void LlamaModel::AttnPre(int layer, int64_t pos0, int64_t T, const float* x, float* q, float* k, float* v) const {
  const LayerWeights& L = layers[size_t(layer)];
  float* xb = Scratch(0, size_t(T * d.dim));
  RmsNorm(x, L.attnNorm, d.eps, T, xb);
  MatMul(L.q, xb, T, q, threads);
  MatMul(L.k, xb, T, k, threads);
  MatMul(L.v, xb, T, v, threads);
  AddBias(q, L.qBias, T);
  AddBias(k, L.kBias, T);
  AddBias(v, L.vBias, T);
  Rope(d, invFreq, q, d.heads, pos0, T);
  Rope(d, invFreq, k, d.kvHeads, pos0, T);
}

void LlamaModel::AttnPost(int layer, int64_t T, float* x, const float* att) const {
  const LayerWeights& L = layers[size_t(layer)];
  const size_t n = size_t(T * d.dim), nh = size_t(T * d.hidden);
  float* tmp = Scratch(1, n);
  MatMul(L.o, att, T, tmp, threads);
  for (size_t i = 0; i < n; ++i) x[i] += tmp[i];
  // SwiGLU FFN: x += W_down (silu(W_gate xb) ⊙ W_up xb).
  RmsNorm(x, L.ffnNorm, d.eps, T, tmp);
  float* g = Scratch(2, nh);
  float* u = Scratch(3, nh);
  MatMul(L.gate, tmp, T, g, threads);
  MatMul(L.up, tmp, T, u, threads);
  for (size_t i = 0; i < nh; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
  MatMul(L.down, g, T, tmp, threads);
  for (size_t i = 0; i < n; ++i) x[i] += tmp[i];
}

void LlamaModel::Logits(const float* x, float* out) const {
  float* xb = Scratch(4, size_t(d.dim));
  RmsNorm(x, outputNorm, d.eps, 1, xb);
  MatMul(output, xb, 1, out, threads);
}

}  // namespace model
}  // namespace kvd
