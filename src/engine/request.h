// Request: one generation request as the engine thread sees it: its tokens, sampling parameters,
// KV pages and a small state machine. Owned by the engine; mutated only on the engine thread
// (ScheduleState and the engine loop). Illegal state transitions are bugs and CHECK-fail.
//
//   kWaiting ──admit──> kPrefilling ──last chunk + first token──> kDecoding ──> kFinished
//      │                    │   ▲                                      │
//      │                    │   └──────────── re-admit ── kRetracted <─┘ (pages given back)
//      └────────────────────┴── abort / reject (any live state) ──> kAborted
//
// A retracted request keeps its output tokens; it re-prefills prompt + output (reusing whatever of
// it the radix cache still holds) and then continues decoding.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "engine/sampling_params.h"
#include "kv/radix_cache.h"

namespace strata {

enum class RequestState { kWaiting, kPrefilling, kDecoding, kRetracted, kFinished, kAborted };
inline constexpr EnumName<RequestState> kRequestStateNames[] = {
    {RequestState::kWaiting, "waiting"},   {RequestState::kPrefilling, "prefilling"},
    {RequestState::kDecoding, "decoding"}, {RequestState::kRetracted, "retracted"},
    {RequestState::kFinished, "finished"}, {RequestState::kAborted, "aborted"}};
constexpr const auto& enum_names(RequestState) { return kRequestStateNames; }
inline const char* request_state_name(RequestState s) { return enum_name(s).data(); }

enum class FinishReason { kNone, kStop, kLength, kAbort };
// "stop", "length", "abort" (OpenAI names, but abort) and "none".
inline constexpr EnumName<FinishReason> kFinishReasonNames[] = {{FinishReason::kNone, "none"},
                                                                {FinishReason::kStop, "stop"},
                                                                {FinishReason::kLength, "length"},
                                                                {FinishReason::kAbort, "abort"}};
constexpr const auto& enum_names(FinishReason) { return kFinishReasonNames; }
inline const char* finish_reason_name(FinishReason r) { return enum_name(r).data(); }

class Request {
 public:
  using Clock = std::chrono::steady_clock;

  Request(int64_t id, std::vector<int32_t> prompt_ids, SamplingParams params);

  int64_t id() const { return id_; }
  RequestState state() const { return state_; }
  bool is_live() const {
    return state_ != RequestState::kFinished && state_ != RequestState::kAborted;
  }
  bool is_running() const {
    return state_ == RequestState::kPrefilling || state_ == RequestState::kDecoding;
  }
  const SamplingParams& params() const { return params_; }
  const std::vector<int32_t>& prompt_ids() const { return prompt_ids_; }
  const std::vector<int32_t>& output_ids() const { return output_ids_; }
  int32_t prompt_len() const { return static_cast<int32_t>(prompt_ids_.size()); }
  int32_t output_len() const { return static_cast<int32_t>(output_ids_.size()); }
  // Tokens whose KV the request needs: prompt then output. The last sampled token's KV is
  // computed by the next decode step, so while decoding kv_len() == total_len() - 1.
  int32_t total_len() const { return prompt_len() + output_len(); }
  int32_t token_at(int32_t i) const {
    return i < prompt_len() ? prompt_ids_[i] : output_ids_[i - prompt_len()];
  }
  // The first n tokens of prompt + output.
  std::vector<int32_t> tokens(int32_t n) const;

  // Effective output limit: params().max_new_tokens, clamped by the engine so that prompt + output
  // always fits the KV pool (set_max_new_tokens_limit).
  int32_t max_new_tokens() const { return max_new_tokens_; }
  int32_t remaining_new_tokens() const { return std::max(0, max_new_tokens_ - output_len()); }
  void set_max_new_tokens_limit(int32_t limit);

  // KV bookkeeping (ScheduleState writes these).
  int32_t kv_len() const { return kv_len_; }  // tokens whose KV is computed
  void set_kv_len(int32_t n);
  int32_t prefix_hit_tokens() const { return prefix_hit_tokens_; }  // cache hit at last admission
  void set_prefix_hit_tokens(int32_t n) { prefix_hit_tokens_ = n; }
  // Page table: pages[i] holds tokens [i*page_size, (i+1)*page_size). The first
  // cached_pages() come from the radix cache (locked through cache_node()); the rest are the
  // request's own. The request holds one pool reference on each.
  std::vector<PageId>& pages() { return pages_; }
  const std::vector<PageId>& pages() const { return pages_; }
  int32_t cached_pages() const { return cached_pages_; }
  RadixNodeHandle cache_node() const { return cache_node_; }
  void set_cache_lock(RadixNodeHandle node, int32_t cached_pages) {
    cache_node_ = node;
    cached_pages_ = cached_pages;
  }

