// Bindings of the centroid index: chunkMeans, kmeans, scoreCentroids, indexKernelLevel, the
// SelectionIndex class (one layer's index for one policy; build runs in a PromiseWorker) and
// selectIndex(handle, ...), the same select reached by handle from any worker thread.
//
// Threading invariant: a SelectionIndex's LayerIndex lives in a SharedIndex that is also reachable
// through a process-global handle registry (SelectionIndex.handle()), so a pipeline stage worker
// can select on it while the owning (main) thread keeps mutating it. Every mutation (build's swap,
// buildSync, extend) holds the SharedIndex's lock exclusively; select and every inspection hold it
// shared. A select on a worker therefore sees the index either before or after a mutation, never in
// between. A build() in progress (busy) refuses every other call from any thread.
//
// Every input is validated here, on the JS thread, with typed errors naming what was expected and
// what was given; the kernels behind (index_*.cc, layer_index.cc) assume valid input.
#include <napi.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "common/args.h"
#include "common/async_work.h"
#include "common/errors.h"
#include "common/handles.h"
#include "index/headwise_select.h"
#include "index/index.h"
#include "index/layer_index.h"
#include "common/registry.h"

namespace kvd {
namespace {

const char* LevelName(SimdLevel l) {
  return l == SimdLevel::Avx512 ? "avx512" : l == SimdLevel::Avx2 ? "avx2" : "scalar";
}

void CheckFinite(const float* p, size_t n, const std::string& what) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i]))
      Throw("E_NONFINITE", what + ": expected finite values, got " + (std::isnan(p[i]) ? "NaN" : "Inf") +
                               " at element " + std::to_string(i));
}

int64_t ArgInt(const Napi::CallbackInfo& info, size_t i, const std::string& what, int64_t min, int64_t max,
               const char* code = "E_RANGE") {
  Napi::Value v = info[i];
  if (!v.IsNumber()) Throw("E_TYPE", what + ": expected an integer, got " + (v.IsUndefined() ? "undefined" : "a non-number"));
  double d = v.As<Napi::Number>().DoubleValue();
  if (!std::isfinite(d) || d != std::floor(d) || d < double(min) || d > double(max))
    Throw(code, what + ": expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " + Num(d));
  return int64_t(d);
}

Napi::Object OptionsArg(const Napi::CallbackInfo& info, size_t i, const std::string& what) {
  if (info.Length() <= i || info[i].IsUndefined()) return Napi::Object::New(info.Env());
  return GetOptionsArg(info, i, what);
}

// chunkMeans(k, { start, end, chunkSize = 4, head? }) -> Float32Array [heads or 1][chunks][dim]:
// the mean key of each chunkSize consecutive tokens of [start, end) ((end - start) % chunkSize == 0).
Napi::Value ChunkMeansJs(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    KvView kv = GetKvView(info[0], "chunkMeans k");
    Napi::Object o = OptionsArg(info, 1, "chunkMeans options");
    const int64_t chunk = GetIntOr(o, "chunkSize", "chunkMeans options", 1, 1 << 20, 4);
    const int64_t start = GetIntOr(o, "start", "chunkMeans options", 0, kv.tokens, 0);
    const int64_t end = GetIntOr(o, "end", "chunkMeans options", start, kv.tokens, kv.tokens);
    if ((end - start) % chunk != 0)
      Throw("E_SHAPE", "chunkMeans range [" + std::to_string(start) + ", " + std::to_string(end) +
                           "): expected a length that is a multiple of chunkSize " + std::to_string(chunk) + ", got " +
                           std::to_string(end - start));
    int h0 = 0, h1 = kv.heads;
    if (!o.Get("head").IsUndefined()) {
      h0 = int(GetInt(o, "head", "chunkMeans options", 0, kv.heads - 1));
      h1 = h0 + 1;
    }
    const int64_t n = (end - start) / chunk;
    auto out = Napi::Float32Array::New(info.Env(), size_t(h1 - h0) * n * kv.dim);
    for (int h = h0; h < h1; ++h) ChunkMeans(kv, h, int(chunk), start, start, 0, n, out.Data() + size_t(h - h0) * n * kv.dim);
    return out;
  });
}

// kmeans(points, dim, { k, iters = 10, seed = 0, trials = 0 (2 + ln k) }) -> { centroids, assignments, offsets, members,
// inertia, iterations }.
Napi::Value KMeansJs(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto pts = GetF32(info[0], "kmeans points");
    const int dim = int(ArgInt(info, 1, "kmeans dim", 1, 65536));
    if (pts.length % dim != 0 || pts.length == 0)
      Throw("E_SHAPE", "kmeans points: expected a non-empty multiple of dim " + std::to_string(dim) + " elements, got " +
                           std::to_string(pts.length));
    CheckFinite(pts.data, pts.length, "kmeans points");
    const size_t n = pts.length / dim;
    Napi::Object o = OptionsArg(info, 2, "kmeans options");
    KMeansOptions ko;
    ko.k = int(GetInt(o, "k", "kmeans options", 1, int64_t(n)));
    ko.maxIters = int(GetIntOr(o, "iters", "kmeans options", 0, 100000, 10));
    ko.seed = uint64_t(GetIntOr(o, "seed", "kmeans options", 0, (int64_t(1) << 53) - 1, 0));
    ko.trials = int(GetIntOr(o, "trials", "kmeans options", 0, 1000, 0));
    KMeansResult r = KMeans(pts.data, n, dim, ko);
    Napi::Env env = info.Env();
    Napi::Object res = Napi::Object::New(env);
    res.Set("centroids", ToJs(env, r.centroids));
    res.Set("assignments", ToJs(env, r.assignments));
    res.Set("offsets", ToJs(env, r.offsets));
    res.Set("members", ToJs(env, r.members));
    res.Set("inertia", Napi::Number::New(env, r.inertia));
    res.Set("iterations", Napi::Number::New(env, r.iterations));
    return res;
  });
}

