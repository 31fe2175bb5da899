// The selection index of one layer (all its kv heads) for one policy, and the selection it answers.
//
// Token geometry (shared with src/index/selection.ts): chunk j = tokens [j*chunk, (j+1)*chunk).
// Tokens [0, sinks) are always attended, so chunk representatives leave them out; chunk j is
// indexed ("sealed") once (j+1)*chunk <= tokens - local, i.e. once it left the local window.
// Indexed chunks are [firstChunk, endChunk) with firstChunk = floor(sinks / chunk); the tail
// [tailStart, tokens) = the local window plus the not-yet-sealed remainder is always attended.
//
// Policies:
//  - kvdrive: chunk means (c = 4) clustered by k-means per segment of `segmentTokens` tokens
//    (~tokensPerCluster tokens per cluster). Select scores every centroid (max over the GQA group),
//    takes the best clusters until candidateFactor x K tokens (at least the pool; the factors scale
//    with K, IndexConfig::candidateExponent), re-ranks their
//    chunks by q·chunk-mean (max over the group) and keeps the best up to K tokens. Both levels add
//    the variance term of IndexConfig::varianceWeight. Given the keys (the host's KV, read in place),
//    level 3 re-ranks the best level-2 chunks up to rerankFactor x K tokens by their estimated share
//    of dense attention mass, summed over the GQA group: exact q·k of their tokens, each query head
//    normalised over the scored tokens plus sinks and tail. A chunk mean averages a single strong
//    key away; the exact scores do not (this is what finds needles and closes most of the gap to
//    the token oracle). When rerankFactor x K covers every candidate (the defaults on the demo
//    workload), level 2 is skipped. Level 3 reads each key row once for the whole group; with a
//    token-major ('thd') cache its rows are 256 B scattered 2 KiB apart, and this gather dominates
//    the select (memory-bound; a head-major 'htd' cache reads a chunk's rows contiguously).
//  - shadowkv, as its paper selects (minus the low-rank pre-RoPE key compression): chunk means
//    (c = 8) as landmarks, every landmark scored, best chunks up to K tokens; plus its static
//    outlier chunks (outlierChunks, 48 in the paper's configuration), those whose keys have the
//    lowest cosine similarity to their landmark, selected first within the K tokens (at most a
//    quarter of them, so small budgets keep landmark-ranked chunks).
//  - quest: pages (c = 16) with per-channel min / max, upper-bound score, best pages up to K.
// Ranking ties break towards the lower chunk id (clusters: the lower index over the head's segments),
// so selections are deterministic.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/aligned.h"
#include "index/index.h"
#include "index/key_sketch.h"

