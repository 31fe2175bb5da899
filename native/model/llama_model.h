// The native forward pass of Llama-family GGUF models (architectures llama and qwen2), split at
// attention: the host (src/model/gguf/) calls Embed, then per layer AttnPre → its AttentionBackend
// → AttnPost, then Logits. Weights stay in the memory-mapped file and are read in place.
//
// Activations are f32, token-major: x is T × dim, q is T × (nHeads·headSize), k/v are
// T × (nKvHeads·headSize) (k after RoPE), for T consecutive positions pos0 .. pos0+T-1 (T = 1 for
// decode, a chunk of the prompt for prefill). A weight of `rows` outputs × `cols` inputs (GGUF
// ne = [cols, rows]) computes y[t][r] = Σ_c W[r][c] · x[t][c].
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/quant.h"

namespace kvd {
namespace model {

struct Weight {
  const uint8_t* data = nullptr;
  QType type = QType::F32;
  int64_t cols = 0;  // ne0: inputs, contiguous
  int64_t rows = 0;  // ne1: outputs
  size_t rowBytes = 0;
};

struct LayerWeights {
  std::vector<float> attnNorm, ffnNorm;
  std::vector<float> qBias, kBias, vBias;  // empty when the architecture has none (llama)
  Weight q, k, v, o, gate, up, down;
};

struct ModelDims {
  int dim = 0, hidden = 0, layers = 0, heads = 0, kvHeads = 0, headSize = 0, vocab = 0;
  int ropeDim = 0;       // leading dims of each head that RoPE rotates (even, ≤ headSize)
  bool ropeNeox = false; // pairs (i, i + ropeDim/2) (qwen2) instead of (2i, 2i+1) (llama)
  float eps = 1e-5f;     // RMSNorm epsilon
};

class LlamaModel {
 public:
  ModelDims d;
  std::vector<float> invFreq;  // ropeDim / 2 rotation frequencies (radians per position)
  Weight tokEmbd, output;
  std::vector<float> outputNorm;
  std::vector<LayerWeights> layers;
  int threads = 1;

  // Where the weights live. kMapped: the file mapped read-only, weights read in place from the page
  // cache (no second copy; the kernel may evict and re-read pages). kHugePages: the file read once
  // into anonymous memory advised for transparent huge pages and then made read-only. Decode reads
  // every weight once per token; over 4 KiB pages that is one TLB miss per 4 KiB (260K for a
  // 1 GiB model), and when the process also streams gigabytes of KV cache the page walks (under a
  // shadow-paging hypervisor, the shadow faults) cost more than the reads themselves; 2 MiB pages
  // cut them 512-fold. Falls back to 4 KiB pages where the kernel has no huge pages to give.
  enum class Placement { kMapped, kHugePages };

  // Opens `path`; the weights point into the mapping or the huge-page copy (see Placement).
  LlamaModel(const std::string& path, Placement placement);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const uint8_t* base() const { return static_cast<const uint8_t*>(map_); }
  size_t fileBytes() const { return bytes_; }

  void Embed(const int32_t* tokens, int64_t T, float* x) const;
  void AttnPre(int layer, int64_t pos0, int64_t T, const float* x, float* q, float* k, float* v) const;
  void AttnPost(int layer, int64_t T, float* x, const float* att) const;
  void Logits(const float* x, float* out) const;

 private:
  void* map_ = nullptr;       // what base() points into
  size_t bytes_ = 0;          // the file's size
  void* region_ = nullptr;    // the mmap to release (the huge-page copy's mapping is larger than the file)
  size_t regionBytes_ = 0;
};

// y (T × w.rows) = x (T × w.cols) · Wᵀ, rows split over `threads`.
void MatMul(const Weight& w, const float* x, int64_t T, float* y, int threads);
// out = x / sqrt(mean(x²) + eps) ⊙ g, for T rows of g.size() elements.
void RmsNorm(const float* x, const std::vector<float>& g, float eps, int64_t T, float* out);

}  // namespace model
}  // namespace kvd