// scoreCentroids(q, groupSize, centroids, n, dim, layout = 'rows') -> Float32Array(n): max over the
// group of q·c. layout 'rows': n x dim row-major f32 (transposed into tiles first, inside the call);
// 'tiles': f32 tiles (centroidTiles()), so the call is the kernel alone; 'tiles8': int8 tiles
// ({ tiles: Int8Array, scales: Float32Array } from centroidTiles(.., 'i8')); 'tiles4': 4-bit tiles
// ({ tiles: Uint8Array, scales } from centroidTiles(.., 'u4')), the layout the index scores; for
// both, q is quantized inside the call, and an optional 7th argument { var, coef } adds the
// select's spread term, coef[j] * var[i], to each head's score before the max.
Napi::Value ScoreCentroidsJs(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto q = GetF32(info[0], "scoreCentroids q");
    const int g = int(ArgInt(info, 1, "scoreCentroids groupSize", 1, 4096));
    const int64_t n = ArgInt(info, 3, "scoreCentroids n", 0, int64_t(1) << 40);
    const int dim = int(ArgInt(info, 4, "scoreCentroids dim", 1, 65536));
    std::string layout = "rows";
    if (info.Length() > 5 && !info[5].IsUndefined()) {
      layout = info[5].IsString() ? std::string(info[5].As<Napi::String>()) : "";
      if (layout != "rows" && layout != "tiles" && layout != "tiles8" && layout != "tiles4")
        Throw("E_CONFIG", "scoreCentroids layout: expected 'rows', 'tiles', 'tiles8' or 'tiles4', got " +
                              (layout.empty() ? std::string("a non-string") : "'" + layout + "'"));
    }
    ExpectLength(q.length, size_t(g) * dim, "scoreCentroids q (groupSize*dim)");
    CheckFinite(q.data, q.length, "scoreCentroids q");
    // The output is allocated only once the centroids are checked to hold n (a huge n given with
    // small arrays is E_SHAPE, not an allocation that aborts the process).
    if (layout == "tiles8" || layout == "tiles4") {
      const bool four = layout == "tiles4";
      Napi::Object o = GetOptionsArg(info, 2, "scoreCentroids centroids (" + layout + ")",
                                     four ? "{ tiles: Uint8Array, scales: Float32Array }" : "{ tiles: Int8Array, scales: Float32Array }");
      ArrayArg<int8_t> t8;
      ArrayArg<uint8_t> t4;
      if (four) {
        t4 = GetArray<uint8_t>(o.Get("tiles"), napi_uint8_array, "scoreCentroids centroids.tiles (4-bit tiles)");
        ExpectLength(t4.length, TileBytes4(size_t(n), dim), "scoreCentroids centroids.tiles (ceil(n/16)*ceil(ceil(dim/4)/2)*64)");
      } else {
        t8 = GetArray<int8_t>(o.Get("tiles"), napi_int8_array, "scoreCentroids centroids.tiles (int8 tiles)");
        ExpectLength(t8.length, TileBytesI8(size_t(n), dim), "scoreCentroids centroids.tiles (ceil(n/16)*16*ceil4(dim))");
      }
      auto sc = GetF32(o.Get("scales"), "scoreCentroids centroids.scales");
      ExpectLength(sc.length, TileScalesI8(size_t(n)), "scoreCentroids centroids.scales (ceil(n/16)*16)");
      CheckFinite(sc.data, sc.length, "scoreCentroids centroids.scales");
      // Optional spread term, as the select's level 1 adds it: + coef[j] * var[i] inside the max.
      const float* var = nullptr;
      const float* coef = nullptr;
      if (info.Length() > 6 && !info[6].IsUndefined()) {
        Napi::Object sp = GetOptionsArg(info, 6, "scoreCentroids spread", "{ var: Float32Array(n), coef: Float32Array(groupSize) }");
        auto v = GetF32(sp.Get("var"), "scoreCentroids spread.var");
        auto cf = GetF32(sp.Get("coef"), "scoreCentroids spread.coef");
        ExpectLength(v.length, size_t(n), "scoreCentroids spread.var (n)");
        ExpectLength(cf.length, size_t(g), "scoreCentroids spread.coef (groupSize)");
        CheckFinite(v.data, v.length, "scoreCentroids spread.var");
        CheckFinite(cf.data, cf.length, "scoreCentroids spread.coef");
        var = v.data;
        coef = cf.data;
      }
      QueryI8 qq;
      QuantizeQueryI8(q.data, g, dim, qq);
      auto out = Napi::Float32Array::New(info.Env(), size_t(n));
      // Tiles whose bytes all lie in [-63, 63] (7-bit centroid codes, centroidTiles(.., 'i8')) are scored by the
      // faster AVX2 kernel, which checks them as it reads them; any others by the general one: the
      // same scores either way. (A scan before the call cost a pass over the tiles: ~0.3 ms on a
      // cold 8-head 128K set, a third of the kernel.)
      if (four) ScoreTilesMax4(qq, t4.data, sc.data, size_t(n), out.Data(), var, coef);
      else ScoreTilesMaxI8(qq, t8.data, sc.data, size_t(n), out.Data(), var, coef, TileCodes::kCheck);
      return out;
    }
    if (info.Length() > 6 && !info[6].IsUndefined())
      Throw("E_CONFIG", "scoreCentroids spread: expected it only with layout 'tiles8' or 'tiles4', got it with '" + layout + "'");
    auto c = GetF32(info[2], "scoreCentroids centroids");
    if (layout == "tiles") {
      ExpectLength(c.length, TileFloats(size_t(n), dim), "scoreCentroids centroids (tiles: ceil(n/16)*16*dim)");
      auto out = Napi::Float32Array::New(info.Env(), size_t(n));
      ScoreTilesMax(q.data, g, c.data, size_t(n), dim, out.Data());
      return out;
    } else {
      ExpectLength(c.length, size_t(n) * dim, "scoreCentroids centroids (n*dim)");
      auto out = Napi::Float32Array::New(info.Env(), size_t(n));
      std::vector<float> tiles(TileFloats(size_t(n), dim));
      TransposeTiles(c.data, size_t(n), dim, tiles.data());
      ScoreTilesMax(q.data, g, tiles.data(), size_t(n), dim, out.Data());
      return out;
    }
  });
}

