// LayerIndex: build / extend / select for the three selection policies (see layer_index.h).
#include "index/layer_index.h"

#include "common/background.h"
#include "common/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <cstring>
#include <limits>
#include <string>

namespace kvd {
namespace {

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::string Range(int64_t a, int64_t b) { return "[" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

void RebuildCsr(Segment& seg) {
  seg.offsets.assign(size_t(seg.k) + 1, 0);
  for (int32_t a : seg.assign) ++seg.offsets[size_t(a) + 1];
  for (int j = 0; j < seg.k; ++j) seg.offsets[j + 1] += seg.offsets[j];
  seg.members.assign(seg.assign.size(), 0);
  std::vector<int32_t> fill(seg.offsets.begin(), seg.offsets.end() - 1);
  for (size_t i = 0; i < seg.assign.size(); ++i) seg.members[fill[seg.assign[i]]++] = int32_t(seg.c0 + int64_t(i));
}

// Ranking order: higher score first, then lower chunk id.
inline bool Better(const Ranked& a, const Ranked& b) { return a.score > b.score || (a.score == b.score && a.id < b.id); }
// Better as a function object: std::nth_element / std::sort inline it (a function pointer is an
// indirect call per comparison).
struct ByRank {
  bool operator()(const Ranked& a, const Ranked& b) const { return Better(a, b); }
};

// Sortable bits of a score: a larger float gives a larger key (-0 folded into +0, as Better has them
// equal; scores are never NaN).
inline uint32_t ScoreKey(float s) {
  if (s == 0.f) s = 0.f;
  uint32_t b;
  std::memcpy(&b, &s, 4);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The entries of key[0, n) whose digit key >> shift equals `digit`, compacted into out (room for
// n + 16): returns how many. Branch-free: the entries a radix pass keeps lie at random, so a branch
// per entry mispredicts at about the rate it is taken. AVX-512 compares 16 keys at once and
// compresses the matching lanes in a register (a compress straight to memory is microcoded and slow
// on AMD Zen 4), then stores all 16; the scalar loop writes every entry and advances over the kept.
// The scalar body over entries [i, n), appending after the m entries already kept; returns the count.
inline size_t KeysWithDigitFrom(const uint32_t* key, size_t i, size_t n, int shift, uint32_t digit, uint32_t* out, size_t m) {
  for (; i < n; ++i) {
    out[m] = key[i];
    m += (key[i] >> shift) == digit;
  }
  return m;
}
__attribute__((target("avx512f"))) size_t KeysWithDigitAvx512(const uint32_t* key, size_t n, int shift, uint32_t digit,
                                                             uint32_t* out) {
  const __m512i d = _mm512_set1_epi32(int(digit));
  const __m128i sh = _mm_cvtsi32_si128(shift);
  size_t m = 0, i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i k = _mm512_loadu_si512(key + i);
    const __mmask16 eq = _mm512_cmpeq_epi32_mask(_mm512_srl_epi32(k, sh), d);
    _mm512_storeu_si512(out + m, _mm512_maskz_compress_epi32(eq, k));
    m += size_t(__builtin_popcount(eq));
  }
  return KeysWithDigitFrom(key, i, n, shift, digit, out, m);
}
size_t KeysWithDigit(const uint32_t* key, size_t n, int shift, uint32_t digit, uint32_t* out) {
  if (IndexKernelLevel() == SimdLevel::Avx512) return KeysWithDigitAvx512(key, n, shift, digit, out);
  return KeysWithDigitFrom(key, 0, n, shift, digit, out, 0);
}

// Splits entries [0, n) by their digit key >> shift against `prefix`: the positions i of those
// above it into `above`, of those equal to it into `equal` (each with room for n + 16), both
// ascending; sets na / ne to their counts. Branch-free, as KeysWithDigit. SplitAtCutFrom is the
// scalar body over entries [i, n), appending after the a / e entries already listed.
inline void SplitAtCutFrom(const uint32_t* key, size_t i, size_t n, int shift, uint32_t prefix,
                           int32_t* above, size_t& a, int32_t* equal, size_t& e) {
  for (; i < n; ++i) {
    const uint32_t d = key[i] >> shift;
    above[a] = int32_t(i);
    a += d > prefix;
    equal[e] = int32_t(i);
    e += d == prefix;
  }
}
__attribute__((target("avx512f"))) void SplitAtCutAvx512(const uint32_t* key, size_t n, int shift, uint32_t prefix,
                                                        int32_t* above, size_t& na, int32_t* equal, size_t& ne) {
  const __m512i p = _mm512_set1_epi32(int(prefix));
  const __m128i sh = _mm_cvtsi32_si128(shift);
  const __m512i sixteen = _mm512_set1_epi32(16);
  __m512i pos = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  size_t a = 0, e = 0, i = 0;
  for (; i + 16 <= n; i += 16, pos = _mm512_add_epi32(pos, sixteen)) {
    const __m512i d = _mm512_srl_epi32(_mm512_loadu_si512(key + i), sh);
    const __mmask16 gt = _mm512_cmpgt_epu32_mask(d, p), eq = _mm512_cmpeq_epi32_mask(d, p);
    _mm512_storeu_si512(above + a, _mm512_maskz_compress_epi32(gt, pos));
    a += size_t(__builtin_popcount(gt));
    _mm512_storeu_si512(equal + e, _mm512_maskz_compress_epi32(eq, pos));
    e += size_t(__builtin_popcount(eq));
  }
  SplitAtCutFrom(key, i, n, shift, prefix, above, a, equal, e);
  na = a;
  ne = e;
}
void SplitAtCut(const uint32_t* key, size_t n, int shift, uint32_t prefix, int32_t* above, size_t& na,
                int32_t* equal, size_t& ne) {
  if (IndexKernelLevel() == SimdLevel::Avx512) return SplitAtCutAvx512(key, n, shift, prefix, above, na, equal, ne);
  na = ne = 0;
  SplitAtCutFrom(key, 0, n, shift, prefix, above, na, equal, ne);
}

// The cut of a radix select for the best k of n entries (ByRank order; 0 < k < n): each entry's key
// is computed once (kept in `scratch` after the histogram words, at kCutKeys), a histogram of its top 11
// bits and, unless that digit's group is taken whole, one of the next 11 bits over that group only.
// The best k are then the entries with key >> shift above prefix and the ByRank-best `need` of those
// equal to it (ByRank is a strict total order, so that set is unique).
constexpr size_t kCutBins = 2048;
// Where the keys start in `scratch`: after two histograms (entries alternate between them, so that
// neighbours with the same digit — common, scores cluster — do not wait on each other's increment).
constexpr size_t kCutKeys = 2 * kCutBins;
struct RadixCut {
  uint32_t prefix;
  int shift;
  size_t need;
};
template <class ScoreAt>
RadixCut CutBestBy(size_t n, size_t k, ScoreAt scoreAt, std::vector<uint32_t>& scratch) {
  scratch.resize(kCutKeys + 2 * n + 16);  // keys, then the second pass's keys of the cut's digit
  uint32_t* hist = scratch.data();
  uint32_t* hist1 = hist + kCutBins;
  uint32_t* key = scratch.data() + kCutKeys;
  auto merge = [&]() {
    for (size_t b = 0; b < kCutBins; ++b) hist[b] += hist1[b];
  };
  // Digit b of a histogram: every entry with a higher digit is taken, need - (their count) from b.
  auto cut = [&](size_t& need) {
    size_t above = 0;
    uint32_t b = kCutBins - 1;
    for (;; --b) {
      if (above + hist[b] >= need) break;
      above += hist[b];
    }
    need -= above;
    return b;
  };
  std::fill(hist, hist + 2 * kCutBins, 0u);
  size_t i = 0;
  for (; i + 2 <= n; i += 2) {
    key[i] = ScoreKey(scoreAt(i));
    key[i + 1] = ScoreKey(scoreAt(i + 1));
    ++hist[key[i] >> 21];
    ++hist1[key[i + 1] >> 21];
  }
  if (i < n) {
    key[i] = ScoreKey(scoreAt(i));
    ++hist[key[i] >> 21];
  }
  merge();
  size_t need = k;
  const uint32_t b1 = cut(need);
  if (need < hist[b1]) {
    std::fill(hist, hist + 2 * kCutBins, 0u);
    uint32_t* group = key + n;
    const size_t m = KeysWithDigit(key, n, 21, b1, group);
    for (i = 0; i + 2 <= m; i += 2) {
      ++hist[(group[i] >> 10) & (kCutBins - 1)];
      ++hist1[(group[i + 1] >> 10) & (kCutBins - 1)];
    }
    if (i < m) ++hist[(group[i] >> 10) & (kCutBins - 1)];
    merge();
    const uint32_t b2 = cut(need);
    return {(b1 << 11) | b2, 10, need};
  }
  return {b1, 21, need};
}
RadixCut CutBest(const Ranked* first, size_t n, size_t k, std::vector<uint32_t>& scratch) {
  return CutBestBy(n, k, [first](size_t i) { return first[i].score; }, scratch);
}

// Moves the best k entries of [first, last) (ByRank order) to its front, in no particular order: the
// same set as std::nth_element at k - 1, by CutBest then a single partition of the entries (and
// their keys) by its threshold, and ByRank over the entries that share it.
void SelectBest(Ranked* first, Ranked* last, size_t k, std::vector<uint32_t>& scratch) {
  const size_t n = size_t(last - first);
  if (k == 0 || k >= n) return;
  const RadixCut c = CutBest(first, n, k, scratch);
  uint32_t* key = scratch.data() + kCutKeys;
  // Entries above the threshold to the front, then those equal to it.
  size_t w = 0;
  for (size_t i = 0; i < n; ++i)
    if ((key[i] >> c.shift) > c.prefix) {
      std::swap(first[w], first[i]);
      std::swap(key[w], key[i]);
      ++w;
    }
  size_t e = w;
  for (size_t i = w; i < n; ++i)
    if ((key[i] >> c.shift) == c.prefix) {
      std::swap(first[e], first[i]);
      std::swap(key[e], key[i]);
      ++e;
    }
  if (c.need < e - w) std::nth_element(first + w, first + w + (c.need - 1), first + e, ByRank());
}
// Sets in `bits` the ids of the best k of n entries, entry i being (scoreAt(i), idAt(i)) (the set
// SelectBest would move to the front) without moving any: the entries above CutBest's threshold
// directly, the `need` best of those equal to it through `ties` (scratch). Accessors, so that the
// re-rank's scores and token ids can be read where they lie (two arrays) as well as from Ranked.
template <class ScoreAt, class IdAt>
void MarkBestBy(size_t n, ScoreAt scoreAt, IdAt idAt, size_t k, std::vector<uint32_t>& scratch, std::vector<Ranked>& ties,
                std::vector<uint64_t>& bits) {
  // Raw pointers: the vectors live in thread-local scratch, and through the references the compiler
  // re-derived their address (a __tls_get_addr call) on every marked entry.
  uint64_t* bp = bits.data();
  auto mark = [bp](int32_t id) { bp[size_t(id) >> 6] |= uint64_t(1) << (id & 63); };
  if (k == 0) return;
  if (k >= n) {
    for (size_t i = 0; i < n; ++i) mark(idAt(i));
    return;
  }
  const RadixCut c = CutBestBy(n, k, scoreAt, scratch);
  // The entries above the cut and those at it, split out without a branch per entry (SplitAtCut),
  // their positions after the keys.
  scratch.resize(kCutKeys + n + 2 * (n + 16));
  const uint32_t* key = scratch.data() + kCutKeys;
  int32_t* above = reinterpret_cast<int32_t*>(scratch.data() + kCutKeys + n);
  int32_t* equal = above + n + 16;
  size_t na = 0, ne = 0;
  SplitAtCut(key, n, c.shift, c.prefix, above, na, equal, ne);
  // Neighbouring entries often fall in one word (a chunk's tokens): its bits are gathered in a
  // register and stored once per run, not read-modify-written per entry.
  size_t word = 0;
  uint64_t run = 0;
  for (size_t i = 0; i < na; ++i) {
    const int32_t id = idAt(size_t(above[i]));
    if (size_t(id) >> 6 != word) {
      if (run) bp[word] |= run;
      word = size_t(id) >> 6;
      run = 0;
    }
    run |= uint64_t(1) << (id & 63);
  }
  if (run) bp[word] |= run;
  ties.clear();
  for (size_t i = 0; i < ne; ++i) ties.push_back({scoreAt(size_t(equal[i])), idAt(size_t(equal[i]))});
  if (c.need < ties.size()) std::nth_element(ties.begin(), ties.begin() + std::ptrdiff_t(c.need - 1), ties.end(), ByRank());
  for (size_t i = 0; i < c.need; ++i) mark(ties[i].id);
}
// MarkBestBy over v's entries (v keeps its order).
void MarkBest(const std::vector<Ranked>& v, size_t k, std::vector<uint32_t>& scratch, std::vector<Ranked>& ties,
              std::vector<uint64_t>& bits) {
  const Ranked* vp = v.data();
  MarkBestBy(v.size(), [vp](size_t i) { return vp[i].score; }, [vp](size_t i) { return vp[i].id; }, k, scratch, ties, bits);
}
void SelectBest(std::vector<Ranked>& v, size_t k, std::vector<uint32_t>& hist) {
  SelectBest(v.data(), v.data() + v.size(), k, hist);
}

// Sorts v[sorted, next) into final rank order, next >= sorted: a partial selection then a sort,
// O(n + m log m). Elements before `sorted` are already final, so growing the prefix in steps gives
// the same order as one full sort (ByRank is a strict total order).
size_t ExtendSorted(std::vector<Ranked>& v, size_t sorted, size_t next, std::vector<uint32_t>& hist) {
  next = std::min(next, v.size());
  if (next <= sorted) return sorted;
  SelectBest(v.data() + sorted, v.data() + v.size(), next - sorted, hist);
  std::sort(v.begin() + sorted, v.begin() + next, ByRank());
  return next;
}

// Sets bits [a, b) of a bit set.
void SetBits(std::vector<uint64_t>& bits, int64_t a, int64_t b) {
  for (; a < b && (a & 63); ++a) bits[size_t(a) >> 6] |= uint64_t(1) << (a & 63);
  for (; a + 64 <= b; a += 64) bits[size_t(a) >> 6] = ~uint64_t(0);
  for (; a < b; ++a) bits[size_t(a) >> 6] |= uint64_t(1) << (a & 63);
}

// Marks in `chosen` (a bit set over cluster ids [0, n)) the clusters that a walk over every cluster
// c in ByRank order of (scores[c], c) takes while the tokens taken so far (ctoks[c] each) are below
// `target`: the same set as sorting them all and walking, without the sort. One pass bins the
// scores linearly between their min and max (any monotonic map gives the same set: a higher bin
// means a no lower score) and sums each bin's tokens; every cluster above the bin where the running
// sum reaches the target is taken unsorted (their tokens sum below the target, so the walk takes
// them all first), and only that bin's clusters (`bin`, scratch) are sorted and walked. Empty
// clusters (ctoks 0) change no sum: whether one is marked changes no chunk its callers mark.
void TakeClusters(const float* scores, const int32_t* ctoks, size_t n, double target, std::vector<uint32_t>& hist,
                  std::vector<Ranked>& bin, std::vector<uint64_t>& chosen) {
  chosen.assign((n + 63) / 64, 0);
  if (n == 0 || !(target > 0)) return;
  // Four running minima and maxima: with one of each, every compare waited on the previous one.
  float lo[4] = {scores[0], scores[0], scores[0], scores[0]}, hi[4] = {lo[0], lo[0], lo[0], lo[0]};
  size_t c = 0;
  for (; c + 4 <= n; c += 4)
    for (int u = 0; u < 4; ++u) lo[u] = std::min(lo[u], scores[c + u]), hi[u] = std::max(hi[u], scores[c + u]);
  for (; c < n; ++c) lo[0] = std::min(lo[0], scores[c]), hi[0] = std::max(hi[0], scores[c]);
  const float mn = std::min(std::min(lo[0], lo[1]), std::min(lo[2], lo[3]));
  const float mx = std::max(std::max(hi[0], hi[1]), std::max(hi[2], hi[3]));
  constexpr int kBins = 4096;
  // Scores may be +-inf (keys near the f32 range): then inv is 0 or t is NaN, and everything falls
  // into bin 0 (sorted and walked in full), never an out-of-range bin (int(NaN) is undefined).
  const float inv = mx > mn ? float(kBins / (double(mx) - double(mn))) : 0.f;
  // Each cluster's bin, kept after two histograms of kBins words (clusters alternate between them,
  // so that neighbours in one bin, common as scores cluster, do not wait on each other's
  // increment); then room for SplitAtCut's two lists. Only the histograms need zeros.
  hist.resize(2 * kBins + n + 2 * (n + 16));
  uint32_t* const h0 = hist.data();
  uint32_t* const h1 = h0 + kBins;
  std::fill(h0, h1 + kBins, 0u);
  uint32_t* const binOf = h1 + kBins;
  for (c = 0; c < n; ++c) {
    const float t = (scores[c] - mn) * inv;
    binOf[c] = uint32_t(t >= float(kBins - 1) ? kBins - 1 : (t > 0 ? int(t) : 0));
  }
  for (c = 0; c + 2 <= n; c += 2) {
    h0[binOf[c]] += uint32_t(ctoks[c]);
    h1[binOf[c + 1]] += uint32_t(ctoks[c + 1]);
  }
  if (c < n) h0[binOf[c]] += uint32_t(ctoks[c]);
  double above = 0;
  int b = kBins - 1;
  for (; b > 0 && above + h0[b] + h1[b] < target; --b) above += h0[b] + h1[b];
  // Clusters above bin b are all taken (their tokens sum to `above` < target); bin b's are sorted,
  // best first, and walked from there. SplitAtCut lists both without a branch per cluster.
  int32_t* const over = reinterpret_cast<int32_t*>(binOf + n);
  int32_t* const at = over + n + 16;
  size_t nOver = 0, nAt = 0;
  SplitAtCut(binOf, n, 0, uint32_t(b), over, nOver, at, nAt);
  for (size_t i = 0; i < nOver; ++i) chosen[size_t(over[i]) >> 6] |= uint64_t(1) << (over[i] & 63);
  bin.clear();
  for (size_t i = 0; i < nAt; ++i) bin.push_back({scores[at[i]], at[i]});
  std::sort(bin.begin(), bin.end(), ByRank());
  double taken = above;
  for (size_t i = 0; i < bin.size() && taken < target; ++i) {
    chosen[size_t(bin[i].id) >> 6] |= uint64_t(1) << (bin[i].id & 63);
    taken += ctoks[bin[i].id];
  }
}

}  // namespace

// Per-thread scratch of Select: the vectors keep their capacity between decode steps, so a step
// allocates nothing (fresh large blocks cost page faults and zeroing every call). Contents never
// carry over: every use clears or overwrites first.
struct SelectScratch {
  std::vector<Ranked> ranked, clusters, tok, ties;
  std::vector<int32_t> ids, rows;
  std::vector<uint64_t> chosen;
  std::vector<float> scores, coef, extra, ones, logits, share;
  std::vector<uint64_t> bits;
  std::vector<uint32_t> hist;
  // Token ids and their sketch rows, int32 (a layer's tokens are: LayerIndex::CheckKv): half the
  // bytes of the re-rank's per-head scratch, which with the group's logits must stay in L2.
  std::vector<int32_t> toksAt, rowsAt;
  SketchQuery sketchQuery;
  QueryI8 queryI8;  // level 1: the head's query group as int8
};
// Looked up once per head task and passed down: a thread_local access from a dlopen'ed addon
// is a __tls_get_addr call, which perf showed at ~4% of a select on this VM when made per call.
static SelectScratch& Scratch() {
  thread_local SelectScratch s;
  return s;
}

int64_t LayerIndex::SealedEnd(int64_t tokens) const {
  const int64_t avail = tokens - cfg_.local;
  const int64_t e = avail > 0 ? avail / cfg_.chunk : 0;
  return std::max(firstChunk(), e);
}

int64_t LayerIndex::tailStart() const {
  if (endChunk_ > firstChunk()) return endChunk_ * cfg_.chunk;
  return sinkEnd();
}

int64_t LayerIndex::ChunkTokens(int64_t j) const {
  return (j + 1) * cfg_.chunk - std::max<int64_t>(j * cfg_.chunk, cfg_.sinks);
}

void LayerIndex::CheckKv(const KvView& kv, int64_t tokens, const char* what) const {
  // Token ids are int32 everywhere past the index (selections, the re-rank's scratch).
  if (tokens < 0 || tokens > INT32_MAX)
    Throw("E_RANGE", std::string(what) + " tokens: expected an integer in [0, " + std::to_string(INT32_MAX) + "], got " + std::to_string(tokens));
  if (tokens > kv.tokens)
    Throw("E_SHAPE", std::string(what) + " tokens: expected at most k.tokens = " + std::to_string(kv.tokens) + ", got " +
                         std::to_string(tokens));
  if (built_ && (kv.heads != heads_ || kv.dim != dim_))
    Throw("E_SHAPE", std::string(what) + " k: expected " + std::to_string(heads_) + " kv heads x dim " +
                         std::to_string(dim_) + " as at build, got " + std::to_string(kv.heads) + " x " +
                         std::to_string(kv.dim));
}

void LayerIndex::ComputeReps(const KvView& kv, int h, int64_t c0, int64_t c1, int64_t first) {
  HeadIndex& H = heads_data_[h];
  const int64_t r0 = H.repsFirst;  // rows hold chunks [r0, ...)
  const size_t base = size_t(c0 - r0) * dim_, n = size_t(c1 - c0) * dim_;
  H.reps.resize(base + n);
  if (cfg_.policy == PolicyKind::Quest) {
    H.maxs.resize(base + n);
    ChunkMinMax(kv, h, cfg_.chunk, -first, cfg_.sinks - first, c0, c1, H.reps.data() + base, H.maxs.data() + base);
  } else {
    float* var = nullptr;
    if (cfg_.policy == PolicyKind::Kvdrive) {
      H.var.resize(size_t(c1 - r0));
      var = H.var.data() + (c0 - r0);
    }
    ChunkMeans(kv, h, cfg_.chunk, -first, cfg_.sinks - first, c0, c1, H.reps.data() + base, var);
    if (cfg_.policy == PolicyKind::ShadowKV && cfg_.outlierChunks > 0) {
      // Outlier detection (ShadowKV): the key least aligned with its chunk's landmark.
      H.minCos.resize(size_t(c1 - r0));
      std::vector<float> row(static_cast<size_t>(dim_), 0.f);
      for (int64_t j = c0; j < c1; ++j) {
        const float* m = Rep(H, j);
        double mm = 0;
        for (int d = 0; d < dim_; ++d) mm += double(m[d]) * m[d];
        double worst = 1.0;
        for (int64_t t = std::max<int64_t>(j * cfg_.chunk, cfg_.sinks); t < (j + 1) * cfg_.chunk; ++t) {
          const void* r = kv.Row(t - first, h);  // kv holds tokens [first, ...)
          double kk = 0, km = 0;
          for (int d = 0; d < dim_; ++d) {
            const double x = LoadElem(r, kv.dtype, size_t(d));
            kk += x * x;
            km += x * m[d];
          }
          const double den = std::sqrt(kk * mm);
          worst = std::min(worst, den > 0 ? km / den : 1.0);
        }
        H.minCos[size_t(j - r0)] = std::isfinite(worst) ? float(worst) : 1.f;
      }
    }
  }
  // Keys feed every score; a NaN or Inf would silently corrupt rankings, so refuse it here.
  for (int64_t j = c0; j < c1; ++j) {
    const float* r = Rep(H, j);
    const float* m = cfg_.policy == PolicyKind::Quest ? H.maxs.data() + size_t(j - r0) * dim_ : r;
    for (int d = 0; d < dim_; ++d)
      if (!std::isfinite(r[d]) || !std::isfinite(m[d]))
        Throw("E_NONFINITE", "k: expected finite keys, got NaN or Inf in kv head " + std::to_string(h) + ", tokens " +
                                 Range(std::max<int64_t>(j * cfg_.chunk, cfg_.sinks), (j + 1) * cfg_.chunk));
  }
}

void LayerIndex::ClusterSegment(const SegmentRows& rows, int h, Segment& seg) const {
  const size_t n = size_t(seg.c1 - seg.c0);
  int64_t toks = 0;
  for (int64_t j = seg.c0; j < seg.c1; ++j) toks += ChunkTokens(j);
  KMeansOptions o;
  o.k = int(std::min<int64_t>(int64_t(n), std::max<int64_t>(1, (toks + cfg_.tokensPerCluster - 1) / cfg_.tokensPerCluster)));
  o.maxIters = cfg_.kmeansIters;
  o.trials = cfg_.kmeansTrials;
  o.seed = Mix(Mix(cfg_.seed, uint64_t(h)), uint64_t(seg.c0));
  KMeansResult r = KMeans(rows.means, n, dim_, o);
  seg.k = o.k;
  seg.centroids = std::move(r.centroids);
  seg.assign = std::move(r.assignments);
  seg.inertia = r.inertia;
  seg.counts.assign(seg.k, 0);
  seg.sums.assign(size_t(seg.k) * dim_, 0.0);
  seg.sumSq.assign(seg.k, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const float* p = rows.means + i * size_t(dim_);
    double* s = seg.sums.data() + size_t(seg.assign[i]) * dim_;
    double sq = double(rows.var[i]) * dim_;
    for (int d = 0; d < dim_; ++d) s[d] += p[d], sq += double(p[d]) * p[d];
    seg.sumSq[seg.assign[i]] += sq;
    ++seg.counts[seg.assign[i]];
  }
  seg.var.assign(seg.k, 0.f);
  for (int c = 0; c < seg.k; ++c) ClusterVariance(seg, c);
  seg.radius.assign(seg.k, 0.f);
  for (size_t i = 0; i < n; ++i) {
    const int c = seg.assign[i];
    const int64_t j = seg.c0 + int64_t(i);
    seg.radius[c] = std::max(seg.radius[c], MemberRadius(rows, seg, j, seg.centroids.data() + size_t(c) * dim_));
  }
  PickOutliers(rows, seg);
  seg.clusteredFull = seg.c1 == seg.cEnd;
  seg.tiles.resize(TileBytes4(seg.k, dim_));
  seg.tileScales.resize(TileScalesI8(seg.k));
  QuantizeTiles4(seg.centroids.data(), seg.k, dim_, seg.tiles.data(), seg.tileScales.data());
  if (seg.clusteredFull) {
    // A full segment never grows again: the running sums (k x dim doubles) and the row-major
    // centroids are no longer needed (select reads the tiles).
    std::vector<double>().swap(seg.sums);
    std::vector<double>().swap(seg.sumSq);
    std::vector<float>().swap(seg.centroids);
  } else {
    ReserveOpen(seg);
  }
  RebuildCsr(seg);
}

// An open segment grows by one chunk per sealed chunk and by one cluster per tokensPerCluster
// tokens until it is full: room for the full segment up front, so decode-time Extend appends in
// place. Otherwise the first chunk sealed after a build reallocated every head's centroids and
// running sums (~0.4 MiB per head, fresh mmap'd blocks, munmap of the old ones): ~15-35 ms in one
// decode step at 128K on this VM.
void LayerIndex::ReserveOpen(Segment& seg) const {
  const int64_t toks = seg.cEnd * cfg_.chunk - std::max<int64_t>(seg.c0 * cfg_.chunk, cfg_.sinks);
  const size_t kMax = size_t(std::max<int64_t>(1, (toks + cfg_.tokensPerCluster - 1) / cfg_.tokensPerCluster));
  seg.centroids.reserve(kMax * size_t(dim_));
  seg.sums.reserve(kMax * size_t(dim_));
  seg.counts.reserve(kMax);
  seg.sumSq.reserve(kMax);
  seg.var.reserve(kMax);
  seg.radius.reserve(kMax);
  seg.assign.reserve(size_t(seg.cEnd - seg.c0));
  seg.tiles.reserve(TileBytes4(kMax, dim_));
  seg.tileScales.reserve(TileScalesI8(kMax));
}

size_t LayerIndex::RowsRoom() const {
  const int64_t segChunks = cfg_.segmentTokens / cfg_.chunk;
  // An Extend installs a pending re-clustering before sealing past fill + reclusterDelay tokens:
  // at most reclusterDelay / chunk + 1 chunks are sealed after the fill meanwhile.
  return size_t(segChunks + (cfg_.reclusterDelay > 0 ? cfg_.reclusterDelay / cfg_.chunk + 1 : 0));
}

SegmentRows LayerIndex::RowsOf(const HeadIndex& H, const Segment& seg) const {
  return {Rep(H, seg.c0), H.var.data() + (seg.c0 - H.repsFirst)};
}

void LayerIndex::ReleaseChunkMeans(HeadIndex& H, int64_t upTo) const {
  if (upTo <= H.repsFirst) return;
  const size_t drop = size_t(upTo - H.repsFirst);
  // The rows after upTo (chunks of the next segment added by the same extend) move to the front.
  // The room of one segment's rows (reserved at build) stays: the open segment grows back into it,
  // one row per sealed chunk. Given back, the open segment's rows grew anew, and the first chunk
  // sealed after a build reallocated every head's rows (copy + page faults of the fresh block:
  // ~25 ms in one decode step at 128K on this VM: bench/index.md, "The demo's select column vs
  // select-ab").
  // The room is what the open segment holds when one chunk short of full, so the memory plan's
  // per-layer fixed bytes (kv-memory.ts indexCost) already count it. Only an extend that sealed more
  // than a segment at once leaves more: that goes back.
  H.reps.erase(H.reps.begin(), H.reps.begin() + std::ptrdiff_t(drop * size_t(dim_)));
  H.var.erase(H.var.begin(), H.var.begin() + std::ptrdiff_t(drop));
  const size_t room = RowsRoom();
  if (H.var.capacity() > room || H.reps.capacity() > room * size_t(dim_)) {
    H.reps.shrink_to_fit();
    H.var.shrink_to_fit();
    H.reps.reserve(room * size_t(dim_));
    H.var.reserve(room);
  }
  H.repsFirst = upTo;
}

// The ceil(outlierFraction x chunks) chunks of the segment with the highest key variance (ties:
// lower id), ascending by id.
void LayerIndex::PickOutliers(const SegmentRows& rows, Segment& seg) const {
  seg.outliers.clear();
  const size_t n = size_t(seg.c1 - seg.c0);
  const size_t want = std::min(n, size_t(std::ceil(cfg_.outlierFraction * double(n))));
  if (want == 0) return;
  const float* var = rows.var;
  std::vector<Ranked> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = {var[i], int32_t(seg.c0 + int64_t(i))};
  std::nth_element(r.begin(), r.begin() + (want - 1), r.end(), ByRank());
  for (size_t i = 0; i < want; ++i) seg.outliers.push_back(r[i].id);
  std::sort(seg.outliers.begin(), seg.outliers.end());
}

// Bound on the distance of chunk j's tokens from centre c: |mean_j - c| + sqrt(n_j * dim * var_j)
// (the chunk's own spread bounds any one token's distance from its mean).
float LayerIndex::MemberRadius(const SegmentRows& rows, const Segment& seg, int64_t j, const float* c) const {
  const float* m = rows.means + size_t(j - seg.c0) * dim_;
  double d2 = 0;
  for (int d = 0; d < dim_; ++d) d2 += double(m[d] - c[d]) * double(m[d] - c[d]);
  return float(std::sqrt(d2) + std::sqrt(double(ChunkTokens(j)) * dim_ * double(rows.var[j - seg.c0])));
}

// Variance of the member tokens around the centroid c, per dimension:
// (E_members[mean_t |k_t|²] - 2 c·m + |c|²) / dim with m the mean of the member chunk means.
void LayerIndex::ClusterVariance(Segment& seg, int c) const {
  if (seg.counts[c] == 0) {
    seg.var[c] = 0.f;
    return;
  }
  const double n = seg.counts[c];
  const float* cc = seg.centroids.data() + size_t(c) * dim_;
  const double* s = seg.sums.data() + size_t(c) * dim_;
  double v = seg.sumSq[c] / n;
  for (int d = 0; d < dim_; ++d) v += double(cc[d]) * cc[d] - 2.0 * double(cc[d]) * (s[d] / n);
  seg.var[c] = float(std::max(0.0, v) / dim_);
}

// Online step for a segment that is not full yet: the chunk opens a new cluster while the segment
// has fewer than ceil(tokens / tokensPerCluster) clusters, else joins the nearest centroid, which
// moves to the running mean of its members. A segment that fills up is re-clustered by k-means.
bool LayerIndex::AddChunkOnline(int h, Segment& seg, int64_t j, bool defer) const {
  const HeadIndex& H = heads_data_[h];
  const float* x = Rep(H, j);
  // Tokens of chunks [c0, j]: one run [max(c0*chunk, sinks), (j+1)*chunk) (only firstChunk can
  // hold sinks, and c0 >= firstChunk).
  const int64_t toks = (j + 1) * cfg_.chunk - std::max<int64_t>(seg.c0 * cfg_.chunk, cfg_.sinks);
  const int64_t want = (toks + cfg_.tokensPerCluster - 1) / cfg_.tokensPerCluster;
  int32_t c;
  if (seg.k < want) {
    c = seg.k++;
    seg.centroids.insert(seg.centroids.end(), x, x + dim_);
    seg.sums.resize(size_t(seg.k) * dim_, 0.0);
    seg.counts.push_back(0);
    seg.sumSq.push_back(0.0);
    seg.var.push_back(0.f);
  } else {
    float best = 0;
    c = -1;
    for (int q = 0; q < seg.k; ++q) {
      const float* cq = seg.centroids.data() + size_t(q) * dim_;
      float s = DotFixed(cq, cq, dim_) - 2.f * DotFixed(x, cq, dim_);
      if (c < 0 || s < best) best = s, c = q;
    }
  }
  double* s = seg.sums.data() + size_t(c) * dim_;
  double sq = double(ChunkVar(H, j)) * dim_;
  for (int d = 0; d < dim_; ++d) s[d] += x[d], sq += double(x[d]) * x[d];
  seg.sumSq[c] += sq;
  ++seg.counts[c];
  for (int d = 0; d < dim_; ++d) seg.centroids[size_t(c) * dim_ + d] = float(s[d] / seg.counts[c]);
  ClusterVariance(seg, c);
  seg.c1 = j + 1;
  const SegmentRows rows = RowsOf(H, seg);
  if (seg.radius.size() < size_t(seg.k)) seg.radius.resize(seg.k, 0.f);
  seg.radius[c] = std::max(seg.radius[c], MemberRadius(rows, seg, j, seg.centroids.data() + size_t(c) * dim_));
  seg.assign.push_back(c);
  PickOutliers(rows, seg);
  const bool filled = seg.c1 == seg.cEnd;
  if (filled && !defer) {
    ClusterSegment(rows, h, seg);
    return true;
  }
  // Only centroid c moved (or was added): rewrite its lanes. A new tile is appended zeroed (tile t
  // sits at t*dim*16 whatever k is, and padding lanes are zero).
  seg.tiles.resize(TileBytes4(seg.k, dim_), uint8_t(0x88));  // code 0 in every nibble
  seg.tileScales.resize(TileScalesI8(seg.k), 0.f);
  SetTile4(seg.centroids.data() + size_t(c) * dim_, size_t(c), dim_, seg.tiles.data(), seg.tileScales.data());
  RebuildCsr(seg);
  if (filled) {
    // Full, its k-means deferred: nothing joins it online any more, so the running sums and the
    // row-major centroids go now (select reads the tiles; the k-means starts from the chunk means).
    std::vector<double>().swap(seg.sums);
    std::vector<double>().swap(seg.sumSq);
    std::vector<float>().swap(seg.centroids);
  }
  return filled;
}

// Heads are independent: they run on the thread pool with at most cfg.threads workers. The
// exception of the lowest failing head is rethrown once every head is done.
void LayerIndex::ForEachHead(const std::function<void(int)>& fn) const {
  ThreadPool::Global().ParallelFor(size_t(heads_), [&](size_t h) { fn(int(h)); }, std::max(1, cfg_.threads));
}

void LayerIndex::Build(const KvView& kv, int64_t tokens) {
  if (cfg_.segmentTokens % cfg_.chunk != 0)
    Throw("E_CONFIG", "segmentTokens: expected a multiple of chunkSize " + std::to_string(cfg_.chunk) + ", got " +
                          std::to_string(cfg_.segmentTokens));
  if (cfg_.releaseChunkMeans && (cfg_.policy != PolicyKind::Kvdrive || !cfg_.keySketch || !(cfg_.rerankFactor > 0)))
    Throw("E_CONFIG", "releaseChunkMeans: expected the kvdrive policy with keySketch and rerankFactor > 0 (select then "
                      "re-ranks every candidate), got " + std::string(cfg_.policy != PolicyKind::Kvdrive ? "another policy" : !cfg_.keySketch ? "keySketch false" : "rerankFactor 0"));
  if (cfg_.sketchBits != 8 && cfg_.sketchBits != 4)
    Throw("E_CONFIG", "sketchBits: expected 4 or 8, got " + std::to_string(cfg_.sketchBits));
  DropRecluster();  // its rows are about to go
  built_ = false;
  prior_.clear();
  CheckKv(kv, tokens, "build");
  heads_ = kv.heads;
  dim_ = kv.dim;
  tokens_ = tokens;
  heads_data_.assign(heads_, HeadIndex{});
  const int64_t c0 = firstChunk(), c1 = SealedEnd(tokens);
  const int64_t segChunks = cfg_.segmentTokens / cfg_.chunk;
  const bool release = cfg_.releaseChunkMeans;

  auto buildHead = [&](int h) {
    // Room for the context to double before the per-chunk arrays reallocate: extend() then appends
    // without copying them (a 128K context holds 16 MiB of chunk means per kv head, and copying
    // them all for one new chunk stalls that decode step). Reserved pages are not touched, so
    // this costs address space, not memory.
    // With releaseChunkMeans only the open segment's rows are ever held, and a full segment's while
    // its re-clustering is pending (RowsRoom).
    const size_t room = release ? RowsRoom() : size_t(2 * (c1 - c0) + segChunks);
    HeadIndex& H = heads_data_[h];
    H.repsFirst = c0;
    H.reps.reserve(room * dim_);
    if (cfg_.policy == PolicyKind::Quest) H.maxs.reserve(room * dim_);
    if (cfg_.policy == PolicyKind::Kvdrive) H.var.reserve(room);
    if (cfg_.policy == PolicyKind::Kvdrive && cfg_.keySketch) {
      H.sketch.bits = cfg_.sketchBits;
      UpdateSketch(kv, h, tokens);
    }
    if (cfg_.policy != PolicyKind::Kvdrive) {
      ComputeReps(kv, h, c0, c1);
      return;
    }
    // Segment by segment: means, k-means, and (releaseChunkMeans) the full segment's means dropped
    // before the next one's are computed. Nothing sealed yet (a context shorter than sinks +
    // local): no segment (a firstChunk > 0 would otherwise open an empty one and ask k-means for 0
    // clusters).
    if (c1 <= c0) return;
    // The cluster table takes each segment's fields as it is built (a full segment's own blocks are
    // freed there and reused by the next segment's), in room for the segments plus the next one.
    ReserveClusters(H, size_t((c1 - 1) / segChunks - c0 / segChunks + 2));
    for (int64_t s = c0 / segChunks; s * segChunks < c1; ++s) {
      Segment seg;
      seg.c0 = std::max(c0, s * segChunks);
      seg.c1 = std::min(c1, (s + 1) * segChunks);
      seg.cEnd = (s + 1) * segChunks;
      ComputeReps(kv, h, seg.c0, seg.c1);
      ClusterSegment(RowsOf(H, seg), h, seg);
      if (cfg_.keySketch && seg.clusteredFull) OrderSketchRows(H, seg);
      if (release && seg.clusteredFull) ReleaseChunkMeans(H, seg.cEnd);
      H.segments.push_back(std::move(seg));
      RefreshClusters(H, H.segments.size() - 1);
    }
  };
  ForEachHead(buildHead);
  endChunk_ = c1;
  built_ = true;
}

struct LayerIndex::PendingRecluster {
  int64_t installAt = 0;        // the token count at which Extend installs the result
  std::vector<size_t> segAt;    // per kv head: the segment's position in HeadIndex::segments
  std::vector<Segment> result;  // per kv head: written by the task alone until it finished
  std::shared_ptr<BackgroundTask> task;
};

void LayerIndex::Extend(const KvView& kv, int64_t tokens, int64_t first) {
  if (!built_) Throw("E_CONFIG", "extend: expected build() to have completed first, got an index that was never built");
  if (first < 0 || first > endChunk_ * cfg_.chunk)
    Throw("E_RANGE", "extend first: expected a token in [0, " + std::to_string(endChunk_ * cfg_.chunk) +
                         "] (k must hold every chunk not sealed yet), got " + std::to_string(first));
  if (tokens - first > kv.tokens)
    Throw("E_SHAPE", "extend tokens: expected at most first + k.tokens = " + std::to_string(first + kv.tokens) + ", got " +
                         std::to_string(tokens));
  CheckKv(kv, std::min(tokens, kv.tokens), "extend");
  if (tokens < tokens_)
    Throw("E_RANGE", "extend tokens: expected >= " + std::to_string(tokens_) + " (the context only grows), got " +
                         std::to_string(tokens));
  const int64_t c0 = endChunk_, c1 = SealedEnd(tokens);
  const int64_t segChunks = cfg_.segmentTokens / cfg_.chunk;
  // Some segment gets its last chunk in this extend (segments end at multiples of segChunks).
  const int64_t fills = c1 / segChunks - c0 / segChunks;
  if (pending_) {
    // A pending re-clustering is installed at its token count, and earlier if this extend would
    // move the rows it reads (more chunk means than their room holds) or fill another segment.
    bool outgrows = false;
    for (const HeadIndex& H : heads_data_)
      outgrows = outgrows || H.reps.size() + size_t(c1 - c0) * dim_ > H.reps.capacity() || H.var.size() + size_t(c1 - c0) > H.var.capacity();
    if (tokens >= pending_->installAt || fills > 0 || outgrows) InstallRecluster();
  }
  if (c1 > c0) {
    // Validate the new representatives for every head before changing any state.
    for (int h = 0; h < heads_; ++h) {
      try {
        ComputeReps(kv, h, c0, c1, first);
      } catch (...) {
        for (int r = 0; r <= h; ++r) {
          HeadIndex& R = heads_data_[r];
          const size_t rows = size_t(c0 - R.repsFirst);
          R.reps.resize(rows * dim_);
          if (cfg_.policy == PolicyKind::Quest) R.maxs.resize(rows * dim_);
          if (cfg_.policy == PolicyKind::Kvdrive) R.var.resize(rows);
          if (cfg_.policy == PolicyKind::ShadowKV && cfg_.outlierChunks > 0) R.minCos.resize(rows);
        }
        throw;
      }
    }
    if (cfg_.policy == PolicyKind::Kvdrive) {
      // One segment filling is re-clustered on the background thread (reclusterDelay); several at
      // once (a long extend) run their k-means here, heads split over threads like the build.
      const bool defer = cfg_.reclusterDelay > 0 && fills == 1;
      std::vector<size_t> filledAt(static_cast<size_t>(heads_), 0);
      auto extendHead = [&](int h) {
        HeadIndex& H = heads_data_[h];
        // The segments that change: the open one (if any) and those opened below.
        const size_t changed = !H.segments.empty() && H.segments.back().cEnd > c0 ? H.segments.size() - 1 : H.segments.size();
        // The sketch first: a segment that fills below orders its rows, so they must be there.
        if (cfg_.keySketch) UpdateSketch(kv, h, tokens, first);
        for (int64_t j = c0; j < c1; ++j) {
          if (H.segments.empty() || H.segments.back().cEnd <= j) {
            Segment seg;
            seg.c0 = seg.c1 = j;
            seg.cEnd = (j / segChunks + 1) * segChunks;
            ReserveOpen(seg);
            H.segments.push_back(std::move(seg));
          }
          Segment& seg = H.segments.back();
          if (AddChunkOnline(h, seg, j, defer)) filledAt[size_t(h)] = H.segments.size() - 1;
          if (cfg_.keySketch && seg.clusteredFull && !seg.slotOrder) OrderSketchRows(H, seg);
          if (cfg_.releaseChunkMeans && seg.clusteredFull) ReleaseChunkMeans(H, seg.cEnd);
        }
        RefreshClusters(H, changed);
      };
      if (fills > 0 && !defer) ForEachHead(extendHead);
      else
        for (int h = 0; h < heads_; ++h) extendHead(h);
      if (defer) StartRecluster(filledAt, tokens + cfg_.reclusterDelay);
    }
    endChunk_ = c1;
  } else if (cfg_.policy == PolicyKind::Kvdrive && cfg_.keySketch) {
    for (int h = 0; h < heads_; ++h) UpdateSketch(kv, h, tokens, first);
  }
  tokens_ = tokens;
}

LayerIndex::~LayerIndex() { DropRecluster(); }

void LayerIndex::StartRecluster(const std::vector<size_t>& segAt, int64_t installAt) {
  auto p = std::make_shared<PendingRecluster>();
  p->installAt = installAt;
  p->segAt = segAt;
  p->result.resize(size_t(heads_));
  std::vector<SegmentRows> rows(static_cast<size_t>(heads_));
  for (int h = 0; h < heads_; ++h) {
    const Segment& seg = heads_data_[size_t(h)].segments[segAt[size_t(h)]];
    Segment& r = p->result[size_t(h)];
    r.c0 = seg.c0, r.c1 = seg.c1, r.cEnd = seg.cEnd;
    // The rows stay in place until the install: Extend installs before anything could move them.
    rows[size_t(h)] = RowsOf(heads_data_[size_t(h)], seg);
  }
  // The task reads cfg_ and dim_ (fixed once built) and the rows; it writes only p->result. This
  // index outlives it: Build, the install and the destructor wait for or cancel it first.
  PendingRecluster* raw = p.get();
  p->task = std::make_shared<BackgroundTask>([this, raw, rows = std::move(rows)] {
    for (size_t h = 0; h < rows.size(); ++h) ClusterSegment(rows[h], int(h), raw->result[h]);
  });
  pending_ = std::move(p);
  BackgroundQueue::Global().Post(pending_->task);
}

void LayerIndex::InstallRecluster() {
  std::shared_ptr<PendingRecluster> p = std::move(pending_);
  // Not started yet: it runs here. A failed k-means (out of memory) leaves the online clusters,
  // which select reads as it did since the fill; the error reaches the caller.
  p->task->Wait();
  for (int h = 0; h < heads_; ++h) {
    HeadIndex& H = heads_data_[size_t(h)];
    Segment& seg = H.segments[p->segAt[size_t(h)]];
    seg = std::move(p->result[size_t(h)]);
    if (cfg_.keySketch) OrderSketchRows(H, seg);
    if (cfg_.releaseChunkMeans) ReleaseChunkMeans(H, seg.cEnd);
    RefreshClusters(H, p->segAt[size_t(h)]);
  }
}

void LayerIndex::DropRecluster() {
  if (!pending_) return;
  pending_->task->Cancel();
  pending_.reset();
}

void LayerIndex::UpdateSketch(const KvView& kv, int h, int64_t tokens, int64_t first) {
  KeySketch& s = heads_data_[h].sketch;
  s.bits = cfg_.sketchBits;
  // Channel scales are measured on the context at build; a build on a short context (a host that
  // starts at position 0) re-measures them each time the context doubles, up to 4096 tokens, and
  // keeps them from then on (per-row scales absorb what later tokens exceed).
  constexpr int64_t kCalibrateUpTo = 4096;
  // Re-measuring re-quantizes every token, so it needs the whole context in kv (first == 0); a
  // caller that passes only its tail (first > 0, the runtime's offloaded sequences) only appends.
  if (s.dim != kv.dim || (first == 0 && s.calibratedAt < kCalibrateUpTo && tokens >= std::max<int64_t>(64, 2 * s.calibratedAt))) {
    CalibrateSketch(kv, h, tokens, s);
    // Every row was rewritten in token order: the slot-ordered segments reorder theirs again.
    for (Segment& seg : heads_data_[h].segments)
      if (seg.slotOrder) OrderSketchRows(heads_data_[h], seg);
  } else {
    AppendSketch(kv, h, tokens, s, first);
  }
}

const Segment* LayerIndex::SegmentOf(const HeadIndex& H, int64_t j) const {
  // Segment i covers chunks [max(firstChunk, (b + i) x segChunks), (b + i + 1) x segChunks) with
  // b = firstChunk / segChunks (segments are consecutive from the first indexed chunk).
  const int64_t segChunks = cfg_.segmentTokens / cfg_.chunk;
  if (j < firstChunk()) return nullptr;
  const int64_t i = j / segChunks - firstChunk() / segChunks;
  if (i >= int64_t(H.segments.size())) return nullptr;
  const Segment& seg = H.segments[size_t(i)];
  return j >= seg.c0 && j < seg.c1 ? &seg : nullptr;
}

int64_t LayerIndex::SlotOf(const HeadIndex& H, int64_t j) const {
  const Segment* seg = SegmentOf(H, j);
  return seg && seg->slotOrder ? seg->chunkSlots[size_t(j - seg->c0)] : j;
}

int64_t LayerIndex::ChunkOfSlot(const HeadIndex& H, int64_t s) const {
  const Segment* seg = SegmentOf(H, s);  // a segment's slots are its chunk range
  return seg && seg->slotOrder ? seg->slotChunks[size_t(s - seg->c0)] : s;
}

int64_t LayerIndex::SketchRow(int h, int64_t t) const {
  const int64_t j = t / cfg_.chunk;
  return SlotOf(heads_data_[size_t(h)], j) * cfg_.chunk + (t - j * cfg_.chunk);
}

void LayerIndex::OrderSketchRows(HeadIndex& H, Segment& seg) const {
  KeySketch& sk = H.sketch;
  const int64_t chunk = cfg_.chunk, n = seg.c1 - seg.c0;
  if (sk.tokens() < seg.c1 * chunk)
    Throw("E_INTERNAL", "sketch: expected rows up to token " + std::to_string(seg.c1 * chunk) + " before ordering a segment, got " +
                            std::to_string(sk.tokens()));
  // Whole chunks move (a first chunk that holds sinks too: its sink rows move with it, SketchRow
  // finds them). The segment's rows are copied out once (256 KiB at 4096 tokens, 4 bits).
  if (!seg.slotOrder) {
    // The slot order (see Segment::slotChunks), from the segment's own members and outliers (chunk
    // ids until now; it may not be in H.segments yet).
    std::vector<char> outlier(static_cast<size_t>(n), 0);
    for (int32_t id : seg.outliers) outlier[size_t(id - seg.c0)] = 1;
    seg.slotChunks.resize(size_t(n));
    seg.runs.assign(size_t(seg.k) + 2, 0);
    size_t p = 0;
    for (int c = 0; c < seg.k; ++c) {
      seg.runs[size_t(c)] = int32_t(p);
      for (int32_t q = seg.offsets[size_t(c)]; q < seg.offsets[size_t(c) + 1]; ++q)
        if (!outlier[size_t(seg.members[size_t(q)] - seg.c0)]) seg.slotChunks[p++] = seg.members[size_t(q)];
    }
    seg.runs[size_t(seg.k)] = int32_t(p);
    for (int32_t id : seg.outliers) seg.slotChunks[p++] = id;  // ascending
    seg.runs[size_t(seg.k) + 1] = int32_t(p);
    seg.chunkSlots.resize(size_t(n));
    for (size_t i = 0; i < size_t(n); ++i) seg.chunkSlots[size_t(seg.slotChunks[i] - seg.c0)] = int32_t(seg.c0 + int64_t(i));
    for (int32_t& id : seg.outliers) id = seg.chunkSlots[size_t(id - seg.c0)];  // still ascending
    seg.slotOrder = true;
  }
  const size_t rb = size_t(sk.RowBytes()), r0 = size_t(seg.c0 * chunk), rows = size_t(n * chunk);
  std::vector<int8_t> codes(sk.codes.begin() + std::ptrdiff_t(r0 * rb), sk.codes.begin() + std::ptrdiff_t((r0 + rows) * rb));
  std::vector<float> scales(sk.rowScale.begin() + std::ptrdiff_t(r0), sk.rowScale.begin() + std::ptrdiff_t(r0 + rows));
  for (int64_t p = 0; p < n; ++p) {
    const size_t from = size_t((seg.slotChunks[size_t(p)] - seg.c0) * chunk), to = size_t(p * chunk);
    std::memcpy(sk.codes.data() + (r0 + to) * rb, codes.data() + from * rb, size_t(chunk) * rb);
    std::memcpy(sk.rowScale.data() + r0 + to, scales.data() + from, size_t(chunk) * 4);
  }
}

int64_t LayerIndex::ClustersPerSegment() const {
  return std::min(cfg_.segmentTokens / cfg_.chunk, (cfg_.segmentTokens + cfg_.tokensPerCluster - 1) / cfg_.tokensPerCluster);
}

void LayerIndex::ReserveClusters(HeadIndex& H, size_t segments) const {
  ClusterTable& t = H.clusters;
  const size_t k = size_t(ClustersPerSegment()) * segments, tiles = (size_t(ClustersPerSegment()) + 15) / 16 * segments;
  for (auto* v : {&t.var, &t.radius}) v->reserve(k);
  for (auto* v : {&t.tokens, &t.runBegin, &t.runEnd}) v->reserve(k);
  t.base.reserve(segments + 1);
  t.tileAt.reserve(segments + 1);
  t.tiles.reserve(tiles * TileBytes4(16, dim_));
  t.tileScales.reserve(tiles * 16);
}

void LayerIndex::RefreshClusters(HeadIndex& H, size_t from) const {
  ClusterTable& t = H.clusters;
  from = std::min({from, t.base.size() - 1, H.segments.size()});
  t.base.resize(from + 1);
  t.tileAt.resize(from + 1);
  const size_t n0 = size_t(t.base[from]);
  t.var.resize(n0), t.radius.resize(n0), t.tokens.resize(n0), t.runBegin.resize(n0), t.runEnd.resize(n0);
  const size_t tileBytes = TileBytes4(16, dim_);
  t.tiles.resize(size_t(t.tileAt[from]) * tileBytes);
  t.tileScales.resize(size_t(t.tileAt[from]) * 16);
  // Room for what is appended below: a build reserves for its segments plus one first
  // (ReserveClusters), so the table grows in place segment by segment and an open segment cluster
  // by cluster; past that, room for an eighth more segments (at least one). Not more: the small
  // arrays come from the heap, where room reused from freed blocks is resident memory.
  const size_t segs = H.segments.size();
  if (t.var.capacity() < size_t(t.base[from]) + (segs - from) * size_t(ClustersPerSegment())) ReserveClusters(H, segs + std::max<size_t>(1, segs / 8));
  for (size_t s = from; s < H.segments.size(); ++s) {
    Segment& seg = H.segments[s];
    const size_t k = size_t(seg.k);
    if (seg.var.size() != k || seg.counts.size() != k || seg.radius.size() > k || (seg.slotOrder && seg.runs.size() < k + 1) ||
        seg.tiles.size() != TileBytes4(k, dim_) || seg.tileScales.size() != TileScalesI8(k))
      Throw("E_INTERNAL", "index: expected segment " + std::to_string(s) + "'s per-cluster fields (" + std::to_string(k) +
                              " clusters) to be held, got them released (a segment refreshed twice after it was full)");
    for (size_t c = 0; c < k; ++c) {
      t.var.push_back(seg.var[c]);
      t.radius.push_back(c < seg.radius.size() ? seg.radius[c] : 0.f);
      t.tokens.push_back(seg.counts[c] * cfg_.chunk);
      t.runBegin.push_back(seg.slotOrder ? int32_t(seg.c0 + seg.runs[c]) : 0);
      t.runEnd.push_back(seg.slotOrder ? int32_t(seg.c0 + seg.runs[c + 1]) : 0);
    }
    t.base.push_back(t.base.back() + seg.k);
    t.tiles.insert(t.tiles.end(), seg.tiles.begin(), seg.tiles.end());
    t.tileScales.insert(t.tileScales.end(), seg.tileScales.begin(), seg.tileScales.end());
    t.tileAt.push_back(t.tileAt.back() + int32_t((k + 15) / 16));
    // A full, clustered segment never changes again (a re-clustering replaces a segment that filled
    // online; a keySketch index orders a full segment's rows before this): the table's copies are
    // the only ones kept.
    if (seg.clusteredFull) {
      LineVector<uint8_t>().swap(seg.tiles);
      std::vector<float>().swap(seg.tileScales);
      std::vector<float>().swap(seg.var);
      std::vector<float>().swap(seg.radius);
      std::vector<int32_t>().swap(seg.counts);
      std::vector<int32_t>().swap(seg.runs);
    }
  }
  // Only the first indexed chunk can hold sinks (ChunkTokens): its cluster holds fewer tokens.
  if (from == 0 && !H.segments.empty() && !H.segments[0].assign.empty() && H.segments[0].c0 == firstChunk())
    t.tokens[size_t(H.segments[0].assign[0])] -= int32_t(cfg_.chunk - ChunkTokens(firstChunk()));
}

namespace {
// A cursor over a head's segments for ascending positions (chunk ids or slots: a segment's slots are
// its chunk range): Ordered(x) is the slot-ordered segment holding x, or nullptr (x in no segment,
// or in one still in chunk order, where slot and chunk are the same). Each call walks forwards from
// the last, so a pass over ascending positions costs one step per segment, with no division.
struct ForwardSegments {
  const std::vector<Segment>& segs;
  size_t at = 0;
  const Segment* Ordered(int64_t x) {
    while (at < segs.size() && segs[at].c1 <= x) ++at;
    if (at == segs.size()) return nullptr;
    const Segment& s = segs[at];
    return s.slotOrder && x >= s.c0 ? &s : nullptr;
  }
};
}  // namespace

size_t LayerIndex::RerankChunks(int64_t budget) const {
  // Without chunk means (released) there is no level 2 to pick the re-ranked chunks: all of them.
  if (cfg_.releaseChunkMeans) return std::numeric_limits<size_t>::max();
  return std::max<size_t>(1, size_t(std::ceil(cfg_.FactorAt(cfg_.rerankFactor, budget, tokens_) * double(budget) / cfg_.chunk)));
}

bool LayerIndex::RerankExact(const float* qh, int g, int h, const KvView* keys, int64_t budget, int64_t want,
                             std::vector<Ranked>& ranked, bool allMarked, bool markBest, const std::vector<int32_t>* prior,
                             SelectResult& out, SelectScratch& sc) const {
  // The best level-2 chunks, ceil(rerankFactor x K / chunk) of them (at least one): a partial
  // selection, unordered (they are re-scored below).
  const size_t n = std::min(ranked.size(), RerankChunks(budget));
  SelectBest(ranked, n, sc.hist);
  const size_t sorted = n;
  // The re-ranked chunks in ascending id order (a bit set over the indexed chunks, scanned), so the
  // key gather below walks the cache forwards: neighbouring rows share pages and prefetch streams.
  // ranked ids are slots (Segment::slotOrder): in ascending slot order a slot-ordered segment's
  // sketch rows are read as runs, one per taken cluster.
  const HeadIndex& H = heads_data_[size_t(h)];
  const bool useKeys = keys && !cfg_.preferSketch;
  // Select passes every candidate, ascending, already marked in sc.bits (re-marking them is a pass
  // over the candidates and the bit set for nothing).
  std::vector<uint64_t>& bits = sc.bits;
  if (!allMarked) {
    bits.assign(size_t(endChunk_ + 63) / 64, 0);
    for (size_t i = 0; i < n; ++i) bits[size_t(ranked[i].id) >> 6] |= uint64_t(1) << (ranked[i].id & 63);
  }
  std::vector<int32_t>& toksAt = sc.toksAt;
  std::vector<int32_t>& rowsAt = sc.rowsAt;  // sketch rows of toksAt (when scoring the sketch)
  const int64_t chunk = cfg_.chunk;
  // Sized once for the most tokens (n whole chunks, sinks, tail) and written by index.
  const size_t most = n * size_t(chunk) + (prior ? prior->size() : 0) + size_t(sinkEnd()) + size_t(tokens_ - tailStart());
  toksAt.resize(most);
  rowsAt.resize(useKeys ? 0 : most);
  size_t at = 0, m = 0;
  // ChunkOfSlot for ascending slots: the segment is found by walking forwards.
  ForwardSegments slotSegs{H.segments};
  auto chunkOf = [&](int64_t slot) -> int64_t {
    const Segment* seg = slotSegs.Ordered(slot);
    return seg ? seg->slotChunks[size_t(slot - seg->c0)] : slot;
  };
  // The slot -> chunk entries of the candidates (4 bytes per slot, in runs scattered over the
  // segments' maps) mostly miss the cache: the lines of the first and last candidate of the word
  // kMapAhead words on are requested before this word's are read (a second cursor finds their
  // segment, walking forwards as chunkOf does).
  constexpr size_t kMapAhead = 4;
  ForwardSegments aheadSegs{H.segments};
  auto prefetchMap = [&](size_t w) {
    const uint64_t b = bits[w];
    if (!b) return;
    const int64_t first = int64_t(w * 64) + __builtin_ctzll(b), last = int64_t(w * 64) + 63 - __builtin_clzll(b);
    const Segment* seg = aheadSegs.Ordered(first);
    if (!seg) return;
    const int32_t* map = seg->slotChunks.data() - seg->c0;
    // Every line the word's candidates span (up to 4: 64 entries of 4 bytes), not only the first
    // and the last one's.
    const int64_t end = std::min<int64_t>(last, seg->c1 - 1);
    for (int64_t x = first; x <= end; x += 16) __builtin_prefetch(map + x);
    __builtin_prefetch(map + end);
  };
  for (size_t w = 0; w < kMapAhead && w < bits.size(); ++w) prefetchMap(w);
  for (size_t w = 0; w < bits.size(); ++w) {
    if (w + kMapAhead < bits.size()) prefetchMap(w + kMapAhead);
    for (uint64_t b = bits[w]; b; b &= b - 1) {
      const int64_t slot = int64_t(w * 64) + __builtin_ctzll(b);
      const int64_t j = chunkOf(slot);
      ranked[at++].id = int32_t(j);  // ranked[0, n) now chunk ids in slot order (scores rewritten below)
      if (chunk == 4 && !useKeys && j * chunk >= cfg_.sinks) {
        // The common case (the runtime's chunks of 4, keyless, past the sinks): a chunk's tokens and
        // its sketch rows are 4 consecutive ids each, one 16-byte store per array.
        const __m128i r = _mm_setr_epi32(0, 1, 2, 3);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(toksAt.data() + m), _mm_add_epi32(_mm_set1_epi32(int32_t(j * 4)), r));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(rowsAt.data() + m), _mm_add_epi32(_mm_set1_epi32(int32_t(slot * 4)), r));
        m += 4;
        continue;
      }
      for (int64_t t = std::max<int64_t>(j * chunk, cfg_.sinks); t < (j + 1) * chunk; ++t, ++m) {
        toksAt[m] = int32_t(t);
        if (!useKeys) rowsAt[m] = int32_t(slot * chunk + (t - j * chunk));
      }
    }
  }
  // The prior's tokens outside the candidate chunks (`prior` is passed only with allMarked and
  // tokenGranular, where every entry below counts token by token): distinct from the chunks'
  // tokens and from each other.
  if (prior) {
    // SlotOf for ascending chunks: the segment is found by walking forwards (no divisions per
    // token: ~16K prior tokens a layer-step). Each prior token's chunk -> slot entry lies at random
    // in the segments' maps (cold after level 1): the entry kPriorAhead tokens on is requested
    // before this one is read (a second cursor walks forwards for it).
    ForwardSegments chunkSegs{H.segments};
    ForwardSegments aheadSegs{H.segments};
    constexpr size_t kPriorAhead = 16;
    const std::vector<int32_t>& pr = *prior;
    for (size_t i = 0; i < pr.size(); ++i) {
      if (i + kPriorAhead < pr.size()) {
        const int64_t ja = pr[i + kPriorAhead] / chunk;
        if (ja >= firstChunk() && ja < endChunk_)
          if (const Segment* sa = aheadSegs.Ordered(ja)) __builtin_prefetch(sa->chunkSlots.data() + (ja - sa->c0));
      }
      const int32_t t = pr[i];
      const int64_t j = t / chunk;
      if (j < firstChunk() || j >= endChunk_ || t < cfg_.sinks) continue;
      const Segment* seg = chunkSegs.Ordered(j);
      const int64_t slot = seg ? seg->chunkSlots[size_t(j - seg->c0)] : j;
      if (bits[size_t(slot) >> 6] >> (slot & 63) & 1) continue;
      toksAt[m] = int32_t(t);
      if (!useKeys) rowsAt[m] = int32_t(slot * chunk + (t - j * chunk));
      ++m;
    }
  }
  const size_t nRe = m;
  // The rest keep their level-2 order below every re-ranked entry: score -(1 + rank) (masses >= 0).
  // Token-granular selections that the re-ranked tokens already fill never look at the rest.
  const bool needRest = !cfg_.tokenGranular || want > int64_t(nRe);
  if (needRest) {
    ExtendSorted(ranked, sorted, ranked.size(), sc.hist);
    for (size_t i = n; i < ranked.size(); ++i) ranked[i] = {-float(1 + (i - n)), int32_t(ChunkOfSlot(H, ranked[i].id))};
  } else {
    ranked.resize(n);
  }

