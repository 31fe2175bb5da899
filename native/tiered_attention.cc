// attendFetched / attendFetchedAsync: exact sparse attention of one layer-step whose selected chunks
// were staged by the storage tiers (TieredKv.fetch: DRAM slots or SSD extents copied, page-first,
// into one buffer, entry i = selection.chunkIds[i]) while the always-attended tokens (sinks and
// the local tail, never offloaded) stay in small token-major tensors in memory.
//
// Spans are listed exactly as attendSparse lists them over a contiguous cache — sinks [0, sinkEnd),
// each selected chunk clipped to [sinkEnd, tailStart) in ascending id order, then the tail
// [tailStart, tokens) — so with the same rows the output is bit-identical to attendSparse (the
// AttendHeadSpans contract: the result depends on span contents and order, never on where they live).
#include <napi.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "args.h"
#include "async_work.h"
#include "attention.h"
#include "errors.h"
#include "hot_tier.h"
#include "page_spans.h"
#include "registry.h"

namespace kvd {
namespace {

struct FetchedJob {
  std::string what;
  const float* q = nullptr;
  int qHeads = 0, kvHeads = 0, group = 0, dim = 0;
  Dtype dtype = Dtype::F32;
  float scale = 1.f;
  KvView sinkK, sinkV;  // tokens [0, sink.tokens), sink.tokens >= sinkEnd
  KvView tailK, tailV;  // tokens [tailBase, tailBase + tail.tokens)
  int64_t tailBase = 0;
  int64_t chunkSize = 0, tokens = 0, sinkEnd = 0, tailStart = 0;
  const int32_t* offsets = nullptr;
  const int32_t* chunkIds = nullptr;
  size_t nChunks = 0;
  // Page-first chunks staged by the tiers: per kv head the ascending ids fetchedIds[fetchedOffsets[h]
  // .. fetchedOffsets[h+1]), entry i at fetched + i * chunkBytes (default: the selection itself).
  const uint8_t* fetched = nullptr;
  const int32_t* fetchedOffsets = nullptr;
  const int32_t* fetchedIds = nullptr;
  // Optional hot tier: a selected chunk resident there (all its rows) is read from its slot.
  std::shared_ptr<hot::Tier> tier;
  int hotSeq = 0, hotLayer = 0;
  float* out = nullptr;
  float* lse = nullptr;
  float* chunkMass = nullptr;
};

struct Where {
  int kind;  // 0 sink tensor, 1 fetched chunk, 2 tail tensor, 3 hot-tier slot
  int64_t firstToken;
};

void Run(const FetchedJob& job) {
  const size_t cb = PageFirstChunkBytes(int(job.chunkSize), job.dim, job.dtype);
  const size_t es = DtypeSize(job.dtype);
  std::unique_ptr<hot::Tier::LayerLock> lock;
  if (job.tier) lock = std::make_unique<hot::Tier::LayerLock>(*job.tier, job.hotSeq, job.hotLayer);
  hot::PagedChunks pages{job.fetched, cb, job.fetchedOffsets, job.fetchedIds};
  std::vector<std::vector<Span>> spans(size_t(job.kvHeads));
  std::vector<std::vector<Where>> where(size_t(job.kvHeads));
  std::vector<std::vector<float>> mass(size_t(job.kvHeads));
  std::vector<HeadAttn> heads(size_t(job.kvHeads));
  const size_t headOut = size_t(job.group) * size_t(job.dim);
  for (int h = 0; h < job.kvHeads; ++h) {
    auto& s = spans[size_t(h)];
    auto& w = where[size_t(h)];
    if (job.sinkEnd > 0) {
      s.push_back(Span{job.sinkK.Row(0, h), job.sinkV.Row(0, h), job.sinkEnd, job.sinkK.tokenStride, job.sinkV.tokenStride});
      w.push_back(Where{0, 0});
    }
    for (int32_t i = job.offsets[h]; i < job.offsets[h + 1]; ++i) {
      const int64_t c = job.chunkIds[i];
      const int64_t a = std::max(c * job.chunkSize, job.sinkEnd);
      const int64_t b = std::min((c + 1) * job.chunkSize, job.tailStart);
      const int64_t len = b > a ? b - a : 0;
      const int64_t skip = len ? a - c * job.chunkSize : 0;  // rows of the chunk clipped off at its start
      if (job.tier) {
        hot::PairState& p = job.tier->Pair(job.hotSeq, job.hotLayer, h);
        const int32_t slot = p.Find(int32_t(c));
        if (slot >= 0 && p.slotRows[size_t(slot)] >= skip + len) {
          const size_t off = (size_t(slot) * job.tier->chunkElems() + size_t(skip) * size_t(job.dim)) * es;
          s.push_back(Span{p.k + off, p.v + off, len, job.dim, job.dim});
          w.push_back(Where{3, len ? a : 0});
          continue;
        }
      }
      const uint8_t* page = pages.Page(h, int32_t(c));
      if (!page)
        Throw("E_RANGE", job.what + ": chunk " + std::to_string(c) + " of kv head " + std::to_string(h) +
                             " is selected but neither fetched nor resident in the hot tier");
      Span sp = PageFirstChunkSpan(page, int(job.chunkSize), job.dim, job.dtype);
      sp.k = static_cast<const uint8_t*>(sp.k) + size_t(skip) * size_t(job.dim) * es;
      sp.v = static_cast<const uint8_t*>(sp.v) + size_t(skip) * size_t(job.dim) * es;
      sp.len = len;
      s.push_back(sp);
      w.push_back(Where{1, len ? a : 0});
    }
    if (job.tokens > job.tailStart) {
      const int64_t at = job.tailStart - job.tailBase;
      s.push_back(Span{job.tailK.Row(at, h), job.tailV.Row(at, h), job.tokens - job.tailStart, job.tailK.tokenStride,
                       job.tailV.tokenStride});
      w.push_back(Where{2, job.tailStart});
    }
    mass[size_t(h)].resize(s.size());
    heads[size_t(h)] = HeadAttn{job.q + size_t(h) * headOut, s.data(), s.size(), job.out + size_t(h) * headOut,
                                job.lse + size_t(h) * size_t(job.group), mass[size_t(h)].data()};
  }
  AttnScratch scratch;
  try {
    AttendHeadsSpans(heads.data(), heads.size(), job.group, job.dim, job.dtype, job.scale, scratch);
  } catch (const NonFiniteRowError& e) {
    const Where& w = where[e.head][e.span];
    static const char* from[] = {"sink tensor", "fetched chunk", "tail tensor", "hot-tier slot"};
    Throw("E_NONFINITE", job.what + ": " + (e.inValue ? "v" : "k") + ": kv head " + std::to_string(e.head) + ", token " +
                             std::to_string(w.firstToken + e.row) + " (" + from[w.kind] + "): NaN/Inf in the " +
                             (e.inValue ? "value" : "key") + " row");
  }
  for (int h = 0; h < job.kvHeads; ++h) {
    const size_t first = job.sinkEnd > 0 ? 1 : 0;
    for (int32_t i = job.offsets[h]; i < job.offsets[h + 1]; ++i)
      job.chunkMass[i] = mass[size_t(h)][first + size_t(i - job.offsets[h])];
    // Lookahead eviction ranks hot-tier residents by the mass they just received.
    if (job.tier)
      job.tier->RecordMass(job.hotSeq, job.hotLayer, h, job.chunkIds + job.offsets[h], job.chunkMass + job.offsets[h],
                           job.offsets[h + 1] - job.offsets[h]);
  }
}

// Page lists (kvHeads + 1 offsets and ascending ids per head) of a buffer of page-first chunks;
// returns false when absent (undefined).
bool GetPageLists(const Napi::Object& o, const char* offKey, const char* idKey, int heads, const std::string& what,
                  ArrayArg<int32_t>& off, ArrayArg<int32_t>& ids) {
  if (o.Get(offKey).IsUndefined()) return false;
  GetChunkLists(o, offKey, idKey, heads, INT32_MAX, what, "", off, ids);
  return true;
}

// The hot tier, sequence and layer named by `hot: { handle, sequence?, layer }`, checked against
// the attention's shape.
void GetHot(const Napi::Object& o, const std::string& what, int kvHeads, int dim, Dtype dt, int64_t chunkSize,
            std::shared_ptr<hot::Tier>& tier, int& seq, int& layer) {
  Napi::Value hv = o.Get("hot");
  if (hv.IsUndefined()) return;
  if (!hv.IsObject()) Throw("E_TYPE", what + ".hot: expected { handle, sequence?, layer }");
  Napi::Object h = hv.As<Napi::Object>();
  tier = hot::Acquire(int32_t(GetInt(h, "handle", what + ".hot", 0, int64_t(1) << 30)));
  const hot::TierConfig& c = tier->config();
  if (c.kvHeads != kvHeads || c.dim != dim || c.dtype != dt || c.chunkSize != chunkSize)
    Throw("E_SHAPE", what + ".hot: expected a hot tier of " + std::to_string(kvHeads) + " kv heads x " + std::to_string(dim) +
                         " " + DtypeName(dt) + ", chunk " + std::to_string(chunkSize) + ", got " + std::to_string(c.kvHeads) +
                         " x " + std::to_string(c.dim) + " " + DtypeName(c.dtype) + ", chunk " + std::to_string(c.chunkSize));
  seq = int(GetIntOr(h, "sequence", what + ".hot", 0, c.sequences - 1, 0));
  layer = int(GetInt(h, "layer", what + ".hot", 0, c.layers - 1));
}

void CheckPair(const KvView& k, const KvView& v, const std::string& what) {
  if (v.tokens != k.tokens || v.heads != k.heads || v.dim != k.dim || v.dtype != k.dtype)
    Throw("E_SHAPE", what + ".v: expected the shape and dtype of " + what + ".k (" + std::to_string(k.tokens) + " x " +
                         std::to_string(k.heads) + " x " + std::to_string(k.dim) + " " + DtypeName(k.dtype) + "), got " +
                         std::to_string(v.tokens) + " x " + std::to_string(v.heads) + " x " + std::to_string(v.dim) +
                         " " + DtypeName(v.dtype));
}

FetchedJob Prepare(const Napi::CallbackInfo& info, const std::string& what, std::vector<Napi::Object>& keep,
                   Napi::Object& result) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsObject() || info[0].IsTypedArray() || info[0].IsArray())
    Throw("E_TYPE", what + ": expected an options object { q, qHeads, sink, tail, tailBase, selection, fetched }");
  Napi::Object o = info[0].As<Napi::Object>();
  FetchedJob job;
  job.what = what;
  for (const char* part : {"sink", "tail"}) {
    Napi::Value pv = o.Get(part);
    if (!pv.IsObject()) Throw("E_TYPE", what + "." + part + ": expected { k, v } KV tensors");
    Napi::Object p = pv.As<Napi::Object>();
    KvView k = GetKvView(p.Get("k"), what + "." + part + ".k");
    KvView v = GetKvView(p.Get("v"), what + "." + part + ".v");
    CheckPair(k, v, what + "." + part);
    if (k.tokenStride != int64_t(k.heads) * k.dim || v.tokenStride != int64_t(v.heads) * v.dim)
      Throw("E_CONFIG", what + "." + part + ": expected token-major ('thd') tensors, got layout 'htd'");
    keep.push_back(k.array);
    keep.push_back(v.array);
    if (std::string(part) == "sink") job.sinkK = k, job.sinkV = v;
    else job.tailK = k, job.tailV = v;
  }
  if (job.tailK.heads != job.sinkK.heads || job.tailK.dim != job.sinkK.dim || job.tailK.dtype != job.sinkK.dtype)
    Throw("E_SHAPE", what + ".tail: expected the heads, dim and dtype of sink (" + std::to_string(job.sinkK.heads) + " x " +
                         std::to_string(job.sinkK.dim) + " " + DtypeName(job.sinkK.dtype) + "), got " +
                         std::to_string(job.tailK.heads) + " x " + std::to_string(job.tailK.dim) + " " +
                         DtypeName(job.tailK.dtype));
  job.kvHeads = job.sinkK.heads;
  job.dim = job.sinkK.dim;
  job.dtype = job.sinkK.dtype;
  job.qHeads = GetQHeads(o, job.kvHeads, what);
  job.group = job.qHeads / job.kvHeads;
  auto q = GetQuery(o, job.qHeads, job.dim, what);
  job.q = q.data;
  keep.push_back(q.object);
  job.scale = GetScaleArg(o, job.dim, what);
  job.tailBase = GetInt(o, "tailBase", what, 0, kMaxTokens);

