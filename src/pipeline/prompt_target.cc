#include "pipeline/prompt_target.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace strata {

namespace {
// 0.8f as 0.8, not 0.800000011920929: the shortest decimal that reads back as the same float.
double shortest(float v) { return std::stod(fmt::format("{}", v)); }
}  // namespace

nlohmann::json JobSampling::to_json() const {
  const SamplingParams& p = params;
  nlohmann::json j = {{"temperature", shortest(p.temperature)},
                      {"top_p", shortest(p.top_p)},
                      {"top_k", p.top_k},
                      {"max_new_tokens", p.max_new_tokens},
                      {"stop", p.stop_strings},
                      {"ignore_eos", p.ignore_eos},
                      {"seed", base_seed()}};
  if (p.min_p != 0) j["min_p"] = shortest(p.min_p);
  if (p.repetition_penalty != 1) j["repetition_penalty"] = shortest(p.repetition_penalty);
  if (p.presence_penalty != 0) j["presence_penalty"] = shortest(p.presence_penalty);
  if (p.frequency_penalty != 0) j["frequency_penalty"] = shortest(p.frequency_penalty);
  if (!p.logit_bias.empty()) {
    nlohmann::json bias = nlohmann::json::object();
    for (const auto& [id, b] : p.logit_bias) bias[std::to_string(id)] = shortest(b);
    j["logit_bias"] = bias;
  }
  if (!p.stop_token_ids.empty()) j["stop_token_ids"] = p.stop_token_ids;
  if (p.min_new_tokens != 0) j["min_new_tokens"] = p.min_new_tokens;
  if (!chat_template_kwargs.is_null()) j["chat_template_kwargs"] = chat_template_kwargs;
  if (reasoning) j["reasoning_parser"] = reasoning->name;
  if (tool_call) j["tool_call_parser"] = tool_call->name;
  return j;
}

void split_reasoning(const ReasoningFormat& format, bool starts_inside, GenerationOutcome* o) {
  ReasoningSplitter::Parts parts =
      ReasoningSplitter(format, starts_inside).push_and_finish(o->text);
  o->text = std::move(parts.content);
  o->reasoning = std::move(parts.reasoning);
}

void split_tool_calls(const ToolCallFormat& format, int earlier_calls, GenerationOutcome* o) {
  ToolCallSplitter::Parts parts = ToolCallSplitter(format).push_and_finish(o->text);
  if (parts.calls.empty()) return;
  o->text = std::move(parts.content);
  o->tool_calls = tool_calls_json(
      name_tool_calls(format, std::move(parts.calls), earlier_calls, 0, /*parallel=*/true));
  if (o->finish_reason == "stop") o->finish_reason = "tool_calls";
}

double backoff_delay_s(const RetryPolicy& policy, int retry, std::mt19937_64& rng) {
  const double exp = std::pow(policy.multiplier, std::max(0, retry - 1));
  const double cap = std::min(policy.max_delay_s, policy.initial_delay_s * exp);
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  return cap * jitter(rng);
}

}  // namespace strata