  // The always attended sinks and tail only feed the normalisers.
  for (int64_t t = 0; t < sinkEnd(); ++t) toksAt[m++] = int32_t(t);
  for (int64_t t = tailStart(); t < tokens_; ++t) toksAt[m++] = int32_t(t);
  const size_t nAll = m;
  if (!useKeys)
    for (size_t i = nRe; i < nAll; ++i) rowsAt[i] = int32_t(SketchRow(h, toksAt[i]));
  // Exact q·k of every gathered row for the whole GQA group (head-major, g x ld), one read per row.
  const size_t ld = (nAll + 15) / 16 * 16;
  std::vector<float>& logits = sc.logits;
  std::vector<float>& share = sc.share;
  logits.resize(size_t(g) * ld);
  share.resize((nRe + 15) / 16 * 16);
  if (useKeys) {
    ScoreKeyRows(qh, g, *keys, h, toksAt.data(), nAll, logits.data(), ld);
  } else {
    const KeySketch& sketch = H.sketch;
    PrepareSketchQuery(qh, g, sketch, sc.sketchQuery);
    ScoreSketchRows(sc.sketchQuery, g, sketch, rowsAt.data(), nAll, logits.data(), ld);
  }
  // Per query head: w_t = exp(s·q·k_t - m) / z with m the max and z the sum over everything scored
  // — t's estimated share of that head's attention (z underestimates the true normaliser by the
  // same factor for every token of the head); share = the sum over the group.
  const int64_t bad = GroupShares(logits.data(), g, nAll, ld, nRe, float(1.0 / std::sqrt(double(dim_))), share.data());
  if (bad >= 0)
    Throw("E_NONFINITE", "select keys: expected finite keys, got NaN or Inf in kv head " + std::to_string(h) +
                             ", token " + std::to_string(toksAt[size_t(bad) % ld]));
  bool marked = false;
  if (cfg_.tokenGranular && markBest && !needRest) {
    // The caller takes the best min(K, re-ranked) tokens as a set: marked in sc.bits (now over
    // tokens; the candidate slots were read above) straight from share / toksAt, with no list of
    // the tokens built for it. The same set as MarkBest over that list.
    bits.assign(size_t(tokens_ + 63) / 64, 0);
    const float* sp = share.data();
    const int32_t* tp = toksAt.data();
    MarkBestBy(nRe, [sp](size_t i) { return sp[i]; }, [tp](size_t i) { return tp[i]; },
               std::min(nRe, size_t(budget)), sc.hist, sc.ties, bits);
    ranked.clear();
    marked = true;
  } else if (cfg_.tokenGranular) {
    // Token ids from here on: the re-ranked tokens by their share, then the remaining chunks'
    // tokens in level-2 order (scores -(1 + chunk rank)). Sorted lazily by the caller.
    std::vector<Ranked>& tok = sc.tok;
    tok.resize(nRe);
    for (size_t i = 0; i < nRe; ++i) tok[i] = {share[i], toksAt[i]};
    for (size_t i = n; i < ranked.size(); ++i) {
      const int64_t j = ranked[i].id;
      for (int64_t t = std::max<int64_t>(j * cfg_.chunk, cfg_.sinks); t < (j + 1) * cfg_.chunk; ++t)
        tok.push_back({ranked[i].score, int32_t(t)});
    }
    ranked.swap(tok);
  } else {
    size_t t = 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t len = ChunkTokens(ranked[i].id);
      float mass = 0;
      for (int64_t r = 0; r < len; ++r) mass += share[t++];
      ranked[i].score = mass;
    }
  }
  out.keysScored += int64_t(nAll);
  out.bytesScored += int64_t(nAll) * (useKeys ? dim_ * int64_t(DtypeSize(keys->dtype)) : heads_data_[h].sketch.BytesPerToken());
  return marked;
}

