// JS bindings of the hot tier (native/cache/hot_tier.h) and of warm-up importance scoring.
//
// fetch, attend, warm and importance come in a synchronous and a Promise-returning variant (run on
// the libuv pool, holding references to every array they read or write); the pipeline may also call
// the C++ API (hot::Acquire + Tier methods) from its own workers. Every argument is validated on the
// JS thread before any state changes, so a rejected call leaves the tier untouched.
#include <napi.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/args.h"
#include "common/async_work.h"
#include "attention/attention.h"
#include "common/errors.h"
#include "cache/hot_tier.h"
#include "common/registry.h"

namespace kvd {
namespace hot {
namespace {

int32_t Handle(const Napi::CallbackInfo& info, const std::string& what) {
  if (info.Length() < 1 || !info[0].IsNumber()) Throw("E_TYPE", what + ": expected a hot tier handle (integer)");
  return int32_t(GetIntValue(info[0], what + " handle", 0, INT32_MAX, "E_CLOSED"));
}

// A Selection checked against the tier (GetSelectionArg), with per-head views for Tier::Fetch.
struct ParsedSelection {
  SelectionArg arg;
  int64_t tailStart = 0, sinkEnd = 0, tokens = 0;
  const int32_t* offsets = nullptr;
  const int32_t* ids = nullptr;
  size_t nIds = 0;
  std::vector<Napi::Object> arrays;  // keep-alive handles of the arrays above (async use)
  HeadSelection Head(int h) const {
    HeadSelection s;
    s.ids = ids + offsets[h];
    s.n = offsets[h + 1] - offsets[h];
    if (arg.hasPool) {
      const int32_t* po = arg.poolOffsets.data;
      s.poolIds = arg.poolIds.data + po[h];
      s.poolScores = arg.poolScores.data + po[h];
      s.poolN = po[h + 1] - po[h];
    }
    return s;
  }
};

ParsedSelection GetSelection(const Napi::Value& sv, const Tier& t, int64_t srcTokens, const std::string& what) {
  SelectionRules rules;
  rules.kvHeads = t.config().kvHeads;
  rules.chunkSize = t.config().chunkSize;
  rules.maxTokens = srcTokens;
  rules.pool = true;
  ParsedSelection s;
  s.arg = GetSelectionArg(sv, rules, what);
  s.tokens = s.arg.tokens;
  s.sinkEnd = s.arg.sinkEnd;
  s.tailStart = s.arg.tailStart;
  s.offsets = s.arg.offsets.data;
  s.ids = s.arg.chunkIds.data;
  s.nIds = s.arg.chunkIds.length;
  s.arg.Keep(s.arrays);
  return s;
}

struct LayerArgs {
  std::shared_ptr<Tier> tier;
  int seq = 0, layer = 0;
  KvView k, v;
};

LayerArgs GetLayerArgs(const Napi::CallbackInfo& info, const Napi::Object& o, const std::string& what) {
  LayerArgs a;
  a.tier = Acquire(Handle(info, what));
  const TierConfig& c = a.tier->config();
  a.seq = int(GetIntOr(o, "sequence", what, 0, c.sequences - 1, 0));
  a.layer = int(GetInt(o, "layer", what, 0, c.layers - 1));
  a.k = GetKvView(o.Get("k"), what + ".k");
  a.v = GetKvView(o.Get("v"), what + ".v");
  for (const KvView* kv : {&a.k, &a.v}) {
    const std::string n = what + (kv == &a.k ? ".k" : ".v");
    if (kv->heads != c.kvHeads || kv->dim != c.dim)
      Throw("E_SHAPE", n + ": expected heads " + std::to_string(c.kvHeads) + " and dim " + std::to_string(c.dim) +
                           " (the hot tier's shape), got heads " + std::to_string(kv->heads) + " and dim " +
                           std::to_string(kv->dim));
    if (kv->dtype != c.dtype)
      Throw("E_DTYPE", n + ".dtype: expected the hot tier's dtype '" + DtypeName(c.dtype) + "', got '" +
                           DtypeName(kv->dtype) + "'");
  }
  if (a.v.tokens != a.k.tokens)
    Throw("E_SHAPE", what + ".v.tokens: expected k's token count " + std::to_string(a.k.tokens) + ", got " + std::to_string(a.v.tokens));
  return a;
}

Napi::Float64Array F64(Napi::Env env, const std::vector<double>& v) {
  auto a = Napi::Float64Array::New(env, v.size());
  for (size_t i = 0; i < v.size(); ++i) a[i] = v[i];
  return a;
}

// Counters per kv head (or per pair) as an object of Float64Arrays.
Napi::Object CountersObject(Napi::Env env, const std::vector<Counters>& cs) {
  Napi::Object o = Napi::Object::New(env);
  auto field = [&](const char* name, int64_t Counters::*m) {
    std::vector<double> v(cs.size());
    for (size_t i = 0; i < cs.size(); ++i) v[i] = double(cs[i].*m);
    o.Set(name, F64(env, v));
  };
  field("hits", &Counters::hits);
  field("misses", &Counters::misses);
  field("admitted", &Counters::admitted);
  field("streamed", &Counters::streamed);
  field("bytesAdmitted", &Counters::bytesAdmitted);
  field("bytesStreamed", &Counters::bytesStreamed);
  field("evictions", &Counters::evictions);
  field("warmAdmitted", &Counters::warmAdmitted);
  field("warmBytes", &Counters::warmBytes);
  return o;
}

// An operation split in three: validated on the JS thread (Prepare*), `run` (pure C++ on raw
// pointers; on a libuv worker thread for the async variants), `done` (builds the JS result on the JS
// thread). `keep` lists every JS object whose memory `run` touches; the async variant's
// PromiseWorker holds references to them until it settles. State shared by run and done lives in shared_ptrs.
struct Prepared {
  std::function<void()> run;
  std::function<Napi::Value(Napi::Env)> done;
  std::vector<Napi::Object> keep;
};

using PrepareFn = Prepared (*)(const Napi::CallbackInfo&);

template <PrepareFn P>
Napi::Value RunSync(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    Prepared op = P(info);
    op.run();
    return op.done(info.Env());
  });
}

// Validation errors reject the promise (an async API never throws synchronously).
template <PrepareFn P>
Napi::Value RunAsync(const Napi::CallbackInfo& info) {
  return GuardPromise(info.Env(), "hotTier", [&]() -> Napi::Value {
    Prepared op = P(info);
    return PromiseWorker::Start(info.Env(), std::move(op.run), std::move(op.done), op.keep, WorkerLabels{"kvdrive:hot-tier", "", "the requested buffers"});
  });
}

// ---- bindings ----

Napi::Value Create(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "hotTier options";
    Napi::Object o = GetOptionsArg(info, 0, what);
    TierConfig c;
    c.sequences = int(GetIntOr(o, "sequences", what, 1, 4096, 1));
    c.layers = int(GetInt(o, "layers", what, 1, 4096));
    c.kvHeads = int(GetInt(o, "kvHeads", what, 1, 4096));
    c.dim = int(GetInt(o, "headDim", what, 1, 65536));
    c.chunkSize = int(GetInt(o, "chunkSize", what, 1, 1 << 16));
    c.budget = GetInt(o, "budget", what, 1, int64_t(1) << 31);
    Napi::Value dt = o.Get("dtype");
    if (!dt.IsString()) Throw("E_DTYPE", what + ".dtype: expected 'f32', 'f16' or 'bf16'");
    c.dtype = ParseDtype(dt.As<Napi::String>());
    Napi::Value ev = o.Get("eviction");
    if (!ev.IsString()) Throw("E_POLICY", what + ".eviction: expected 'lookahead', 'lru' or 'lfu'");
    c.eviction = ParseEviction(ev.As<Napi::String>());
    auto w = GetI32(o.Get("windows"), what + ".windows");
    ExpectLength(w.length, size_t(c.layers) * c.kvHeads, what + ".windows (layers*kvHeads)");
    c.windows.assign(w.data, w.data + w.length);
    const int64_t perStep = (c.budget + c.chunkSize - 1) / c.chunkSize;
    for (size_t i = 0; i < w.length; ++i)
      if (w.data[i] < 0 || int64_t(w.data[i]) * perStep > (int64_t(1) << 30))
        Throw("E_RANGE", what + ".windows[" + std::to_string(i) + "]: expected a window in [0, " +
                             std::to_string((int64_t(1) << 30) / perStep) + "], got " + std::to_string(w.data[i]));
    Napi::Value mb = o.Get("maxBytes");
    if (!mb.IsNumber()) Throw("E_TYPE", what + ".maxBytes: expected a byte count (number)");
    const double mbd = mb.As<Napi::Number>().DoubleValue();
    if (!(mbd >= 0) || mbd > 9e15) Throw("E_RANGE", what + ".maxBytes: expected a byte count >= 0, got " + Num(mbd));
    c.maxBytes = int64_t(mbd);
    auto tier = std::make_shared<Tier>(c);
    return Napi::Number::New(info.Env(), Register(std::move(tier)));
  });
}

