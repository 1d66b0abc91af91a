// Status and StatusOr: the error channel for what users and inputs can cause (bad files, bad
// flags, bad requests). Broken invariants use CHECK (check.h) instead.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "core/enum_names.h"

namespace strata {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // malformed input: bad JSON, wrong field type, bad flag value
  kNotFound,            // missing file, tensor, model name
  kOutOfRange,          // prompt longer than the context, value beyond a limit
  kResourceExhausted,   // queue full, KV can never fit
  kUnimplemented,       // a known feature that is not built yet
  kFailedPrecondition,  // e.g. lossy KV without a quality record
  kUnavailable,         // server draining, backend down
  kInternal,
  kDataLoss,  // truncated or corrupt file
};

inline constexpr EnumName<StatusCode> kStatusCodeNames[] = {
    {StatusCode::kOk, "OK"},
    {StatusCode::kInvalidArgument, "InvalidArgument"},
    {StatusCode::kNotFound, "NotFound"},
    {StatusCode::kOutOfRange, "OutOfRange"},
    {StatusCode::kResourceExhausted, "ResourceExhausted"},
    {StatusCode::kUnimplemented, "Unimplemented"},
    {StatusCode::kFailedPrecondition, "FailedPrecondition"},
    {StatusCode::kUnavailable, "Unavailable"},
    {StatusCode::kInternal, "Internal"},
    {StatusCode::kDataLoss, "DataLoss"}};
constexpr const auto& enum_names(StatusCode) { return kStatusCodeNames; }
inline const char* status_code_name(StatusCode code) { return enum_name(code).data(); }

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "NotFound: file x missing"
  std::string to_string() const;

  // Prefixes context: status.with_context("loading {}", path).
  template <typename... Args>
  Status with_context(fmt::format_string<Args...> f, Args&&... args) const {
    if (ok()) return *this;
    return Status(code_, fmt::format(f, std::forward<Args>(args)...) + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_error(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
#define STRATA_ERROR_FN(fn, code)                                                 \
  template <typename... Args>                                                     \
  Status fn(fmt::format_string<Args...> f, Args&&... args) {                      \
    return Status(StatusCode::code, fmt::format(f, std::forward<Args>(args)...)); \
  }
STRATA_ERROR_FN(invalid_argument, kInvalidArgument)
STRATA_ERROR_FN(not_found, kNotFound)
STRATA_ERROR_FN(out_of_range, kOutOfRange)
STRATA_ERROR_FN(resource_exhausted, kResourceExhausted)
STRATA_ERROR_FN(unimplemented, kUnimplemented)
STRATA_ERROR_FN(failed_precondition, kFailedPrecondition)
STRATA_ERROR_FN(unavailable, kUnavailable)
STRATA_ERROR_FN(internal_error, kInternal)
STRATA_ERROR_FN(data_loss, kDataLoss)
#undef STRATA_ERROR_FN

// A value or an error. Access the value only after checking ok().
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace strata

// Returns early with the error of a Status expression.
#define STRATA_RETURN_IF_ERROR(expr) \
  do {                               \
    ::strata::Status _st = (expr);   \
    if (!_st.ok()) return _st;       \
  } while (0)

#define STRATA_CONCAT_INNER(a, b) a##b
#define STRATA_CONCAT(a, b) STRATA_CONCAT_INNER(a, b)
// STRATA_ASSIGN_OR_RETURN(auto x, make_x()); returns the error if make_x() failed.
#define STRATA_ASSIGN_OR_RETURN(decl, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL(STRATA_CONCAT(_status_or_, __COUNTER__), decl, expr)
#define STRATA_ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  decl = std::move(tmp).value()
