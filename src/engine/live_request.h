// Engine-internal: a request plus what its stream needs (the detokenizer, text held back while
// it could still be the start of a stop string, the sampler's random stream, the counts of its
// output tokens for the penalties).
#pragma once

#include <algorithm>
#include <string>

#include "engine/engine.h"
#include "engine/logit_edits.h"

namespace strata {

struct Engine::Live {
  Live(int64_t id, GenerateRequest g, const Tokenizer& tok, uint64_t seed)
      : request(id, std::move(g.prompt_ids), g.params),
        on_event(std::move(g.on_event)),
        top_logprobs(g.top_logprobs),
        internal(g.internal),
        decoder(tok, g.skip_special_tokens, std::move(g.keep_special_ids)),
        rng(seed, g.resume_rng_draws),
        resume_output_ids(std::move(g.resume_output_ids)),
        resume_kv(std::move(g.resume_kv)),
        export_kv(g.export_kv),
        exported_rows(g.kv_export_from_row),
        capture(std::move(g.capture)) {
    // Prompt logprobs: every scored position is computed, none served from the prefix cache.
    if (g.prompt_logprobs_from >= 0) {
      prompt_logprobs_pending = true;
      prompt_logprobs_from = std::max(g.prompt_logprobs_from, 1);
      const int32_t scored = std::max(0, request.prompt_len() - prompt_logprobs_from);
      prompt_logprobs.resize(size_t(scored));
      if (scored > 0) request.set_prompt_score_from(prompt_logprobs_from);
    }
    request.set_use_prefix_cache(g.use_prefix_cache && g.prompt_logprobs_from < 0);
    request.set_urgent(g.urgent);
    if (!resume_output_ids.empty()) request.preload_output(resume_output_ids);
    if (request.params().edits_logits()) output_counts.add(resume_output_ids);
  }
  Request request;
  StreamCallback on_event;
  int top_logprobs;
  bool internal;  // not counted in EngineStats' request and token totals
  StreamDecoder decoder;
  SamplerRng rng;
  OutputTokenCounts output_counts;          // kept only when the request's params edit logits
  std::vector<int32_t> resume_output_ids;   // emitted once the request is queued
  std::shared_ptr<const KvRows> resume_kv;  // loaded into the pool once the request is queued
  bool export_kv = false;
  int32_t exported_rows = 0;  // KV rows streamed so far (or held by the caller's checkpoint)
  // Prompt logprobs of prompt tokens prompt_logprobs_from.. (filled as their rows are scored,
  // again if a retracted prefill scores them again), sent with the first output token.
  bool prompt_logprobs_pending = false;
  int32_t prompt_logprobs_from = 0;
  std::vector<TokenLogprobs> prompt_logprobs;
  std::string pending_text;  // decoded, not yet emitted
  size_t max_stop_len = 0;   // longest stop string: that much text minus one is held back
  bool stopped_by_string = false;
  bool start_announced = false;             // the `started` event went out
  std::shared_ptr<CapturedStates> capture;  // null: no capture
  // Speculative decoding, for the finished event's usage.
  int32_t spec_verify_ct = 0;
  int32_t spec_draft_token_num = 0;
  int32_t spec_accept_token_num = 0;
  uint64_t capture_fence = 0;  // the last CaptureWriter job holding rows of `capture`
};

}  // namespace strata
