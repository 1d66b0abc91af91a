// A request's event stream (the engine thread's side of StreamEvent): each step's tokens
// detokenized, stop strings cut, text held back while it could still begin one, the prompt's
// logprobs with the first token; then the finished event and the request's share of the stats.
#include <algorithm>
#include <string>

#include "engine/engine.h"
#include "engine/live_request.h"
#include "engine/spec/drafter.h"

namespace strata {
namespace {

// Largest prefix length <= n that does not cut a UTF-8 sequence.
size_t utf8_safe_prefix(const std::string& s, size_t n) {
  while (n > 0 && n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

}  // namespace

// Streams one step's tokens of a request: detokenize, check stop strings, hold back text that
// could still begin a stop string.
void Engine::emit(Live& live, std::vector<int32_t> tokens, std::vector<TokenLogprobs> logprobs,
                  bool resumed, int32_t later) {
  if (live.stopped_by_string) return;
  for (int32_t t : tokens) live.pending_text += live.decoder.push(t);
  StreamEvent ev;
  ev.resumed = resumed;
  ev.rng_draws = live.rng.draws();
  ev.token_ids = std::move(tokens);
  ev.logprobs = std::move(logprobs);
  // The prompt's logprobs go with the first output token: every prompt row is scored by the step
  // that samples it, and a retraction after it prefills the prompt again without scoring.
  if (live.prompt_logprobs_pending && !resumed) {
    ev.prompt_logprobs = std::move(live.prompt_logprobs);
    ev.prompt_logprobs_from = live.prompt_logprobs_from;
    live.prompt_logprobs_pending = false;
    live.request.set_prompt_score_from(-1);
  }
  const SamplingParams& params = live.request.params();
  // Stop strings count from min_new_tokens on (text before it is emitted, never searched).
  const bool look = live.request.output_len() >= params.min_new_tokens;
  size_t stop_at = std::string::npos, stop_len = 0;  // the first match (the longest there)
  for (const auto& s : params.stop_strings) {
    if (!look || s.empty()) continue;
    const size_t p = live.pending_text.find(s);
    if (p != std::string::npos && (p < stop_at || (p == stop_at && s.size() > stop_len))) {
      stop_at = p;
      stop_len = s.size();
    }
  }
  if (stop_at != std::string::npos) {
    ev.text =
        live.pending_text.substr(0, stop_at + (params.include_stop_str_in_output ? stop_len : 0));
    live.pending_text.clear();
    live.stopped_by_string = true;
  } else {
    const size_t hold = live.max_stop_len > 0 ? live.max_stop_len - 1 : 0;
    const size_t n = live.pending_text.size() > hold
                         ? utf8_safe_prefix(live.pending_text, live.pending_text.size() - hold)
                         : 0;
    ev.text = live.pending_text.substr(0, n);
    live.pending_text.erase(0, n);
  }
  ev.prompt_tokens = live.request.prompt_len();
  ev.completion_tokens = live.request.output_len() - later;
  if (live.on_event) live.on_event(ev);
}

void Engine::finalize(Live& live) {
  const Request& r = live.request;
  StreamEvent ev;
  ev.finished = true;
  if (!live.stopped_by_string) ev.text = live.pending_text + live.decoder.finish();
  ev.finish_reason = r.state() == RequestState::kAborted ? FinishReason::kAbort : r.finish_reason();
  if (live.stopped_by_string) ev.finish_reason = FinishReason::kStop;
  ev.error = r.error();
  ev.prompt_tokens = r.prompt_len();
  ev.completion_tokens = r.output_len();
  ev.cached_tokens = r.prefix_hit_tokens();
  ev.spec_verify_ct = live.spec_verify_ct;
  ev.spec_draft_token_num = live.spec_draft_token_num;
  ev.spec_accept_token_num = live.spec_accept_token_num;
  if (drafter_) drafter_->release(r.id());
  if (live.on_event) live.on_event(ev);
  std::lock_guard<std::mutex> lk(mu_);
  if (!live.internal) {  // a health probe is no user traffic
    if (ev.finish_reason == FinishReason::kAbort) {
      ++stats_.requests_aborted_total;
      stats_.aborted_computed_tokens_total += r.computed_tokens();
    } else {
      ++stats_.requests_finished_total;
    }
    stats_.prompt_tokens_total += r.prompt_len();
  }
  ++finalized_pending_;  // leaves live_count_ after the stats reflect it (update_stats)
}

}  // namespace strata
