// The one promise-returning AsyncWorker of the addon, and the rejection path of async bindings.
//
// PromiseWorker: `work` runs on the libuv pool (no JS access there), `done` builds the resolved
// value on the JS thread. Typed arrays (and any other JS object) whose memory `work` touches are
// kept alive with references for the worker's lifetime. A kvd::Error thrown by `work` rejects the
// promise with the same typed error (code preserved); bad_alloc becomes E_NOMEM, any other
// std::exception E_INTERNAL. `failed`, when given, runs on the JS thread just before a rejection
// (to undo state the binding set when it queued the work).
//
// RejectedPromise / GuardPromise: an async API never throws synchronously; a validation error
// raised before the worker is queued becomes a rejected promise with the same typed error.
#pragma once
#include <napi.h>

#include <exception>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "common/errors.h"

namespace kvd {

// How a worker names itself and its out-of-memory / internal failures.
struct WorkerLabels {
  const char* resource = "kvdrive.io";                 // async resource name (async_hooks)
  std::string prefix;                                  // prepended to E_NOMEM / E_INTERNAL messages
  std::string memoryFor = "the requested buffers";     // "... not enough memory for <memoryFor>"
};

class PromiseWorker : public Napi::AsyncWorker {
 public:
  using Work = std::function<void()>;
  using Done = std::function<Napi::Value(Napi::Env)>;
  using Failed = std::function<void()>;

  // Queues the worker and returns its promise.
  static Napi::Promise Start(Napi::Env env, Work work, Done done, const std::vector<Napi::Object>& keep,
                             WorkerLabels labels = {}, Failed failed = nullptr) {
    auto* w = new PromiseWorker(env, std::move(work), std::move(done), std::move(labels), std::move(failed));
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
      SetError(labels_.prefix + "native allocation failed: not enough memory for " + labels_.memoryFor);
    } catch (const std::exception& e) {
      code_ = "E_INTERNAL";
      SetError(labels_.prefix + "internal error: " + e.what());
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
    if (failed_) failed_();
    deferred_.Reject(ToJsError(Env(), code_.empty() ? "E_INTERNAL" : code_, e.Message()).Value());
  }

 private:
  PromiseWorker(Napi::Env env, Work work, Done done, WorkerLabels labels, Failed failed)
      : Napi::AsyncWorker(env, labels.resource), deferred_(Napi::Promise::Deferred::New(env)),
        work_(std::move(work)), done_(std::move(done)), failed_(std::move(failed)), labels_(std::move(labels)) {}
  Napi::Promise::Deferred deferred_;
  Work work_;
  Done done_;
  Failed failed_;
  WorkerLabels labels_;
  std::string code_;
  std::vector<Napi::ObjectReference> keep_;
};

// A promise already rejected with `error` (from std::current_exception()): kvd::Error keeps its
// code, a Napi::Error passes through as is, bad_alloc becomes E_NOMEM and anything else E_INTERNAL,
// those two messages starting with `what` (the binding's name).
inline Napi::Promise RejectedPromise(Napi::Env env, const std::string& what, std::exception_ptr error) {
  auto d = Napi::Promise::Deferred::New(env);
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    d.Reject(ToJsError(env, e.code, e.what()).Value());
  } catch (const Napi::Error& e) {
    d.Reject(e.Value());
  } catch (const std::bad_alloc&) {
    d.Reject(ToJsError(env, "E_NOMEM", what + ": native allocation failed: not enough memory for the outputs").Value());
  } catch (const std::exception& e) {
    d.Reject(ToJsError(env, "E_INTERNAL", what + ": internal error: " + e.what()).Value());
  } catch (...) {
    d.Reject(ToJsError(env, "E_INTERNAL", what + ": internal error: unknown exception").Value());
  }
  return d.Promise();
}

// Wraps the body of a promise-returning binding (which validates, then PromiseWorker::Start()s):
// any exception it throws becomes RejectedPromise(env, what, ...) instead of a synchronous throw.
template <typename F>
Napi::Value GuardPromise(Napi::Env env, const std::string& what, F&& body) {
  try {
    return body();
  } catch (...) {
    return RejectedPromise(env, what, std::current_exception());
  }
}

}  // namespace kvd