void LayerIndex::SelectHead(const float* q, int qHeads, int64_t budget, int64_t pool, const KvView* keys, int h,
                            HeadSelection& part) const {
  const int g = qHeads / heads_;
  const int64_t want = std::max(budget, pool);
  SelectResult& out = part.r;
  int64_t& tileVectors = part.tileVectors;
  out.chunk = cfg_.chunk;
  SelectScratch& sc = Scratch();
  std::vector<Ranked>& ranked = sc.ranked;
  std::vector<int32_t>& ids = sc.ids;
  std::vector<float>& scores = sc.scores;
  const HeadIndex& H = heads_data_[h];
  const float* qh = q + size_t(h) * g * dim_;
  ranked.clear();
  bool reranked = false;  // ranked holds level-3 scores (token ids with tokenGranular)
  bool marked = false;    // level 3 marked the selected tokens in sc.bits itself (ranked empty)
  if (cfg_.policy == PolicyKind::Kvdrive) {
    // Variance-term coefficients per query head: w * (s/2) * |q_j|² (null when w = 0).
    std::vector<float>& coef = sc.coef;
    coef.resize(g);
    for (int j = 0; j < g; ++j)
      coef[j] = float(cfg_.varianceWeight * 0.5 / std::sqrt(double(dim_)) *
                      double(DotFixed(qh + size_t(j) * dim_, qh + size_t(j) * dim_, dim_)));
    const bool useVar = cfg_.varianceWeight > 0;
    const bool useRadius = cfg_.radiusWeight > 0;
    double qMax2 = 0;
    for (int j = 0; j < g; ++j) qMax2 = std::max(qMax2, double(DotFixed(qh + size_t(j) * dim_, qh + size_t(j) * dim_, dim_)));
    const double varCoefMax = cfg_.varianceWeight * 0.5 / std::sqrt(double(dim_)) * qMax2;
    const double radCoef = cfg_.radiusWeight * std::sqrt(qMax2);
    std::vector<float>& extra = sc.extra;
    std::vector<float>& ones = sc.ones;
    ones.assign(g, 1.f);
    // Level 1: every centroid, max over the GQA group. A cluster's rank key id is its index
    // over the head's segments (segment base + cluster): unique, so ties break deterministically.
    QuantizeQueryI8(qh, g, dim_, sc.queryI8);
    const ClusterTable& ct = H.clusters;
    if (ct.base.size() != H.segments.size() + 1)
      Throw("E_INTERNAL", "select: expected the cluster table of kv head " + std::to_string(h) + " to cover its " +
                              std::to_string(H.segments.size()) + " segments, got " + std::to_string(ct.base.size()) + " offsets");
    const size_t totalK = size_t(ct.base.back());
    // The spread terms of every cluster in one pass over the table: one per cluster with the
    // group's largest |q| (the max over the group is then taken over q_j·c + that term).
    if (useRadius) {
      extra.resize(totalK);
      float* e = extra.data();
      const float* rad = ct.radius.data();
      if (useVar) {
        const float* var = ct.var.data();
        for (size_t c = 0; c < totalK; ++c) e[c] = float(varCoefMax * var[c] + radCoef * rad[c]);
      } else {
        for (size_t c = 0; c < totalK; ++c) e[c] = float(varCoefMax * 0.f + radCoef * rad[c]);
      }
    }
    scores.resize(totalK);
    for (size_t s = 0, e = 0; s < H.segments.size(); s = e) {
      // Segments [s, e): all but the last of whole tiles, so their tiles, scales and cluster ids
      // run on from one to the next: one call (every full segment at once).
      for (e = s + 1; e < H.segments.size() && H.segments[e - 1].k % 16 == 0; ++e) {
      }
      for (size_t x = s; x < e; ++x)
        if (ct.base[x + 1] - ct.base[x] != H.segments[x].k)
          Throw("E_INTERNAL", "select: expected the cluster table to hold segment " + std::to_string(x) + "'s " +
                                  std::to_string(H.segments[x].k) + " clusters, got " + std::to_string(ct.base[x + 1] - ct.base[x]));
      const size_t base = size_t(ct.base[s]), n = size_t(ct.base[e]) - base;
      const uint8_t* tiles = ct.TilesOf(s, dim_);
      const float* tileScales = ct.ScalesOf(s);
      if (useRadius)
        ScoreTilesMax4(sc.queryI8, tiles, tileScales, n, scores.data() + base, extra.data() + base, ones.data());
      else
        ScoreTilesMax4(sc.queryI8, tiles, tileScales, n, scores.data() + base, useVar ? ct.var.data() + base : nullptr, coef.data());
      out.vectorsScored += int64_t(n);
      tileVectors += int64_t(n);
    }
    // Candidate clusters in rank order until candidateFactor x K tokens (and at least the pool).
    // Candidate chunks are marked in a bit set over the indexed chunks (scanned in ascending order
    // below, so the next level walks the cache forwards).
    // With a prior selection, fewer clusters: the prior's chunks join the candidates below.
    const std::vector<int32_t>* prior = cfg_.reuseCandidateFactor > 0 && !prior_.empty() ? &prior_[size_t(h)] : nullptr;
    const double factor = cfg_.FactorAt(prior ? cfg_.reuseCandidateFactor : cfg_.candidateFactor, budget, tokens_);
    const double target = std::max(factor * double(budget), double(want));
    std::vector<uint64_t>& chosen = sc.chosen;
    TakeClusters(scores.data(), ct.tokens.data(), totalK, target, sc.hist, sc.clusters, chosen);
    // Candidates are marked in a bit set over slots (Segment::slotOrder; chunk ids elsewhere).
    std::vector<uint64_t>& bits = sc.bits;
    bits.assign(size_t(endChunk_ + 63) / 64, 0);
    for (size_t s = 0, base = 0; s < H.segments.size(); base += size_t(H.segments[s].k), ++s) {
      const Segment& seg = H.segments[s];
      if (seg.slotOrder) {
        // A taken cluster's chunks are one run of slots (its outlier chunks are in the segment's
        // outlier run, marked below). The taken clusters are read off `chosen` word by word
        // (a few in eight are taken), not tested one cluster at a time.
        const size_t end = base + size_t(seg.k);
        for (size_t w = base >> 6; w << 6 < end; ++w) {
          uint64_t word = chosen[w];
          if ((w << 6) < base) word &= ~uint64_t(0) << (base & 63);
          if (((w + 1) << 6) > end) word &= ~uint64_t(0) >> (64 - (end & 63));
          for (; word; word &= word - 1) {
            const size_t c = (w << 6) + size_t(__builtin_ctzll(word));
            SetBits(bits, ct.runBegin[c], ct.runEnd[c]);
          }
        }
        continue;
      }
      // Chunks of the taken clusters: one forward pass over the segment's assignments (rather
      // than each taken cluster's member list).
      const int32_t* a = seg.assign.data();
      const int64_t n = seg.c1 - seg.c0;
      for (int64_t i = 0; i < n; ++i) {
        const size_t gid = base + size_t(a[i]);
        if (chosen[gid >> 6] >> (gid & 63) & 1) {
          const int64_t id = seg.c0 + i;
          bits[size_t(id) >> 6] |= uint64_t(1) << (id & 63);
        }
      }
    }
    // Outlier chunks (highest key variance of each segment) are always candidates: one strong
    // key among weak, opposed neighbours drags its cluster's centroid away from any query.
    if (cfg_.outlierFraction > 0)
      for (const Segment& seg : H.segments)
        for (int32_t id : seg.outliers) bits[size_t(id) >> 6] |= uint64_t(1) << (id & 63);
    size_t nIds = 0;
    for (uint64_t w : bits) nIds += size_t(__builtin_popcountll(w));
    // Level 3 scores the keys, or without them (or with preferSketch) the head's sketch.
    const bool haveSketch = cfg_.keySketch && H.sketch.tokens() >= tokens_;
    const bool rerank = (keys || haveSketch) && (haveSketch || !cfg_.preferSketch) && cfg_.rerankFactor > 0 && nIds > 0;
    // The prior's tokens join the candidates one by one where level 3 re-ranks every candidate
    // token by token (RerankExact adds those outside the candidate chunks: a prior of K tokens
    // spans ~3K chunk tokens); otherwise their chunks join (at their slots).
    const bool priorTokens = prior && cfg_.tokenGranular && rerank && RerankChunks(budget) >= nIds;
    if (prior && !priorTokens) {
      for (int32_t t : *prior) {
        const int64_t j = t / cfg_.chunk;
        if (j < firstChunk() || j >= endChunk_) continue;
        const int64_t s = SlotOf(H, j);
        if (!(bits[size_t(s) >> 6] >> (s & 63) & 1)) ++nIds;
        bits[size_t(s) >> 6] |= uint64_t(1) << (s & 63);
      }
    }
    if (rerank && RerankChunks(budget) >= nIds) {
      // Level 3 re-ranks every candidate (and no candidate is left over to order): level 2's
      // chunk-mean scores would never be read. RerankExact reads the candidates from the bit set
      // and writes every entry of `ranked`.
      ranked.resize(nIds);
      marked = RerankExact(qh, g, h, keys, budget, want, ranked, true, pool == 0, priorTokens ? prior : nullptr, out, sc);
      reranked = true;
      goto fill;
    }
    // ids: the candidate slots, ascending.
    ids.resize(nIds);
    for (size_t w = 0, at = 0; w < bits.size(); ++w)
      for (uint64_t b = bits[w]; b; b &= b - 1) ids[at++] = int32_t(w * 64) + __builtin_ctzll(b);
    // Level 2: re-rank the candidates' chunks by q·chunk-mean.
    if (cfg_.releaseChunkMeans && !ids.empty())  // construction requires what makes `rerank` true
      Throw("E_INTERNAL", "select: expected the level-3 re-rank to cover every candidate (chunk means released), got none");
    {
    std::vector<int32_t>& rows = sc.rows;
    rows.resize(ids.size());
    for (size_t t = 0; t < ids.size(); ++t) rows[t] = int32_t(ChunkOfSlot(H, ids[t]) - H.repsFirst);
    scores.resize(ids.size());
    ScoreRowsMaxGather(qh, g, H.reps.data(), rows.data(), ids.size(), dim_, scores.data(),
                       useVar ? H.var.data() : nullptr, coef.data());
    out.vectorsScored += int64_t(ids.size());
    for (size_t t = 0; t < ids.size(); ++t) ranked.push_back({scores[t], ids[t]});
    if (rerank) {
      marked = RerankExact(qh, g, h, keys, budget, want, ranked, false, pool == 0, nullptr, out, sc);
      reranked = true;
    } else {
      for (Ranked& r : ranked) r.id = int32_t(ChunkOfSlot(H, r.id));
    }
    }
  } else {
    const size_t n = size_t(endChunk_ - firstChunk());
    scores.resize(n);
    if (cfg_.policy == PolicyKind::Quest) {
      ScoreMinMaxMax(qh, g, H.reps.data(), H.maxs.data(), n, dim_, scores.data());
      out.vectorsScored += int64_t(2 * n);
    } else {
      ScoreRowsMax(qh, g, H.reps.data(), n, dim_, scores.data());
      out.vectorsScored += int64_t(n);
    }
    for (size_t t = 0; t < n; ++t) ranked.push_back({scores[t], int32_t(firstChunk() + int64_t(t))});
    if (cfg_.policy == PolicyKind::ShadowKV && cfg_.outlierChunks > 0 && n > 0) {
      // The outlier chunks rank first (score +inf), inside the budget but never more than a
      // quarter of its chunks (the paper's 48 at its budget 2048 / chunk 8 = 256 chunks).
      std::vector<Ranked>& worst = sc.tok;
      worst.resize(n);
      for (size_t t = 0; t < n; ++t) worst[t] = {-H.minCos[t], int32_t(t)};
      const size_t m = std::min({n, size_t(cfg_.outlierChunks), size_t(budget / cfg_.chunk / 4)});
      SelectBest(worst, m, sc.hist);
      for (size_t i = 0; i < m; ++i) ranked[size_t(worst[i].id)].score = INFINITY;
    }
  }
fill:
  // Token-granular ids (kvdrive re-rank with tokenGranular) are single tokens.
  const bool tokens = reranked && cfg_.tokenGranular;
  if (tokens) out.chunk = 1;
  if (tokens && pool == 0) {
    // Every id is one token: the selection is the best min(K, n) ids, a partial selection (no
    // ranking order needed, the ids are returned ascending).
    // Marked in a bit set over the tokens where they lie (no partition of `ranked`), read back
    // ascending (cheaper than sorting the ids).
    std::vector<uint64_t>& bits = sc.bits;
    if (!marked) {
      bits.assign(size_t(tokens_ + 63) / 64, 0);
      MarkBest(ranked, std::min(ranked.size(), size_t(budget)), sc.hist, sc.ties, bits);
    }
    // Counted first, then written by index: ids grown by push_back reallocated ~12 times a head.
    size_t count = 0;
    for (uint64_t w : bits) count += size_t(__builtin_popcountll(w));
    const size_t at = out.ids.size();
    out.ids.resize(at + count);
    int32_t* o = out.ids.data() + at;
    for (size_t w = 0; w < bits.size(); ++w)
      for (uint64_t b = bits[w]; b; b &= b - 1) *o++ = int32_t(w * 64) + __builtin_ctzll(b);
    return;
  }
  // Greedy fill in rank order, sorting lazily: a chunk that does not fit is skipped (only the
  // first chunk can be shorter than `chunk`), and the walk stops once nothing more can fit.
  size_t sorted = 0;
  const size_t guess = size_t(std::max(budget, pool) / (tokens ? 1 : cfg_.chunk)) + 2;
  auto rankedAt = [&](size_t i) -> const Ranked& {
    if (i >= sorted) sorted = ExtendSorted(ranked, sorted, std::max({i + 1, guess, sorted * 2}), sc.hist);
    return ranked[i];
  };
  const int64_t shortLen = tokens ? 1 : ChunkTokens(firstChunk());
  bool shortSeen = tokens;
  auto roomFor = [&](int64_t used, int64_t cap) { return cap - used >= (shortSeen ? (tokens ? 1 : cfg_.chunk) : shortLen); };
  int64_t used = 0, poolUsed = 0;
  const size_t selBegin = out.ids.size();
  for (size_t i = 0; i < ranked.size() && (roomFor(used, budget) || (pool > 0 && roomFor(poolUsed, pool))); ++i) {
    const Ranked& r = rankedAt(i);
    const int64_t len = tokens ? 1 : ChunkTokens(r.id);
    if (!tokens && r.id == firstChunk()) shortSeen = true;
    if (used + len <= budget) {
      used += len;
      out.ids.push_back(r.id);
    }
    if (pool > 0 && poolUsed + len <= pool) {
      poolUsed += len;
      out.poolIds.push_back(r.id);
      out.poolScores.push_back(r.score);
    }
  }
  std::sort(out.ids.begin() + selBegin, out.ids.end());
}

