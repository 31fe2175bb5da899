// Exact span attention (attention.h): two passes over the attended tokens of one kv head.
//
//   pass 1  logits[j][t] = q_j · k_t            dot_rows: one read of k_t for the whole GQA group
//   pass 2  logits *= scale; m_j = max_t        (non-finite logits detected here)
//   pass 3  p[j][t] = exp(logit - m_j); s_j = sum_t p[j][t]
//   pass 4  out_j = (sum_t p[j][t] v_t) / s_j   weighted_rows over tiles of kTileRows value rows
//   lse_j = m_j + log(s_j)
//
// Logits live group-major (row j has `total` entries) in the caller's scratch so passes 2–3 run
// over contiguous memory. Tiles in pass 4 are cut by position in the concatenated token sequence,
// never by span, and weighted_rows sums rows strictly in order: so the arithmetic depends only on
// the token order, which is the determinism contract of attention.h.
#include "attention.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "attn_simd.h"
#include "simd.h"

namespace kvd {
namespace {

constexpr size_t kTileRows = 32;  // value rows per weighted_rows call (32 x 256 B f16 rows stay in L1)

int64_t TotalTokens(const Span* spans, size_t nSpans) {
  int64_t total = 0;
  for (size_t s = 0; s < nSpans; ++s) {
    if (spans[s].len < 0)
      Throw("E_INTERNAL", "AttendHeadSpans: span " + std::to_string(s) + " has negative length " +
                              std::to_string(spans[s].len));
    total += spans[s].len;
  }
  return total;
}

// Maps a position in the concatenated sequence to (span, row within span).
void Locate(const Span* spans, size_t nSpans, int64_t pos, size_t* span, int64_t* row) {
  for (size_t s = 0; s < nSpans; ++s) {
    if (pos < spans[s].len) {
      *span = s;
      *row = pos;
      return;
    }
    pos -= spans[s].len;
  }
  *span = nSpans;
  *row = 0;
}

// Pass 1: L[j * total + pos] = q_j · k_pos (unscaled).
void Logits(const float* qGroup, int group, int dim, Dtype dt, const Span* spans, size_t nSpans, int64_t total,
            float* L) {
  const SimdKernels& simd = Simd();
  const size_t esz = DtypeSize(dt);
  float stackTmp[64];
  std::vector<float> heapTmp;
  float* tmp = stackTmp;
  if (group > 64) {
    heapTmp.resize(size_t(group));
    tmp = heapTmp.data();
  }
  int64_t pos = 0;
  for (size_t s = 0; s < nSpans; ++s) {
    const uint8_t* k = static_cast<const uint8_t*>(spans[s].k);
    const int64_t strideBytes = spans[s].kStride * int64_t(esz);
    for (int64_t t = 0; t < spans[s].len; ++t, ++pos) {
      simd.dot_rows(qGroup, size_t(group), k + t * strideBytes, dt, size_t(dim), tmp);
      for (int j = 0; j < group; ++j) L[size_t(j) * size_t(total) + size_t(pos)] = tmp[j];
    }
  }
}

[[noreturn]] void ThrowNonFiniteLogit(const float* L, int group, int64_t total, const Span* spans, size_t nSpans) {
  int64_t first = total;
  for (int j = 0; j < group; ++j)
    for (int64_t p = 0; p < first; ++p)
      if (!std::isfinite(L[size_t(j) * size_t(total) + size_t(p)])) {
        first = p;
        break;
      }
  size_t span;
  int64_t row;
  Locate(spans, nSpans, first, &span, &row);
  throw NonFiniteRowError(span, row, false,
                          "attention logit is not finite at row " + std::to_string(row) + " of span " +
                              std::to_string(span) + " (NaN/Inf in the key row, or q·k overflowed)");
}

[[noreturn]] void ThrowNonFiniteOutput(int dim, Dtype dt, const Span* spans, size_t nSpans) {
  const size_t esz = DtypeSize(dt);
  for (size_t s = 0; s < nSpans; ++s) {
    const uint8_t* v = static_cast<const uint8_t*>(spans[s].v);
    for (int64_t t = 0; t < spans[s].len; ++t) {
      const void* row = v + t * spans[s].vStride * int64_t(esz);
      for (int d = 0; d < dim; ++d)
        if (!std::isfinite(LoadElem(row, dt, size_t(d))))
          throw NonFiniteRowError(s, t, true,
                                  "attention output is not finite: NaN/Inf in the value row at row " +
                                      std::to_string(t) + " of span " + std::to_string(s));
    }
  }
  // Every value is finite, so the weighted sum itself overflowed f32.
  throw NonFiniteRowError(nSpans, 0, true, "attention output overflowed f32 (value rows too large)");
}

// Passes 2–3 on L: scales, subtracts the max, exponentiates. Writes m[j], s[j].
void Softmax(float* L, int group, int64_t total, float scale, const Span* spans, size_t nSpans, float* m, float* s) {
  const AttnKernels& attn = AttnSimd();
  bool finite = true;
  for (int j = 0; j < group; ++j) m[j] = attn.scale_max(L + size_t(j) * size_t(total), size_t(total), scale, &finite);
  if (!finite) ThrowNonFiniteLogit(L, group, total, spans, nSpans);
  for (int j = 0; j < group; ++j) s[j] = attn.exp_sum(L + size_t(j) * size_t(total), size_t(total), m[j]);
}

}  // namespace

void AttendHeadSpans(const float* qGroup, int group, int dim, Dtype dt, float scale, const Span* spans, size_t nSpans,
                     float* out, float* lse, float* spanMass, AttnScratch& scratch) {
  const int64_t total = TotalTokens(spans, nSpans);
  std::fill(out, out + size_t(group) * size_t(dim), 0.f);
  if (spanMass) std::fill(spanMass, spanMass + nSpans, 0.f);
  if (total == 0) {
    std::fill(lse, lse + group, -INFINITY);
    return;
  }
  scratch.logits.resize(size_t(group) * size_t(total));
  float* L = scratch.logits.data();
  Logits(qGroup, group, dim, dt, spans, nSpans, total, L);

  std::vector<float> ms(size_t(group) * 2);
  float* m = ms.data();
  float* s = m + group;
  Softmax(L, group, total, scale, spans, nSpans, m, s);

  // Pass 4: out_j += sum_t p[j][t] v_t, tile by tile in token order.
  const AttnKernels& attn = AttnSimd();
  const size_t esz = DtypeSize(dt);
  const void* rows[kTileRows];
  size_t nr = 0;
  int64_t tileStart = 0;
  for (size_t sp = 0; sp < nSpans; ++sp) {
    const uint8_t* v = static_cast<const uint8_t*>(spans[sp].v);
    const int64_t strideBytes = spans[sp].vStride * int64_t(esz);
    for (int64_t t = 0; t < spans[sp].len; ++t) {
      rows[nr++] = v + t * strideBytes;
      if (nr == kTileRows) {
        attn.weighted_rows(out, size_t(group), L + tileStart, size_t(total), rows, nr, dt, size_t(dim));
        tileStart += int64_t(nr);
        nr = 0;
      }
    }
  }
  if (nr) attn.weighted_rows(out, size_t(group), L + tileStart, size_t(total), rows, nr, dt, size_t(dim));

  bool finite = true;
  for (int j = 0; j < group; ++j) {
    const float inv = 1.f / s[j];  // s[j] >= 1: the max logit contributes exp(0)
    float* o = out + size_t(j) * size_t(dim);
    for (int d = 0; d < dim; ++d) {
      o[d] *= inv;
      finite &= std::isfinite(o[d]);
    }
    lse[j] = m[j] + std::log(s[j]);
  }
  if (!finite) ThrowNonFiniteOutput(dim, dt, spans, nSpans);

  if (spanMass) {
    int64_t pos = 0;
    for (size_t sp = 0; sp < nSpans; ++sp) {
      double mass = 0.0;
      for (int j = 0; j < group; ++j) {
        const float* p = L + size_t(j) * size_t(total) + size_t(pos);
        double sj = 0.0;
        for (int64_t t = 0; t < spans[sp].len; ++t) sj += p[t];
        mass += sj / double(s[j]);
      }
      spanMass[sp] = float(mass / group);
      pos += spans[sp].len;
    }
  }
}

void AttentionProbsHeadSpans(const float* qGroup, int group, int dim, Dtype dt, float scale, const Span* spans,
                             size_t nSpans, float* probs) {
  const int64_t total = TotalTokens(spans, nSpans);
  if (total == 0) return;
  Logits(qGroup, group, dim, dt, spans, nSpans, total, probs);
  std::vector<float> ms(size_t(group) * 2);
  Softmax(probs, group, total, scale, spans, nSpans, ms.data(), ms.data() + group);
  for (int j = 0; j < group; ++j) {
    const float inv = 1.f / ms[size_t(group + j)];
    float* p = probs + size_t(j) * size_t(total);
    for (int64_t t = 0; t < total; ++t) p[t] *= inv;
  }
}

void MergeAttention(float* outA, float* lseA, const float* outB, const float* lseB, int heads, int dim) {
  for (int h = 0; h < heads; ++h) {
    const float la = lseA[h], lb = lseB[h];
    const float m = std::max(la, lb);
    if (m == -INFINITY) continue;  // both partials are over no tokens: A (zeros, -inf) stays
    const float wa = std::exp(la - m), wb = std::exp(lb - m);
    const float sum = wa + wb;
    const float ca = wa / sum, cb = wb / sum;
    float* oa = outA + size_t(h) * size_t(dim);
    const float* ob = outB + size_t(h) * size_t(dim);
    for (int d = 0; d < dim; ++d) oa[d] = ca * oa[d] + cb * ob[d];
    lseA[h] = m + std::log(sum);
  }
}

}  // namespace kvd