// centroidTiles(centroids, n, dim, dtype = 'f32') -> Float32Array of f32 tiles, or for dtype 'i8'
// { tiles: Int8Array, scales: Float32Array } (int8 tiles, index.h, with 7-bit codes: kCentroidLevels),
// or for 'u4' { tiles: Uint8Array, scales } (4-bit tiles, TileBytes4): n x dim row-major centroids in
// the tile layout. The 'u4' tiles are what the index stores, so scoreCentroids(.., 'tiles4') over
// them times the kernel a select's level 1 runs.
Napi::Value CentroidTilesJs(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto c = GetF32(info[0], "centroidTiles centroids");
    const int64_t n = ArgInt(info, 1, "centroidTiles n", 0, int64_t(1) << 40);
    const int dim = int(ArgInt(info, 2, "centroidTiles dim", 1, 65536));
    std::string dt = "f32";
    if (info.Length() > 3 && !info[3].IsUndefined()) {
      dt = info[3].IsString() ? std::string(info[3].As<Napi::String>()) : "";
      if (dt != "f32" && dt != "i8" && dt != "u4")
        Throw("E_DTYPE", "centroidTiles dtype: expected 'f32', 'i8' or 'u4', got " + (dt.empty() ? std::string("a non-string") : "'" + dt + "'"));
    }
    ExpectLength(c.length, size_t(n) * dim, "centroidTiles centroids (n*dim)");
    CheckFinite(c.data, c.length, "centroidTiles centroids");
    if (dt == "u4") {
      const size_t bytes = TileBytes4(size_t(n), dim);
      auto tiles = Napi::Uint8Array::New(info.Env(), bytes);
      auto scales = Napi::Float32Array::New(info.Env(), TileScalesI8(size_t(n)));
      QuantizeTiles4(c.data, size_t(n), dim, tiles.Data(), scales.Data());
      Napi::Object o = Napi::Object::New(info.Env());
      o.Set("tiles", tiles);
      o.Set("scales", scales);
      return o;
    }
    if (dt == "i8") {
      const size_t bytes = TileBytesI8(size_t(n), dim);
      auto buf = Napi::ArrayBuffer::New(info.Env(), bytes);
      auto tiles = Napi::TypedArrayOf<int8_t>::New(info.Env(), bytes, buf, 0, napi_int8_array);
      auto scales = Napi::Float32Array::New(info.Env(), TileScalesI8(size_t(n)));
      QuantizeTilesI8(c.data, size_t(n), dim, tiles.Data(), scales.Data(), kCentroidLevels);
      Napi::Object o = Napi::Object::New(info.Env());
      o.Set("tiles", tiles);
      o.Set("scales", scales);
      return o;
    }
    auto out = Napi::Float32Array::New(info.Env(), TileFloats(size_t(n), dim));
    TransposeTiles(c.data, size_t(n), dim, out.Data());
    return out;
  });
}

// indexKernelLevel(cap?) -> the level the index kernels run at now; with an argument, first caps
// it ('scalar' | 'avx2' | 'avx512' | 'best').
Napi::Value IndexKernelLevelJs(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    if (info.Length() > 0 && !info[0].IsUndefined()) {
      std::string s = info[0].IsString() ? std::string(info[0].As<Napi::String>()) : "";
      if (s == "scalar") SetIndexKernelCap(SimdLevel::Scalar);
      else if (s == "avx2") SetIndexKernelCap(SimdLevel::Avx2);
      else if (s == "avx512" || s == "best") SetIndexKernelCap(SimdLevel::Avx512);
      else Throw("E_CONFIG", "indexKernelLevel: expected 'scalar', 'avx2', 'avx512' or 'best', got " +
                                 (s.empty() ? std::string("a non-string") : "'" + s + "'"));
    }
    return Napi::String::New(info.Env(), LevelName(IndexKernelLevel()));
  });
}

// One layer's index as shared by its owner and the worker threads selecting on it (see the top).
struct SharedIndex {
  IndexConfig cfg;
  std::shared_mutex mu;               // exclusive: build's swap, buildSync, extend; shared: the rest
  std::unique_ptr<LayerIndex> index;  // guarded by mu
  std::atomic<bool> busy{false};      // a build() is in progress (owner thread sets and clears it)

  void NotBusy(const char* what) const {
    if (busy.load(std::memory_order_acquire))
      Throw("E_CONFIG", std::string(what) + ": expected no build() in progress, got a call while the index is being built (await build() first)");
  }
};

HandleRegistry<SharedIndex>& IndexHandles() {
  static HandleRegistry<SharedIndex> registry("selection index");
  return registry;
}

