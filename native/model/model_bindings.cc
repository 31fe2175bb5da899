// N-API bindings of the GGUF model forward pass (llama_model.h). Models are reached by handle
// (handles.h). Every argument is checked: tensor descriptors against the mapped file's size and the
// model's dimensions, activations against the lengths the dimensions imply.
#include <napi.h>

#include <memory>
#include <string>

#include "common/args.h"
#include "common/errors.h"
#include "common/handles.h"
#include "model/llama_model.h"
#include "model/parallel.h"
#include "common/registry.h"

namespace kvd {
namespace model {
namespace {

HandleRegistry<LlamaModel>& Models() {
  static HandleRegistry<LlamaModel> r("GGUF model");
  return r;
}

QType GetQType(const Napi::Object& o, const std::string& what) {
  const int64_t code = GetInt(o, "type", what, 0, 1 << 20);
  const QTypeInfo* info = QInfo(int(code));
  if (!info) Throw("E_DTYPE", what + ".type: expected a GGML type code of F32, F16, BF16, Q8_0, Q4_0, Q4_K or Q6_K, got " + std::to_string(code));
  return QType(code);
}

// { offset, type, ne0, ne1 } → a view into the mapping, checked against the expected shape.
Weight GetWeight(const LlamaModel& m, const Napi::Object& spec, const char* key, int64_t cols, int64_t rows) {
  const std::string what = std::string("tensor ") + key;
  Napi::Value v = spec.Get(key);
  if (!v.IsObject()) Throw("E_TYPE", what + ": expected a tensor descriptor { offset, type, ne0, ne1 }");
  Napi::Object o = v.As<Napi::Object>();
  Weight w;
  w.type = GetQType(o, what);
  w.cols = GetInt(o, "ne0", what, 1, int64_t(1) << 32);
  w.rows = GetInt(o, "ne1", what, 1, int64_t(1) << 32);
  if (w.cols != cols || w.rows != rows)
    Throw("E_SHAPE", what + ": expected ne [" + std::to_string(cols) + ", " + std::to_string(rows) + "], got [" +
                         std::to_string(w.cols) + ", " + std::to_string(w.rows) + "]");
  const QTypeInfo* info = QInfo(int(w.type));
  if (w.cols % info->elems != 0)
    Throw("E_SHAPE", what + ": expected ne0 a multiple of " + std::to_string(info->elems) + " (" + info->name + " block), got " + std::to_string(w.cols));
  w.rowBytes = QRowBytes(w.type, size_t(w.cols));
  const int64_t offset = GetInt(o, "offset", what, 0, int64_t(1) << 50);
  const uint64_t end = uint64_t(offset) + uint64_t(w.rows) * w.rowBytes;
  if (end > m.fileBytes())
    Throw("E_MODEL_FORMAT", what + ": expected its " + std::to_string(uint64_t(w.rows) * w.rowBytes) + " bytes at offset " +
                                std::to_string(offset) + " inside the file, got a " + std::to_string(m.fileBytes()) + "-byte file");
  w.data = m.base() + offset;
  return w;
}

// A vector tensor (norm gain, bias) decoded to f32.
std::vector<float> GetVector(const LlamaModel& m, const Napi::Object& spec, const char* key, int64_t n, bool optional) {
  if (optional && spec.Get(key).IsUndefined()) return {};
  Weight w = GetWeight(m, spec, key, n, 1);
  std::vector<float> out(static_cast<size_t>(n));
  Quant().dequant(w.type, w.data, out.data(), size_t(n));
  return out;
}

Napi::Value Open(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    if (info.Length() < 1 || !info[0].IsObject()) Throw("E_TYPE", "ggufModelOpen: expected a model spec object");
    Napi::Object s = info[0].As<Napi::Object>();
    Napi::Value p = s.Get("path");
    if (!p.IsString()) Throw("E_TYPE", "ggufModelOpen.path: expected a string");
    Napi::Value wv = s.Get("weights");
    const std::string weights = wv.IsUndefined() ? "huge-pages" : wv.IsString() ? std::string(wv.As<Napi::String>()) : "";
    if (weights != "huge-pages" && weights != "mmap")
      Throw("E_CONFIG", "ggufModelOpen.weights: expected 'huge-pages' or 'mmap', got " + (wv.IsString() ? "'" + weights + "'" : "a non-string value"));
    auto m = std::make_shared<LlamaModel>(std::string(p.As<Napi::String>()),
                                          weights == "mmap" ? LlamaModel::Placement::kMapped : LlamaModel::Placement::kHugePages);
    ModelDims& d = m->d;
    const std::string w = "ggufModelOpen";
    d.dim = int(GetInt(s, "dim", w, 1, 1 << 16));
    d.hidden = int(GetInt(s, "hidden", w, 1, 1 << 18));
    d.layers = int(GetInt(s, "layers", w, 1, 1 << 10));
    d.heads = int(GetInt(s, "heads", w, 1, 1 << 10));
    d.kvHeads = int(GetInt(s, "kvHeads", w, 1, d.heads));
    d.headSize = int(GetInt(s, "headSize", w, 2, 1 << 12));
    d.vocab = int(GetInt(s, "vocab", w, 1, 1 << 22));
    d.ropeDim = int(GetInt(s, "ropeDim", w, 2, d.headSize));
    if (d.heads % d.kvHeads != 0 || d.ropeDim % 2 != 0)
      Throw("E_SHAPE", "ggufModelOpen: expected heads divisible by kvHeads and an even ropeDim, got heads " + std::to_string(d.heads) +
                           ", kvHeads " + std::to_string(d.kvHeads) + ", ropeDim " + std::to_string(d.ropeDim));
    d.ropeNeox = s.Get("ropeNeox").ToBoolean();
    Napi::Value eps = s.Get("eps");
    if (!eps.IsNumber() || !(eps.As<Napi::Number>().DoubleValue() > 0)) Throw("E_RANGE", "ggufModelOpen.eps: expected a number > 0");
    d.eps = eps.As<Napi::Number>().FloatValue();
    m->threads = int(GetIntOr(s, "threads", w, 1, 1024, MaxThreads()));
    auto inv = GetF32(s.Get("invFreq"), "ggufModelOpen.invFreq");
    ExpectLength(inv.length, size_t(d.ropeDim / 2), "ggufModelOpen.invFreq (ropeDim/2)");
    m->invFreq.assign(inv.data, inv.data + inv.length);

    Napi::Value tv = s.Get("tensors");
    if (!tv.IsObject()) Throw("E_TYPE", "ggufModelOpen.tensors: expected an object");
    Napi::Object t = tv.As<Napi::Object>();
    const int64_t qDim = int64_t(d.heads) * d.headSize, kvDim = int64_t(d.kvHeads) * d.headSize;
    m->tokEmbd = GetWeight(*m, t, "token_embd", d.dim, d.vocab);
    m->output = GetWeight(*m, t, "output", d.dim, d.vocab);
    m->outputNorm = GetVector(*m, t, "output_norm", d.dim, false);
    Napi::Value lv = t.Get("layers");
    if (!lv.IsArray() || lv.As<Napi::Array>().Length() != uint32_t(d.layers))
      Throw("E_SHAPE", "ggufModelOpen.tensors.layers: expected an array of " + std::to_string(d.layers) + " layer descriptors");
    Napi::Array la = lv.As<Napi::Array>();
    for (int l = 0; l < d.layers; ++l) {
      Napi::Value e = la.Get(uint32_t(l));
      if (!e.IsObject()) Throw("E_TYPE", "ggufModelOpen.tensors.layers[" + std::to_string(l) + "]: expected an object");
      Napi::Object o = e.As<Napi::Object>();
      LayerWeights L;
      L.attnNorm = GetVector(*m, o, "attn_norm", d.dim, false);
      L.ffnNorm = GetVector(*m, o, "ffn_norm", d.dim, false);
      L.q = GetWeight(*m, o, "attn_q", d.dim, qDim);
      L.k = GetWeight(*m, o, "attn_k", d.dim, kvDim);
      L.v = GetWeight(*m, o, "attn_v", d.dim, kvDim);
      L.o = GetWeight(*m, o, "attn_output", qDim, d.dim);
      L.qBias = GetVector(*m, o, "attn_q_bias", qDim, true);
      L.kBias = GetVector(*m, o, "attn_k_bias", kvDim, true);
      L.vBias = GetVector(*m, o, "attn_v_bias", kvDim, true);
      L.gate = GetWeight(*m, o, "ffn_gate", d.dim, d.hidden);
      L.up = GetWeight(*m, o, "ffn_up", d.dim, d.hidden);
      L.down = GetWeight(*m, o, "ffn_down", d.hidden, d.dim);
      m->layers.push_back(std::move(L));
    }
    return Napi::Number::New(info.Env(), Models().Add(m));
  });
}

std::shared_ptr<LlamaModel> GetModel(const Napi::CallbackInfo& info, const char* fn) {
  if (info.Length() < 1 || !info[0].IsNumber()) Throw("E_TYPE", std::string(fn) + ": expected a model handle");
  return Models().Get(info[0].As<Napi::Number>().Int64Value());
}

int64_t Arg(const Napi::CallbackInfo& info, size_t i, const std::string& what, int64_t min, int64_t max) {
  if (info.Length() <= i || !info[i].IsNumber()) Throw("E_TYPE", what + ": expected an integer");
  const double v = info[i].As<Napi::Number>().DoubleValue();
  if (v != double(int64_t(v)) || v < double(min) || v > double(max))
    Throw("E_RANGE", what + ": expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " + Num(v));
  return int64_t(v);
}

// Rows T of an activation array: its length must be a positive multiple of `width`.
int64_t Rows(size_t length, int64_t width, const std::string& what) {
  if (length == 0 || length % size_t(width) != 0)
    Throw("E_SHAPE", what + ": expected a positive multiple of " + std::to_string(width) + " elements, got " + std::to_string(length));
  return int64_t(length / size_t(width));
}

Napi::Value Close(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    if (info.Length() < 1 || !info[0].IsNumber()) Throw("E_TYPE", "ggufModelClose: expected a model handle");
    return Napi::Boolean::New(info.Env(), Models().Remove(info[0].As<Napi::Number>().Int64Value()));
  });
}

