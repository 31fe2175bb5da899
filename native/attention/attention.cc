// Exact span attention (attention.h): two passes over the attended tokens of each kv head.
//
//   pass 1  logits[j][t] = q_j · k_t            logits_rows: one read of k_t for the whole GQA group
//   pass 2  logits *= scale; m_j = max_t        (non-finite logits detected here)
//   pass 3  p[j][t] = exp(logit - m_j); s_j = sum_t p[j][t]
//   pass 4  out_j = (sum_t p[j][t] v_t) / s_j   weighted_rows
//   lse_j = m_j + log(s_j)
//
// Logits live group-major (row j has `total` entries) in the caller's scratch so passes 2–3 run
// over contiguous memory. Passes 1 and 4 walk rows in tiles of kTileRows positions; with several
// heads per call the heads take turns tile by tile, so in a token-major cache the rows of all
// heads of the same tokens are read together (one stream) rather than one strided pass per head.
// Tiles are cut by position in each head's concatenated token sequence, never by span, and
// weighted_rows sums rows strictly in order: the arithmetic depends only on the token order (and
// not on the other heads in the call), which is the determinism contract of attention.h.
#include "attention/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

// Walks the rows (keys or values) of a span list in token order.
class RowCursor {
 public:
  RowCursor(const Span* spans, size_t n, bool values, size_t esz) : spans_(spans), n_(n), values_(values), esz_(esz) {}
  // Writes the next rows, up to `max`, to out (fewer after the last); returns how many. A span's
  // run is written in one loop (a dense span fills a whole tile without per-row checks).
  size_t Fill(const void** out, size_t max) {
    size_t n = 0;
    while (n < max && s_ < n_) {
      const Span& sp = spans_[s_];
      if (t_ >= sp.len) {
        ++s_;
        t_ = 0;
        continue;
      }
      const uint8_t* base = static_cast<const uint8_t*>(values_ ? sp.v : sp.k);
      const int64_t stride = (values_ ? sp.vStride : sp.kStride) * int64_t(esz_);
      const size_t take = size_t(std::min<int64_t>(int64_t(max - n), sp.len - t_));
      const uint8_t* p = base + t_ * stride;
      for (size_t i = 0; i < take; ++i, p += stride) out[n + i] = p;
      n += take;
      t_ += int64_t(take);
    }
    return n;
  }

 private:
  const Span* spans_;
  size_t n_;
  bool values_;
  size_t esz_;
  size_t s_ = 0;
  int64_t t_ = 0;
};

size_t Tiles(int64_t total) { return size_t((total + int64_t(kTileRows) - 1) / int64_t(kTileRows)); }

// Calls kernel(head, tile, rows, n, aheadRows, nAhead, to) for every tile of kTileRows consecutive rows
// (keys or values) of every active head: tile-major, heads taking turns, so the heads' rows of the
// same positions are read together. Row pointers are collected `lookahead` calls ahead and passed as
// aheadRows for the kernel to prefetch while it computes, so scattered rows (sparse chunks, strided
// heads) are requested before they are used. (Rows in runs of a row or two, token-granular
// selections, are copied together first instead: ForEachGatheredTile.)
//
// The distance depends on how the rows lie. Rows in short spans (sparse chunks, chunk selections of
// a page or so per span): kLookaheadScattered = 1 call = 16 rows
// (64 lines of 256-byte f16 rows), enough to cover DRAM latency at the rate rows are consumed, few
// enough that the prefetches fit the core's miss buffers (it used to be 4 x 32 = 128 rows, and the
// logits kernel's samples sat almost all on its prefetch instructions; 16 rows measured faster,
// bench/RESULTS.md). Rows in long spans (averaging kStreamedRowsPerSpan rows or more: dense
// attention and its parts): kLookaheadStreamed = 4 calls, i.e. with the heads of a token-major
// cache taking turns, 4 heads' tiles = 16 KiB further along the same stream. At 1 call the dense
// kernel's samples sat on its key loads (perf: ~47% of LogitsBlock's on vcvtph2ps); 2-6 calls took
// ~20% less CPU per dense call than 1 in alternated runs, 8 (the same head's next tile) did not
// (bench/RESULTS.md, "Dense attention: a longer prefetch distance over long spans"). Streamed rows
// are prefetched into L2, scattered ones into L1 (PrefetchTo, attn_simd.h).
constexpr size_t kLookaheadScattered = 1;
constexpr size_t kLookaheadStreamed = 4;
constexpr size_t kMaxLookahead = 4;
//
// `prefetchValues` (with keys): the VALUE rows of the tile ahead are requested too, into L2, before
// each call, so the values pass later finds its scattered rows already near (token by token, a
// selected row's K and V are requested together; the values pass still prefetches them into L1).
// Measured on DRAM-tier pages (bench/attend-ab.ts): ~15-20% less CPU per attendFetched call.

