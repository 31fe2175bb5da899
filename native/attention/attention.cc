// Exact span attention (attention.h): ONE pass over the attended tokens of each kv head, tile by
// tile (kTileRows positions), with an online softmax (flash-decoding's recurrence):
//
//   L[j][t] = q_j · k_t                       logits_rows: one read of k_t for the whole GQA group
//   L *= scale; mt_j = max over the tile      (non-finite logits detected here)
//   m_j' = max(m_j, mt_j); if it grew, acc_j and s_j are rescaled by exp(m_j - m_j')
//   L[j][t] = exp(L[j][t] - m_j'); s_j += sum over the tile
//   acc_j += sum_t L[j][t] v_t                weighted_rows, on the tile's value rows
//   out_j = acc_j / s_j; lse_j = m_j + log(s_j)
//
// A tile's key and value rows are consumed together, and the next tile's are prefetched while this
// one computes (logits_rows prefetches its keys, weighted_rows its values), so each selected token's
// K and V rows are requested once, together, a tile ahead: memory latency overlaps arithmetic in
// one stream instead of two passes that each wait on DRAM (scattered rows: the runtime's
// token-granular selections read from DRAM-tier pages).
//
// Logits live group-major (row j has `total` entries) in the caller's scratch; after the pass they
// hold exp(logit - m at that tile), and each tile's m is kept, so span masses are exact afterwards.
// With several heads per call the heads take turns tile by tile, so in a token-major cache the
// rows of all heads of the same tokens are read together (one stream). Tiles are cut by position
// in each head's concatenated token sequence, never by span, and weighted_rows sums rows strictly
// in order: the arithmetic depends only on the token order (and not on the other heads in the
// call), which is the determinism contract of attention.h.
#include "attention/attention.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "attention/attn_simd.h"
#include "common/simd.h"

namespace kvd {
namespace {

constexpr size_t kTileRows = 16;  // rows per kernel call (16 x 256 B f16 rows stay in L1)

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

// Walks the rows of a span list in token order: each row's key and value.
class RowCursor {
 public:
  RowCursor(const Span* spans, size_t n, size_t esz) : spans_(spans), n_(n), esz_(int64_t(esz)) {}
  // The next row's key and value; false after the last.
  bool Next(const void** k, const void** v) {
    while (s_ < n_ && t_ >= spans_[s_].len) {
      ++s_;
      t_ = 0;
    }
    if (s_ >= n_) return false;
    const Span& sp = spans_[s_];
    *k = static_cast<const uint8_t*>(sp.k) + t_ * sp.kStride * esz_;
    *v = static_cast<const uint8_t*>(sp.v) + t_ * sp.vStride * esz_;
    ++t_;
    return true;
  }

