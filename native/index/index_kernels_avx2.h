// AVX2 bodies of index kernels whose generic 16-lane form (index_kernels.cc) GCC compiles poorly
// for 256-bit vectors: it lowers the 64-byte vector compares, conversions and pointer arrays of
// those bodies lane by lane through the stack (and the int8 centroid scoring, whose per-tile dots
// went through memory into such an epilogue). Each function here performs exactly the operations
// of its generic body, lane for lane and in the same order (16 lanes held as two __m256 halves:
// lanes 0-7 and 8-15; multiply and add fused only where the generic body fuses them), so every
// level still gives the same bits. Only index_kernels.cc's AVX2 dispatch may call them (they carry
// the avx2 target attribute).
#pragma once
#include <cstddef>
#include <cstdint>

#include "index/index.h"

namespace kvd {
namespace avx2 {

// GroupShares (index.h).
int64_t GroupShares(float* logits, int group, size_t n, size_t ld, size_t nShare, float scale, float* share);
// DotFixed / RowNormsFixed (index.h): the 16-lane dot in DotBody's order.
float Dot(const float* a, const float* b, int dim);
void RowNorms(const float* x, size_t n, int dim, float* out);
// DotsFixed (index.h): out[i] = the 16-lane dot of row i of x with c, DotBody's order.
void DotsMany(const float* x, size_t n, int dim, const float* c, float* out);
// NearestCentroids over tiled centroids (index_kernels.cc's NearestBody).
void Nearest(const float* x, const float* xnorm, size_t n, const float* ct, const float* cnorm, size_t k, int dim,
             int32_t* best, float* dist);
// ScoreRowsMax / ScoreRowsMaxGather (index.h; ids null: rows in order).
void ScoreRowsMax(const float* q, int group, const float* rows, const int32_t* ids, size_t n, int dim, float* out,
                  const float* var, const float* coef);
// ScoreMinMaxMax (index.h).
void ScoreMinMax(const float* q, int group, const float* mn, const float* mx, size_t n, int dim, float* out);
// ScoreKeyRows (index.h): fused multiply-adds, as every level of it.
void ScoreKeyRows(const float* q, int group, const KvView& keys, int h, const int32_t* tokens, size_t n, float* out,
                  size_t ld);
// ScoreTilesMaxI8 (index.h): the int8 tile dots and ScoreTilesI8's f32 epilogue, fused.
void ScoreTilesI8(const QueryI8& qq, const int8_t* ct, const float* scales, size_t k, float* out, const float* var,
                  const float* coef);
// The same for tiles whose bytes are all in [-63, 63] (ScoreTilesMaxI8's TileCodes::kSevenBit): same scores.
void ScoreTilesI8Codes7(const QueryI8& qq, const int8_t* ct, const float* scales, size_t k, float* out, const float* var,
                        const float* coef);
// ScoreTilesI8Codes7 that also checks every byte as it reads it: false (out not valid) if one lies
// outside [-63, 63].
bool ScoreTilesI8Codes7Checked(const QueryI8& qq, const int8_t* ct, const float* scales, size_t k, float* out,
                               const float* var, const float* coef);

// ScoreTilesMax4 over 4-bit tiles (index.h, TileBytes4).
void ScoreTiles4(const QueryI8& qq, const uint8_t* ct, const float* scales, size_t k, float* out, const float* var,
                 const float* coef);
}  // namespace avx2
}  // namespace kvd