SelectResult LayerIndex::Select(const float* q, int qHeads, int64_t budget, int64_t pool, const KvView* keys, int headBegin,
                                int headEnd) const {
  if (headEnd < 0) headEnd = heads_;
  if (headBegin < 0 || headBegin >= headEnd || headEnd > heads_)
    Throw("E_RANGE", "select heads: expected a kv head range within [0, " + std::to_string(heads_) + "), got [" + std::to_string(headBegin) +
                         ", " + std::to_string(headEnd) + ")");
  // Kv heads are independent: each selects into its own result on the thread pool (per-thread
  // scratch), and the results are concatenated in head order, so the selection does not depend on
  // the thread count.
  std::vector<HeadSelection> parts{size_t(headEnd - headBegin)};
  ThreadPool::Global().ParallelFor(
      size_t(headEnd - headBegin), [&](size_t i) { SelectHead(q, qHeads, budget, pool, keys, headBegin + int(i), parts[i]); },
      std::max(1, cfg_.threads));
  return JoinHeads(parts, pool);
}

SelectResult LayerIndex::JoinHeads(std::vector<HeadSelection>& parts, int64_t pool) const {
  SelectResult out;
  out.chunk = cfg_.chunk;
  out.offsets.push_back(0);
  if (pool > 0) out.poolOffsets.push_back(0);
  int64_t tileVectors = 0;
  for (HeadSelection& p : parts) {
    const SelectResult& r = p.r;
    if (r.chunk == 1) out.chunk = 1;
    out.ids.insert(out.ids.end(), r.ids.begin(), r.ids.end());
    out.offsets.push_back(int32_t(out.ids.size()));
    if (pool > 0) {
      out.poolIds.insert(out.poolIds.end(), r.poolIds.begin(), r.poolIds.end());
      out.poolScores.insert(out.poolScores.end(), r.poolScores.begin(), r.poolScores.end());
      out.poolOffsets.push_back(int32_t(out.poolIds.size()));
    }
    out.vectorsScored += r.vectorsScored;
    out.keysScored += r.keysScored;
    out.bytesScored += r.bytesScored;
    tileVectors += p.tileVectors;
  }
  const int64_t vecBytes = int64_t(dim_) * 4;
  // Index vectors (4-bit centroids with a f32 scale, f32 chunk representatives); key rows were added as read.
  out.bytesScored += (out.vectorsScored - tileVectors) * vecBytes + tileVectors * (int64_t(TileBlocks4(dim_)) * 4 + 4);
  out.vectorsScored += out.keysScored;
  return out;
}

