// Key sketch: a compact quantized copy of one kv head's keys that kvdrive's level-3 re-rank scores
// when select() is not given the keys (the runtime's offloaded paths keep K/V on SSD / in DRAM tiers
// and only the index in memory), or when it is told to prefer the sketch.
//
// Quantization (per kv head), b = 8 or 4 bits: keys are first divided by a per-channel scale c[d]
// (the channel's max |k| over the tokens seen at calibration; outlier channels do not eat every
// other channel's precision), then each token row gets its own scale s_t = max_d |k_t[d] / c[d]| / M
// (M = 127 at 8 bits, 7 at 4 bits) and codes round(k_t[d] / (c[d] s_t)) in [-M, M]. So
// k_t[d] ~= c[d] * s_t * code_t[d]; a token later than the calibration that exceeds a channel's
// range only costs that row some precision (s_t grows). The rounding error of one code is at most
// s_t / 2 in normalised units, so |q.k_t - score| <= s_t / 2 * sum_d |q[d] c[d]| plus the query's
// own rounding (test/index-sketch.test.ts checks that bound).
// Layout: rows contiguous per head, appended in token order (a chunk's rows are one read); the
// index then reorders each full segment's rows cluster by cluster (LayerIndex::OrderSketchRows,
// LayerIndex::SketchRow maps a token to its row). RowBytes() bytes of codes plus one f32 scale per
// row: dim + 4 bytes per token and kv head at 8 bits (132 B at
// dim 128, vs 256 B of f16 keys), ceil(dim / 2) + 4 at 4 bits (68 B).
// 4-bit packing: codes are stored as u = code + 8 in [1, 15], two per byte, in blocks of 64 dims
// (the last block: the remaining n < 64 dims): with half = ceil(n / 2), byte i of a block holds dim
// i in its low nibble and dim half + i in its high nibble (8, i.e. code 0, past the end). A vector
// kernel thus unpacks 16 or 32 bytes into two runs of consecutive dims, no shuffles.
//
// Scoring: q_j . k_t ~= s_t * qs_j * sum_d q16_j[d] * code_t[d], with q16_j = round(q_j[d] c[d] /
// qs_j) an integer query (qs_j chosen so that the integer sum fits int32, and at 4 bits so that
// q16 fits int8: 127 levels, for the VNNI byte products); at 4 bits the sum is
// sum_d q16_j[d] u_t[d] - 8 sum_d q16_j[d]. It is exact integer arithmetic, so the scores are
// bit-identical at every SIMD level and in any order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/aligned.h"
#include "common/args.h"

namespace kvd {

struct KeySketch {
  int dim = 0;
  int bits = 8;                     // 8 or 4 (set before CalibrateSketch)
  std::vector<float> channelScale;  // dim: c[d] > 0
  PageVector<int8_t> codes;         // tokens x RowBytes(): int8 codes, or packed 4-bit u (see above);
                                    // line-aligned: a 4-bit row of dim 128 is one cache line; from 4 MiB
                                    // on, on a 2 MiB boundary for huge pages (common/aligned.h)
  std::vector<float> rowScale;      // tokens: s_t
  int64_t calibratedAt = 0;         // tokens the channel scales were measured on
  // Bytes of `codes` advised for 2 MiB pages at the last calibration (CalibrateSketch): the whole
  // huge pages inside the rows written then, never beyond them, so the resident bytes stay the
  // index bytes a budget counts (rows appended later stay on 4 KiB pages).
  int64_t hugePageBytes = 0;

  int64_t tokens() const { return int64_t(rowScale.size()); }
  static constexpr int64_t RowBytes(int dim, int bits) { return bits == 4 ? (int64_t(dim) + 1) / 2 : int64_t(dim); }
  int64_t RowBytes() const { return RowBytes(dim, bits); }
  // Bytes per token of one kv head: codes plus the f32 row scale.
  static constexpr int64_t BytesPerToken(int dim, int bits) { return RowBytes(dim, bits) + 4; }
  int64_t BytesPerToken() const { return BytesPerToken(dim, bits); }
  int64_t Bytes() const { return int64_t(codes.size() + (rowScale.size() + channelScale.size()) * 4); }
};

// Channel scales from tokens [0, tokens) of kv head h (max |k| per channel; 1 for an all-zero or
// empty channel), then every row [0, tokens) quantized afresh.
void CalibrateSketch(const KvView& kv, int h, int64_t tokens, KeySketch& s);
// Appends rows [s.tokens(), tokens) of kv head h with the current channel scales.
void AppendSketch(const KvView& kv, int h, int64_t tokens, KeySketch& s, int64_t first = 0);

// One row's codes: scale s = max_d |x[d] invC[d]| / levels, codes round-to-even(x[d] invC[d] / s) in
// [-levels, levels] into codes[0, dim) (invC null: unit channel scales; an all-zero row: scale 0,
// codes 0). False for a non-finite row (codes 0, scale NaN). The sketch's rows and the index's int8
// centroid tiles and their queries (index.h) are quantized by it.
bool QuantizeCodes(const float* x, const float* invC, int dim, float levels, int8_t* codes, float* scale);

// A query group prepared for ScoreSketchRows: group rows of dim int16, one f32 scale per row, and
// (4 bits) 8 x the row's integer sum, the offset the unsigned codes add.
struct SketchQuery {
  std::vector<int16_t> q;
  // 4 bits: the kernel PrepareSketchQuery chose (by the index kernels' level), which ScoreSketchRows
  // then runs, and q (within int8) in that kernel's order: VNNI's (key_sketch.cc), or dim order
  // over whole 64-dim blocks for AVX2 (empty for the scalar kernel, which reads q).
  enum class Kernel4 : unsigned char { Scalar, Avx2, Vnni } kernel4 = Kernel4::Scalar;
  std::vector<int8_t> q8;
  std::vector<int32_t> qt;  // VNNI, head dims a multiple of 128, groups of whole fours: Tiles16Vnni's query
  std::vector<float> scale;
  std::vector<int32_t> offset;
  std::vector<float> rowScale;  // ScoreSketchRows' scratch (the scored rows' scales)
};
void PrepareSketchQuery(const float* q, int group, const KeySketch& s, SketchQuery& out);

// out[j * ld + i] = approximate q_j . (the key of sketch row rows[i]) for j < group, i < n (see
// the header comment). Rows are read in the order given (ascending runs read the sketch forwards).
// Rows must be < s.tokens(). A non-finite row scale (a NaN/Inf key) gives a non-finite score.
void ScoreSketchRows(SketchQuery& q, int group, const KeySketch& s, const int32_t* rows, size_t n, float* out,
                     size_t ld);

}  // namespace kvd