// Spans averaging fewer rows than kScatteredRowsPerSpan count as scattered (their values are
// prefetched by the keys pass); averaging kStreamedRowsPerSpan or more, as streamed.
constexpr size_t kScatteredRowsPerSpan = 16;
constexpr size_t kStreamedRowsPerSpan = 256;
bool Scattered(size_t rows, size_t spans) { return spans > 0 && rows < kScatteredRowsPerSpan * spans; }
size_t LookaheadFor(size_t rows, size_t spans) {
  return spans > 0 && rows >= kStreamedRowsPerSpan * spans ? kLookaheadStreamed : kLookaheadScattered;
}

template <typename Kernel>
void ForEachTile(const HeadAttn* heads, size_t nHeads, const int64_t* totals, const bool* active, bool values,
                 bool prefetchValues, size_t lookahead, size_t esz, size_t rowBytes, Kernel&& kernel) {
  const PrefetchTo to = lookahead >= kLookaheadStreamed ? PrefetchTo::L2 : PrefetchTo::L1;
  lookahead = std::min(std::max<size_t>(lookahead, 1), kMaxLookahead);
  prefetchValues = prefetchValues && !values;
  std::vector<RowCursor> cursors, valueCursors;
  cursors.reserve(nHeads);
  size_t maxTiles = 0;
  for (size_t h = 0; h < nHeads; ++h) {
    cursors.emplace_back(heads[h].spans, active[h] ? heads[h].nSpans : 0, values, esz);
    if (prefetchValues) valueCursors.emplace_back(heads[h].spans, active[h] ? heads[h].nSpans : 0, true, esz);
    if (active[h]) maxTiles = std::max(maxTiles, Tiles(totals[h]));
  }
  if (maxTiles == 0) return;
  struct Call {
    size_t head = 0, tile = 0, n = 0;
    const void* rows[kTileRows];
    const void* valueRows[kTileRows];  // with prefetchValues: the same rows' values
  };
  Call ring[kMaxLookahead + 1];
  size_t tile = 0, head = size_t(-1);
  // Collects the next (tile, head) call that has rows into c; false after the last.
  auto collect = [&](Call& c) {
    for (;;) {
      if (++head >= nHeads) {
        head = 0;
        if (++tile >= maxTiles) return false;
      }
      if (active[head] && tile < Tiles(totals[head])) break;
    }
    c.head = head;
    c.tile = tile;
    c.n = cursors[head].Fill(c.rows, kTileRows);
    if (prefetchValues) valueCursors[head].Fill(c.valueRows, c.n);
    return true;
  };
  size_t filled = 0;  // calls collected so far; call i lives in ring[i % (lookahead + 1)]
  while (filled <= lookahead && collect(ring[filled])) ++filled;
  for (size_t i = 0; i < filled; ++i) {
    const size_t ahead = i + lookahead;
    bool have = ahead < filled;
    if (!have && ahead == filled && collect(ring[ahead % (lookahead + 1)])) {
      ++filled;
      have = true;
    }
    const Call& c = ring[i % (lookahead + 1)];
    const Call* a = have ? &ring[ahead % (lookahead + 1)] : nullptr;
    if (a && prefetchValues)
      for (size_t r = 0; r < a->n; ++r)
        for (size_t off = 0; off < rowBytes; off += 64) __builtin_prefetch(static_cast<const char*>(a->valueRows[r]) + off, 0, 2);
    kernel(c.head, c.tile, static_cast<const void* const*>(c.rows), c.n,
           a ? static_cast<const void* const*>(a->rows) : nullptr, a ? a->n : 0, to);
  }
}