namespace kvd {

struct SelectScratch;  // per-thread scratch of Select (layer_index.cc)

enum class PolicyKind : int { Kvdrive = 0, Quest = 1, ShadowKV = 2 };

struct IndexConfig {
  PolicyKind policy = PolicyKind::Kvdrive;
  int chunk = 4;
  int tokensPerCluster = 16;
  int64_t segmentTokens = 4096;  // multiple of chunk
  int sinks = 4;
  int local = 64;
  int kmeansIters = 8;
  // k-means++ draws per centre for segment clustering. Greedy seeding with 2 + ln k draws (what the
  // kmeans() binding uses) costs ~7 Lloyd iterations at k = 256; 2 draws keep the build linear and
  // cheap while avoiding most of plain k-means++'s bad seeds.
  int kmeansTrials = 2;
  uint64_t seed = 0;
  double candidateFactor = 8.0;  // src/index/options.ts default (tuned there)
  // kvdrive: with a prior selection (SetPrior: the sequence's selection at the previous decode
  // step), clusters are taken until reuseCandidateFactor x K tokens instead, and the prior's tokens
  // join the candidates. Consecutive steps' best tokens overlap by ~3/4 (a query moves by a third of
  // its norm per step on the synthetic trace), so the prior carries most of this step's selection
  // and fewer clusters need re-ranking. 0: a prior is ignored.
  double reuseCandidateFactor = 0.0;
  // kvdrive: how the candidate and re-rank counts grow with the budget K. The three factors
  // (candidateFactor, reuseCandidateFactor, rerankFactor) hold where K is kFactorShare of the
  // context T (2048 of 128K, where they were tuned); at budget K each is multiplied by
  // (K / (kFactorShare T))^(candidateExponent - 1), so the candidates grow as K^candidateExponent.
  // 1: proportional to K. Below 1 a large budget's extra tokens are the low-mass tail, which fewer
  // candidates per selected token still find, and a small budget, where each missed token weighs
  // more, gets more candidates per token.
  double candidateExponent = 0.35;  // src/index/options.ts default (tuned there)
  static constexpr double kFactorShare = 1.0 / 64;
  // A factor as it applies at budget K over a context of T tokens (see candidateExponent). For e in
  // [0, 1] (checked at construction), FactorAt(f, K, T) x K <= f x max(K, T / 64): the token counts
  // made from it stay as far inside size_t as f x K did before.
  double FactorAt(double factor, int64_t budget, int64_t tokens) const {
    if (candidateExponent == 1.0) return factor;
    return factor * std::pow(double(budget) / (kFactorShare * double(std::max<int64_t>(tokens, 1))), candidateExponent - 1.0);
  }
  // kvdrive: weight of the variance term in centroid and chunk scores (0: plain q·mean). A chunk's
  // attention mass is sum_t exp(s q·k_t) ~ exp(s q·mean + s²/2 q^T Σ q) (second-order cumulant);
  // with an isotropic Σ = var·I the score in q·k units is q·mean + w (s/2) |q|² var, s = 1/sqrt(dim).
  // It lifts chunks and clusters whose few strong keys the mean averages away. w = 1 is the Gaussian
  // estimate; keys aligned with q are heavier-tailed than that, and 3 (src/index/options.ts default)
  // met the recall target on the synthetic needle cases.
  double varianceWeight = 3.0;
  // kvdrive, when select() is given the layer's keys: the best level-2 chunks up to
  // rerankFactor x K tokens are re-ranked by their exact attention mass (level 3, see Select).
  // 0 disables the re-rank. When it covers every level-2 candidate, level 2 is skipped.
  double rerankFactor = 10.0;
  // kvdrive level 1: weight b of the cluster radius term, score += b * |q| * radius (0: off). The
  // variance is an average over a cluster's tokens, so one strong key (a needle) among 16 barely
  // moves it; the radius is a max and does not dilute (Cauchy-Schwarz: q·k <= q·c + |q| r).
  double radiusWeight = 0.1;
  // kvdrive: share of each segment's chunks, those with the highest key variance, that join the
  // level-2 candidates whatever their cluster scores (0: none).
  double outlierFraction = 0.015;  // src/index/options.ts default (tuned there)
  // With the re-rank: select single tokens (the selection's chunkSize is 1) rather than whole chunks,
  // the best tokens of the re-ranked chunks first.
  bool tokenGranular = true;
  // kvdrive: keep a key sketch per kv head (key_sketch.h: int8, dim + 4 bytes per token, or 4-bit,
  // ceil(dim / 2) + 4), built at Build / Extend, so the level-3 re-rank runs when Select is given
  // no keys.
  bool keySketch = false;
  int sketchBits = 8;  // 8 or 4
  // kvdrive: once a segment is full and clustered, drop its chunk means and per-chunk variances
  // (dim x 4 + 4 bytes per chunk and kv head, the bulk of the index without a sketch): only the
  // open segment keeps them (online adds, its k-means when it fills). Level 2 then cannot run, so
  // level 3 re-ranks every candidate (RerankChunks is unbounded); this needs keySketch (keyless
  // selects) and rerankFactor > 0, checked at construction.
  bool releaseChunkMeans = false;
  // kvdrive: re-rank with the sketch even when Select is given the keys (contiguous, half the
  // bytes of f16 keys; scores approximate).
  bool preferSketch = false;
  // shadowkv: static outlier chunks selected first (the paper's configuration: 48).
  int outlierChunks = 48;
  // kvdrive Extend: a segment that fills keeps the clusters it grew online, and its k-means runs on
  // the background thread (common/background.h) instead of inside that decode step; the result
  // replaces the online clusters at the first Extend reaching fill + reclusterDelay tokens (waiting
  // for it there if it is not done), so selections depend on the token count only, never on timing.
  // 0: the k-means runs inside the Extend that fills (as Build does for every full segment).
  int64_t reclusterDelay = 256;
  int threads = 2;  // build and select split kv heads over this many pool workers
};

// The clusters of one segment of one kv head. Member lists hold absolute chunk ids.
struct Segment {
  int64_t c0 = 0, c1 = 0;  // chunks held now, [c0, c1)
  int64_t cEnd = 0;        // where the segment ends once full
  bool clusteredFull = false;  // k-means ran over the whole, full segment
  int k = 0;
  std::vector<float> centroids;   // k x dim row-major while the segment can grow; released once full
  LineVector<uint8_t> tiles;      // the centroids as 4-bit tiles (TileBytes4(k, dim) bytes, index.h),
                                  // what level 1 scores: dim4 / 2 + 4 bytes per centroid with its
                                  // scale; line-aligned, so each 64-byte block is one cache line
  std::vector<float> tileScales;  // TileScalesI8(k): per-centroid scale of the tiles
  std::vector<double> sums;       // k x dim member sums (running means for chunks added online);
                                  // released once the segment is full
  std::vector<int32_t> counts;    // k; tiles, tileScales, var, radius, counts and runs are released once
                                  // the segment is full and clustered (HeadIndex::clusters holds them)
  std::vector<int32_t> assign;    // (c1 - c0): cluster of chunk c0 + i
  std::vector<int32_t> offsets;   // k + 1 CSR offsets
  std::vector<int32_t> members;   // (c1 - c0) chunk ids grouped by cluster, ascending inside one
  std::vector<double> sumSq;      // k: sum over member chunks of mean_t |k_t|² (= dim*var + |mean|²);
                                  // released once the segment is full
  std::vector<float> var;         // k: per-dimension variance of the member tokens around the centroid
  std::vector<int32_t> outliers;  // chunks with the highest key variance (outlierFraction): their chunk
                                  // ids, or with slotOrder their slots; ascending
  // The head's key sketch holds this (full) segment's rows in slot order: slot c0 + p is the chunk
  // slotChunks[p]. Cluster c's chunks other than outliers are slots [c0 + runs[c], c0 + runs[c + 1])
  // and the outlier chunks (candidates at every select) the last run [c0 + runs[k], c1), ascending
  // by chunk id inside each run; chunkSlots[j - c0] is chunk j's slot. The keyless re-rank then
  // reads the chosen clusters' rows and the segment's outliers as a few long runs, not one
  // scattered run per chunk. Set for full segments of an index with keySketch; otherwise slots are
  // chunk ids (and the three arrays empty).
  std::vector<int32_t> slotChunks, chunkSlots, runs;
  bool slotOrder = false;
  std::vector<float> radius;      // k: bound on the distance of any member token from the centroid
                                  // (max over member chunks of |mean - centroid| + chunk spread);
                                  // for an open segment, measured against the centroid at insertion
  double inertia = 0;             // of the last k-means run
};

// Chunk means and per-chunk variances of one segment's chunks: row i is chunk seg.c0 + i (what the
// k-means reads; for a background re-clustering, rows the owning index keeps in place until it
// installs the result).
struct SegmentRows {
  const float* means = nullptr;  // (c1 - c0) x dim
  const float* var = nullptr;    // (c1 - c0)
};

// kvdrive: the per-cluster fields every select reads, for all of a head's segments back to back
// (cluster id = base[s] + c, the ids level 1 ranks by). Written by LayerIndex::RefreshClusters after
// every change to a segment: copies of an open segment's fields, and a full, clustered segment's
// own (it releases them), so that level 1 and the candidate marking each stream one array instead
// of reading six small arrays per segment: a segment's tiles / var / radius / counts / runs are
// separate heap blocks, cold after the previous layer's step, and their misses were about half of
// the select's own bookkeeping time (perf, 128K: 32 segments).
struct ClusterTable {
  std::vector<int32_t> base{0};       // segments + 1: the first cluster id of each segment, then the total
  std::vector<float> var, radius;     // Segment::var / Segment::radius
  std::vector<int32_t> tokens;        // tokens of the cluster's chunks (the first indexed chunk's sinks
                                      // left out); 0 for an empty cluster
  std::vector<int32_t> runBegin, runEnd;  // slot-ordered segments: the cluster's slots other than
                                          // outliers, [runBegin, runEnd) (absolute); else 0, 0
  // Segment::tiles / tileScales back to back: segment s's from tile tileAt[s] (16 clusters per
  // tile, a segment's last tile padded), so consecutive segments of whole tiles are one tile array
  // that level 1 scores in one call (the 128K demo's 32 full segments: one 557 KB stream per head).
  std::vector<int32_t> tileAt{0};  // segments + 1
  LineVector<uint8_t> tiles;
  std::vector<float> tileScales;
  // Segment s's tiles (head dimension `dim`) and their scales; consecutive segments of whole tiles
  // run on from there.
  const uint8_t* TilesOf(size_t s, int dim) const { return tiles.data() + size_t(tileAt[s]) * TileBytes4(16, dim); }
  const float* ScalesOf(size_t s) const { return tileScales.data() + size_t(tileAt[s]) * 16; }
  int64_t Bytes() const {
    return int64_t(base.size() + var.size() + radius.size() + tokens.size() + runBegin.size() + runEnd.size() + tileAt.size() +
                   tileScales.size()) * 4 + int64_t(tiles.size());
  }
};

struct HeadIndex {
  // reps / var / maxs / minCos hold chunks [repsFirst, endChunk): repsFirst = firstChunk, except for
  // kvdrive with releaseChunkMeans, where it is the first chunk of the open segment.
  int64_t repsFirst = 0;
  std::vector<float> reps;  // (endChunk - repsFirst) x dim: chunk means, or page minima for quest
  std::vector<float> maxs;  // quest page maxima, same shape
  std::vector<float> var;   // kvdrive: per-chunk key variance (see IndexConfig::varianceWeight)
  std::vector<float> minCos;  // shadowkv: per chunk, the lowest cosine similarity of a key to the chunk mean
  std::vector<Segment> segments;  // kvdrive only, ascending
  KeySketch sketch;               // kvdrive with keySketch: every token [0, tokens) of the head
  ClusterTable clusters;          // kvdrive: segments' per-cluster fields, back to back (see above)
};

// One ranked chunk of a select: higher score first, then lower chunk id.
struct Ranked {
  float score;
  int32_t id;
};

struct SelectResult {
  int chunk = 0;                                  // tokens per id: cfg.chunk, or 1 (token-granular re-rank)
  std::vector<int32_t> offsets, ids;              // per head, ascending ids
  std::vector<int32_t> poolOffsets, poolIds;      // per head, best first (when pool > 0)
  std::vector<float> poolScores;
  int64_t vectorsScored = 0;  // index vectors + key rows
  int64_t keysScored = 0;     // key rows read by the level-3 re-rank
  int64_t bytesScored = 0;
};

class LayerIndex {
 public:
  explicit LayerIndex(const IndexConfig& cfg) : cfg_(cfg) {}
  // A background re-clustering not started yet is dropped, a running one waited for (it reads this
  // index's chunk means).
  ~LayerIndex();
  LayerIndex(const LayerIndex&) = delete;
  LayerIndex& operator=(const LayerIndex&) = delete;

