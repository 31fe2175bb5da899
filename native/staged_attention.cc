// attendStaged: sparse attention whose selected chunks come partly from a staging buffer of
// page-first chunks (read from SSD extents by the pipeline's fetch stage) and partly from the
// contiguous DRAM cache (sinks, tail, and chunks newer than the SSD segment).
//
// Staging layout (the fetch stage's contract): the chunk at selection position j of kv head h
// (chunkIds[offsets[h] + j]) is staged at byte (h * maxChunksPerHead + j) * chunkBytes when its id
// is < stagedChunks, page-first: chunkSize K rows then chunkSize V rows, dim f32 each. Entries of
// chunks with id >= stagedChunks are unused (those chunks are read from k/v).
//
// Spans are built exactly as attendSparse builds them (sinks, each selected chunk clipped to
// [sinkEnd, tailStart), tail), in the same order with the same lengths, so by the determinism
// contract of attention.h the output is bit-identical to attendSparse over a cache holding the
// same rows.
#include <napi.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "args.h"
#include "attention.h"
#include "errors.h"
#include "registry.h"

namespace kvd {
namespace {

Napi::Value AttendStaged(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    const std::string what = "attendStaged";
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsObject()) Throw("E_TYPE", what + ": expected an options object");
    Napi::Object o = info[0].As<Napi::Object>();
    KvView k = GetKvView(o.Get("k"), what + ".k");
    KvView v = GetKvView(o.Get("v"), what + ".v");
    if (k.dtype != Dtype::F32 || v.dtype != Dtype::F32) Throw("E_DTYPE", what + ": expected f32 k and v (the staged chunks are f32)");
    if (k.tokens != v.tokens || k.heads != v.heads || k.dim != v.dim)
      Throw("E_SHAPE", what + ".v: expected the shape of k (" + std::to_string(k.tokens) + " x " + std::to_string(k.heads) + " x " +
                           std::to_string(k.dim) + "), got " + std::to_string(v.tokens) + " x " + std::to_string(v.heads) + " x " +
                           std::to_string(v.dim));
    const int hkv = k.heads, dim = k.dim;
    const int qHeads = GetQHeads(o, hkv, what);
    const int group = qHeads / hkv;
    auto q = GetQuery(o, qHeads, dim, what);
    const int64_t maxC = GetInt(o, "maxChunksPerHead", what, 1, int64_t(1) << 30);

    const std::string sw = what + ".selection";
    SelectionRules rules;
    rules.kvHeads = hkv;
    rules.maxTokens = k.tokens;
    const SelectionArg sel = GetSelectionArg(o.Get("selection"), rules, sw);
    const int64_t cs = sel.chunkSize, tokens = sel.tokens, sinkEnd = sel.sinkEnd, tailStart = sel.tailStart;
    const ArrayArg<int32_t>& offsets = sel.offsets;
    const ArrayArg<int32_t>& ids = sel.chunkIds;
    const int64_t nChunks = sel.maxChunks;
    for (int h = 0; h < hkv; ++h) {
      const int64_t n = int64_t(offsets.data[h + 1]) - offsets.data[h];
      if (n > maxC)
        Throw("E_RANGE", sw + ".offsets: expected at most maxChunksPerHead = " + std::to_string(maxC) + " chunks for kv head " +
                             std::to_string(h) + ", got " + std::to_string(n));
    }
    const int64_t stagedChunks = GetInt(o, "stagedChunks", what, 0, nChunks);
    const size_t rowBytes = size_t(dim) * sizeof(float);
    const uint64_t chunkBytes = CheckedMul(2 * uint64_t(cs), rowBytes, what + " chunkBytes");
    auto staged = GetArray<uint8_t>(o.Get("staged"), napi_uint8_array, what + ".staged");
    const uint64_t stagedNeed = CheckedMul(uint64_t(hkv), uint64_t(maxC), chunkBytes, what + ".staged size");
    if (stagedChunks > 0 && staged.length < stagedNeed)
      Throw("E_SHAPE", what + ".staged: expected at least kvHeads x maxChunksPerHead x chunkBytes = " +
                           std::to_string(stagedNeed) + " bytes, got " + std::to_string(staged.length));
    // Same default and rounding as attendSparse.
    const float scale = GetScaleArg(o, dim, what);

    // Spans per head, in attendSparse's order.
    std::vector<std::vector<Span>> spans(static_cast<size_t>(hkv));
    for (int h = 0; h < hkv; ++h) {
      auto& s = spans[size_t(h)];
      auto dram = [&](int64_t a, int64_t b) {
        const int64_t len = b > a ? b - a : 0;
        const int64_t at = len ? a : 0;
        s.push_back(Span{k.Row(at, h), v.Row(at, h), len, k.tokenStride, v.tokenStride});
      };
      if (sinkEnd > 0) dram(0, sinkEnd);
      for (int32_t i = offsets.data[h]; i < offsets.data[h + 1]; ++i) {
        const int64_t c = ids.data[i];
        const int64_t a = std::max(c * cs, sinkEnd), b = std::min((c + 1) * cs, tailStart);
        if (c >= stagedChunks || b <= a) {
          dram(a, b);
          continue;
        }
        const uint8_t* base = staged.data + (size_t(h) * size_t(maxC) + size_t(i - offsets.data[h])) * chunkBytes;
        const size_t skip = size_t(a - c * cs) * rowBytes;
        s.push_back(Span{base + skip, base + size_t(cs) * rowBytes + skip, b - a, dim, dim});
      }
      if (tokens > tailStart) dram(tailStart, tokens);
    }
    auto out = NewF32(env, uint64_t(qHeads) * uint64_t(dim), what + ".out");
    auto lse = NewF32(env, uint64_t(qHeads), what + ".lse");
    std::vector<HeadAttn> heads(static_cast<size_t>(hkv));
    for (int h = 0; h < hkv; ++h) {
      const size_t q0 = size_t(h) * size_t(group);
      heads[size_t(h)] = HeadAttn{q.data + q0 * dim, spans[size_t(h)].data(), spans[size_t(h)].size(), out.Data() + q0 * dim,
                                  lse.Data() + q0, nullptr};
    }
    thread_local AttnScratch scratch;
    try {
      AttendHeadsSpans(heads.data(), heads.size(), group, dim, Dtype::F32, scale, scratch);
    } catch (const NonFiniteRowError& e) {
      Throw("E_NONFINITE", what + ": kv head " + std::to_string(e.head) + ", span " + std::to_string(e.span) + ", row " +
                               std::to_string(e.row) + ": NaN/Inf in a " + (e.inValue ? "value" : "key") + " row");
    }
    Napi::Object r = Napi::Object::New(env);
    r.Set("out", out);
    r.Set("lse", lse);
    return r;
  });
}

void InitStagedAttention(Napi::Env env, Napi::Object exports) {
  exports.Set("attendStaged", Napi::Function::New(env, AttendStaged));
}

}  // namespace

KVD_REGISTER_MODULE(InitStagedAttention);

}  // namespace kvd
