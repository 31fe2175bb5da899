// The scalar end of GroupShares' first pass (index.h), shared by the generic body
// (index_kernels.cc) and the AVX2 one (index_kernels_avx2.cc), so both finish a row the same way.
// No target attribute: it inlines into either.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvd {

// Folds logits [full, n) of a row into its max `m` (`x > m ? x : m`, as the vector pass) and into
// `nanSum`, the vector pass's sum of x * 0 (0 while every logit is finite, NaN otherwise: x * 0 is
// NaN exactly for NaN and +-Inf). Returns the index of the row's first non-finite logit, or -1.
inline int64_t FinishRowMax(const float* l, size_t full, size_t n, float& m, float nanSum) {
  for (size_t i = full; i < n; ++i) {
    nanSum += l[i] * 0.f;
    m = l[i] > m ? l[i] : m;
  }
  if (!(nanSum == 0.f))
    for (size_t i = 0; i < n; ++i)
      if (!(l[i] * 0.f == 0.f)) return int64_t(i);
  return -1;
}

}  // namespace kvd