  // Indexes tokens [0, tokens) of kv from scratch (replaces any previous state). Thread-safe with
  // respect to other LayerIndex objects; runs kv heads on cfg.threads threads.
  void Build(const KvView& kv, int64_t tokens);
  // Seals the chunks that left the local window since the last Build/Extend (tokens must not shrink).
  // kv holds tokens [first, first + kv.tokens) (first = 0: the whole context); only the newly sealed
  // chunks' rows are read, so a caller that offloads older tokens passes just its in-memory tail
  // (first <= the first token of the first chunk not sealed yet).
  void Extend(const KvView& kv, int64_t tokens, int64_t first = 0);
  // Selection for one decode position: q is qHeads x dim (qHeads a multiple of heads), budget K >= 1
  // tokens per kv head, pool M >= K tokens (0: no pool).
  // keys (optional): the layer's keys holding at least tokens() tokens, same heads and dim as at
  // build, for kvdrive's exact level-3 re-rank.
  // [headBegin, headEnd): the kv heads to select (default all; headEnd < 0 = heads()); q still
  // holds every head. Heads select independently, so the results of consecutive ranges
  // concatenated equal one whole select (the caller streams a step head group by head group).
  SelectResult Select(const float* q, int qHeads, int64_t budget, int64_t pool, const KvView* keys = nullptr, int headBegin = 0,
                      int headEnd = -1) const;
  // Select as its parts, for callers that schedule the kv heads themselves (attendFetched's
  // `select`: a head's attention starts as soon as its own selection is made): SelectHead makes kv
  // head h's selection (the arguments as Select's, q holding every head; distinct heads may run
  // concurrently, each on its thread's scratch), JoinHeads concatenates heads' selections in order
  // as Select returns them.
  struct HeadSelection {
    SelectResult r;
    int64_t tileVectors = 0;  // centroids (4-bit tiles + scale); every other index vector is f32
  };
  void SelectHead(const float* q, int qHeads, int64_t budget, int64_t pool, const KvView* keys, int h, HeadSelection& part) const;
  SelectResult JoinHeads(std::vector<HeadSelection>& parts, int64_t pool) const;
  // The prior selection later Selects add to their candidates (IndexConfig::reuseCandidateFactor):
  // per kv head h the ids offsets[h]..offsets[h + 1] of `ids` (heads_ + 1 offsets, ids ascending,
  // validated by the caller), each covering tokens [id x idTokens, (id + 1) x idTokens). Kept as
  // token ids per kv head; replaces any prior. Build clears it.
  void SetPrior(const int32_t* offsets, const int32_t* ids, int64_t idTokens);
  void ClearPrior() { prior_.clear(); }