  SelectionRules rules;
  rules.kvHeads = job.kvHeads;
  rules.maxTokens = job.tailBase + job.tailK.tokens;
  rules.maxSinkEnd = job.sinkK.tokens;
  rules.minTailStart = job.tailBase;
  rules.chunksBeforeTail = true;
  SetSelection(job, GetSelectionArg(o.Get("selection"), rules, what + ".selection"), keep);

  ArrayArg<int32_t> fOff, fIds;
  size_t nFetched = job.nChunks;
  if (GetPageLists(o, "fetchedOffsets", "fetchedIds", job.kvHeads, what, fOff, fIds)) {
    job.fetchedOffsets = fOff.data;
    job.fetchedIds = fIds.data;
    nFetched = fIds.length;
    keep.push_back(fOff.object);
    keep.push_back(fIds.object);
  } else {
    job.fetchedOffsets = job.offsets;
    job.fetchedIds = job.chunkIds;
  }
  auto fetched = GetArray<uint8_t>(o.Get("fetched"), napi_uint8_array, what + ".fetched");
  const uint64_t need = CheckedMul(nFetched, PageFirstChunkBytes(int(job.chunkSize), job.dim, job.dtype), what + ".fetched size");
  if (fetched.length < need)
    Throw("E_SHAPE", what + ".fetched: expected at least " + std::to_string(need) + " bytes (" + std::to_string(nFetched) +
                         " page-first chunks), got " + std::to_string(fetched.length));
  job.fetched = fetched.data;
  keep.push_back(fetched.object);
  GetHot(o, what, job.kvHeads, job.dim, job.dtype, job.chunkSize, job.tier, job.hotSeq, job.hotLayer);