// Rows that lie in runs averaging fewer than kGatheredRowsPerRun rows (a run: consecutive spans whose
// rows follow each other in memory; token-granular selections, ~1-2 rows per run) are first copied,
// a block of positions of one head at a time, into a contiguous per-thread buffer, and the row
// kernels then run over the copy. Why: with the kernels' arithmetic between the loads, this machine
// keeps few misses in flight — a random 256-byte row cost ~140 ns inside the logits loop, prefetched
// or not — while a loop that only copies keeps many (~24 ns per row), and the copy is then read from
// L2 (bench/RESULTS.md, "Scattered rows copied together before the row kernels"). Runs of ~4 rows or
// more gained nothing from the copy there and are walked in place (ForEachTile). The copy holds the
// same bytes in the same order and tiles are still cut every kTileRows positions, so every output is
// bit-identical to the walk in place (the determinism contract of attention.h).
//
// A block is at most kGatherRows rows and kGatherBytes (256 f16 rows of dim 128 = 64 KiB), at
// least one tile; each row's lines are requested kGatherAhead rows before it is copied (without
// that the copy waited on each row in turn: ~2.5x slower per row).
constexpr size_t kGatheredRowsPerRun = 3;
constexpr size_t kGatherRows = 256;
constexpr size_t kGatherBytes = size_t(128) << 10;
constexpr size_t kGatherAhead = 16;