// select(q, budget, pool = 0, keys?, headBegin?, headEnd?) on `s` with the arguments starting at
// info[at], on the calling thread (the owner's or a worker's): the one select both
// SelectionIndex.select and selectIndex run. With a head range, offsets cover heads
// [headBegin, headEnd) only (headEnd - headBegin + 1 entries, from 0).
// -> { offsets, chunkIds, poolOffsets?, poolIds?, poolScores?, tokens, sinkEnd, tailStart, chunkSize,
//      vectorsScored, bytesScored }
Napi::Value SelectOn(const Napi::CallbackInfo& info, size_t at, SharedIndex& s) {
  s.NotBusy("select");
  std::shared_lock<std::shared_mutex> lock(s.mu);
  const LayerIndex& index = *s.index;
  if (!index.built()) Throw("E_CONFIG", "select: expected build() to have completed first, got an index that was never built");
  auto q = GetF32(info[at], "select q");
  const int dim = index.dim(), heads = index.heads();
  if (q.length == 0 || q.length % (size_t(heads) * dim) != 0)
    Throw("E_SHAPE", "select q: expected qHeads*dim elements with qHeads a multiple of kvHeads " + std::to_string(heads) +
                         " and dim " + std::to_string(dim) + ", got " + std::to_string(q.length) + " elements");
  CheckFinite(q.data, q.length, "select q");
  const int64_t budget = ArgInt(info, at + 1, "select budget (tokens per kv head)", 1, int64_t(1) << 40, "E_BUDGET");
  int64_t pool = 0;
  if (info.Length() > at + 2 && !info[at + 2].IsUndefined()) {
    pool = ArgInt(info, at + 2, "select pool (tokens per kv head)", 1, int64_t(1) << 40, "E_BUDGET");
    if (pool < budget)
      Throw("E_BUDGET", "select pool: expected at least the budget " + std::to_string(budget) + " tokens, got " + std::to_string(pool));
  }
  // keys: the layer's keys, read in place on this thread (kvdrive's exact level-3 re-rank).
  KvView keys;
  const bool haveKeys = info.Length() > at + 3 && !info[at + 3].IsUndefined();
  if (haveKeys) {
    keys = GetKvView(info[at + 3], "select keys");
    if (keys.heads != heads || keys.dim != dim)
      Throw("E_SHAPE", "select keys: expected " + std::to_string(heads) + " kv heads x dim " + std::to_string(dim) +
                           " as at build, got " + std::to_string(keys.heads) + " x " + std::to_string(keys.dim));
    if (keys.tokens < index.tokens())
      Throw("E_SHAPE", "select keys.tokens: expected at least the indexed context " + std::to_string(index.tokens()) +
                           " tokens, got " + std::to_string(keys.tokens));
  }
  // [headBegin, headEnd) (optional, default every kv head): a head group of a streamed step.
  int headBegin = 0, headEnd = heads;
  if (info.Length() > at + 4 && !info[at + 4].IsUndefined()) {
    headBegin = int(ArgInt(info, at + 4, "select headBegin (first kv head)", 0, heads - 1, "E_RANGE"));
    headEnd = int(ArgInt(info, at + 5, "select headEnd (kv head past the last)", headBegin + 1, heads, "E_RANGE"));
  }
  SelectResult r = index.Select(q.data, int(q.length / dim), budget, pool, haveKeys ? &keys : nullptr, headBegin, headEnd);
  Napi::Env env = info.Env();
  Napi::Object o = SelectionToJs(env, r, index);
  if (pool > 0) {
    o.Set("poolOffsets", ToJs(env, r.poolOffsets));
    o.Set("poolIds", ToJs(env, r.poolIds));
    o.Set("poolScores", ToJs(env, r.poolScores));
  }
  o.Set("vectorsScored", Napi::Number::New(env, double(r.vectorsScored)));
  o.Set("bytesScored", Napi::Number::New(env, double(r.bytesScored)));
  return o;
}

// selectIndex(handle, q, budget, pool?, keys?, headBegin?, headEnd?): SelectionIndex.select on the index registered as
// `handle` (SelectionIndex.handle()), from any thread. E_CLOSED once the owner was collected.
Napi::Value SelectIndexJs(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    std::shared_ptr<SharedIndex> s = IndexHandles().Get(ArgInt(info, 0, "selectIndex handle", 1, INT32_MAX, "E_CLOSED"));
    return SelectOn(info, 1, *s);
  });
}

