// --log-requests, as SGLang's: one log line when a generation request is accepted ("Receive:")
// and one when it ends ("Finish:"), with what --log-requests-level asks for:
//   0  metadata: endpoint, id, prompt and completion token counts, finish reasons, latency;
//   1  and the sampling parameters;
//   2  and the prompt and output text, each cut to its first kPartialChars characters (default);
//   3  and the whole prompt and output text.
// Only the parsed request is logged, never its HTTP headers (the API key travels in one).
// Pure functions (the caller logs the line); thread-safe.
#pragma once

#include <string>
#include <vector>

#include "server/openai_schema.h"

namespace strata {

inline constexpr int kDefaultLogRequestsLevel = 2;
inline constexpr size_t kPartialChars = 2048;

struct RequestLogConfig {
  bool enabled = false;
  int level = kDefaultLogRequestsLevel;  // 0..3
};

// "Receive: POST /v1/completions id=cmpl-… prompts=1 prompt_tokens=[12] …".
std::string describe_received(const OpenAiRequest& req, const ResponseMeta& meta,
                              const std::vector<int32_t>& prompt_tokens, int level);
// "Finish: id=cmpl-… finish_reason=[length] completion_tokens=[16] … e2e=0.412s …".
std::string describe_finished(const OpenAiRequest& req, const ResponseMeta& meta,
                              const std::vector<ChoiceResult>& choices, const Usage& usage,
                              double e2e_s, int level);

}  // namespace strata
