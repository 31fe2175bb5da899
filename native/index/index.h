// Hierarchical centroid index: the C++ functions other native files may call.
//
// Layouts: point / centroid / chunk-mean matrices are row-major f32, `n` rows of `dim` floats.
// Queries of one GQA group are `group` rows of `dim` floats, contiguous.
//
// Determinism: every kernel here accumulates each dot product in the same fixed order (16
// interleaved partial sums, then a fixed reduction tree; GEMM tiles accumulate each output
// sequentially over the dimension) at every SIMD level, without FMA contraction, so results are
// bit-identical between the scalar, AVX2 and AVX-512 builds of the kernels.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/args.h"
#include "common/simd.h"

namespace kvd {

// ---- kernels (native/index/index_kernels.cc) ----

// The SIMD level the index kernels run at: the lowest of what the CPU supports, what the shared
// dispatch table is set to (when that table offers vector levels), and the cap set by
// SetIndexKernelCap (tests use it to compare levels).
SimdLevel IndexKernelLevel();
void SetIndexKernelCap(SimdLevel cap);
SimdLevel IndexKernelCap();

// out[i] = max_{j<group} q[j]·rows[i] for i < n (rows row-major, n x dim). With var (n values) and
// coef (group values): out[i] = max_j (q[j]·rows[i] + coef[j] * var[i]) (variance-aware scores).
void ScoreRowsMax(const float* q, int group, const float* rows, size_t n, int dim, float* out,
                  const float* var = nullptr, const float* coef = nullptr);
// Like ScoreRowsMax for the rows named by ids (row ids[i] of `rows`, variance var[ids[i]]).
void ScoreRowsMaxGather(const float* q, int group, const float* rows, const int32_t* ids, size_t n, int dim,
                        float* out, const float* var = nullptr, const float* coef = nullptr);
// Quest upper bound for pages with per-channel min / max (each n x dim):
// out[i] = max_j sum_d max(q[j][d]*mn[i][d], q[j][d]*mx[i][d]).
void ScoreMinMaxMax(const float* q, int group, const float* mn, const float* mx, size_t n, int dim, float* out);

// Centroid tiles: k row-major centroids as ceil(k/16) tiles of dim x 16 (lane l of tile t is
// centroid 16t + l; padding lanes are zero). The layout the scoring and k-means kernels stream.
inline size_t TileFloats(size_t k, int dim) { return (k + 15) / 16 * size_t(dim) * 16; }
void TransposeTiles(const float* c, size_t k, int dim, float* ct);
void UntransposeTiles(const float* ct, size_t k, int dim, float* c);
// out[i] = max_j (q[j]·c_i + coef[j] * var[i]) over k tiled centroids (var/coef may be null: plain
// max of dots). Each dot accumulates sequentially over d (not DotFixed's order).
void ScoreTilesMax(const float* q, int group, const float* ct, size_t k, int dim, float* out,
                   const float* var = nullptr, const float* coef = nullptr);

// Int8 centroid tiles (a quarter of f32's bytes, half of f16's): what the index stored and scored
// until the 4-bit tiles below; the scoreCentroids binding still takes them.
// Each centroid c_i is stored as round(c_i / s_i) in [-127, 127] with its own scale
// s_i = max_d |c_i[d]| / 127 (per centroid, not per dimension: the scale then factors out of the
// dot product, and an online add that moves one centroid rewrites only that centroid's bytes).
// Layout: ceil(k/16) tiles of 16 centroids; a tile is Dim4(dim) / 4 quads of 64 bytes, quad p holding
// lane l's dims 4p..4p+3 at bytes 4l..4l+3; dims past dim and lanes past k are zero. Scales:
// TileScalesI8(k) floats, zero past k.
inline int Dim4(int dim) { return (dim + 3) & ~3; }
inline size_t TileBytesI8(size_t k, int dim) { return (k + 15) / 16 * 16 * size_t(Dim4(dim)); }
inline size_t TileScalesI8(size_t k) { return (k + 15) / 16 * 16; }
// ct and scales sized as above; every byte and scale is written. `levels`: the largest code, 127
// (the default) or less: the centroidTiles binding quantizes with kCentroidLevels, 7-bit codes,
// which ScoreTilesMaxI8 scores faster on AVX2 (TileCodes::kSevenBit).
void QuantizeTilesI8(const float* c, size_t k, int dim, int8_t* ct, float* scales, float levels = 127.f);
// Writes centroid j (dim values) into its lanes and scale of tiles that already hold >= j + 1 centroids.
void SetTileI8(const float* centroid, size_t j, int dim, int8_t* ct, float* scales, float levels = 127.f);
// 7-bit centroid codes lie in [-63, 63]: the AVX2 kernel then multiplies them, offset by 64
// into [1, 127], as unsigned bytes by the int8 query (vpmaddubsw: a pair of products is at most
// 2 x 127 x 127 = 32258 and never saturates), about half the instructions of widening them to
// int16 first; the scores stay the exact integer dots of every other level.
constexpr float kCentroidLevels = 63.f;
// The dequantized centroids (byte x scale), k x dim row-major.
void DequantizeTilesI8(const int8_t* ct, const float* scales, size_t k, int dim, float* c);

// 4-bit centroid tiles: what the index stores and level 1 scores every decode step (half the bytes
// of the int8 tiles, which that level streams from memory: ~12 GB/s per thread there). Codes
// round(c_i / s_i) in [-7, 7] with s_i = max_d |c_i[d]| / 7, stored as u = code + 8 in [1, 15].
// Layout: ceil(k/16) tiles of 16 centroids; a tile is TileBlocks4(dim) blocks of 64 bytes, block b
// holding quads 2b and 2b + 1 of the int8 layout in the low and the high nibbles of the same bytes
// (byte 4l + i: lane l's dim 8b + i low, dim 8b + 4 + i high). A missing last odd quad, dims past
// dim and lanes past k hold u = 8 (code 0). Scales: TileScalesI8(k) floats, zero past k. Against
// 7-bit codes, recall / oracle on the demo workload moved by ~0.001 (bench/RESULTS.md).
inline size_t TileBlocks4(int dim) { return (size_t(Dim4(dim)) / 4 + 1) / 2; }
inline size_t TileBytes4(size_t k, int dim) { return (k + 15) / 16 * TileBlocks4(dim) * 64; }
constexpr float kCentroidLevels4 = 7.f;
// ct and scales sized as above; every byte and scale is written.
void QuantizeTiles4(const float* c, size_t k, int dim, uint8_t* ct, float* scales);
// Writes centroid j into its lanes and scale of tiles that already hold >= j + 1 centroids.
void SetTile4(const float* centroid, size_t j, int dim, uint8_t* ct, float* scales);
// The dequantized centroids (code x scale), k x dim row-major.
void DequantizeTiles4(const uint8_t* ct, const float* scales, size_t k, int dim, float* c);

// A query group quantized like a centroid (per query head: scale max_d |q_j[d]| / 127, codes in
// [-127, 127]), in the forms the kernels broadcast. Built once per group, scored against any
// number of tile sets.
struct QueryI8 {
  int group = 0, dim4 = 0;
  std::vector<int8_t> q;       // group x dim4 codes (zero past dim)
  std::vector<float> scale;    // group
  std::vector<int32_t> sum;    // group: sum of the codes (the VNNI kernel's bias correction)
  std::vector<int32_t> pat8;   // group x dim4/4: four codes packed little-endian
  std::vector<int64_t> pat16;  // group x dim4/4: the same four as int16
};
void QuantizeQueryI8(const float* q, int group, int dim, QueryI8& out);
// out[i] = max_j (sq_j * s_i * (q8_j · c8_i) + coef[j] * var[i]) over k int8-tiled centroids (var /
// coef may be null). The integer dot is exact, and the float part is the same operations at every
// level, so scores are bit-identical at every SIMD level (scalar, AVX2, AVX-512 with VNNI when the
// CPU has it, else the AVX2 kernel). Any byte value is valid (-128 too); int32 sums cannot overflow
// for dim <= 65536.
// `codes` says what the caller knows of the tile bytes; every choice gives the same scores:
//   kAny       any byte: the general kernel;
//   kSevenBit  every byte in [-63, 63] (tiles quantized with levels <= 63; the caller vouches,
//              nothing checks): the AVX2 level's faster 7-bit kernel;
//   kCheck     the 7-bit kernel, which checks the bytes as it reads them, and the general kernel
//              again only if one lay outside [-63, 63] (tiles nobody vouches for, the
//              scoreCentroids binding: no separate pass over the tiles).
enum class TileCodes { kAny, kSevenBit, kCheck };
void ScoreTilesMaxI8(const QueryI8& q, const int8_t* ct, const float* scales, size_t k, float* out,
                     const float* var = nullptr, const float* coef = nullptr, TileCodes codes = TileCodes::kAny);

// ScoreTilesMaxI8 over 4-bit tiles (TileBytes4): the same exact integer dots of the int8 query with
// the centroid codes, the same float epilogue, so the scores are bit-identical at every SIMD level
// (scalar, AVX2, AVX-512 with VNNI) and equal to ScoreTilesMaxI8's over the same codes as int8 tiles.
void ScoreTilesMax4(const QueryI8& q, const uint8_t* ct, const float* scales, size_t k, float* out,
                    const float* var = nullptr, const float* coef = nullptr);

// Level 3 of kvdrive select. out[j * ld + i] = q_j · (key row of token tokens[i], kv head h) for
// j < group, i < n. Each row is read once for the whole GQA group and widened exactly (f16 /
// bf16); each dot accumulates 16 lanes over d with fused multiply-adds, then a fixed reduction tree
// (not DotFixed's order, but the same bits at every SIMD level: the scalar level uses fmaf).
void ScoreKeyRows(const float* q, int group, const KvView& keys, int h, const int32_t* tokens, size_t n, float* out,
                  size_t ld);
// Attention shares of scored tokens. logits: group rows of ld floats (ld a multiple of 16, >= n),
// row j holding q_j·k_i for i < n. Per row: x = scale * logit, w_i = exp(x_i - max) / sum_i exp(..)
// (a vector exp, ~2 ulp, identical at every SIMD level). Then share[i] = sum_j w_ji for
// i < nShare (share holds nShare rounded up to 16 floats). Overwrites logits with the w values (not
// normalised). Returns -1, or the index j * ld + i of the first non-finite scaled logit (share
// then undefined).
int64_t GroupShares(float* logits, int group, size_t n, size_t ld, size_t nShare, float scale, float* share);

// sum_d a[d]*b[d] in the fixed order described above.
float DotFixed(const float* a, const float* b, int dim);
// out[i] = DotFixed(x_i, c) for the n rows of x (one call for a whole matrix-vector product).
void DotsFixed(const float* x, size_t n, int dim, const float* c, float* out);
// out[i] = DotFixed(x_i, x_i).
void RowNormsFixed(const float* x, size_t n, int dim, float* out);

// For each point i < n: best[i] = argmin_j (cnorm[j] - 2 x_i·c_j) over k centroids (ties: lowest j),
// dist[i] = max(0, xnorm[i] + that minimum). Points x (n x dim) and centroids c (k x dim) row-major.
void NearestCentroids(const float* x, const float* xnorm, size_t n, const float* c, const float* cnorm, size_t k,
                      int dim, int32_t* best, float* dist);

// ---- k-means (native/index/index_kmeans.cc) ----

struct KMeansOptions {
  int k = 1;
  int maxIters = 10;
  uint64_t seed = 0;
  int trials = 0;  // k-means++ candidates per centre; 0: 2 + floor(ln k) (greedy k-means++)
};

struct KMeansResult {
  std::vector<float> centroids;      // k x dim
  std::vector<int32_t> assignments;  // n, cluster of each point
  std::vector<int32_t> offsets;      // k + 1, CSR offsets into members
  std::vector<int32_t> members;      // n point ids grouped by cluster, ascending within a cluster
  double inertia = 0;                // sum of squared distances to the assigned centroid
  int iterations = 0;                // Lloyd iterations run
};

// Greedy k-means++ seeding (D² sampling with a splitmix64 stream from `seed`) and Lloyd iterations until no
// assignment changes or maxIters. An empty cluster takes the point farthest from its centroid.
// Requires 1 <= k <= n (throws E_RANGE otherwise).
KMeansResult KMeans(const float* x, size_t n, int dim, const KMeansOptions& opt);

// ---- representatives (native/index/index_repr.cc) ----

// Chunk j covers tokens [origin + j*chunk, origin + (j+1)*chunk) minus those below floorTok (the
// sinks, always attended anyway). Writes the mean key of chunks j in [c0, c1) of kv head h as
// (c1-c0) x dim f32 rows. Requires origin + c1*chunk <= kv.tokens and every chunk non-empty.
// With var != nullptr also writes each chunk's per-dimension key variance, mean_t ||k_t - mean||² / dim.
void ChunkMeans(const KvView& kv, int h, int chunk, int64_t origin, int64_t floorTok, int64_t c0, int64_t c1,
                float* out, float* var = nullptr);
// Per-channel min and max of the same token ranges (Quest pages).
void ChunkMinMax(const KvView& kv, int h, int chunk, int64_t origin, int64_t floorTok, int64_t c0, int64_t c1,
                 float* mn, float* mx);

}  // namespace kvd