Napi::Value Destroy(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    return Napi::Boolean::New(info.Env(), Unregister(Handle(info, "hotTierDestroy")));
  });
}

Napi::Value Info(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto t = Acquire(Handle(info, "hotTierInfo"));
    const TierConfig& c = t->config();
    int64_t slotBytes = 0, metaBytes = 0;
    Tier::RequiredBytes(c, &slotBytes, &metaBytes);
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("bytes", Napi::Number::New(info.Env(), double(t->bytes())));
    o.Set("slotBytes", Napi::Number::New(info.Env(), double(slotBytes)));
    o.Set("metadataBytes", Napi::Number::New(info.Env(), double(metaBytes)));
    o.Set("slotsPerStep", Napi::Number::New(info.Env(), t->slotsPerStep()));
    o.Set("chunkBytes", Napi::Number::New(info.Env(), double(t->chunkElems() * DtypeSize(c.dtype) * 2)));
    auto caps = Napi::Int32Array::New(info.Env(), size_t(c.layers) * c.kvHeads);
    for (int l = 0; l < c.layers; ++l)
      for (int h = 0; h < c.kvHeads; ++h) caps[size_t(l) * c.kvHeads + h] = t->Capacity(l, h);
    o.Set("capacities", caps);
    o.Set("eviction", Napi::String::New(info.Env(), EvictionName(c.eviction)));
    return o;
  });
}