void LayerIndex::SetPrior(const int32_t* offsets, const int32_t* ids, int64_t idTokens) {
  // Kept only where a select reads it (4 bytes per token held).
  if (cfg_.policy != PolicyKind::Kvdrive || !(cfg_.reuseCandidateFactor > 0)) {
    prior_.clear();
    return;
  }
  // Rewritten in place, once per decode step: the per-head lists keep their capacity. A prior is
  // only a hint to the next select's candidates, so if growing a list fails midway the prior is
  // dropped (never left half old, half new) and the error goes to the caller.
  try {
    RewritePrior(offsets, ids, idTokens);
  } catch (...) {
    prior_.clear();
    throw;
  }
}

void LayerIndex::RewritePrior(const int32_t* offsets, const int32_t* ids, int64_t idTokens) {
  prior_.resize(static_cast<size_t>(heads_));
  for (int h = 0; h < heads_; ++h) {
    std::vector<int32_t>& p = prior_[size_t(h)];
    const int32_t* first = ids + offsets[h];
    const int32_t* last = ids + offsets[h + 1];
    // Ids ascending and distinct, so their tokens are too.
    if (idTokens == 1) {
      // A token selection (the runtime's): its ids are the tokens, each below the indexed count
      // (the caller checked them against it).
      p.assign(first, last);
      continue;
    }
    p.clear();
    for (const int32_t* i = first; i < last; ++i) {
      // Token ids are int32 (as selections hold them): an index past 2^31 tokens keeps those below.
      const int64_t t0 = int64_t(*i) * idTokens, t1 = std::min({t0 + idTokens, tokens_, int64_t(INT32_MAX)});
      for (int64_t t = t0; t < t1; ++t) p.push_back(int32_t(t));
    }
  }
}