// Calls kernel(head, tile, rows, n, nullptr, 0, L1) like ForEachTile, head after head, over copies of
// the rows (keys or values) made a block at a time into `buf` (grown as needed, kept by the caller).
// While a block's tiles are computed, the next block's rows are requested into L2, spread over the
// tiles: the kernels' arithmetic then overlaps the next block's misses, and that block's copy finds
// its rows near. (Without it, copy and arithmetic took turns: attention over a token-granular
// selection cost the gather of its rows plus the arithmetic, bench/RESULTS.md.)
template <typename Kernel>
void ForEachGatheredTile(const HeadAttn* heads, size_t nHeads, const int64_t* totals, const bool* active, bool values,
                         size_t esz, size_t rowBytes, LineVector<uint8_t>& buf, Kernel&& kernel) {
  const size_t block = std::clamp(kGatherBytes / rowBytes / kTileRows * kTileRows, kTileRows, kGatherRows);
  if (buf.size() < block * rowBytes) buf.resize(block * rowBytes);
  uint8_t* const base = buf.data();
  const void* copies[kGatherRows];
  for (size_t i = 0; i < block; ++i) copies[i] = base + i * rowBytes;
  auto request = [&](const void* row, int locality) {
    for (size_t off = 0; off < rowBytes; off += 64)
      locality == 3 ? __builtin_prefetch(static_cast<const uint8_t*>(row) + off, 0, 3)
                    : __builtin_prefetch(static_cast<const uint8_t*>(row) + off, 0, 2);
  };
  // Blocks in order: every active head's positions, a block at a time.
  struct Block {
    size_t head = 0;
    int64_t pos = 0;
    size_t n = 0;
    const void* src[kGatherRows];
  };
  // One cursor, made afresh as the walk reaches each head (no allocation per call).
  size_t head = 0;
  int64_t pos = 0;
  RowCursor cursor(nHeads ? heads[0].spans : nullptr, nHeads ? heads[0].nSpans : 0, values, esz);
  auto next = [&](Block& b) {
    while (head < nHeads && (!active[head] || pos >= totals[head])) {
      ++head;
      pos = 0;
      if (head < nHeads) cursor = RowCursor(heads[head].spans, heads[head].nSpans, values, esz);
    }
    if (head >= nHeads) return false;
    b.head = head;
    b.pos = pos;
    b.n = cursor.Fill(b.src, block);
    pos += int64_t(block);
    return true;
  };
  Block pair[2];  // the block being copied and computed, and the one after it (~4 KiB of row pointers)
  Block* cur = &pair[0];
  Block* ahead = &pair[1];
  bool have = next(*cur);
  if (have)
    for (size_t i = 0; i < std::min(cur->n, kGatherAhead); ++i) request(cur->src[i], 3);
  while (have) {
    const size_t n = cur->n;
    for (size_t i = 0; i < n; ++i) {
      if (i + kGatherAhead < n) request(cur->src[i + kGatherAhead], 3);
      uint8_t* to = base + i * rowBytes;
      const uint8_t* from = static_cast<const uint8_t*>(cur->src[i]);
      // Whole 64-byte lines inline (rows of dim 128 are 256 / 512 B); any other size by memcpy.
      if (rowBytes % 64 == 0) {
        for (size_t off = 0; off < rowBytes; off += 64) std::memcpy(to + off, from + off, 64);
      } else {
        std::memcpy(to, from, rowBytes);
      }
    }
    const bool haveAhead = next(*ahead);
    // The next block's rows, requested a tile's share before each tile call (all of them by the last).
    const size_t aheadN = haveAhead ? ahead->n : 0;
    const size_t tiles = (n + kTileRows - 1) / kTileRows;
    const size_t perTile = tiles ? (aheadN + tiles - 1) / tiles : 0;
    size_t requested = 0;
    for (size_t t = 0, k = 0; t < n; t += kTileRows, ++k) {
      for (const size_t upto = std::min(aheadN, (k + 1) * perTile); requested < upto; ++requested)
        request(ahead->src[requested], 2);
      kernel(cur->head, size_t(cur->pos) / kTileRows + t / kTileRows, copies + t, std::min(kTileRows, n - t), nullptr, size_t(0),
             PrefetchTo::L1);
    }
    std::swap(cur, ahead);
    have = haveAhead;
  }
}

// Runs of rows in the heads' span lists: spans that do not continue the previous one of their head
// in memory (keys and values both), and empty spans not at all.
size_t RowRuns(const HeadAttn* heads, size_t nHeads, size_t esz) {
  size_t runs = 0;
  for (size_t h = 0; h < nHeads; ++h) {
    const Span* prev = nullptr;
    for (size_t s = 0; s < heads[h].nSpans; ++s) {
      const Span& sp = heads[h].spans[s];
      if (sp.len <= 0) continue;
      const bool follows = prev && sp.kStride == prev->kStride && sp.vStride == prev->vStride &&
                           sp.k == static_cast<const uint8_t*>(prev->k) + prev->len * prev->kStride * int64_t(esz) &&
                           sp.v == static_cast<const uint8_t*>(prev->v) + prev->len * prev->vStride * int64_t(esz);
      runs += !follows;
      prev = &sp;
    }
  }
  return runs;
}

// Whether the heads' rows (rows in spans spans) are copied before the kernels: scattered, and in
// runs averaging fewer than kGatheredRowsPerRun rows (RowRuns only counted when scattered).
bool CopyFirst(const HeadAttn* heads, size_t nHeads, size_t rows, size_t spans, size_t esz) {
  return Scattered(rows, spans) && rows < kGatheredRowsPerRun * RowRuns(heads, nHeads, esz);
}