// (h, tokens Int32Array(T), x Float32Array(T·dim))
Napi::Value Embed(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto m = GetModel(info, "ggufModelEmbed");
    auto tok = GetI32(info[1], "ggufModelEmbed tokens");
    auto x = GetF32(info[2], "ggufModelEmbed x");
    ExpectLength(x.length, tok.length * size_t(m->d.dim), "ggufModelEmbed x (tokens × dim)");
    for (size_t i = 0; i < tok.length; ++i)
      if (tok.data[i] < 0 || tok.data[i] >= m->d.vocab)
        Throw("E_RANGE", "ggufModelEmbed tokens[" + std::to_string(i) + "]: expected a token id in [0, " + std::to_string(m->d.vocab) +
                             "), got " + std::to_string(tok.data[i]));
    m->Embed(tok.data, int64_t(tok.length), x.data);
    return info.Env().Undefined();
  });
}

// (h, layer, pos0, x(T·dim), q(T·qDim), k(T·kvDim), v(T·kvDim))
Napi::Value AttnPre(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto m = GetModel(info, "ggufModelAttnPre");
    const ModelDims& d = m->d;
    const int layer = int(Arg(info, 1, "ggufModelAttnPre layer", 0, d.layers - 1));
    const int64_t pos0 = Arg(info, 2, "ggufModelAttnPre pos0", 0, int64_t(1) << 40);
    auto x = GetF32(info[3], "ggufModelAttnPre x");
    const int64_t T = Rows(x.length, d.dim, "ggufModelAttnPre x");
    auto q = GetF32(info[4], "ggufModelAttnPre q");
    auto k = GetF32(info[5], "ggufModelAttnPre k");
    auto v = GetF32(info[6], "ggufModelAttnPre v");
    ExpectLength(q.length, size_t(T) * d.heads * d.headSize, "ggufModelAttnPre q (T × heads × headSize)");
    ExpectLength(k.length, size_t(T) * d.kvHeads * d.headSize, "ggufModelAttnPre k (T × kvHeads × headSize)");
    ExpectLength(v.length, size_t(T) * d.kvHeads * d.headSize, "ggufModelAttnPre v (T × kvHeads × headSize)");
    m->AttnPre(layer, pos0, T, x.data, q.data, k.data, v.data);
    return info.Env().Undefined();
  });
}