Prepared PrepareFetch(const Napi::CallbackInfo& info) {
  const std::string what = "hotTier.fetch";
  Napi::Object o = GetOptionsArg(info, 1, what);
  auto a = std::make_shared<LayerArgs>(GetLayerArgs(info, o, what));
  auto sel = std::make_shared<ParsedSelection>(GetSelection(o.Get("selection"), *a->tier, a->k.tokens, what + ".selection"));
  auto per = std::make_shared<std::vector<Counters>>(size_t(a->tier->config().kvHeads));
  Prepared op;
  op.keep = sel->arrays;
  op.keep.push_back(a->k.array);
  op.keep.push_back(a->v.array);
  op.run = [a, sel, per] {
    Tier::LayerLock lock(*a->tier, a->seq, a->layer);
    const Source src{&a->k, &a->v};
    for (int h = 0; h < a->tier->config().kvHeads; ++h)
      (*per)[size_t(h)] = a->tier->Fetch(a->seq, a->layer, h, sel->Head(h), sel->tailStart, src);
  };
  op.done = [per](Napi::Env env) -> Napi::Value { return CountersObject(env, *per); };
  return op;
}

// Sparse attention reading the selected chunks from their slots (sinks and tail from the source),
// spans in token order exactly as attendSparse builds them, so outputs are bit-identical. Chunks not
// resident (streamed because the window is smaller than the selection) are read from the source and
// counted in `sourceChunks`. Records each resident chunk's attention mass for lookahead eviction.
Prepared PrepareAttend(const Napi::CallbackInfo& info) {
  const std::string what = "hotTier.attend";
  Napi::Object o = GetOptionsArg(info, 1, what);
  auto a = std::make_shared<LayerArgs>(GetLayerArgs(info, o, what));
  Tier& t = *a->tier;
  const TierConfig& c = t.config();
  auto sel = std::make_shared<ParsedSelection>(GetSelection(o.Get("selection"), t, a->k.tokens, what + ".selection"));
  const int qHeads = GetQHeads(o, c.kvHeads, what);
  const int group = qHeads / c.kvHeads;
  auto q = GetQuery(o, qHeads, c.dim, what);
  const float scale = GetScaleArg(o, c.dim, what);
  Napi::Env env = info.Env();
  auto out = NewF32(env, uint64_t(qHeads) * uint64_t(c.dim), what + ".out");
  auto lse = NewF32(env, uint64_t(qHeads), what + ".lse");
  auto chunkMass = NewF32(env, sel->nIds, what + ".chunkMass");
  auto fromSource = std::make_shared<int64_t>(0);
  auto result = std::make_shared<Napi::ObjectReference>(Napi::Persistent(Napi::Object::New(env)));
  result->Value().Set("out", out);
  result->Value().Set("lse", lse);
  result->Value().Set("chunkMass", chunkMass);
  Prepared op;
  op.keep = sel->arrays;
  op.keep.insert(op.keep.end(), {a->k.array, a->v.array, q.object, result->Value()});
  const float* qd = q.data;
  float* outD = out.Data();
  float* lseD = lse.Data();
  float* massD = chunkMass.Data();
  op.run = [a, sel, fromSource, qd, outD, lseD, massD, group, scale, what] {
    Tier& t = *a->tier;
    const TierConfig& c = t.config();
    Tier::LayerLock lock(t, a->seq, a->layer);
    AttnScratch scratch;
    const size_t es = DtypeSize(c.dtype);
    const int64_t cs = c.chunkSize;
    std::vector<Span> spans;
    std::vector<float> mass;
    for (int h = 0; h < c.kvHeads; ++h) {
      PairState& p = t.Pair(a->seq, a->layer, h);
      spans.clear();
      auto fromSrc = [&](int64_t s, int64_t e) {
        const int64_t len = e > s ? e - s : 0;
        const int64_t at = len ? s : 0;  // empty spans point at a valid row; nothing is read
        spans.push_back(Span{a->k.Row(at, h), a->v.Row(at, h), len, a->k.tokenStride, a->v.tokenStride});
      };
      if (sel->sinkEnd > 0) fromSrc(0, sel->sinkEnd);
      const size_t firstChunk = spans.size();
      for (int32_t i = sel->offsets[h]; i < sel->offsets[h + 1]; ++i) {
        const int64_t chunk = sel->ids[i];
        const int64_t s = std::max(chunk * cs, sel->sinkEnd), e = std::min((chunk + 1) * cs, sel->tailStart);
        if (e <= s) {
          fromSrc(s, e);
          continue;
        }
        const int32_t slot = p.Find(int32_t(chunk));
        if (slot < 0 || p.slotRows[size_t(slot)] < e - chunk * cs) {
          ++*fromSource;
          fromSrc(s, e);
          continue;
        }
        const size_t off = (size_t(slot) * t.chunkElems() + size_t(s - chunk * cs) * c.dim) * es;
        spans.push_back(Span{p.k + off, p.v + off, e - s, c.dim, c.dim});
      }
      if (sel->tokens > sel->tailStart) fromSrc(sel->tailStart, sel->tokens);
      mass.assign(spans.size(), 0.f);
      const size_t qOff = size_t(h) * group;
      try {
        AttendHeadSpans(qd + qOff * c.dim, group, c.dim, c.dtype, scale, spans.data(), spans.size(), outD + qOff * c.dim,
                        lseD + qOff, mass.data(), scratch);
      } catch (const NonFiniteRowError& e) {
        Throw("E_NONFINITE", what + ": kv head " + std::to_string(h) + ": span " + std::to_string(e.span) + " row " +
                                 std::to_string(e.row) + ": NaN/Inf in a " + (e.inValue ? "value" : "key") + " row");
      }
      const int32_t n = sel->offsets[h + 1] - sel->offsets[h];
      for (int32_t i = 0; i < n; ++i) massD[size_t(sel->offsets[h] + i)] = mass[firstChunk + size_t(i)];
      t.RecordMass(a->seq, a->layer, h, sel->ids + sel->offsets[h], massD + sel->offsets[h], n);
    }
  };
  op.done = [result, fromSource](Napi::Env env) -> Napi::Value {
    Napi::Object r = result->Value();
    r.Set("sourceChunks", Napi::Number::New(env, double(*fromSource)));
    return r;
  };
  return op;
}