  auto out = NewF32(env, uint64_t(job.qHeads) * uint64_t(job.dim), what + ".out");
  auto lse = NewF32(env, uint64_t(job.qHeads), what + ".lse");
  auto mass = NewF32(env, job.nChunks, what + ".chunkMass");
  job.out = out.Data();
  job.lse = lse.Data();
  job.chunkMass = mass.Data();
  result = Napi::Object::New(env);
  result.Set("out", out);
  result.Set("lse", lse);
  result.Set("chunkMass", mass);
  keep.push_back(result);
  return job;
}

Napi::Value AttendFetched(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    std::vector<Napi::Object> keep;
    Napi::Object result;
    FetchedJob job = Prepare(info, "attendFetched", keep, result);
    Run(job);
    return result;
  });
}

// Validation errors reject the promise (an async API never throws synchronously).
Napi::Value AttendFetchedAsync(const Napi::CallbackInfo& info) {
  return GuardPromise(info.Env(), "attendFetchedAsync", [&]() -> Napi::Value {
    std::vector<Napi::Object> keep;
    Napi::Object result;
    FetchedJob job = Prepare(info, "attendFetchedAsync", keep, result);
    auto ref = std::make_shared<Napi::ObjectReference>(Napi::Persistent(result));
    return PromiseWorker::Start(
        info.Env(), [job]() { Run(job); }, [ref](Napi::Env) -> Napi::Value { return ref->Value(); }, keep);
  });
}

