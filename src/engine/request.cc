#include "engine/request.h"

#include <algorithm>

#include "core/check.h"

namespace strata {

Request::Request(int64_t id, std::vector<int32_t> prompt_ids, SamplingParams params)
    : id_(id),
      prompt_ids_(std::move(prompt_ids)),
      params_(std::move(params)),
      max_new_tokens_(std::max(0, params_.max_new_tokens)),
      arrival_time_(Clock::now()) {}

std::vector<int32_t> Request::tokens(int32_t n) const {
  CHECK_LE(n, total_len());
  std::vector<int32_t> out;
  out.reserve(n);
  int32_t from_prompt = std::min(n, prompt_len());
  out.insert(out.end(), prompt_ids_.begin(), prompt_ids_.begin() + from_prompt);
  out.insert(out.end(), output_ids_.begin(), output_ids_.begin() + (n - from_prompt));
  return out;
}

void Request::set_max_new_tokens_limit(int32_t limit) {
  max_new_tokens_ = std::max(0, std::min(max_new_tokens_, limit));
}

void Request::set_kv_len(int32_t n) {
  CHECK_MSG(n >= 0 && n <= total_len(), "request {}: kv_len {} of {} tokens", id_, n, total_len());
  kv_len_ = n;
}

void Request::start_prefill() {
  CHECK_MSG(state_ == RequestState::kWaiting || state_ == RequestState::kRetracted,
            "request {}: start_prefill from {}", id_, request_state_name(state_));
  if (first_scheduled_time_ == Clock::time_point{}) first_scheduled_time_ = Clock::now();
  state_ = RequestState::kPrefilling;
}

void Request::start_decode() {
  CHECK_MSG(state_ == RequestState::kPrefilling, "request {}: start_decode from {}", id_,
            request_state_name(state_));
  CHECK_GT(output_len(), 0);
  state_ = RequestState::kDecoding;
}

void Request::retract() {
  CHECK_MSG(is_running(), "request {}: retract from {}", id_, request_state_name(state_));
  CHECK_MSG(pages_.empty() && cache_node_ == nullptr, "request {}: retract with pages held", id_);
  state_ = RequestState::kRetracted;
  kv_len_ = 0;
  ++num_retractions_;
}

void Request::finish(FinishReason reason) {
  CHECK_MSG(is_running(), "request {}: finish from {}", id_, request_state_name(state_));
  CHECK(reason == FinishReason::kStop || reason == FinishReason::kLength);
  CHECK_MSG(pages_.empty() && cache_node_ == nullptr, "request {}: finish with pages held", id_);
  state_ = RequestState::kFinished;
  finish_reason_ = reason;
  finish_time_ = Clock::now();
}

void Request::abort(std::string error) {
  CHECK_MSG(is_live(), "request {}: abort from {}", id_, request_state_name(state_));
  CHECK_MSG(pages_.empty() && cache_node_ == nullptr, "request {}: abort with pages held", id_);
  state_ = RequestState::kAborted;
  finish_reason_ = FinishReason::kAbort;
  error_ = std::move(error);
  finish_time_ = Clock::now();
}

void Request::preload_output(std::vector<int32_t> tokens) {
  CHECK_MSG(state_ == RequestState::kWaiting && output_ids_.empty(),
            "request {}: preload_output while {}", id_, request_state_name(state_));
  output_ids_ = std::move(tokens);
}

FinishReason Request::append_output(int32_t token, std::span<const int32_t> eos_ids) {
  CHECK_MSG(is_running(), "request {}: token appended while {}", id_, request_state_name(state_));
  output_ids_.push_back(token);
  if (first_token_time_ == Clock::time_point{}) first_token_time_ = Clock::now();
  const auto& stops = params_.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) return FinishReason::kStop;
  if (!params_.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end())
    return FinishReason::kStop;
  if (output_len() >= max_new_tokens_) return FinishReason::kLength;
  return FinishReason::kNone;
}

void Request::truncate_output(int32_t output_len) {
  CHECK_MSG((is_running() || state_ == RequestState::kFinished) && output_len >= 0 &&
                output_len <= this->output_len(),
            "request {}: truncate_output({}) of {} while {}", id_, output_len, this->output_len(),
            request_state_name(state_));
  output_ids_.resize(size_t(output_len));
  kv_len_ = std::min(kv_len_, total_len());
}

}  // namespace strata