Napi::Value RecordMassBinding(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "hotTier.recordMass";
    Napi::Object o = GetOptionsArg(info, 1, what);
    auto t = Acquire(Handle(info, what));
    const TierConfig& c = t->config();
    const int seq = int(GetIntOr(o, "sequence", what, 0, c.sequences - 1, 0));
    const int layer = int(GetInt(o, "layer", what, 0, c.layers - 1));
    ParsedSelection sel = GetSelection(o.Get("selection"), *t, int64_t(1) << 40, what + ".selection");
    auto m = GetF32(o.Get("chunkMass"), what + ".chunkMass");
    ExpectLength(m.length, sel.nIds, what + ".chunkMass (one per selected chunk)");
    Tier::LayerLock lock(*t, seq, layer);
    for (int h = 0; h < c.kvHeads; ++h)
      t->RecordMass(seq, layer, h, sel.ids + sel.offsets[h], m.data + sel.offsets[h], sel.offsets[h + 1] - sel.offsets[h]);
    return info.Env().Undefined();
  });
}

Prepared PrepareWarm(const Napi::CallbackInfo& info) {
  const std::string what = "hotTier.warm";
  Napi::Object o = GetOptionsArg(info, 1, what);
  auto a = std::make_shared<LayerArgs>(GetLayerArgs(info, o, what));
  const TierConfig& c = a->tier->config();
  // Warm-up order: per kv head the chunks to place, best first (any order, each < the source's chunks).
  auto off = GetI32(o.Get("offsets"), what + ".offsets");
  auto ids = GetI32(o.Get("chunkIds"), what + ".chunkIds");
  CheckOffsets(off, size_t(c.kvHeads), ids.length, what + ".offsets");
  const int64_t maxChunks = (a->k.tokens + c.chunkSize - 1) / c.chunkSize;
  CheckIds(off.data, size_t(c.kvHeads), ids, maxChunks, false, what + ".chunkIds", "kv head",
           " (chunks of the source's " + std::to_string(a->k.tokens) + " tokens)");
  auto placed = std::make_shared<std::vector<int32_t>>(size_t(c.kvHeads));
  Prepared op;
  op.keep = {a->k.array, a->v.array, off.object, ids.object};
  const int32_t* offD = off.data;
  const int32_t* idsD = ids.data;
  op.run = [a, placed, offD, idsD] {
    Tier::LayerLock lock(*a->tier, a->seq, a->layer);
    const Source src{&a->k, &a->v};
    for (int h = 0; h < a->tier->config().kvHeads; ++h)
      (*placed)[size_t(h)] = a->tier->Warm(a->seq, a->layer, h, idsD + offD[h], offD[h + 1] - offD[h], src);
  };
  op.done = [placed](Napi::Env env) -> Napi::Value {
    auto r = Napi::Int32Array::New(env, placed->size());
    for (size_t h = 0; h < placed->size(); ++h) r[h] = (*placed)[h];
    return r;
  };
  return op;
}

