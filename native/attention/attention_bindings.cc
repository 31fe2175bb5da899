// JS bindings of the attention kernels: attendDense / attendSparse (sync and Promise-returning
// async), attentionWeights and mergeAttention.
//
// Every argument is validated on the JS thread before any kernel runs (typed errors naming what was
// expected and what was given). Inputs are viewed without copies; outputs are JS Float32Arrays
// allocated up front and filled by the kernel, so the async variants only hold references
// (ObjectReference) to every array they touch until the promise settles.
#include <napi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/args.h"
#include "common/async_work.h"
#include "attention/attention.h"
#include "attention/attention_split.h"
#include "attention/query_args.h"
#include "attention/span_lists.h"
#include "common/errors.h"
#include "common/registry.h"

namespace kvd {
namespace {

// One attention call, fully validated, with raw pointers into JS memory (kept alive by the caller).
struct AttnJob {
  std::string what;  // binding name, for messages
  const float* q = nullptr;
  int qHeads = 0, kvHeads = 0, group = 0, dim = 0, threads = 1;
  float scale = 1.f;
  KvView k, v;
  int64_t tokens = 0;  // attend [0, tokens) (dense) / the selection's context length (sparse)
  bool sparse = false;
  // Selection (sparse only), see src/index/selection.ts.
  int64_t chunkSize = 0, sinkEnd = 0, tailStart = 0;
  const int32_t* offsets = nullptr;
  const int32_t* chunkIds = nullptr;
  size_t nChunks = 0;
  // Outputs.
  float* out = nullptr;        // qHeads x dim
  float* lse = nullptr;        // qHeads
  float* chunkMass = nullptr;  // nChunks (sparse only)
};

// ---- running ----

// Runs every kv head through AttendSplit (the thread pool, split by head and by KV length; the
// result does not depend on the thread count). NaN/Inf errors name the kv head and token. Each
// head's spans, in token order: sinks, each selected chunk clipped to [sinkEnd, tailStart), the
// tail (sparse), or the whole cache (dense).
void RunJob(const AttnJob& job) {
  const size_t n = size_t(job.kvHeads);
  SpanLists& ls = ThreadSpanLists();
  ls.Reserve(job.sparse ? size_t(job.offsets[n] - job.offsets[0]) + 2 * n : n, n);
  size_t at = 0;
  auto add = [&](int h, int64_t a, int64_t b) {
    const int64_t len = b > a ? b - a : 0;
    const int64_t first = len ? a : 0;  // empty spans point at a valid row; nothing is read
    ls.spans[at] = Span{job.k.Row(first, h), job.v.Row(first, h), len, job.k.tokenStride, job.v.tokenStride};
    ls.first[at] = first;
    ++at;
  };
  const size_t firstChunkSpan = job.sparse && job.sinkEnd > 0 ? 1 : 0;  // span of chunkIds[offsets[h]] in head h
  const size_t headOut = size_t(job.group) * size_t(job.dim);
  for (size_t h = 0; h < n; ++h) {
    ls.start[h] = at;
    const int hi = int(h);
    if (!job.sparse) {
      add(hi, 0, job.tokens);
    } else {
      if (job.sinkEnd > 0) add(hi, 0, job.sinkEnd);
      for (int32_t i = job.offsets[h]; i < job.offsets[h + 1]; ++i) {
        const int64_t c = job.chunkIds[i];
        add(hi, std::max(c * job.chunkSize, job.sinkEnd), std::min((c + 1) * job.chunkSize, job.tailStart));
      }
      if (job.tokens > job.tailStart) add(hi, job.tailStart, job.tokens);
    }
    const size_t qOff = h * size_t(job.group);
    ls.heads[h] = HeadAttn{job.q + qOff * size_t(job.dim), ls.spans.data() + ls.start[h], at - ls.start[h],
                           job.out + h * headOut, job.lse + qOff, job.sparse ? ls.mass.data() + ls.start[h] : nullptr};
  }
  ls.start[n] = at;
  try {
    AttendSplit(ls.heads.data(), n, job.group, job.dim, job.k.dtype, job.scale, job.threads);
  } catch (const NonFiniteRowError& e) {
    const int h = int(e.head);
    if (e.span >= ls.heads[e.head].nSpans)
      Throw("E_NONFINITE", job.what + ": kv head " + std::to_string(h) + ": " + e.what());
    const int64_t token = ls.first[ls.start[e.head] + e.span] + e.row;
    Throw("E_NONFINITE", job.what + ": " + (e.inValue ? "v" : "k") + ": kv head " + std::to_string(h) + ", token " +
                             std::to_string(token) + ": NaN/Inf in the " + (e.inValue ? "value" : "key") +
                             " row (attention " + (e.inValue ? "output" : "logit") + " is not finite)");
  }
  if (job.sparse) {
    for (size_t h = 0; h < n; ++h)
      for (int32_t c = job.offsets[h]; c < job.offsets[h + 1]; ++c)
        job.chunkMass[c] = ls.mass[ls.start[h] + firstChunkSpan + size_t(c - job.offsets[h])];
  }
}

// ---- parsing ----

Napi::Object GetOptions(const Napi::CallbackInfo& info, const std::string& what) {
  return GetOptionsArg(info, 0, what, "{ q, qHeads, k, v, ... }");
}

// q, qHeads, k (and v when withValues), scale, threads: everything but the token range.
void ParseCommon(const Napi::Object& o, AttnJob& job, bool withValues, std::vector<Napi::Object>& keep) {
  const std::string& what = job.what;
  job.k = GetKvView(o.Get("k"), what + ".k");
  job.kvHeads = job.k.heads;
  job.dim = job.k.dim;
  if (withValues) {
    job.v = GetKvView(o.Get("v"), what + ".v");
    if (job.v.tokens != job.k.tokens || job.v.heads != job.k.heads || job.v.dim != job.k.dim)
      Throw("E_SHAPE", what + ".v: expected the shape of k (tokens " + std::to_string(job.k.tokens) + ", heads " +
                           std::to_string(job.k.heads) + ", dim " + std::to_string(job.k.dim) + "), got tokens " +
                           std::to_string(job.v.tokens) + ", heads " + std::to_string(job.v.heads) + ", dim " +
                           std::to_string(job.v.dim));
    if (job.v.dtype != job.k.dtype)
      Throw("E_DTYPE", what + ".v.dtype: expected the dtype of k ('" + DtypeName(job.k.dtype) + "'), got '" +
                           DtypeName(job.v.dtype) + "'");
    keep.push_back(job.v.array);
  }
  keep.push_back(job.k.array);
  ReadQueryArgs(o, job, what, keep);
}

void ParseSelection(const Napi::Object& o, AttnJob& job, std::vector<Napi::Object>& keep) {
  SelectionRules rules;
  rules.kvHeads = job.kvHeads;
  rules.maxTokens = job.k.tokens;
  SetSelection(job, GetSelectionArg(o.Get("selection"), rules, job.what + ".selection"), keep);
}

// Parses the call and allocates its outputs (JS arrays, written by the kernel). `result` is the
// object the call returns / resolves to.
AttnJob Prepare(const Napi::CallbackInfo& info, const std::string& what, bool sparse, std::vector<Napi::Object>& keep,
                Napi::Object& result) {
  Napi::Env env = info.Env();
  Napi::Object o = GetOptions(info, what);
  AttnJob job;
  job.what = what;
  job.sparse = sparse;
  ParseCommon(o, job, true, keep);
  if (sparse) ParseSelection(o, job, keep);
  else job.tokens = GetIntOr(o, "tokens", what, 0, job.k.tokens, job.k.tokens);

  auto out = NewF32(env, uint64_t(job.qHeads) * uint64_t(job.dim), what + ".out");
  auto lse = NewF32(env, uint64_t(job.qHeads), what + ".lse");
  job.out = out.Data();
  job.lse = lse.Data();
  result = Napi::Object::New(env);
  result.Set("out", out);
  result.Set("lse", lse);
  keep.push_back(out);
  keep.push_back(lse);
  if (sparse) {
    auto mass = NewF32(env, job.nChunks, what + ".chunkMass");
    job.chunkMass = mass.Data();
    result.Set("chunkMass", mass);
    keep.push_back(mass);
  }
  return job;
}

// ---- bindings ----

Napi::Value AttendSync(const Napi::CallbackInfo& info, bool sparse) {
  return Guard(info, [&]() -> Napi::Value {
    std::vector<Napi::Object> keep;
    Napi::Object result;
    AttnJob job = Prepare(info, sparse ? "attendSparse" : "attendDense", sparse, keep, result);
    RunJob(job);
    return result;
  });
}

// Runs the job on the libuv pool (PromiseWorker holds a reference to every typed array the job
// points into, inputs and outputs, until the promise settles); validation errors reject the promise.
Napi::Value AttendAsync(const Napi::CallbackInfo& info, bool sparse) {
  const std::string what = sparse ? "attendSparseAsync" : "attendDenseAsync";
  return GuardPromise(info.Env(), what, [&]() -> Napi::Value {
    std::vector<Napi::Object> keep;
    Napi::Object result;
    AttnJob job = Prepare(info, what, sparse, keep, result);
    auto ref = std::make_shared<Napi::ObjectReference>(Napi::Persistent(result));
    return PromiseWorker::Start(
        info.Env(), [job]() { RunJob(job); }, [ref](Napi::Env) -> Napi::Value { return ref->Value(); }, keep,
        WorkerLabels{"kvdrive:attend", "", "the attention scratch buffers"});
  });
}

Napi::Value AttendDense(const Napi::CallbackInfo& info) { return AttendSync(info, false); }
Napi::Value AttendSparse(const Napi::CallbackInfo& info) { return AttendSync(info, true); }
Napi::Value AttendDenseAsync(const Napi::CallbackInfo& info) { return AttendAsync(info, false); }
Napi::Value AttendSparseAsync(const Napi::CallbackInfo& info) { return AttendAsync(info, true); }

// attentionWeights({ q, qHeads, k, tokens?, scale?, into? }) -> Float32Array(qHeads * tokens) (`into`
// when given), row h = softmax probabilities of query head h over tokens [0, tokens).
Napi::Value AttentionWeights(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "attentionWeights";
    Napi::Object o = GetOptions(info, what);
    std::vector<Napi::Object> keep;
    AttnJob job;
    job.what = what;
    ParseCommon(o, job, false, keep);
    job.tokens = GetIntOr(o, "tokens", what, 0, job.k.tokens, job.k.tokens);
    const size_t T = size_t(job.tokens);
    const uint64_t n = CheckedMul(uint64_t(job.qHeads), T, what + " qHeads*tokens");
    // `into`: the caller's array (an eval reusing one per step: a fresh qHeads x tokens array per
    // step, 16 MiB at 128K, is garbage the next timed row's GC would pay for), else a new one.
    Napi::Float32Array probs;
    const Napi::Value iv = o.Get("into");
    if (iv.IsUndefined()) {
      probs = NewF32(info.Env(), n, what + " (qHeads*tokens)");
    } else {
      auto into = GetF32(iv, what + ".into");
      ExpectLength(into.length, size_t(n), what + ".into (qHeads x tokens)");
      // The probabilities are written head by head while q and k are still read: an `into` sharing
      // memory with either would be read back half overwritten (no crash, wrong numbers).
      const auto overlaps = [&](const void* p, size_t bytes) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(into.data), b = reinterpret_cast<uintptr_t>(p);
        return n > 0 && bytes > 0 && a < b + bytes && b < a + size_t(n) * sizeof(float);
      };
      const size_t qBytes = size_t(job.qHeads) * size_t(job.dim) * sizeof(float);
      const size_t kBytes = size_t(job.k.tokens) * size_t(job.k.heads) * size_t(job.k.dim) * DtypeSize(job.k.dtype);
      if (overlaps(job.q, qBytes) || overlaps(job.k.data, kBytes))
        Throw("E_CONFIG", what + ".into: expected an array sharing no memory with q or k (it is written while they are read), got one overlapping " +
                              (overlaps(job.q, qBytes) ? "q" : "k.data"));
      probs = into.object.As<Napi::Float32Array>();
    }
    for (int h = 0; h < job.kvHeads; ++h) {
      const size_t qOff = size_t(h) * size_t(job.group);
      Span span{job.k.Row(0, h), job.k.Row(0, h), job.tokens, job.k.tokenStride, job.k.tokenStride};
      try {
        AttentionProbsHeadSpans(job.q + qOff * size_t(job.dim), job.group, job.dim, job.k.dtype, job.scale, &span, 1,
                                probs.Data() + qOff * T);
      } catch (const NonFiniteRowError& e) {
        Throw("E_NONFINITE", what + ": k: kv head " + std::to_string(h) + ", token " + std::to_string(e.row) +
                                 ": NaN/Inf in the key row (attention logit is not finite)");
      }
    }
    return probs;
  });
}