  const IndexConfig& config() const { return cfg_; }
  bool built() const { return built_; }
  int heads() const { return heads_; }
  int dim() const { return dim_; }
  int64_t tokens() const { return tokens_; }
  int64_t sinkEnd() const { return tokens_ < cfg_.sinks ? tokens_ : cfg_.sinks; }
  int64_t tailStart() const;
  int64_t firstChunk() const { return cfg_.sinks / cfg_.chunk; }
  int64_t endChunk() const { return endChunk_; }
  // Row of token t (< tokens()) in head h's key sketch (slot order inside full segments).
  int64_t SketchRow(int h, int64_t t) const;
  const HeadIndex& head(int h) const { return heads_data_[h]; }
  // Row-major k x dim centroids of a segment (dequantized from the 4-bit tiles once the row-major
  // copy is released).
  std::vector<float> SegmentCentroids(const HeadIndex& H, size_t s) const;
  // Bytes held by the index: representatives, centroids, running sums, membership lists, sketch,
  // a pending re-clustering's result and the containers themselves.
  int64_t Bytes() const;
  // The most a pending re-clustering (reclusterDelay) adds for `heads` kv heads of dimension `dim`:
  // its result (one full segment's clusters), the chunk-mean rows sealed while it is pending and
  // the per-cluster fields the filled segment keeps until then.
  int64_t ReclusterReserveBytes(int heads, int dim) const;
  // One kv head's re-clustering result at its largest (a full segment's clusters).
  int64_t ReclusterResultBytes(int dim) const;