class SelectionIndex : public Napi::ObjectWrap<SelectionIndex> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "SelectionIndex",
                       {InstanceMethod("build", &SelectionIndex::Build), InstanceMethod("buildSync", &SelectionIndex::BuildSync),
                        InstanceMethod("extend", &SelectionIndex::Extend),
                        InstanceMethod("select", &SelectionIndex::Select), InstanceMethod("bytes", &SelectionIndex::Bytes),
                        InstanceMethod("reserveBytes", &SelectionIndex::ReserveBytes),
                        InstanceMethod("clusters", &SelectionIndex::Clusters),
                        InstanceMethod("scoreSketch", &SelectionIndex::ScoreSketch),
                        InstanceMethod("geometry", &SelectionIndex::Geometry),
                        InstanceMethod("handle", &SelectionIndex::Handle), InstanceMethod("setPrior", &SelectionIndex::SetPrior)});
  }

  // new SelectionIndex({ policy: 'kvdrive'|'quest'|'shadowkv', chunkSize, tokensPerCluster,
  //   segmentTokens, sinks, local, kmeansIters, seed, candidateFactor, reuseCandidateFactor,
  //   candidateExponent, varianceWeight, threads,
  //   rerankFactor, radiusWeight, outlierFraction, tokenGranular, keySketch, preferSketch, sketchBits,
  //   releaseChunkMeans, outlierChunks, reclusterDelay })
  explicit SelectionIndex(const Napi::CallbackInfo& info) : Napi::ObjectWrap<SelectionIndex>(info), s_(std::make_shared<SharedIndex>()) {
    IndexConfig& cfg = s_->cfg;
    try {
      if (!info[0].IsObject()) Throw("E_TYPE", "SelectionIndex config: expected an object");
      Napi::Object o = info[0].As<Napi::Object>();
      const std::string what = "SelectionIndex config";
      Napi::Value p = o.Get("policy");
      std::string name = p.IsString() ? std::string(p.As<Napi::String>()) : "";
      if (name == "kvdrive") cfg.policy = PolicyKind::Kvdrive;
      else if (name == "quest") cfg.policy = PolicyKind::Quest;
      else if (name == "shadowkv") cfg.policy = PolicyKind::ShadowKV;
      else Throw("E_POLICY", what + ".policy: expected 'kvdrive', 'quest' or 'shadowkv', got " + (name.empty() ? "a non-string" : "'" + name + "'"));
      cfg.chunk = int(GetInt(o, "chunkSize", what, 1, 1 << 16));
      cfg.tokensPerCluster = int(GetIntOr(o, "tokensPerCluster", what, 1, 1 << 20, 16));
      cfg.segmentTokens = GetIntOr(o, "segmentTokens", what, 1, int64_t(1) << 30, 4096);
      cfg.sinks = int(GetIntOr(o, "sinks", what, 0, 1 << 20, 4));
      cfg.local = int(GetIntOr(o, "local", what, 0, 1 << 24, 64));
      cfg.kmeansIters = int(GetIntOr(o, "kmeansIters", what, 0, 1000, 8));
      cfg.seed = uint64_t(GetIntOr(o, "seed", what, 0, (int64_t(1) << 53) - 1, 0));
      cfg.threads = int(GetIntOr(o, "threads", what, 1, 8, 2));
      cfg.outlierChunks = int(GetIntOr(o, "outlierChunks", what, 0, 1 << 20, 48));
      cfg.reclusterDelay = GetIntOr(o, "reclusterDelay", what, 0, 1 << 20, 256);
      Napi::Value cf = o.Get("candidateFactor");
      if (!cf.IsUndefined()) {
        double v = cf.IsNumber() ? cf.As<Napi::Number>().DoubleValue() : NAN;
        if (!(v >= 1.0 && v <= 1e6)) Throw("E_CONFIG", what + ".candidateFactor: expected a number in [1, 1e6], got " + (cf.IsNumber() ? Num(v) : "a non-number"));
        cfg.candidateFactor = v;
      }
      Napi::Value rc = o.Get("reuseCandidateFactor");
      if (!rc.IsUndefined()) {
        double v = rc.IsNumber() ? rc.As<Napi::Number>().DoubleValue() : NAN;
        if (!(v >= 0.0 && v <= 1e6)) Throw("E_CONFIG", what + ".reuseCandidateFactor: expected a number in [0, 1e6], got " + (rc.IsNumber() ? Num(v) : "a non-number"));
        cfg.reuseCandidateFactor = v;
      }
      Napi::Value ce = o.Get("candidateExponent");
      if (!ce.IsUndefined()) {
        double v = ce.IsNumber() ? ce.As<Napi::Number>().DoubleValue() : NAN;
        if (!(v >= 0.0 && v <= 1.0)) Throw("E_CONFIG", what + ".candidateExponent: expected a number in [0, 1], got " + (ce.IsNumber() ? Num(v) : "a non-number"));
        cfg.candidateExponent = v;
      }
      Napi::Value vw = o.Get("varianceWeight");
      if (!vw.IsUndefined()) {
        double v = vw.IsNumber() ? vw.As<Napi::Number>().DoubleValue() : NAN;
        if (!(v >= 0.0 && v <= 1e3)) Throw("E_CONFIG", what + ".varianceWeight: expected a number in [0, 1000], got " + (vw.IsNumber() ? Num(v) : "a non-number"));
        cfg.varianceWeight = v;
      }
      Napi::Value rf = o.Get("rerankFactor");
      if (!rf.IsUndefined()) {
        double v = rf.IsNumber() ? rf.As<Napi::Number>().DoubleValue() : NAN;
        if (!(v >= 0.0 && v <= 1e6)) Throw("E_CONFIG", what + ".rerankFactor: expected a number in [0, 1e6], got " + (rf.IsNumber() ? Num(v) : "a non-number"));
        cfg.rerankFactor = v;
      }
      Napi::Value rw = o.Get("radiusWeight");
      if (!rw.IsUndefined()) {
        double v = rw.IsNumber() ? rw.As<Napi::Number>().DoubleValue() : NAN;
        if (!(v >= 0.0 && v <= 1e3)) Throw("E_CONFIG", what + ".radiusWeight: expected a number in [0, 1000], got " + (rw.IsNumber() ? Num(v) : "a non-number"));
        cfg.radiusWeight = v;
      }
      Napi::Value of = o.Get("outlierFraction");
      if (!of.IsUndefined()) {
        double v = of.IsNumber() ? of.As<Napi::Number>().DoubleValue() : NAN;
        if (!(v >= 0.0 && v <= 1.0)) Throw("E_CONFIG", what + ".outlierFraction: expected a number in [0, 1], got " + (of.IsNumber() ? Num(v) : "a non-number"));
        cfg.outlierFraction = v;
      }
      Napi::Value tg = o.Get("tokenGranular");
      if (!tg.IsUndefined()) {
        if (!tg.IsBoolean()) Throw("E_CONFIG", what + ".tokenGranular: expected a boolean, got a " + (tg.IsNumber() ? "number" : "non-boolean"));
        cfg.tokenGranular = tg.As<Napi::Boolean>().Value();
      }
      for (auto [key, field] : {std::pair<const char*, bool*>{"keySketch", &cfg.keySketch}, {"preferSketch", &cfg.preferSketch},
                                {"releaseChunkMeans", &cfg.releaseChunkMeans}}) {
        Napi::Value b = o.Get(key);
        if (b.IsUndefined()) continue;
        if (!b.IsBoolean()) Throw("E_CONFIG", what + "." + key + ": expected a boolean, got a non-boolean");
        *field = b.As<Napi::Boolean>().Value();
      }
      cfg.sketchBits = int(GetIntOr(o, "sketchBits", what, 4, 8, 8));
      if (cfg.sketchBits != 4 && cfg.sketchBits != 8)
        Throw("E_CONFIG", what + ".sketchBits: expected 4 or 8, got " + std::to_string(cfg.sketchBits));
      if (cfg.releaseChunkMeans && (cfg.policy != PolicyKind::Kvdrive || !cfg.keySketch || !(cfg.rerankFactor > 0)))
        Throw("E_CONFIG", what + ".releaseChunkMeans: expected the kvdrive policy with keySketch true and rerankFactor > 0 "
                                 "(select then re-ranks every candidate), got " +
                              (cfg.policy != PolicyKind::Kvdrive ? std::string("policy '") + name + "'" : !cfg.keySketch ? std::string("keySketch false") : std::string("rerankFactor 0")));
      if (cfg.segmentTokens % cfg.chunk != 0)
        Throw("E_CONFIG", what + ".segmentTokens: expected a multiple of chunkSize " + std::to_string(cfg.chunk) +
                              ", got " + std::to_string(cfg.segmentTokens));
      s_->index = std::make_unique<LayerIndex>(cfg);
    } catch (const Error& e) {
      throw ToJsError(info.Env(), e.code, e.what());
    }
  }

  ~SelectionIndex() override {
    if (handle_ != 0) IndexHandles().Remove(handle_);
  }

 private:
  void NotBusy(const char* what) const { s_->NotBusy(what); }

  Napi::Value Build(const Napi::CallbackInfo& info) {
    return Guard(info, [&]() -> Napi::Value {
      NotBusy("build");
      KvView kv = GetKvView(info[0], "build k");
      const int64_t tokens = ArgInt(info, 1, "build tokens", 0, int64_t(1) << 40);
      if (tokens > kv.tokens)
        Throw("E_SHAPE", "build tokens: expected at most k.tokens = " + std::to_string(kv.tokens) + ", got " + std::to_string(tokens));
      // The new index is built off the JS thread into `next` and replaces the shared index only on success;
      // busy blocks every other method until the promise settles. The worker keeps the key array
      // and this object alive; its copy of the view drops the JS handle (used on the pool thread).
      auto next = std::make_shared<std::unique_ptr<LayerIndex>>(std::make_unique<LayerIndex>(s_->cfg));
      KvView view = kv;
      view.array = Napi::Object();
      Napi::Promise p = PromiseWorker::Start(
          info.Env(), [next, view, tokens] { (*next)->Build(view, tokens); },
          [this, next](Napi::Env env) -> Napi::Value {
            {
              std::unique_lock<std::shared_mutex> lock(s_->mu);
              s_->index = std::move(*next);
            }
            s_->busy.store(false, std::memory_order_release);
            return env.Undefined();
          },
          {kv.array, Value()}, WorkerLabels{"kvdrive:index-build", "index build: ", "the index"},
          [this] { s_->busy.store(false, std::memory_order_release); });
      s_->busy.store(true, std::memory_order_release);  // the worker's callbacks run on this thread, after this call returns
      return p;
    });
  }

  // buildSync(k, tokens): build() on the calling thread, for synchronous hosts (an attention
  // backend called once per layer and position) that start the index from a short or empty
  // context and grow it with extend(). Same checks and typed errors as build(); the previous index
  // is replaced only once the new one is complete, so a failed build leaves it untouched.
  Napi::Value BuildSync(const Napi::CallbackInfo& info) {
    return Guard(info, [&]() -> Napi::Value {
      NotBusy("buildSync");
      KvView kv = GetKvView(info[0], "buildSync k");
      const int64_t tokens = ArgInt(info, 1, "buildSync tokens", 0, int64_t(1) << 40);
      if (tokens > kv.tokens)
        Throw("E_SHAPE", "buildSync tokens: expected at most k.tokens = " + std::to_string(kv.tokens) + ", got " + std::to_string(tokens));
      auto next = std::make_unique<LayerIndex>(s_->cfg);
      next->Build(kv, tokens);
      std::unique_lock<std::shared_mutex> lock(s_->mu);
      s_->index = std::move(next);
      return info.Env().Undefined();
    });
  }

  Napi::Value Extend(const Napi::CallbackInfo& info) {
    return Guard(info, [&]() -> Napi::Value {
      NotBusy("extend");
      KvView kv = GetKvView(info[0], "extend k");
      const int64_t tokens = ArgInt(info, 1, "extend tokens", 0, int64_t(1) << 40);
      const int64_t first = info.Length() > 2 && !info[2].IsUndefined() ? ArgInt(info, 2, "extend first", 0, int64_t(1) << 40) : 0;
      std::unique_lock<std::shared_mutex> lock(s_->mu);
      s_->index->Extend(kv, tokens, first);
      return info.Env().Undefined();
    });
  }

  // select(q, budget, pool = 0, keys?): see SelectOn.
  Napi::Value Select(const Napi::CallbackInfo& info) {
    return Guard(info, [&]() -> Napi::Value { return SelectOn(info, 0, *s_); });
  }

  // setPrior(selection | null): the selection later selects add to their candidates
  // (IndexConfig::reuseCandidateFactor), e.g. this sequence's at the previous decode step; null
  // clears it. Any chunk size; its tokens at most the indexed context, one id list per kv head.
  Napi::Value SetPrior(const Napi::CallbackInfo& info) {
    return Guard(info, [&]() -> Napi::Value {
      NotBusy("setPrior");
      std::unique_lock<std::shared_mutex> lock(s_->mu);
      LayerIndex& index = *s_->index;
      if (info.Length() < 1 || info[0].IsNull()) {
        index.ClearPrior();
        return info.Env().Undefined();
      }
      if (!index.built()) Throw("E_CONFIG", "setPrior: expected build() to have completed first, got an index that was never built");
      SelectionRules rules;
      rules.kvHeads = index.heads();
      rules.maxTokens = index.tokens();
      const SelectionArg sel = GetSelectionArg(info[0], rules, "setPrior selection");
      index.SetPrior(sel.offsets.data, sel.chunkIds.data, sel.chunkSize);
      return info.Env().Undefined();
    });
  }

  // handle() -> the index's handle for selectIndex (registered on first call, released when this
  // object is collected; a select running on a worker keeps the index alive until it returns).
  Napi::Value Handle(const Napi::CallbackInfo& info) {
    return Guard(info, [&]() -> Napi::Value {
      if (handle_ == 0) handle_ = IndexHandles().Add(s_);
      return Napi::Number::New(info.Env(), handle_);
    });
  }

  Napi::Value Bytes(const Napi::CallbackInfo& info) {
    return Guard(info, [&]() -> Napi::Value {
      std::shared_lock<std::shared_mutex> lock(s_->mu);
      return Napi::Number::New(info.Env(), double(s_->index->Bytes()));
    });
  }

  // reserveBytes() -> the most bytes the built index may hold beyond bytes() for a while (a pending
  // background re-clustering, LayerIndex::ReclusterReserveBytes).
  Napi::Value ReserveBytes(const Napi::CallbackInfo& info) {
    return Guard(info, [&]() -> Napi::Value {
      std::shared_lock<std::shared_mutex> lock(s_->mu);
      const LayerIndex& index = *s_->index;
      if (!index.built()) Throw("E_CONFIG", "reserveBytes: expected build() to have completed first, got an index that was never built");
      return Napi::Number::New(info.Env(), double(index.ReclusterReserveBytes(index.heads(), index.dim())));
    });
  }

  // geometry() -> { built, tokens, sinkEnd, tailStart, firstChunk, endChunk, heads, dim, sketchHugePageBytes }
  Napi::Value Geometry(const Napi::CallbackInfo& info) {
    return Guard(info, [&]() -> Napi::Value {
      std::shared_lock<std::shared_mutex> lock(s_->mu);
      const LayerIndex& index = *s_->index;
      Napi::Env env = info.Env();
      Napi::Object o = Napi::Object::New(env);
      o.Set("built", index.built());
      o.Set("tokens", Napi::Number::New(env, double(index.tokens())));
      o.Set("sinkEnd", Napi::Number::New(env, double(index.sinkEnd())));
      o.Set("tailStart", Napi::Number::New(env, double(index.tailStart())));
      o.Set("firstChunk", Napi::Number::New(env, double(index.firstChunk())));
      o.Set("endChunk", Napi::Number::New(env, double(index.endChunk())));
      o.Set("heads", index.heads());
      o.Set("dim", index.dim());
      // Bytes of the key sketches on 2 MiB pages (KeySketch::hugePageBytes), summed over kv heads.
      double huge = 0;
      if (index.built())
        for (int h = 0; h < index.heads(); ++h) huge += double(index.head(h).sketch.hugePageBytes);
      o.Set("sketchHugePageBytes", Napi::Number::New(env, huge));
      return o;
    });
  }

  // clusters(head) -> [{ firstChunk, endChunk, full, k, centroids, offsets, members, inertia }]
  // per segment of that kv head (kvdrive only; an empty list for the flat policies).
  Napi::Value Clusters(const Napi::CallbackInfo& info) {
    return Guard(info, [&]() -> Napi::Value {
      NotBusy("clusters");
      std::shared_lock<std::shared_mutex> lock(s_->mu);
      const LayerIndex& index = *s_->index;
      if (!index.built()) Throw("E_CONFIG", "clusters: expected build() to have completed first, got an index that was never built");
      const int h = int(ArgInt(info, 0, "clusters head", 0, index.heads() - 1));
      Napi::Env env = info.Env();
      const HeadIndex& H = index.head(h);
      const auto& segs = H.segments;
      Napi::Array arr = Napi::Array::New(env, segs.size());
      for (size_t s = 0; s < segs.size(); ++s) {
        Napi::Object o = Napi::Object::New(env);
        o.Set("firstChunk", Napi::Number::New(env, double(segs[s].c0)));
        o.Set("endChunk", Napi::Number::New(env, double(segs[s].c1)));
        o.Set("full", segs[s].clusteredFull);
        o.Set("k", segs[s].k);
        o.Set("centroids", ToJs(env, index.SegmentCentroids(H, s)));
        o.Set("offsets", ToJs(env, segs[s].offsets));
        o.Set("members", ToJs(env, segs[s].members));
        o.Set("inertia", Napi::Number::New(env, segs[s].inertia));
        arr.Set(uint32_t(s), o);
      }
      return arr;
    });
  }

  // scoreSketch(q, head, tokens) -> Float32Array(group x tokens.length): the key sketch's approximate
  // q_j . k_t (key_sketch.h) for the group of query heads q (group x dim) and the given tokens of kv
  // head `head`, as the keyless re-rank scores them (for checking the sketch's error).
  Napi::Value ScoreSketch(const Napi::CallbackInfo& info) {
    return Guard(info, [&]() -> Napi::Value {
      NotBusy("scoreSketch");
      std::shared_lock<std::shared_mutex> lock(s_->mu);
      const LayerIndex& index = *s_->index;
      if (!index.built()) Throw("E_CONFIG", "scoreSketch: expected build() to have completed first, got an index that was never built");
      const int h = int(ArgInt(info, 1, "scoreSketch head", 0, index.heads() - 1));
      const KeySketch& sk = index.head(h).sketch;
      if (!index.config().keySketch || sk.dim == 0)
        Throw("E_CONFIG", "scoreSketch: expected an index built with keySketch, got one without a sketch");
      auto q = GetF32(info[0], "scoreSketch q");
      const int dim = index.dim();
      if (q.length == 0 || q.length % size_t(dim) != 0 || q.length / dim > 4096)
        Throw("E_SHAPE", "scoreSketch q: expected group*dim elements (dim " + std::to_string(dim) + ", group <= 4096), got " + std::to_string(q.length));
      CheckFinite(q.data, q.length, "scoreSketch q");
      auto t = GetArray<int32_t>(info[2], napi_int32_array, "scoreSketch tokens (Int32Array)");
      std::vector<int32_t> toks(t.length);
      for (size_t i = 0; i < t.length; ++i) {
        if (t.data[i] < 0 || t.data[i] >= sk.tokens())
          Throw("E_RANGE", "scoreSketch tokens[" + std::to_string(i) + "]: expected a token in [0, " + std::to_string(sk.tokens()) + "), got " + std::to_string(t.data[i]));
        toks[i] = int32_t(index.SketchRow(h, t.data[i]));  // a row of a token < sk.tokens() <= INT32_MAX
      }
      const int g = int(q.length / dim);
      SketchQuery sq;
      PrepareSketchQuery(q.data, g, sk, sq);
      const size_t n = toks.size(), ld = std::max<size_t>(1, n);
      auto out = Napi::Float32Array::New(info.Env(), size_t(g) * n);
      if (n > 0) ScoreSketchRows(sq, g, sk, toks.data(), n, out.Data(), ld);
      return out;
    });
  }

  // Shared with the handle registry (worker threads); guarded as the top of this file says.
  std::shared_ptr<SharedIndex> s_;
  int32_t handle_ = 0;  // 0: not registered yet
};

