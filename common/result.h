// Result<T>: errors as values inside the library (docs/STYLE.md rule 3).
//
// An Error carries what went wrong and, where it helps, how to fix it; the CLI
// and the LibTorch binding turn it into an exit code or a TORCH_CHECK at the edge.
// std::expected is C++23; this is the small subset the project needs on C++20.
#pragma once

#include <cassert>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace lunajit {

enum class ErrorKind {
  invalid_argument,  // bad spec, config, shape or option: the user's input (CLI exit code 2)
  compile_failed,    // NVRTC or the host JIT rejected a source
  unavailable,       // a driver, device or file is missing
  runtime_failure,   // a launch, barrier or I/O failure
};

struct Error {
  ErrorKind kind = ErrorKind::runtime_failure;
  std::string message;

  static Error invalid(std::string msg) { return {ErrorKind::invalid_argument, std::move(msg)}; }
  static Error failure(std::string msg) { return {ErrorKind::runtime_failure, std::move(msg)}; }
  static Error unavailable(std::string msg) { return {ErrorKind::unavailable, std::move(msg)}; }
};

// Thrown only at the edges (CLI, binding, tests) by Result::value_or_throw().
class LunajitError : public std::runtime_error {
 public:
  explicit LunajitError(Error e) : std::runtime_error(e.message), error_(std::move(e)) {}
  const Error& error() const { return error_; }

 private:
  Error error_;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Error error) : v_(std::move(error)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const Error& error() const { assert(!ok()); return std::get<1>(v_); }

  T value_or_throw() && {
    if (!ok()) throw LunajitError(std::get<1>(v_));
    return std::get<0>(std::move(v_));
  }

 private:
  std::variant<T, Error> v_;
};

// Result<void>
struct Ok {};
using Status = Result<Ok>;
inline Status ok_status() { return Ok{}; }

}  // namespace lunajit
