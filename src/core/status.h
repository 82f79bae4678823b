#pragma once
// Status and Result<T>: how megatron-cpp reports failures a caller can act on
// (bad flags, bad files, invalid configurations). No exceptions cross module
// boundaries: a rank unwinding while its peers wait in a collective is a hang.
// Invariant violations use MT_CHECK instead, which prints and aborts.

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace mt {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a flag or configuration the user can fix
  kNotFound,         // a file or key that is not there
  kCorrupt,          // a file whose bytes are not what the format says
  kIoError,          // the OS refused a read or write
  kInternal,         // a bug: should never reach a user
};

class Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  static Status invalid(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
  static Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Result<T>: a value or a non-OK Status.
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}             // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}      // NOLINT
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(value()); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }
  Status status() const { return is_ok() ? Status() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace mt

// MT_CHECK(cond, message): for invariants only (bugs, broken contracts).
#define MT_CHECK(cond, msg)                                       \
  do {                                                            \
    if (!(cond)) ::mt::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

#define MT_RETURN_IF_ERROR(expr)            \
  do {                                      \
    ::mt::Status _st = (expr);              \
    if (!_st.is_ok()) return _st;           \
  } while (0)