// mergeAttention(outA, lseA, outB, lseB, heads, dim): (outA, lseA) becomes attention over the union
// of the two disjoint token sets.
Napi::Value MergeAttentionBinding(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "mergeAttention";
    if (info.Length() < 6) Throw("E_TYPE", what + ": expected (outA, lseA, outB, lseB, heads, dim), got " + std::to_string(info.Length()) + " arguments");
    auto intArg = [&](size_t i, const char* name) -> int {
      if (!info[i].IsNumber()) Throw("E_TYPE", what + ": " + name + ": expected an integer, got a non-number");
      const double d = info[i].As<Napi::Number>().DoubleValue();
      if (d != std::floor(d) || d < 1 || d > double(1 << 30))
        Throw("E_RANGE", what + ": " + name + ": expected an integer in [1, 2^30], got " + Num(d));
      return int(d);
    };
    const int heads = intArg(4, "heads"), dim = intArg(5, "dim");
    auto outA = GetF32(info[0], what + ": outA");
    auto lseA = GetF32(info[1], what + ": lseA");
    auto outB = GetF32(info[2], what + ": outB");
    auto lseB = GetF32(info[3], what + ": lseB");
    const size_t n = size_t(heads) * size_t(dim);
    ExpectLength(outA.length, n, what + ": outA (heads*dim)");
    ExpectLength(outB.length, n, what + ": outB (heads*dim)");
    ExpectLength(lseA.length, size_t(heads), what + ": lseA (heads)");
    ExpectLength(lseB.length, size_t(heads), what + ": lseB (heads)");
    // lse = -inf is a valid partial (attention over no tokens); NaN and +inf are not.
    auto checkLse = [&](const float* l, const char* name) {
      for (int h = 0; h < heads; ++h)
        if (std::isnan(l[h]) || l[h] == INFINITY)
          Throw("E_NONFINITE", what + ": " + name + "[" + std::to_string(h) + "]: expected a finite log-sum-exp or -Infinity, got " + Num(l[h]));
    };
    checkLse(lseA.data, "lseA");
    checkLse(lseB.data, "lseB");
    auto checkOut = [&](const float* o, const char* name) {
      for (size_t i = 0; i < n; ++i)
        if (!std::isfinite(o[i]))
          Throw("E_NONFINITE", what + ": " + name + ": head " + std::to_string(i / size_t(dim)) + " holds NaN/Inf (at element " + std::to_string(i % size_t(dim)) + ")");
    };
    checkOut(outA.data, "outA");
    checkOut(outB.data, "outB");
    MergeAttention(outA.data, lseA.data, outB.data, lseB.data, heads, dim);
    return info.Env().Undefined();
  });
}

void InitAttention(Napi::Env env, Napi::Object exports) {
  exports.Set("attendDense", Napi::Function::New(env, AttendDense));
  exports.Set("attendSparse", Napi::Function::New(env, AttendSparse));
  exports.Set("attendDenseAsync", Napi::Function::New(env, AttendDenseAsync));
  exports.Set("attendSparseAsync", Napi::Function::New(env, AttendSparseAsync));
  exports.Set("attentionWeights", Napi::Function::New(env, AttentionWeights));
  exports.Set("mergeAttention", Napi::Function::New(env, MergeAttentionBinding));
}

}  // namespace

KVD_REGISTER_MODULE(InitAttention);

}  // namespace kvd