 private:
  int64_t SealedEnd(int64_t tokens) const;  // endChunk for a context of `tokens`
  int64_t ChunkTokens(int64_t j) const;     // tokens of chunk j that are not sinks
  void ComputeReps(const KvView& kv, int h, int64_t c0, int64_t c1, int64_t first = 0);
  // Row of chunk j in head h's reps (j >= repsFirst) and its variance.
  const float* Rep(const HeadIndex& H, int64_t j) const { return H.reps.data() + size_t(j - H.repsFirst) * dim_; }
  float ChunkVar(const HeadIndex& H, int64_t j) const { return H.var[size_t(j - H.repsFirst)]; }
  // releaseChunkMeans: drops head h's chunk means and variances of chunks before `upTo` (a full,
  // clustered segment's end).
  void ReleaseChunkMeans(HeadIndex& H, int64_t upTo) const;
  // Chunk-mean rows each head keeps in place: one segment's, plus those sealed while a
  // re-clustering is pending (the rows it reads must not move).
  size_t RowsRoom() const;
  SegmentRows RowsOf(const HeadIndex& H, const Segment& seg) const;
  // k-means over the segment's chunks [c0, c1) read from `rows` (h seeds it); reads nothing else
  // of the index, so it can run on the background thread.
  void ClusterSegment(const SegmentRows& rows, int h, Segment& seg) const;
  // Adds chunk j to the open segment; returns true when that filled it. A segment that fills is
  // re-clustered here unless `defer` (then the caller starts the background re-clustering).
  bool AddChunkOnline(int h, Segment& seg, int64_t j, bool defer) const;
  void ReserveOpen(Segment& seg) const;  // capacity for an open segment to fill without reallocating
  void ClusterVariance(Segment& seg, int c) const;
  void PickOutliers(const SegmentRows& rows, Segment& seg) const;
  float MemberRadius(const SegmentRows& rows, const Segment& seg, int64_t j, const float* c) const;
  // Background re-clustering (IndexConfig::reclusterDelay): started when an Extend fills exactly one
  // segment, installed by a later Extend (or waited for and dropped by Build / the destructor).
  struct PendingRecluster;
  void StartRecluster(const std::vector<size_t>& segAt, int64_t installAt);
  void InstallRecluster();
  void DropRecluster();
  void CheckKv(const KvView& kv, int64_t tokens, const char* what) const;
  void ForEachHead(const std::function<void(int)>& fn) const;
  // Chunks level 3 re-ranks: ceil(rerankFactor x K / chunk), at least one.
  size_t RerankChunks(int64_t budget) const;
  // Level 3 of kvdrive select for one kv head (see the header comment); ranked is level 2's output,
  // ids as slots (Segment::slotOrder); on return its ids are chunk ids (token ids with
  // tokenGranular).
  // want: max(budget, pool) tokens the caller will fill.
  // Scores with keys when given (and not cfg.preferSketch), else with the head's sketch.
  // allMarked: ranked holds every candidate and its ids are already set in sc.bits (over slots).
  // markBest (token-granular, no pool): when the re-ranked tokens alone fill the selection, the
  // best min(budget, re-ranked) of them are marked in sc.bits over tokens instead (ranked left
  // empty); returns whether it did.
  bool RerankExact(const float* qh, int g, int h, const KvView* keys, int64_t budget, int64_t want,
                   std::vector<Ranked>& ranked, bool allMarked, bool markBest, const std::vector<int32_t>* prior,
                   SelectResult& out, SelectScratch& sc) const;
  // Brings head h's sketch to `tokens` rows (re-calibrating the channel scales while the context
  // is short, see Extend).
  void UpdateSketch(const KvView& kv, int h, int64_t tokens, int64_t first = 0);
  // Slots (see Segment::slotOrder): the segment holding chunk j (null outside every segment), the
  // slot of chunk j and the chunk of slot s (identities outside slot-ordered segments).
  const Segment* SegmentOf(const HeadIndex& H, int64_t j) const;
  int64_t SlotOf(const HeadIndex& H, int64_t j) const;
  int64_t ChunkOfSlot(const HeadIndex& H, int64_t s) const;
  // Puts a full segment's sketch rows, now in token order, into slot order; the first time also
  // turns its outlier chunk ids into slots and sets slotOrder.
  void OrderSketchRows(HeadIndex& H, Segment& seg) const;
  // Rewrites H.clusters from segment `from` on (the earlier segments' entries are kept): called
  // wherever segments change (Build, Extend, InstallRecluster), for the first segment changed.
  void RefreshClusters(HeadIndex& H, size_t from) const;
  // Capacity in H.clusters for `segments` segments of ClustersPerSegment() clusters.
  void ReserveClusters(HeadIndex& H, size_t segments) const;
  int64_t ClustersPerSegment() const;  // clusters of a full segment

  IndexConfig cfg_;
  bool built_ = false;
  int heads_ = 0, dim_ = 0;
  int64_t tokens_ = 0;
  int64_t endChunk_ = 0;
  std::vector<HeadIndex> heads_data_;
  // SetPrior: per kv head, ascending distinct token ids (no vectors: no prior).
  std::vector<std::vector<int32_t>> prior_;
  // SetPrior's rewrite of prior_ in place (SetPrior drops the prior if this throws).
  void RewritePrior(const int32_t* offsets, const int32_t* ids, int64_t idTokens);
  std::shared_ptr<PendingRecluster> pending_;
};

}  // namespace kvd
