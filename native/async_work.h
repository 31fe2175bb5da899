// A promise-returning AsyncWorker: `work` runs on the libuv pool (no JS access there), `done` builds
// the resolved value on the JS thread. Typed arrays whose memory `work` touches are kept alive with
// references for the worker's lifetime. A kvd::Error thrown by `work` rejects the promise with the
// same typed error (code preserved); bad_alloc becomes E_NOMEM, anything else E_INTERNAL.
#pragma once
#include <napi.h>

#include <functional>
#include <new>
#include <string>
#include <vector>

#include "errors.h"

namespace kvd {

class PromiseWorker : public Napi::AsyncWorker {
 public:
  using Work = std::function<void()>;
  using Done = std::function<Napi::Value(Napi::Env)>;

  // Queues the worker and returns its promise.
  static Napi::Promise Start(Napi::Env env, Work work, Done done, const std::vector<Napi::Object>& keep) {
    auto* w = new PromiseWorker(env, std::move(work), std::move(done));
    for (const auto& o : keep) w->keep_.push_back(Napi::Persistent(o));
    Napi::Promise p = w->deferred_.Promise();
    w->Queue();
    return p;
  }

 protected:
  void Execute() override {
    try {
      work_();
    } catch (const Error& e) {
      code_ = e.code;
      SetError(e.what());
    } catch (const std::bad_alloc&) {
      code_ = "E_NOMEM";
      SetError("native allocation failed: not enough memory for the requested buffers");
    } catch (const std::exception& e) {
      code_ = "E_INTERNAL";
      SetError(std::string("internal error: ") + e.what());
    }
  }
  void OnOK() override {
    Napi::Env env = Env();
    try {
      deferred_.Resolve(done_(env));
    } catch (const Error& e) {
      deferred_.Reject(ToJsError(env, e.code, e.what()).Value());
    } catch (const Napi::Error& e) {
      deferred_.Reject(e.Value());
    }
  }
  void OnError(const Napi::Error& e) override {
    deferred_.Reject(ToJsError(Env(), code_.empty() ? "E_INTERNAL" : code_, e.Message()).Value());
  }

 private:
  PromiseWorker(Napi::Env env, Work work, Done done)
      : Napi::AsyncWorker(env, "kvdrive.io"), deferred_(Napi::Promise::Deferred::New(env)),
        work_(std::move(work)), done_(std::move(done)) {}
  Napi::Promise::Deferred deferred_;
  Work work_;
  Done done_;
  std::string code_;
  std::vector<Napi::ObjectReference> keep_;
};

}  // namespace kvd