void InitIndex(Napi::Env env, Napi::Object exports) {
  exports.Set("chunkMeans", Napi::Function::New(env, ChunkMeansJs));
  exports.Set("kmeans", Napi::Function::New(env, KMeansJs));
  exports.Set("scoreCentroids", Napi::Function::New(env, ScoreCentroidsJs));
  exports.Set("centroidTiles", Napi::Function::New(env, CentroidTilesJs));
  exports.Set("indexKernelLevel", Napi::Function::New(env, IndexKernelLevelJs));
  exports.Set("SelectionIndex", SelectionIndex::Define(env));
  exports.Set("selectIndex", Napi::Function::New(env, SelectIndexJs));
}

}  // namespace

struct HeadwiseSelect::Held {
  std::shared_ptr<SharedIndex> s;
  std::shared_lock<std::shared_mutex> lock;
};

HeadwiseSelect::HeadwiseSelect(int64_t handle, const float* q, int qHeads, int64_t budget, const std::string& what)
    : q_(q), qHeads_(qHeads), budget_(budget) {
  if (handle < 1 || handle > INT32_MAX)
    Throw("E_CLOSED", what + ".handle: expected a selection index's handle (SelectionIndex.handle()), got " + std::to_string(handle));
  std::shared_ptr<SharedIndex> s = IndexHandles().Get(handle);
  s->NotBusy(what.c_str());
  held_ = std::make_unique<Held>(Held{s, std::shared_lock<std::shared_mutex>(s->mu)});
  index_ = s->index.get();
  if (!index_->built()) Throw("E_CONFIG", what + ": expected the index to be built first, got an index that was never built");
  if (budget < 1) Throw("E_BUDGET", what + ".budget (tokens per kv head): expected an integer >= 1, got " + std::to_string(budget));
  if (qHeads < 1 || qHeads % index_->heads() != 0)
    Throw("E_SHAPE", what + ": expected qHeads a multiple of the index's " + std::to_string(index_->heads()) + " kv heads, got " +
                         std::to_string(qHeads));
  parts_.resize(size_t(index_->heads()));
}