// Cumulative counters per (layer, kv head), summed over sequences (or for one sequence).
Napi::Value Stats(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "hotTier.stats";
    auto t = Acquire(Handle(info, what));
    const TierConfig& c = t->config();
    int seqLo = 0, seqHi = c.sequences;
    if (info.Length() > 1 && !info[1].IsUndefined()) {
      if (!info[1].IsNumber()) Throw("E_TYPE", what + ".sequence: expected an integer");
      const double s = info[1].As<Napi::Number>().DoubleValue();
      if (s != std::floor(s) || s < 0 || s >= c.sequences)
        Throw("E_RANGE", what + ".sequence: expected an integer in [0, " + std::to_string(c.sequences - 1) + "], got " + Num(s));
      seqLo = int(s);
      seqHi = seqLo + 1;
    }
    std::vector<Counters> per(size_t(c.layers) * c.kvHeads);
    std::vector<double> resident(per.size(), 0.0);
    // Pair state is written by fetch / attend / warm on other threads: read it under each layer's lock.
    for (int s = seqLo; s < seqHi; ++s)
      for (int l = 0; l < c.layers; ++l) {
        Tier::LayerLock lock(*t, s, l, Tier::Wait::kYes);
        for (int h = 0; h < c.kvHeads; ++h) {
          const PairState& p = t->Pair(s, l, h);
          per[size_t(l) * c.kvHeads + h].Add(p.total);
          resident[size_t(l) * c.kvHeads + h] += p.resident;
        }
      }
    Napi::Object o = CountersObject(info.Env(), per);
    o.Set("resident", F64(info.Env(), resident));
    return o;
  });
}