// Pass 1 for several heads: L_h[j * total_h + pos] = q_j · k_pos (unscaled). `gather`: the rows
// are copied into `buf` first (ForEachGatheredTile); else walked in place (ForEachTile), and
// `prefetchValues`: a values pass follows.
void Logits(const HeadAttn* heads, size_t nHeads, const int64_t* totals, float* const* Ls, int group, int dim,
            Dtype dt, bool gather, bool prefetchValues, size_t lookahead, LineVector<uint8_t>& buf) {
  const AttnKernels& attn = AttnSimd();
  std::unique_ptr<bool[]> active(new bool[nHeads]);
  std::fill(active.get(), active.get() + nHeads, true);
  const size_t esz = DtypeSize(dt), rowBytes = size_t(dim) * esz;
  auto kernel = [&](size_t h, size_t tile, const void* const* rows, size_t n, const void* const* next, size_t nNext,
                    PrefetchTo to) {
    attn.logits_rows(heads[h].qGroup, size_t(group), rows, n, dt, size_t(dim), Ls[h] + tile * kTileRows, size_t(totals[h]),
                     next, nNext, to);
  };
  if (gather)
    ForEachGatheredTile(heads, nHeads, totals, active.get(), false, esz, rowBytes, buf, kernel);
  else
    ForEachTile(heads, nHeads, totals, active.get(), false, prefetchValues, lookahead, esz, rowBytes, kernel);
}

