// Typed errors crossing into JavaScript. Every error carries a stable `code` (the same strings as
// src/errors.ts ErrorCode) and a message saying what was expected and what was given.
// Kernels running off the JS thread throw kvd::Error (a plain C++ exception); the binding layer
// converts it into a JS Error with `code` set, so the same messages appear sync or async.
#pragma once
#include <napi.h>
#include <stdexcept>
#include <string>

namespace kvd {

struct Error : std::runtime_error {
  std::string code;
  Error(std::string c, const std::string& msg) : std::runtime_error(msg), code(std::move(c)) {}
};

// Builds the JS error object (Error with .code and .name = 'KvdriveError').
inline Napi::Error ToJsError(Napi::Env env, const std::string& code, const std::string& msg) {
  Napi::Error e = Napi::Error::New(env, msg);
  e.Set("code", Napi::String::New(env, code));
  e.Set("name", Napi::String::New(env, "KvdriveError"));
  return e;
}

[[noreturn]] inline void Throw(const std::string& code, const std::string& msg) { throw Error(code, msg); }

// Wraps a binding body: kvd::Error -> typed JS error; std::bad_alloc -> E_NOMEM; anything else ->
// E_INTERNAL. Use in every exported function: `return kvd::Guard(info, [&]{ ... });`
template <typename F>
Napi::Value Guard(const Napi::CallbackInfo& info, F&& body) {
  try {
    return body();
  } catch (const Error& e) {
    throw ToJsError(info.Env(), e.code, e.what());
  } catch (const Napi::Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw ToJsError(info.Env(), "E_NOMEM", "native allocation failed: not enough memory for the requested buffers");
  } catch (const std::exception& e) {
    throw ToJsError(info.Env(), "E_INTERNAL", std::string("internal error: ") + e.what());
  }
}

}  // namespace kvd
