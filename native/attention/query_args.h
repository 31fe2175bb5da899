// The query side of every attention call (attendSparse / attendDense / attendFetched): qHeads,
// the query vectors, the softmax scale and the worker count, read and validated in one place so
// the bindings cannot drift apart in what they accept.
#pragma once
#include <napi.h>

#include <string>
#include <vector>

#include "common/args.h"

namespace kvd {

// Most workers of the thread pool one attention call may use (its `threads` option).
constexpr int kMaxAttentionThreads = 8;

struct QueryArgs {
  int qHeads = 0, group = 0;  // group: query heads per kv head
  const float* q = nullptr;   // qHeads x dim, finite; kept alive by `keep`
  float scale = 1.f;
  int threads = 1;
};

// Reads o.qHeads (a multiple of kvHeads), o.q (qHeads*dim finite f32), o.scale (default
// 1/sqrt(dim)) and o.threads (1..kMaxAttentionThreads, default 1); the query array is pushed on keep.
inline QueryArgs GetQueryArgs(const Napi::Object& o, int kvHeads, int dim, const std::string& what,
                              std::vector<Napi::Object>& keep) {
  QueryArgs a;
  a.qHeads = GetQHeads(o, kvHeads, what);
  a.group = a.qHeads / kvHeads;
  auto q = GetQuery(o, a.qHeads, dim, what);
  a.q = q.data;
  keep.push_back(q.object);
  a.scale = GetScaleArg(o, dim, what);
  a.threads = int(GetIntOr(o, "threads", what, 1, kMaxAttentionThreads, 1));
  return a;
}

// The same into an attention job's fields (qHeads, group, q, scale, threads), kvHeads and dim
// already set on it.
template <typename Job>
void ReadQueryArgs(const Napi::Object& o, Job& job, const std::string& what, std::vector<Napi::Object>& keep) {
  const QueryArgs a = GetQueryArgs(o, job.kvHeads, job.dim, what, keep);
  job.qHeads = a.qHeads;
  job.group = a.group;
  job.q = a.q;
  job.scale = a.scale;
  job.threads = a.threads;
}

}  // namespace kvd
