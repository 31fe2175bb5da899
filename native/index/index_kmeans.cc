// Seeded, deterministic k-means over f32 points (chunk means): k-means++ seeding, blocked Lloyd
// iterations, empty-cluster repair and CSR membership lists.
//
// Determinism: the random stream is splitmix64 (no <random> distributions, whose output differs
// between standard libraries); sums over points run in ascending point order in double; distance
// kernels are bit-identical at every SIMD level (index_kernels.cc). Same seed + data -> same result.
#include <algorithm>
#include <cmath>
#include <string>

#include "index/index.h"

namespace kvd {
namespace {

struct SplitMix64 {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return double(Next() >> 11) * (1.0 / 9007199254740992.0); }
};

// Greedy k-means++: the first centre uniformly; each next one is the best (lowest resulting
// potential, ties to the earlier draw) of `trials` points drawn with probability proportional to
// the squared distance to the nearest centre chosen so far.
void SeedPlusPlus(const float* x, const float* xnorm, size_t n, int dim, int k, int trials, SplitMix64& rng,
                  float* centers) {
  std::vector<float> minD(n), cand(size_t(trials) * n);
  std::vector<double> cum(n);
  auto distTo = [&](const float* c, float* out) {
    const float cn = DotFixed(c, c, dim);
    DotsFixed(x, n, dim, c, out);
    for (size_t i = 0; i < n; ++i) {
      float d = xnorm[i] + cn - 2.f * out[i];
      out[i] = d > 0.f ? d : 0.f;
    }
  };
  size_t first = size_t(rng.Uniform() * double(n));
  if (first >= n) first = n - 1;
  std::copy(x + first * dim, x + (first + 1) * dim, centers);
  distTo(centers, minD.data());
  for (int m = 1; m < k; ++m) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) cum[i] = (total += minD[i]);
    double bestPot = 0;
    size_t bestPick = 0;
    int bestTrial = -1;
    for (int t = 0; t < trials; ++t) {
      size_t pick;
      if (total > 0) {
        // First point whose cumulative weight exceeds r (a zero-weight point is never picked).
        const double r = rng.Uniform() * total;
        pick = size_t(std::upper_bound(cum.begin(), cum.end(), r) - cum.begin());
        if (pick >= n) pick = n - 1;
        while (minD[pick] <= 0.f && pick > 0) --pick;
      } else {
        // Every point coincides with a chosen centre (duplicates): any point is as good.
        pick = size_t(rng.Uniform() * double(n));
        if (pick >= n) pick = n - 1;
      }
      float* dc = cand.data() + size_t(t) * n;
      distTo(x + pick * dim, dc);
      double pot = 0;
      for (size_t i = 0; i < n; ++i) pot += dc[i] < minD[i] ? dc[i] : minD[i];
      if (bestTrial < 0 || pot < bestPot) bestPot = pot, bestPick = pick, bestTrial = t;
    }
    std::copy(x + bestPick * dim, x + (bestPick + 1) * dim, centers + size_t(m) * dim);
    const float* dc = cand.data() + size_t(bestTrial) * n;
    for (size_t i = 0; i < n; ++i)
      if (dc[i] < minD[i]) minD[i] = dc[i];
  }
}

}  // namespace

KMeansResult KMeans(const float* x, size_t n, int dim, const KMeansOptions& opt) {
  if (opt.k < 1 || size_t(opt.k) > n)
    Throw("E_RANGE", "kmeans k: expected an integer in [1, " + std::to_string(n) + "] (at most the number of points), got " +
                         std::to_string(opt.k));
  if (opt.maxIters < 0) Throw("E_RANGE", "kmeans iterations: expected >= 0, got " + std::to_string(opt.maxIters));
  const size_t k = size_t(opt.k);
  KMeansResult res;
  res.centroids.assign(k * dim, 0.f);
  res.assignments.assign(n, -1);
  std::vector<float> xnorm(n), cnorm(k), dist(n);
  std::vector<int32_t> best(n), counts(k);
  std::vector<double> sums(k * dim);
  RowNormsFixed(x, n, dim, xnorm.data());

  SplitMix64 rng{opt.seed};
  const int trials = opt.trials > 0 ? opt.trials : 2 + int(std::log(double(k)));
  SeedPlusPlus(x, xnorm.data(), n, dim, int(k), trials, rng, res.centroids.data());
  float* C = res.centroids.data();
  for (size_t j = 0; j < k; ++j) cnorm[j] = DotFixed(C + j * dim, C + j * dim, dim);

  bool assignedToCurrent = false;  // do res.assignments / dist belong to the current centroids?
  for (int it = 0; it < opt.maxIters; ++it) {
    NearestCentroids(x, xnorm.data(), n, C, cnorm.data(), k, dim, best.data(), dist.data());
    size_t changed = 0;
    for (size_t i = 0; i < n; ++i) changed += best[i] != res.assignments[i];
    res.assignments.swap(best);
    assignedToCurrent = true;
    if (changed == 0) break;  // converged: the centroids are already the means of these members

    // Empty clusters take the point farthest from its centroid among clusters with >1 member.
    std::fill(counts.begin(), counts.end(), 0);
    for (size_t i = 0; i < n; ++i) ++counts[res.assignments[i]];
    for (size_t j = 0; j < k; ++j) {
      if (counts[j] > 0) continue;
      size_t far = n;
      for (size_t i = 0; i < n; ++i)
        if (counts[res.assignments[i]] > 1 && (far == n || dist[i] > dist[far])) far = i;
      --counts[res.assignments[far]];
      res.assignments[far] = int32_t(j);
      counts[j] = 1;
      dist[far] = 0.f;
    }
    // Means, summed in ascending point order in double.
    std::fill(sums.begin(), sums.end(), 0.0);
    for (size_t i = 0; i < n; ++i) {
      double* s = sums.data() + size_t(res.assignments[i]) * dim;
      const float* p = x + i * dim;
      for (int d = 0; d < dim; ++d) s[d] += p[d];
    }
    for (size_t j = 0; j < k; ++j) {
      for (int d = 0; d < dim; ++d) C[j * dim + d] = float(sums[j * dim + d] / counts[j]);
      cnorm[j] = DotFixed(C + j * dim, C + j * dim, dim);
    }
    assignedToCurrent = false;
    res.iterations = it + 1;
  }
  if (!assignedToCurrent) {
    NearestCentroids(x, xnorm.data(), n, C, cnorm.data(), k, dim, res.assignments.data(), dist.data());
  }
  res.inertia = 0;
  for (size_t i = 0; i < n; ++i) res.inertia += dist[i];

  // CSR membership: counting sort keeps point ids ascending within each cluster.
  res.offsets.assign(k + 1, 0);
  for (size_t i = 0; i < n; ++i) ++res.offsets[res.assignments[i] + 1];
  for (size_t j = 0; j < k; ++j) res.offsets[j + 1] += res.offsets[j];
  res.members.assign(n, 0);
  std::vector<int32_t> fill(res.offsets.begin(), res.offsets.end() - 1);
  for (size_t i = 0; i < n; ++i) res.members[fill[res.assignments[i]]++] = int32_t(i);
  return res;
}

}  // namespace kvd