 private:
  const Span* spans_;
  size_t n_;
  int64_t esz_;
  size_t s_ = 0;
  int64_t t_ = 0;
};

size_t Tiles(int64_t total) { return size_t((total + int64_t(kTileRows) - 1) / int64_t(kTileRows)); }

// One tile of one head: its rows' keys and values (n <= kTileRows).
struct Tile {
  size_t head = 0, tile = 0, n = 0;
  const void* k[kTileRows];
  const void* v[kTileRows];
};

// Calls kernel(tile, ahead) for every tile of kTileRows consecutive rows of every active head:
// tile-major, heads taking turns, so the heads' rows of the same positions are read together.
// `ahead` is the tile the kernel runs next (null after the last): its rows are collected one call
// early for the kernel to prefetch while it computes, so scattered rows (sparse chunks, strided
// heads, token-granular selections) are requested before they are used.
//
// The distance is one tile (16 rows; 64 lines of 256-byte f16 rows per side): enough to cover
// DRAM latency at the rate rows are consumed, few enough that the prefetches fit the core's miss
// buffers. It used to be 4 x 32 = 128 rows (512 lines requested ahead), and the logits kernel's
// samples sat almost all on its prefetch instructions; 16 rows measured faster (bench/RESULTS.md).
template <typename Kernel>
void ForEachTile(const HeadAttn* heads, size_t nHeads, const int64_t* totals, const bool* active, size_t esz,
                 Kernel&& kernel) {
  std::vector<RowCursor> cursors;
  cursors.reserve(nHeads);
  size_t maxTiles = 0;
  for (size_t h = 0; h < nHeads; ++h) {
    cursors.emplace_back(heads[h].spans, active[h] ? heads[h].nSpans : 0, esz);
    if (active[h]) maxTiles = std::max(maxTiles, Tiles(totals[h]));
  }
  if (maxTiles == 0) return;
  size_t tile = 0, head = size_t(-1);
  // Collects the next (tile, head) that has rows into c; false after the last.
  auto collect = [&](Tile& c) {
    for (;;) {
      if (++head >= nHeads) {
        head = 0;
        if (++tile >= maxTiles) return false;
      }
      if (active[head] && tile < Tiles(totals[head])) break;
    }
    c.head = head;
    c.tile = tile;
    c.n = 0;
    while (c.n < kTileRows && cursors[head].Next(&c.k[c.n], &c.v[c.n])) ++c.n;
    return true;
  };
  Tile ring[2];
  if (!collect(ring[0])) return;
  for (size_t i = 0;; ++i) {
    Tile& next = ring[(i + 1) & 1];
    const bool have = collect(next);
    kernel(ring[i & 1], have ? &next : nullptr);
    if (!have) return;
  }
}

// Logits of several heads: L_h[j * total_h + pos] = q_j · k_pos (unscaled); AttentionProbsHeadSpans.
void Logits(const HeadAttn* heads, size_t nHeads, const int64_t* totals, float* const* Ls, int group, int dim,
            Dtype dt) {
  const AttnKernels& attn = AttnSimd();
  std::unique_ptr<bool[]> active(new bool[nHeads]);
  std::fill(active.get(), active.get() + nHeads, true);
  ForEachTile(heads, nHeads, totals, active.get(), DtypeSize(dt), [&](const Tile& c, const Tile* a) {
    attn.logits_rows(heads[c.head].qGroup, size_t(group), c.k, c.n, dt, size_t(dim), Ls[c.head] + c.tile * kTileRows,
                     size_t(totals[c.head]), a ? a->k : nullptr, a ? a->n : 0);
  });
}

// The first non-finite scaled logit at positions [from, to) of L (every position before `from` is
// known to be finite) names the row.
[[noreturn]] void ThrowNonFiniteLogit(size_t head, const float* L, int group, int64_t total, int64_t from, int64_t to,
                                      const Span* spans, size_t nSpans) {
  int64_t first = to;
  for (int j = 0; j < group; ++j)
    for (int64_t p = from; p < first; ++p)
      if (!std::isfinite(L[size_t(j) * size_t(total) + size_t(p)])) {
        first = p;
        break;
      }
  size_t span;
  int64_t row;
  Locate(spans, nSpans, first, &span, &row);
  throw NonFiniteRowError(head, span, row, false,
                          "attention logit is not finite at row " + std::to_string(row) + " of span " +
                              std::to_string(span) + " (NaN/Inf in the key row, or q·k overflowed)");
}

[[noreturn]] void ThrowNonFiniteOutput(size_t head, int dim, Dtype dt, const Span* spans, size_t nSpans) {
  const size_t esz = DtypeSize(dt);
  for (size_t s = 0; s < nSpans; ++s) {
    const uint8_t* v = static_cast<const uint8_t*>(spans[s].v);
    for (int64_t t = 0; t < spans[s].len; ++t) {
      const void* row = v + t * spans[s].vStride * int64_t(esz);
      for (int d = 0; d < dim; ++d)
        if (!std::isfinite(LoadElem(row, dt, size_t(d))))
          throw NonFiniteRowError(head, s, t, true,
                                  "attention output is not finite: NaN/Inf in the value row at row " +
                                      std::to_string(t) + " of span " + std::to_string(s));
    }
  }
  // Every value is finite, so the weighted sum itself overflowed f32.
  throw NonFiniteRowError(head, nSpans, 0, true, "attention output overflowed f32 (value rows too large)");
}

// Softmax of one head's whole logits (AttentionProbsHeadSpans): scale, max, exp, sum. Returns
// false when a scaled logit is not finite (L is then left partly scaled; the caller reports the row).
bool Softmax(float* L, int group, int64_t total, float scale, float* m, float* s) {
  const AttnKernels& attn = AttnSimd();
  bool finite = true;
  for (int j = 0; j < group; ++j) m[j] = attn.scale_max(L + size_t(j) * size_t(total), size_t(total), scale, &finite);
  if (!finite) return false;
  for (int j = 0; j < group; ++j) s[j] = attn.exp_sum(L + size_t(j) * size_t(total), size_t(total), m[j]);
  return true;
}

enum class HeadState : uint8_t { Ok, Empty, BadLogit, BadOutput };

}  // namespace

void AttendHeadsSpans(const HeadAttn* heads, size_t nHeads, int group, int dim, Dtype dt, float scale,
                      AttnScratch& scratch) {
  const AttnKernels& attn = AttnSimd();
  const size_t esz = DtypeSize(dt);
  const size_t g = size_t(group);
  std::vector<int64_t> totals(nHeads);
  std::vector<size_t> offsets(nHeads + 1, 0), tileOff(nHeads + 1, 0);
  for (size_t h = 0; h < nHeads; ++h) {
    totals[h] = TotalTokens(heads[h].spans, heads[h].nSpans);
    offsets[h + 1] = offsets[h] + g * size_t(totals[h]);
    tileOff[h + 1] = tileOff[h] + g * Tiles(totals[h]);
    std::fill(heads[h].out, heads[h].out + g * size_t(dim), 0.f);
    if (heads[h].spanMass) std::fill(heads[h].spanMass, heads[h].spanMass + heads[h].nSpans, 0.f);
    if (heads[h].spanMassByQuery)
      std::fill(heads[h].spanMassByQuery, heads[h].spanMassByQuery + g * heads[h].nSpans, 0.f);
  }
  scratch.logits.resize(offsets[nHeads]);
  std::vector<float*> Ls(nHeads);
  for (size_t h = 0; h < nHeads; ++h) Ls[h] = scratch.logits.data() + offsets[h];

  // Per head and query: the running max m and sum s (m: -inf until the first tile); per tile and
  // query the m its exponentials were taken against (tileM, at tileOff[h] + tile * group + j).
  std::vector<float> ms(nHeads * g * 2);
  std::vector<float> tileM(tileOff[nHeads]);
  std::vector<HeadState> state(nHeads, HeadState::Ok);
  std::vector<size_t> badTile(nHeads, 0);
  std::unique_ptr<bool[]> active(new bool[nHeads]);
  for (size_t h = 0; h < nHeads; ++h) {
    float* m = ms.data() + h * g * 2;
    std::fill(m, m + g, -INFINITY);
    std::fill(m + g, m + 2 * g, 0.f);
    active[h] = totals[h] > 0;
    if (!active[h]) {
      state[h] = HeadState::Empty;
      std::fill(heads[h].lse, heads[h].lse + group, -INFINITY);
    }
  }
  std::vector<float> tileMax(g);

  ForEachTile(heads, nHeads, totals.data(), active.get(), esz, [&](const Tile& c, const Tile* a) {
    const size_t h = c.head;
    if (state[h] != HeadState::Ok) return;  // a head with a non-finite logit attends no further
    const size_t ld = size_t(totals[h]);
    float* L = Ls[h] + c.tile * kTileRows;
    attn.logits_rows(heads[h].qGroup, g, c.k, c.n, dt, size_t(dim), L, ld, a ? a->k : nullptr, a ? a->n : 0);
    bool finite = true;
    for (size_t j = 0; j < g; ++j) tileMax[j] = attn.scale_max(L + j * ld, c.n, scale, &finite);
    if (!finite) {
      state[h] = HeadState::BadLogit;
      badTile[h] = c.tile;
      return;
    }
    float* m = ms.data() + h * g * 2;
    float* s = m + g;
    float* tm = tileM.data() + tileOff[h] + c.tile * g;
    for (size_t j = 0; j < g; ++j) {
      if (tileMax[j] > m[j]) {
        if (m[j] != -INFINITY) {  // earlier tiles' exponentials were taken against a smaller max
          const float f = std::exp(m[j] - tileMax[j]);
          s[j] *= f;
          float* o = heads[h].out + j * size_t(dim);
          for (int d = 0; d < dim; ++d) o[d] *= f;
        }
        m[j] = tileMax[j];
      }
      tm[j] = m[j];
      s[j] += attn.exp_sum(L + j * ld, c.n, m[j]);
    }
    attn.weighted_rows(heads[h].out, g, L, ld, c.v, c.n, dt, size_t(dim), a ? a->v : nullptr, a ? a->n : 0);
  });

  // Normalise, lse, output check, span mass.
  std::vector<double> factor;
  for (size_t h = 0; h < nHeads; ++h) {
    if (state[h] != HeadState::Ok) continue;
    const float* m = ms.data() + h * g * 2;
    const float* s = m + g;
    bool finite = true;
    for (size_t j = 0; j < g; ++j) {
      const float inv = 1.f / s[j];  // s[j] >= 1: the max logit contributes exp(0)
      float* o = heads[h].out + j * size_t(dim);
      for (int d = 0; d < dim; ++d) {
        o[d] *= inv;
        finite &= std::isfinite(o[d]);
      }
      heads[h].lse[j] = m[j] + std::log(s[j]);
    }
    if (!finite) {
      state[h] = HeadState::BadOutput;
      continue;
    }
    if (heads[h].spanMass || heads[h].spanMassByQuery) {
      // Tile t's entries are exp(logit - tileM[t]); probability = entry * exp(tileM[t] - m) / s.
      const size_t total = size_t(totals[h]), tiles = Tiles(totals[h]);
      const float* tm = tileM.data() + tileOff[h];
      factor.resize(tiles * g);
      for (size_t t = 0; t < tiles; ++t)
        for (size_t j = 0; j < g; ++j) factor[j * tiles + t] = std::exp(double(tm[t * g + j]) - double(m[j])) / double(s[j]);
      float* mass = heads[h].spanMass;
      float* byQuery = heads[h].spanMassByQuery;
      const float* L = Ls[h];
      size_t pos = 0;
      for (size_t sp = 0; sp < heads[h].nSpans; ++sp) {
        const size_t len = size_t(heads[h].spans[sp].len);
        double acc = 0.0;
        for (size_t j = 0; j < g; ++j) {
          const float* p = L + j * total;
          const double* f = factor.data() + j * tiles;
          double sj = 0.0;
          for (size_t t = pos; t < pos + len; ++t) sj += double(p[t]) * f[t / kTileRows];
          acc += sj;
          if (byQuery) byQuery[j * heads[h].nSpans + sp] = float(sj);
        }
        if (mass) mass[sp] = float(acc / group);
        pos += len;
      }
    }
  }

  // Report the lowest failing head, so the error does not depend on how heads were grouped.
  for (size_t h = 0; h < nHeads; ++h) {
    if (state[h] == HeadState::BadLogit) {
      const int64_t from = int64_t(badTile[h] * kTileRows);
      ThrowNonFiniteLogit(h, Ls[h], group, totals[h], from, std::min(totals[h], from + int64_t(kTileRows)),
                          heads[h].spans, heads[h].nSpans);
    }
    if (state[h] == HeadState::BadOutput) ThrowNonFiniteOutput(h, dim, dt, heads[h].spans, heads[h].nSpans);
  }
}

void AttendHeadSpans(const float* qGroup, int group, int dim, Dtype dt, float scale, const Span* spans, size_t nSpans,
                     float* out, float* lse, float* spanMass, AttnScratch& scratch) {
  const HeadAttn head{qGroup, spans, nSpans, out, lse, spanMass};
  AttendHeadsSpans(&head, 1, group, dim, dt, scale, scratch);
}

void AttentionProbsHeadSpans(const float* qGroup, int group, int dim, Dtype dt, float scale, const Span* spans,
                             size_t nSpans, float* probs) {
  const int64_t total = TotalTokens(spans, nSpans);
  if (total == 0) return;
  const HeadAttn head{qGroup, spans, nSpans, nullptr, nullptr, nullptr};
  Logits(&head, 1, &total, &probs, group, dim, dt);
  std::vector<float> ms(size_t(group) * 2);
  if (!Softmax(probs, group, total, scale, ms.data(), ms.data() + group))
    ThrowNonFiniteLogit(0, probs, group, total, 0, total, spans, nSpans);
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