Napi::Value Residents(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "hotTier.residents";
    auto t = Acquire(Handle(info, what));
    Napi::Object o = GetOptionsArg(info, 1, what);
    const TierConfig& c = t->config();
    const int seq = int(GetIntOr(o, "sequence", what, 0, c.sequences - 1, 0));
    const int layer = int(GetInt(o, "layer", what, 0, c.layers - 1));
    const int head = int(GetInt(o, "head", what, 0, c.kvHeads - 1));
    std::vector<int32_t> ids;
    {
      Tier::LayerLock lock(*t, seq, layer, Tier::Wait::kYes);
      for (int32_t ch : t->Pair(seq, layer, head).slotChunk)
        if (ch >= 0) ids.push_back(ch);
    }
    std::sort(ids.begin(), ids.end());
    auto a = Napi::Int32Array::New(info.Env(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) a[i] = ids[i];
    return a;
  });
}

// hotTierResetSequence(handle, sequence): empties that sequence's arenas (its handle is reused).
Napi::Value ResetSequenceBinding(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "hotTier.resetSequence";
    auto t = Acquire(Handle(info, what));
    const TierConfig& c = t->config();
    if (info.Length() < 2 || !info[1].IsNumber()) Throw("E_TYPE", what + ".sequence: expected an integer, got " + (info.Length() < 2 ? std::string("nothing") : std::string("a non-number")));
    const double s = info[1].As<Napi::Number>().DoubleValue();
    if (s != std::floor(s) || s < 0 || s >= c.sequences)
      Throw("E_RANGE", what + ".sequence: expected an integer in [0, " + std::to_string(c.sequences - 1) + "], got " + Num(s));
    t->ResetSequence(int(s));
    return info.Env().Undefined();
  });
}

Napi::Value CheckBinding(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto t = Acquire(Handle(info, "hotTier.check"));
    return Napi::String::New(info.Env(), t->Check());
  });
}