std::vector<float> LayerIndex::SegmentCentroids(const HeadIndex& H, size_t s) const {
  const Segment& seg = H.segments[s];
  if (!seg.centroids.empty() || seg.k == 0) return seg.centroids;
  // Full segments keep their tiles in the cluster table only.
  const ClusterTable& t = H.clusters;
  const bool own = !seg.tiles.empty();
  std::vector<float> c(size_t(seg.k) * dim_);
  DequantizeTiles4(own ? seg.tiles.data() : t.TilesOf(s, dim_), own ? seg.tileScales.data() : t.ScalesOf(s), seg.k, dim_, c.data());
  return c;
}

namespace {
// What Bytes counts for one segment's clusters (sizes, not capacities).
int64_t SegmentBytes(const Segment& s) {
  return int64_t(sizeof(Segment)) + int64_t(s.tiles.size()) +
         int64_t(s.tileScales.size() + s.centroids.size() + s.var.size() + s.radius.size() + s.outliers.size()) * 4 +
         int64_t(s.sums.size() + s.sumSq.size()) * 8 + int64_t(s.counts.size() + s.assign.size() + s.offsets.size() + s.members.size()) * 4 +
         int64_t(s.slotChunks.size() + s.chunkSlots.size() + s.runs.size()) * 4;
}
}  // namespace

