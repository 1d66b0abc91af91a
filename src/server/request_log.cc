#include "server/request_log.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace strata {
namespace {

using nlohmann::json;

const char* path_of(const OpenAiRequest& req) {
  switch (req.endpoint) {
    case Endpoint::kChat:
      return "/v1/chat/completions";
    case Endpoint::kGenerate:
      return "/generate";
    default:
      return "/v1/completions";
  }
}

// Text as a JSON string (quotes, newlines escaped: one log line), cut at level 2.
std::string quoted(const std::string& text, int level) {
  const bool cut = level < 3 && text.size() > kPartialChars;
  std::string s = cut ? text.substr(0, kPartialChars) : text;
  std::string out = json(s).dump(-1, ' ', false, json::error_handler_t::replace);
  if (cut) out += fmt::format("…(+{} bytes)", text.size() - kPartialChars);
  return out;
}

std::string sampling(const OpenAiRequest& r) {
  const SamplingParams& p = r.sampling;
  std::string line = fmt::format(
      " max_tokens={} temperature={} top_p={} top_k={} n={} seed={} stop={} ignore_eos={} "
      "stream={} logprobs={}",
      r.max_tokens ? fmt::format("{}", *r.max_tokens) : "default", p.temperature, p.top_p, p.top_k,
      r.n, p.seed ? fmt::format("{}", *p.seed) : "none", json(p.stop_strings).dump(), p.ignore_eos,
      r.stream, r.top_logprobs);
  // The rest only when set, so the common line stays short.
  if (p.min_p != 0) line += fmt::format(" min_p={}", p.min_p);
  if (p.repetition_penalty != 1)
    line += fmt::format(" repetition_penalty={}", p.repetition_penalty);
  if (p.presence_penalty != 0) line += fmt::format(" presence_penalty={}", p.presence_penalty);
  if (p.frequency_penalty != 0) line += fmt::format(" frequency_penalty={}", p.frequency_penalty);
  if (!p.logit_bias.empty()) line += fmt::format(" logit_bias={}", p.logit_bias.size());
  if (!p.stop_token_ids.empty())
    line += fmt::format(" stop_token_ids={}", json(p.stop_token_ids).dump());
  if (!r.chat_template_kwargs.is_null())
    line += " chat_template_kwargs=" + r.chat_template_kwargs.dump();
  return line;
}

std::string prompt_text(const OpenAiRequest& r, int level) {
  if (r.endpoint == Endpoint::kChat) return " messages=" + quoted(r.messages.dump(), level);
  std::string out;
  for (const auto& t : r.text_prompts) out += " prompt=" + quoted(t, level);
  for (const auto& ids : r.token_prompts) out += " prompt_ids=" + quoted(json(ids).dump(), level);
  return out;
}

}  // namespace

std::string describe_received(const OpenAiRequest& req, const ResponseMeta& meta,
                              const std::vector<int32_t>& prompt_tokens, int level) {
  std::string line = fmt::format("Receive: POST {} id={} prompts={} prompt_tokens={}", path_of(req),
                                 meta.id, req.num_prompts(), prompt_tokens);
  if (level >= 1) line += sampling(req);
  if (level >= 2) line += prompt_text(req, level);
  return line;
}

std::string describe_finished(const OpenAiRequest& req, const ResponseMeta& meta,
                              const std::vector<ChoiceResult>& choices, const Usage& usage,
                              double e2e_s, int level) {
  std::vector<std::string> reasons;
  for (const auto& c : choices) {
    const json r = finish_reason_json(c.finish_reason);
    reasons.push_back(r.is_null() ? "none" : r.get<std::string>());
  }
  std::string line = fmt::format(
      "Finish: POST {} id={} finish_reason={} prompt_tokens={} completion_tokens={} "
      "cached_tokens={} e2e={:.3f}s",
      path_of(req), meta.id, reasons, usage.prompt_tokens, usage.completion_tokens,
      usage.cached_tokens, e2e_s);
  for (const auto& c : choices)
    if (!c.error.empty()) line += " error=" + quoted(c.error, 3);
  if (level >= 2)
    for (const auto& c : choices) line += " output=" + quoted(c.text, level);
  return line;
}

}  // namespace strata