[[noreturn]] void ThrowNonFiniteLogit(size_t head, const float* L, int group, int64_t total, const Span* spans,
                                      size_t nSpans) {
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

// Passes 2–3 on one head's logits: scale, max, exp, sum. Returns false when a scaled logit is not
// finite (L is then left partly scaled; the caller reports the row).
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
  std::vector<int64_t> totals(nHeads);
  std::vector<size_t> offsets(nHeads + 1, 0);
  for (size_t h = 0; h < nHeads; ++h) {
    totals[h] = TotalTokens(heads[h].spans, heads[h].nSpans);
    offsets[h + 1] = offsets[h] + size_t(group) * size_t(totals[h]);
    std::fill(heads[h].out, heads[h].out + size_t(group) * size_t(dim), 0.f);
    if (heads[h].spanMass) std::fill(heads[h].spanMass, heads[h].spanMass + heads[h].nSpans, 0.f);
    if (heads[h].spanMassByQuery)
      std::fill(heads[h].spanMassByQuery, heads[h].spanMassByQuery + size_t(group) * heads[h].nSpans, 0.f);
  }
  scratch.logits.resize(offsets[nHeads]);
  std::vector<float*> Ls(nHeads);
  for (size_t h = 0; h < nHeads; ++h) Ls[h] = scratch.logits.data() + offsets[h];

  // Pass 1: logits of every head. Rows in runs of a row or two (token-granular selections) are
  // copied together before the kernels run, in this pass and in pass 4. Otherwise the values of the
  // tile ahead are prefetched only when the rows are scattered (short spans, a sparse selection):
  // over long spans (dense attention, whole pages) the hardware prefetcher already streams them and
  // the extra requests could only cost. (Demo runs showed dense 36 vs 31 ms with them, but dense
  // moved that much between runs of either build, so that was not established; with this guard the
  // kernel bench shows dense not slower.)
  size_t rows = 0, spans = 0;
  for (size_t h = 0; h < nHeads; ++h) {
    rows += size_t(totals[h]);
    spans += heads[h].nSpans;
  }
  const bool scattered = Scattered(rows, spans);
  const bool gather = CopyFirst(heads, nHeads, rows, spans, esz);
  const size_t lookahead = LookaheadFor(rows, spans);
  Logits(heads, nHeads, totals.data(), Ls.data(), group, dim, dt, gather, scattered, lookahead, scratch.gathered);

  // Passes 2–3 per head.
  std::vector<float> ms(nHeads * size_t(group) * 2);
  std::vector<HeadState> state(nHeads, HeadState::Ok);
  for (size_t h = 0; h < nHeads; ++h) {
    float* m = ms.data() + h * size_t(group) * 2;
    if (totals[h] == 0) {
      state[h] = HeadState::Empty;
      std::fill(heads[h].lse, heads[h].lse + group, -INFINITY);
    } else if (!Softmax(Ls[h], group, totals[h], scale, m, m + group)) {
      state[h] = HeadState::BadLogit;
    }
  }

  // Pass 4: out_j += sum_t p[j][t] v_t, heads interleaved tile by tile, tiles in token order.
  {
    std::unique_ptr<bool[]> active(new bool[nHeads]);
    for (size_t h = 0; h < nHeads; ++h) active[h] = state[h] == HeadState::Ok;
    auto kernel = [&](size_t h, size_t tile, const void* const* rows, size_t n, const void* const* next, size_t nNext,
                      PrefetchTo to) {
      attn.weighted_rows(heads[h].out, size_t(group), Ls[h] + tile * kTileRows, size_t(totals[h]), rows, n, dt,
                         size_t(dim), next, nNext, to);
    };
    if (gather)
      ForEachGatheredTile(heads, nHeads, totals.data(), active.get(), true, esz, size_t(dim) * esz, scratch.gathered, kernel);
    else
      ForEachTile(heads, nHeads, totals.data(), active.get(), true, false, lookahead, esz, size_t(dim) * esz, kernel);
  }

  // Normalise, lse, output check, span mass (invSum: a head's 1 / s_j).
  std::vector<double> invSum(static_cast<size_t>(group));
  for (size_t h = 0; h < nHeads; ++h) {
    if (state[h] != HeadState::Ok) continue;
    const float* m = ms.data() + h * size_t(group) * 2;
    const float* s = m + group;
    bool finite = true;
    for (int j = 0; j < group; ++j) {
      const float inv = 1.f / s[j];  // s[j] >= 1: the max logit contributes exp(0)
      float* o = heads[h].out + size_t(j) * size_t(dim);
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
      float* mass = heads[h].spanMass;
      float* byQuery = heads[h].spanMassByQuery;
      const float* L = Ls[h];
      const size_t total = size_t(totals[h]);
      // Reciprocals once per head: a token-granular selection has a span per token, and a division
      // per span and query cost ~5% of a cache-resident attention call.
      for (int j = 0; j < group; ++j) invSum[size_t(j)] = 1.0 / double(s[j]);
      const double invGroup = 1.0 / double(group);
      size_t pos = 0;
      for (size_t sp = 0; sp < heads[h].nSpans; ++sp) {
        const size_t len = size_t(heads[h].spans[sp].len);
        double acc = 0.0;
        for (int j = 0; j < group; ++j) {
          const float* p = L + size_t(j) * total + pos;
          double sj = 0.0;
          for (size_t t = 0; t < len; ++t) sj += p[t];
          const double share = sj * invSum[size_t(j)];
          acc += share;
          if (byQuery) byQuery[size_t(j) * heads[h].nSpans + sp] = float(share);
        }
        if (mass) mass[sp] = float(acc * invGroup);
        pos += len;
      }
    }
  }

  // Report the lowest failing head, so the error does not depend on how heads were grouped.
  for (size_t h = 0; h < nHeads; ++h) {
    if (state[h] == HeadState::BadLogit)
      ThrowNonFiniteLogit(h, Ls[h], group, totals[h], heads[h].spans, heads[h].nSpans);
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
  const bool gather = CopyFirst(&head, 1, size_t(total), nSpans, DtypeSize(dt));
  LineVector<uint8_t> gathered;
  Logits(&head, 1, &total, &probs, group, dim, dt, gather, false, LookaheadFor(size_t(total), nSpans), gathered);
  std::vector<float> ms(size_t(group) * 2);
  if (!Softmax(probs, group, total, scale, ms.data(), ms.data() + group))
    ThrowNonFiniteLogit(0, probs, group, total, spans, nSpans);
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