  // False: admission computes every position instead of sharing a cached prefix (a request whose
  // hidden states are captured needs them all).
  bool use_prefix_cache() const { return use_prefix_cache_; }
  void set_use_prefix_cache(bool on) { use_prefix_cache_ = on; }
  // Prompt logprobs (GenerateRequest::prompt_logprobs_from): >= 0 while the prefill still owes
  // them, the first prompt token scored (>= 1: token 0 has no context); -1 none, or recorded.
  // Each prompt position p in [from - 1, prompt_len - 1) then gets a logits row, scoring token
  // p + 1 (batch_plan.h prompt_score_rows).
  int32_t prompt_score_from() const { return prompt_score_from_; }
  void set_prompt_score_from(int32_t from) { prompt_score_from_ = from; }
  // Queued ahead of the other waiting requests (a capture's one-token tail request: admitted while
  // the pages of the request it completes are still cached).
  bool urgent() const { return urgent_; }
  void set_urgent(bool on) { urgent_ = on; }

  // Transitions (CHECKed).
  void start_prefill();                // kWaiting | kRetracted -> kPrefilling
  void start_decode();                 // kPrefilling -> kDecoding (after its first token)
  void retract();                      // kPrefilling | kDecoding -> kRetracted (kv_len -> 0)
  void finish(FinishReason reason);    // kPrefilling | kDecoding -> kFinished (stop / length)
  void abort(std::string error = "");  // any live state -> kAborted; error empty: client abort

  // Before submission (kWaiting, no output yet): output tokens produced earlier (a resumed
  // generation). Scheduling treats them like a retracted request's: prompt + output is prefilled.
  void preload_output(std::vector<int32_t> tokens);

  // Appends a sampled token. Returns the finish reason it causes (kNone while the request goes
  // on): a stop token or, unless ignore_eos, one of eos_ids -> kStop; the output limit -> kLength.
  // It does not change the state: the caller finishes the request. Stop strings are the
  // detokenizer's business.
  FinishReason append_output(int32_t token, std::span<const int32_t> eos_ids);
  // Drops output tokens past `output_len` (running or just finished: a stop string inside the
  // tokens a speculative step committed); kv_len shrinks to at most total_len().
  void truncate_output(int32_t output_len);

  FinishReason finish_reason() const { return finish_reason_; }
  const std::string& error() const { return error_; }  // why it was aborted by the engine
  int32_t num_retractions() const { return num_retractions_; }
  // Tokens the forward passes computed for this request (prefill chunks, recomputation after a
  // retraction, decode steps); ScheduleState::complete adds each step's.
  int64_t computed_tokens() const { return computed_tokens_; }
  void add_computed_tokens(int32_t n) { computed_tokens_ += n; }

  // Timestamps (steady clock); default-constructed until the event happens.
  Clock::time_point arrival_time() const { return arrival_time_; }
  Clock::time_point first_scheduled_time() const { return first_scheduled_time_; }
  Clock::time_point first_token_time() const { return first_token_time_; }
  Clock::time_point finish_time() const { return finish_time_; }

 private:
  int64_t id_;
  std::vector<int32_t> prompt_ids_;
  std::vector<int32_t> output_ids_;
  SamplingParams params_;
  int32_t max_new_tokens_;
  RequestState state_ = RequestState::kWaiting;
  FinishReason finish_reason_ = FinishReason::kNone;
  std::string error_;
  int32_t kv_len_ = 0;
  bool use_prefix_cache_ = true;
  int32_t prompt_score_from_ = -1;
  bool urgent_ = false;
  int32_t prefix_hit_tokens_ = 0;
  std::vector<PageId> pages_;
  int32_t cached_pages_ = 0;
  RadixNodeHandle cache_node_ = nullptr;
  int32_t num_retractions_ = 0;
  int64_t computed_tokens_ = 0;
  Clock::time_point arrival_time_;
  Clock::time_point first_scheduled_time_{};
  Clock::time_point first_token_time_{};
  Clock::time_point finish_time_{};
};

}  // namespace strata
