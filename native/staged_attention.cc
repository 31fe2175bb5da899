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
    const int qHeads = int(GetInt(o, "qHeads", what, 1, 65536));
    if (qHeads % hkv != 0)
      Throw("E_SHAPE", what + ".qHeads: expected a multiple of kv heads " + std::to_string(hkv) + ", got " + std::to_string(qHeads));
    const int group = qHeads / hkv;
    auto q = GetF32(o.Get("q"), what + ".q");
    ExpectLength(q.length, size_t(qHeads) * dim, what + ".q (qHeads*dim)");
    const int64_t maxC = GetInt(o, "maxChunksPerHead", what, 1, int64_t(1) << 30);

    const std::string sw = what + ".selection";
    Napi::Value sv = o.Get("selection");
    if (!sv.IsObject()) Throw("E_TYPE", sw + ": expected a Selection object { chunkSize, tokens, sinkEnd, tailStart, offsets, chunkIds }");
    Napi::Object sel = sv.As<Napi::Object>();
    const int64_t cs = GetInt(sel, "chunkSize", sw, 1, int64_t(1) << 20);
    const int64_t tokens = GetInt(sel, "tokens", sw, 0, k.tokens);
    const int64_t sinkEnd = GetInt(sel, "sinkEnd", sw, 0, tokens);
    const int64_t tailStart = GetInt(sel, "tailStart", sw, sinkEnd, tokens);
    auto offsets = GetI32(sel.Get("offsets"), sw + ".offsets");
    auto ids = GetI32(sel.Get("chunkIds"), sw + ".chunkIds");
    ExpectLength(offsets.length, size_t(hkv) + 1, sw + ".offsets (kvHeads+1)");
    if (offsets.data[0] != 0 || size_t(offsets.data[hkv]) != ids.length)
      Throw("E_SHAPE", sw + ".offsets: expected CSR offsets from 0 to chunkIds.length " + std::to_string(ids.length));
    const int64_t nChunks = (tokens + cs - 1) / cs;
    for (int h = 0; h < hkv; ++h) {
      const int64_t n = int64_t(offsets.data[h + 1]) - offsets.data[h];
      if (n < 0 || n > maxC)
        Throw("E_RANGE", sw + ".offsets: expected 0..maxChunksPerHead = " + std::to_string(maxC) + " chunks for kv head " +
                             std::to_string(h) + ", got " + std::to_string(n));
      for (int32_t i = offsets.data[h]; i < offsets.data[h + 1]; ++i) {
        if (ids.data[i] < 0 || ids.data[i] >= nChunks || (i > offsets.data[h] && ids.data[i] <= ids.data[i - 1]))
          Throw("E_RANGE", sw + ".chunkIds[" + std::to_string(i) + "]: expected ascending ids in [0, " + std::to_string(nChunks) +
                               "), got " + std::to_string(ids.data[i]));
      }
    }
    const int64_t stagedChunks = GetInt(o, "stagedChunks", what, 0, nChunks);
    const size_t rowBytes = size_t(dim) * sizeof(float);
    const size_t chunkBytes = 2 * size_t(cs) * rowBytes;
    auto staged = GetArray<uint8_t>(o.Get("staged"), napi_uint8_array, what + ".staged");
    if (stagedChunks > 0 && staged.length < size_t(hkv) * size_t(maxC) * chunkBytes)
      Throw("E_SHAPE", what + ".staged: expected at least kvHeads x maxChunksPerHead x chunkBytes = " +
                           std::to_string(size_t(hkv) * size_t(maxC) * chunkBytes) + " bytes, got " + std::to_string(staged.length));
    // Same default and rounding as attendSparse (GetScale in attention_bindings.cc).
    float scale = 1.f / std::sqrt(float(dim));
    Napi::Value scv = o.Get("scale");
    if (!scv.IsUndefined()) {
      const double d = scv.IsNumber() ? scv.As<Napi::Number>().DoubleValue() : -1;
      if (!std::isfinite(d) || d <= 0 || float(d) == 0.f) Throw("E_RANGE", what + ".scale: expected a finite number > 0");
      scale = float(d);
    }

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
    auto out = Napi::Float32Array::New(env, size_t(qHeads) * dim);
    auto lse = Napi::Float32Array::New(env, size_t(qHeads));
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