// (h, layer, x(T·dim) updated in place, att(T·qDim))
Napi::Value AttnPost(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto m = GetModel(info, "ggufModelAttnPost");
    const ModelDims& d = m->d;
    const int layer = int(Arg(info, 1, "ggufModelAttnPost layer", 0, d.layers - 1));
    auto x = GetF32(info[2], "ggufModelAttnPost x");
    const int64_t T = Rows(x.length, d.dim, "ggufModelAttnPost x");
    auto att = GetF32(info[3], "ggufModelAttnPost att");
    ExpectLength(att.length, size_t(T) * d.heads * d.headSize, "ggufModelAttnPost att (T × heads × headSize)");
    m->AttnPost(layer, T, x.data, att.data);
    return info.Env().Undefined();
  });
}

// (h, x(dim), logits(vocab))
Napi::Value Logits(const Napi::CallbackInfo& info) {
  return Guard(info, [&]() -> Napi::Value {
    auto m = GetModel(info, "ggufModelLogits");
    auto x = GetF32(info[1], "ggufModelLogits x");
    auto out = GetF32(info[2], "ggufModelLogits logits");
    ExpectLength(x.length, size_t(m->d.dim), "ggufModelLogits x (dim)");
    ExpectLength(out.length, size_t(m->d.vocab), "ggufModelLogits logits (vocab)");
    m->Logits(x.data, out.data);
    return info.Env().Undefined();
  });
}

void Init(Napi::Env env, Napi::Object exports) {
  exports.Set("ggufModelOpen", Napi::Function::New(env, Open));
  exports.Set("ggufModelClose", Napi::Function::New(env, Close));
  exports.Set("ggufModelEmbed", Napi::Function::New(env, Embed));
  exports.Set("ggufModelAttnPre", Napi::Function::New(env, AttnPre));
  exports.Set("ggufModelAttnPost", Napi::Function::New(env, AttnPost));
  exports.Set("ggufModelLogits", Napi::Function::New(env, Logits));
}

}  // namespace

KVD_REGISTER_MODULE(Init);

}  // namespace model
}  // namespace kvd