HeadwiseSelect::~HeadwiseSelect() = default;

void HeadwiseSelect::Run(int h) {
  LayerIndex::HeadSelection& p = parts_[size_t(h)];
  index_->SelectHead(q_, qHeads_, budget_, 0, nullptr, h, p);
  const int64_t n = int64_t(p.r.ids.size());
  if (n > MaxIds() || n * p.r.chunk > MaxIdTokens())
    Throw("E_INTERNAL", "select: kv head " + std::to_string(h) + " selected " + std::to_string(n) + " ids of " + std::to_string(p.r.chunk) +
                            " tokens, expected at most " + std::to_string(MaxIds()) + " ids covering " + std::to_string(MaxIdTokens()) +
                            " tokens (budget " + std::to_string(budget_) + ")");
}

SelectResult HeadwiseSelect::Join() { return index_->JoinHeads(parts_, 0); }

Napi::Object SelectionToJs(Napi::Env env, const SelectResult& r, const LayerIndex& index) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("chunkSize", Napi::Number::New(env, double(r.chunk)));
  o.Set("tokens", Napi::Number::New(env, double(index.tokens())));
  o.Set("sinkEnd", Napi::Number::New(env, double(index.sinkEnd())));
  o.Set("tailStart", Napi::Number::New(env, double(index.tailStart())));
  o.Set("offsets", ToJs(env, r.offsets));
  o.Set("chunkIds", ToJs(env, r.ids));
  return o;
}

KVD_REGISTER_MODULE(InitIndex);

}  // namespace kvd