int64_t LayerIndex::Bytes() const {
  // Sizes, not capacities: build reserves room for the context to double, and untouched pages are
  // address space only; released chunk means leave one segment's room (ReleaseChunkMeans), what the
  // open segment holds at its largest.
  int64_t b = int64_t(sizeof(*this)) + int64_t(heads_data_.size() * sizeof(HeadIndex));
  for (const HeadIndex& H : heads_data_) {
    b += int64_t(H.reps.size() + H.var.size() + H.maxs.size() + H.minCos.size()) * 4 +
         H.sketch.Bytes() + H.clusters.Bytes();
    for (const Segment& s : H.segments) b += SegmentBytes(s);
  }
  for (const std::vector<int32_t>& p : prior_) b += int64_t(sizeof(p) + p.size() * 4);
  if (pending_) {
    // The result once written; while the task still writes it, the most it can take.
    if (pending_->task->Finished())
      for (const Segment& s : pending_->result) b += SegmentBytes(s);
    else
      b += int64_t(heads_) * ReclusterResultBytes(dim_);
  }
  return b;
}

int64_t LayerIndex::ReclusterResultBytes(int dim) const {
  const int64_t n = cfg_.segmentTokens / cfg_.chunk;
  const int64_t k = std::min(n, (cfg_.segmentTokens + cfg_.tokensPerCluster - 1) / cfg_.tokensPerCluster);
  const int64_t outliers = std::min(n, int64_t(std::ceil(cfg_.outlierFraction * double(n))));
  // A full segment's clusters as SegmentBytes counts them after ClusterSegment: tiles and scales,
  // var, radius, outliers; counts, assign, offsets, members.
  return int64_t(sizeof(Segment)) + int64_t(TileBytes4(size_t(k), dim)) + int64_t(TileScalesI8(size_t(k))) * 4 +
         (k + k + outliers) * 4 + (k + n + (k + 1) + n) * 4;
}

int64_t LayerIndex::ReclusterReserveBytes(int heads, int dim) const {
  if (cfg_.policy != PolicyKind::Kvdrive || cfg_.reclusterDelay == 0) return 0;
  // With releaseChunkMeans the chunk means sealed while a re-clustering is pending are held beside
  // the full segment's (RowsRoom beyond one segment); without it every row is held anyway.
  const int64_t rows = cfg_.releaseChunkMeans ? (cfg_.reclusterDelay / cfg_.chunk + 1) * (int64_t(dim) * 4 + 4) : 0;
  // The filled segment keeps its online clusters' tiles, scales, var, radius and counts until the
  // install, beside their copies in the cluster table (a clustered segment hands them over:
  // RefreshClusters).
  const int64_t k = ClustersPerSegment();
  const int64_t online = int64_t(TileBytes4(size_t(k), dim)) + int64_t(TileScalesI8(size_t(k))) * 4 + 3 * k * 4;
  return int64_t(heads) * (ReclusterResultBytes(dim) + rows + online);
}

}  // namespace kvd
