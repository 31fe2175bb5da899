// Key sketch: a compact int8 copy of one kv head's keys that kvdrive's level-3 re-rank scores when
// select() is not given the keys (the runtime's offloaded paths keep K/V on SSD / in DRAM tiers and
// only the index in memory), or when it is told to prefer the sketch.
//
// Quantization (per kv head): keys are first divided by a per-channel scale c[d] (the channel's
// max |k| over the tokens seen at calibration; outlier channels do not eat every other channel's
// precision), then each token row gets its own scale s_t = max_d |k_t[d] / c[d]| / 127 and int8
// codes round(k_t[d] / (c[d] s_t)). So k_t[d] ~= c[d] * s_t * code_t[d]; a token later than the
// calibration that exceeds a channel's range only costs that row some precision (s_t grows).
// Layout: rows in token order, contiguous per head (a chunk's rows are one read), dim bytes of
// codes plus one f32 scale per token: dim + 4 bytes per token and kv head (132 B at dim 128, vs
// 256 B of f16 keys).
//
// Scoring: q_j . k_t ~= s_t * qs_j * sum_d q16_j[d] * code_t[d], with q16_j = round(q_j[d] c[d] /
// qs_j) an integer query (qs_j chosen so that |q16| * 127 * dim fits int32). The sum is exact
// integer arithmetic, so the scores are bit-identical at every SIMD level and in any order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "args.h"

namespace kvd {

struct KeySketch {
  int dim = 0;
  std::vector<float> channelScale;  // dim: c[d] > 0
  std::vector<int8_t> codes;        // tokens x dim
  std::vector<float> rowScale;      // tokens: s_t
  int64_t calibratedAt = 0;         // tokens the channel scales were measured on

  int64_t tokens() const { return int64_t(rowScale.size()); }
  int64_t Bytes() const { return int64_t(codes.size() + (rowScale.size() + channelScale.size()) * 4); }
  static constexpr int64_t BytesPerToken(int dim) { return int64_t(dim) + 4; }
};

// Channel scales from tokens [0, tokens) of kv head h (max |k| per channel; 1 for an all-zero or
// empty channel), then every row [0, tokens) quantized afresh.
void CalibrateSketch(const KvView& kv, int h, int64_t tokens, KeySketch& s);
// Appends rows [s.tokens(), tokens) of kv head h with the current channel scales.
void AppendSketch(const KvView& kv, int h, int64_t tokens, KeySketch& s, int64_t first = 0);

// A query group prepared for ScoreSketchRows: group rows of dim int16, and one f32 scale per row.
struct SketchQuery {
  std::vector<int16_t> q;
  std::vector<float> scale;
};
void PrepareSketchQuery(const float* q, int group, const KeySketch& s, SketchQuery& out);

// out[j * ld + i] = approximate q_j . k_{tokens[i]} for j < group, i < n (see the header comment).
// Rows are gathered in the order given (ascending tokens read the sketch forwards). Tokens must be
// < s.tokens(). A non-finite row scale (a NaN/Inf key) gives a non-finite score.
void ScoreSketchRows(const SketchQuery& q, int group, const KeySketch& s, const int64_t* tokens, size_t n, float* out,
                     size_t ld);

}  // namespace kvd