// Warm-up importance (SnapKV-style): for each kv head, the attention probability mass every chunk
// receives from the observation queries (each query at absolute position positions[w] attends keys
// [0, min(positions[w] + 1, k.tokens))), summed over the GQA group and the queries and divided by
// their count. q: Float32Array(W × qHeads × dim). Returns Float32Array(kvHeads × ceil(tokens/chunkSize)).
Prepared PrepareImportance(const Napi::CallbackInfo& info) {
  const std::string what = "hotTierImportance";
  Napi::Object o = GetOptionsArg(info, 0, what);
  auto k = std::make_shared<KvView>(GetKvView(o.Get("k"), what + ".k"));
  const int qHeads = GetQHeads(o, k->heads, what);
  const int group = qHeads / k->heads;
  const int64_t cs = GetInt(o, "chunkSize", what, 1, 1 << 16);
  auto pos = GetI32(o.Get("positions"), what + ".positions");
  if (pos.length == 0) Throw("E_SHAPE", what + ".positions: expected at least one observation query, got 0");
  auto q = GetF32(o.Get("q"), what + ".q");
  ExpectLength(q.length, CheckedMul(pos.length, uint64_t(qHeads), uint64_t(k->dim), what + ".q size"),
               what + ".q (queries*qHeads*dim)");
  for (size_t i = 0; i < q.length; ++i)
    if (!std::isfinite(q.data[i])) Throw("E_NONFINITE", what + ".q: element " + std::to_string(i) + " is NaN/Inf; expected finite values");
  for (size_t w = 0; w < pos.length; ++w)
    if (pos.data[w] < 0) Throw("E_RANGE", what + ".positions[" + std::to_string(w) + "]: expected >= 0, got " + std::to_string(pos.data[w]));
  const int64_t nChunks = (k->tokens + cs - 1) / cs;
  auto scores = NewF32(info.Env(), uint64_t(k->heads) * uint64_t(nChunks), what + " scores");
  auto result = std::make_shared<Napi::ObjectReference>(Napi::Persistent(scores.As<Napi::Object>()));
  Prepared op;
  op.keep = {k->array, q.object, pos.object, scores};
  const float* qd = q.data;
  const int32_t* posD = pos.data;
  const size_t nPos = pos.length;
  float* out = scores.Data();
  op.run = [k, qd, posD, nPos, out, qHeads, group, cs, nChunks, what] {
    const float scale = 1.f / std::sqrt(float(k->dim));
    std::vector<double> acc(static_cast<size_t>(nChunks));
    std::vector<float> probs;
    for (int h = 0; h < k->heads; ++h) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t w = 0; w < nPos; ++w) {
        const int64_t len = std::min<int64_t>(int64_t(posD[w]) + 1, k->tokens);
        if (len <= 0) continue;
        Span sp{k->Row(0, h), k->Row(0, h), len, k->tokenStride, k->tokenStride};
        probs.assign(size_t(group) * size_t(len), 0.f);
        try {
          AttentionProbsHeadSpans(qd + (w * qHeads + size_t(h) * group) * k->dim, group, k->dim, k->dtype, scale, &sp, 1,
                                  probs.data());
        } catch (const NonFiniteRowError& e) {
          Throw("E_NONFINITE", what + ".k: kv head " + std::to_string(h) + ", token " + std::to_string(e.row) + ": NaN/Inf in the key row");
        }
        for (int g = 0; g < group; ++g)
          for (int64_t t = 0; t < len; ++t) acc[size_t(t / cs)] += probs[size_t(g) * size_t(len) + size_t(t)];
      }
      const double norm = 1.0 / double(nPos * size_t(group));
      for (int64_t ch = 0; ch < nChunks; ++ch) out[size_t(h) * size_t(nChunks) + size_t(ch)] = float(acc[size_t(ch)] * norm);
    }
  };
  op.done = [result](Napi::Env) -> Napi::Value { return result->Value(); };
  return op;
}

void InitHotTier(Napi::Env env, Napi::Object exports) {
  exports.Set("hotTierCreate", Napi::Function::New(env, Create));
  exports.Set("hotTierDestroy", Napi::Function::New(env, Destroy));
  exports.Set("hotTierInfo", Napi::Function::New(env, Info));
  exports.Set("hotTierFetch", Napi::Function::New(env, RunSync<PrepareFetch>));
  exports.Set("hotTierFetchAsync", Napi::Function::New(env, RunAsync<PrepareFetch>));
  exports.Set("hotTierAttend", Napi::Function::New(env, RunSync<PrepareAttend>));
  exports.Set("hotTierAttendAsync", Napi::Function::New(env, RunAsync<PrepareAttend>));
  exports.Set("hotTierRecordMass", Napi::Function::New(env, RecordMassBinding));
  exports.Set("hotTierWarm", Napi::Function::New(env, RunSync<PrepareWarm>));
  exports.Set("hotTierWarmAsync", Napi::Function::New(env, RunAsync<PrepareWarm>));
  exports.Set("hotTierStats", Napi::Function::New(env, Stats));
  exports.Set("hotTierResidents", Napi::Function::New(env, Residents));
  exports.Set("hotTierResetSequence", Napi::Function::New(env, ResetSequenceBinding));
  exports.Set("hotTierCheck", Napi::Function::New(env, CheckBinding));
  exports.Set("hotTierImportance", Napi::Function::New(env, RunSync<PrepareImportance>));
  exports.Set("hotTierImportanceAsync", Napi::Function::New(env, RunAsync<PrepareImportance>));
}

}  // namespace

KVD_REGISTER_MODULE(InitHotTier);

}  // namespace hot
}  // namespace kvd