// hotTierAdmitPages({ hot: { handle, sequence?, layer }, selection, tokens, pages, pageOffsets,
// pageIds }): the hot tier's F stage for one layer with the misses' rows taken from page-first
// chunks staged by the storage tiers (pages hold at least every selected chunk not resident; rows
// exist for tokens [0, tokens)). Hits are marked used, residents evicted (lookahead: by attention
// mass, the selection's pool protected), misses admitted. Returns the step's counters summed over
// kv heads.
Napi::Value HotTierAdmitPages(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "hotTierAdmitPages";
    if (info.Length() < 1 || !info[0].IsObject()) Throw("E_TYPE", what + ": expected an options object");
    Napi::Object o = info[0].As<Napi::Object>();
    std::shared_ptr<hot::Tier> tier;
    int seq = 0, layer = 0;
    Napi::Value hv = o.Get("hot");
    if (!hv.IsObject()) Throw("E_TYPE", what + ".hot: expected { handle, sequence?, layer }");
    tier = hot::Acquire(int32_t(GetInt(hv.As<Napi::Object>(), "handle", what + ".hot", 0, int64_t(1) << 30)));
    const hot::TierConfig& c = tier->config();
    GetHot(o, what, c.kvHeads, c.dim, c.dtype, c.chunkSize, tier, seq, layer);
    const int64_t tokens = GetInt(o, "tokens", what, 0, kMaxTokens);
    const std::string sw = what + ".selection";
    SelectionRules rules;
    rules.kvHeads = c.kvHeads;
    rules.chunkSize = c.chunkSize;
    rules.chunksBeforeTail = true;
    rules.pool = true;
    const SelectionArg sel = GetSelectionArg(o.Get("selection"), rules, sw);
    const int64_t tailStart = sel.tailStart;
    if (tailStart > tokens)
      Throw("E_RANGE", sw + ".tailStart: expected at most tokens " + std::to_string(tokens) + " (the rows the pages hold), got " +
                           std::to_string(tailStart));
    const ArrayArg<int32_t>& off = sel.offsets;
    const ArrayArg<int32_t>& ids = sel.chunkIds;
    ArrayArg<int32_t> pOff, pIds;
    if (!GetPageLists(o, "pageOffsets", "pageIds", c.kvHeads, what, pOff, pIds)) Throw("E_TYPE", what + ".pageOffsets: expected an Int32Array");
    auto pages = GetArray<uint8_t>(o.Get("pages"), napi_uint8_array, what + ".pages");
    const size_t cb = PageFirstChunkBytes(c.chunkSize, c.dim, c.dtype);
    const uint64_t needBytes = CheckedMul(pIds.length, cb, what + ".pages size");
    if (pages.length < needBytes)
      Throw("E_SHAPE", what + ".pages: expected at least " + std::to_string(needBytes) + " bytes, got " + std::to_string(pages.length));
    hot::PagedChunks paged{pages.data, cb, pOff.data, pIds.data};
    hot::Source src{nullptr, nullptr, &paged, tokens};
    hot::Tier::LayerLock lock(*tier, seq, layer);
    hot::Counters total;
    for (int h = 0; h < c.kvHeads; ++h) {
      hot::HeadSelection hs;
      hs.ids = ids.data + off.data[h];
      hs.n = off.data[h + 1] - off.data[h];
      if (sel.hasPool) {
        const int32_t* po = sel.poolOffsets.data;
        hs.poolIds = sel.poolIds.data + po[h];
        hs.poolScores = sel.poolScores.data + po[h];
        hs.poolN = po[h + 1] - po[h];
      }
      total.Add(tier->Fetch(seq, layer, h, hs, tailStart, src));
    }
    Napi::Env env = info.Env();
    Napi::Object r = Napi::Object::New(env);
    r.Set("hits", double(total.hits));
    r.Set("misses", double(total.misses));
    r.Set("admitted", double(total.admitted));
    r.Set("streamed", double(total.streamed));
    r.Set("evictions", double(total.evictions));
    r.Set("bytesAdmitted", double(total.bytesAdmitted));
    return r;
  });
}

void InitTieredAttention(Napi::Env env, Napi::Object exports) {
  exports.Set("hotTierAdmitPages", Napi::Function::New(env, HotTierAdmitPages, "hotTierAdmitPages"));
  exports.Set("attendFetched", Napi::Function::New(env, AttendFetched, "attendFetched"));
  exports.Set("attendFetchedAsync", Napi::Function::New(env, AttendFetchedAsync, "attendFetchedAsync"));
}

}  // namespace

KVD_REGISTER_MODULE(InitTieredAttention);

}  // namespace kvd
