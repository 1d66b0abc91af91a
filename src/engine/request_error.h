// RequestError: why a generation request was refused, typed so every front end renders it in its
// own terms without parsing text: the server as an OpenAI error body whose `param` names the field
// (server/openai_schema.h, api_error_from), `strata generate` as the failed prompt's error. One
// producer: engine/request_validation.h (and Engine::submit while it shuts down).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace strata {

enum class RequestErrorCode : uint8_t {
  kInvalidValue,           // a value out of range or of the wrong kind: fix the request
  kContextLengthExceeded,  // prompt (+ max_tokens) beyond what this engine can ever hold
  kUnsupported,            // a parameter this engine (or its device) does not implement
  kUnavailable,            // the engine is shutting down: retry elsewhere
};

struct RequestError {
  RequestErrorCode code = RequestErrorCode::kInvalidValue;
  // The offending request field by its OpenAI name ("max_tokens", "logit_bias", "prompt"); empty
  // when no one field is at fault.
  std::string param;
  // A sentence, or (about_value) a predicate on param's value that the front end completes with
  // the name it gives the field: "must be between 0 and 2, got 3" becomes "'temperature' must be
  // between 0 and 2, got 3" on the server and "--temperature must be ..." in `strata generate`.
  std::string message;
  bool about_value = false;

  // The message for a user, `name` standing for param ("'top_p'", "--top-p").
  std::string describe(const std::string& name) const {
    return about_value ? name + " " + message : message;
  }
  // With the request field's own name: "'top_p' must be ...".
  std::string describe() const { return describe("'" + param + "'"); }
  // For callers that only report: InvalidArgument, OutOfRange, Unimplemented or Unavailable with
  // describe().
  Status to_status() const;
};

// A whole-sentence error.
template <typename... Args>
RequestError request_error(RequestErrorCode code, std::string param, fmt::format_string<Args...> f,
                           Args&&... args) {
  return RequestError{.code = code,
                      .param = std::move(param),
                      .message = fmt::format(f, std::forward<Args>(args)...)};
}
// An invalid value of `param`: `f` is the predicate ("must be ..., got ...").
template <typename... Args>
RequestError invalid_value(std::string param, fmt::format_string<Args...> f, Args&&... args) {
  return RequestError{.code = RequestErrorCode::kInvalidValue,
                      .param = std::move(param),
                      .message = fmt::format(f, std::forward<Args>(args)...),
                      .about_value = true};
}

// A request's engine id, or why it was refused (Engine::submit).
class [[nodiscard]] SubmitResult {
 public:
  SubmitResult(int64_t id) : id_(id) {}  // NOLINT: implicit by design, like StatusOr
  SubmitResult(RequestError error) : id_(-1), error_(std::move(error)), failed_(true) {}  // NOLINT
  bool ok() const { return !failed_; }
  int64_t value() const { return id_; }
  int64_t operator*() const { return id_; }
  const RequestError& error() const { return error_; }
  Status status() const { return failed_ ? error_.to_status() : Status(); }

 private:
  int64_t id_;
  RequestError error_{};
  bool failed_ = false;
};

}  // namespace strata
