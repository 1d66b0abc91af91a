#include "server/sglang_generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <span>
#include <utility>

#include "tokenizer/utf8.h"

namespace strata {
namespace {

using nlohmann::json;

constexpr int kDefaultMaxNewTokens = 128;  // SGLang's SamplingParams default

// sampling_params' fields and their completions names (the same unless renamed).
constexpr std::array<std::pair<const char*, const char*>, 20> kSamplingFields = {{
    {"max_new_tokens", "max_tokens"},
    {"sampling_seed", "seed"},
    {"temperature", "temperature"},
    {"top_p", "top_p"},
    {"top_k", "top_k"},
    {"min_p", "min_p"},
    {"frequency_penalty", "frequency_penalty"},
    {"presence_penalty", "presence_penalty"},
    {"repetition_penalty", "repetition_penalty"},
    {"stop", "stop"},
    {"stop_token_ids", "stop_token_ids"},
    {"ignore_eos", "ignore_eos"},
    {"skip_special_tokens", "skip_special_tokens"},
    {"n", "n"},
    {"logit_bias", "logit_bias"},
    {"min_new_tokens", "min_tokens"},
    {"no_stop_trim", "no_stop_trim"},
    {"json_schema", "json_schema"},
    {"regex", "regex"},
    {"ebnf", "ebnf"},
}};

ApiError unsupported(const std::string& param, const std::string& what) {
  return bad_request(fmt::format("'{}' is not supported: {}", param, what), param,
                     "unsupported_parameter");
}

bool set(const json& b, const char* key) {
  auto it = b.find(key);
  return it != b.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>());
}

// The native request's own fields that strata does not implement.
std::optional<ApiError> refuse_unsupported(const json& b, const json& sp) {
  for (const char* key : {"image_data", "audio_data", "video_data"})
    if (set(b, key)) return unsupported(key, "this server serves text models");
  if (set(b, "input_embeds")) return unsupported("input_embeds", "send text or input_ids");
  for (const char* key : {"lora_path", "lora_id"})
    if (set(b, key)) return unsupported(key, "LoRA adapters");
  if (set(b, "session_params")) return unsupported("session_params", "sessions");
  for (const char* key : {"bootstrap_host", "bootstrap_port", "bootstrap_room"})
    if (set(b, key)) return unsupported(key, "prefill/decode disaggregation");
  if (set(b, "custom_logit_processor"))
    return unsupported("custom_logit_processor", "custom logit processors");
  if (set(b, "return_hidden_states"))
    return unsupported("return_hidden_states", "strata generate --capture-hidden-states does it");
  if (set(b, "token_ids_logprob"))
    return unsupported("token_ids_logprob", "logprobs of chosen token ids");
  if (set(sp, "custom_params"))
    return unsupported("sampling_params.custom_params", "custom params");
  if (auto it = sp.find("spaces_between_special_tokens");
      it != sp.end() && it->is_boolean() && !it->get<bool>())
    return unsupported("sampling_params.spaces_between_special_tokens", "only true");
  return std::nullopt;
}

// The completions parameter's native name.
std::string native_param(const std::string& param, bool ids) {
  if (param == "prompt") return ids ? "input_ids" : "text";
  if (param == "logprobs" || param == "top_logprobs") return "top_logprobs_num";
  for (const auto& [native, openai] : kSamplingFields)
    if (param == openai) return std::string("sampling_params.") + native;
  return param;
}

// The completions request's error, in the native request's words.
ApiError renamed(ApiError e, bool ids) {
  if (e.param.empty()) return e;
  const std::string native = native_param(e.param, ids);
  if (native == e.param) return e;
  const std::string quoted = "'" + e.param + "'";
  for (size_t at = e.message.find(quoted); at != std::string::npos;
       at = e.message.find(quoted, at + native.size() + 2))
    e.message.replace(at, quoted.size(), "'" + native + "'");
  e.param = native;
  return e;
}

json finish_reason_item(const ChoiceResult& c) {
  switch (c.finish_reason) {
    case FinishReason::kNone:
      return nullptr;
    case FinishReason::kStop:
      return {{"type", "stop"}};
    case FinishReason::kLength:
      return {{"type", "length"}, {"length", c.token_ids.size()}};
    default:
      return {{"type", "abort"},
              {"message", c.error.empty() ? "the request was aborted" : c.error}};
  }
}

// [logprob (null for a prompt token with none), token id, text or null], SGLang's triple.
json logprob_triple(json lp, int32_t id, const Tokenizer& tok, bool text) {
  return json::array(
      {std::move(lp), id,
       text ? json(tok::to_valid_utf8(tok.decode(std::span<const int32_t>(&id, 1)))) : json()});
}

}  // namespace

std::optional<ApiError> parse_generate_request(std::string_view body, OpenAiRequest* r) {
  json b;
  if (auto e = parse_json_body(body, &b)) return e;
  json sp = json::object();
  if (auto it = b.find("sampling_params"); it != b.end() && !it->is_null()) {
    if (!it->is_object())
      return bad_request("'sampling_params' must be an object", "sampling_params");
    sp = *it;
  }
  if (auto e = refuse_unsupported(b, sp)) return e;
  const bool has_text = set(b, "text"), has_ids = set(b, "input_ids");
  if (has_text == has_ids)
    return bad_request("give exactly one of 'text' and 'input_ids'",
                       has_ids ? "input_ids" : "text");
  const json& prompt = has_text ? b["text"] : b["input_ids"];
  json c = {{"prompt", prompt}, {"max_tokens", kDefaultMaxNewTokens}};
  for (auto it = sp.begin(); it != sp.end(); ++it) {
    const std::string& key = it.key();
    const auto* field = std::find_if(kSamplingFields.begin(), kSamplingFields.end(),
                                     [&](const auto& f) { return key == f.first; });
    if (field != kSamplingFields.end()) {
      c[field->second] = it.value();
    } else if (key != "spaces_between_special_tokens" && key != "custom_params" &&
               key != "stream_interval") {
      return bad_request(fmt::format("'sampling_params.{}' is not a sampling parameter",
                                     tok::to_valid_utf8(key.substr(0, 64))),
                         "sampling_params." + key);
    }
  }
  // max_new_tokens 0 (SGLang's frontend scoring a prompt): the prefill alone. One token is sampled
  // and left out of the answer (OpenAiRequest::prompt_only), as completions' echo with max_tokens
  // 0.
  const bool prompt_only = c["max_tokens"].is_number_integer() && c["max_tokens"] == 0;
  if (prompt_only) c["max_tokens"] = 1;
  if (auto it = b.find("stream"); it != b.end()) c["stream"] = *it;
  bool logprobs = false;
  if (auto e = read_bool(b, "return_logprob", &logprobs)) return e;
  if (logprobs) c["logprobs"] = b.value("top_logprobs_num", json(0));
  if (auto e = parse_openai_request(c.dump(), Endpoint::kCompletions, r))
    return renamed(*e, has_ids);
  r->endpoint = Endpoint::kGenerate;
  r->prompt_only = prompt_only;
  r->native_batch = prompt.is_array() && (has_text || (!prompt.empty() && prompt[0].is_array()));
  if (auto e = read_bool(b, "return_text_in_logprobs", &r->text_in_logprobs)) return e;
  // logprob_start_len >= 0: the prompt's logprobs from that token on (input_token_logprobs);
  // -1 (SGLang's default) none. Only with return_logprob, as SGLang.
  if (auto it = b.find("logprob_start_len"); it != b.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < -1 || it->get<int64_t>() > INT32_MAX)
      return bad_request("'logprob_start_len' must be -1 or a prompt position",
                         "logprob_start_len");
    if (logprobs) r->prompt_logprobs_from = int32_t(it->get<int64_t>());
  }
  if (auto it = b.find("rid"); it != b.end() && !it->is_null()) {
    if (it->is_string()) {
      r->rids.push_back(it->get<std::string>());
    } else if (it->is_array() && int(it->size()) == r->num_prompts()) {
      for (const auto& id : *it) {
        if (!id.is_string()) return bad_request("'rid' must be a string or one per prompt", "rid");
        r->rids.push_back(id.get<std::string>());
      }
    } else {
      return bad_request("'rid' must be a string or one per prompt", "rid");
    }
  }
  return std::nullopt;
}

json build_generate_item(const OpenAiRequest& req, const ChoiceResult& c,
                         const GenerateChoiceMeta& meta, const Tokenizer& tok, int index) {
  json info = {{"id", meta.id},
               {"finish_reason", finish_reason_item(c)},
               {"prompt_tokens", meta.prompt_tokens},
               {"completion_tokens", c.token_ids.size()},
               {"cached_tokens", meta.cached_tokens},
               {"e2e_latency", meta.e2e_latency_s}};
  if (req.top_logprobs >= 0) {
    json lps = json::array(), tops = json::array();
    for (size_t i = 0; i < c.token_ids.size() && i < c.logprobs.size(); ++i) {
      lps.push_back(
          logprob_triple(c.logprobs[i].logprob, c.token_ids[i], tok, req.text_in_logprobs));
      json top = json::array();
      for (const auto& [id, lp] : c.logprobs[i].top)
        top.push_back(logprob_triple(lp, id, tok, req.text_in_logprobs));
      tops.push_back(std::move(top));
    }
    info["output_token_logprobs"] = std::move(lps);
    info["output_top_logprobs"] = std::move(tops);
  }
  if (req.prompt_logprobs_from >= 0) {
    // Prompt tokens logprob_start_len..: [null, id, text] for token 0 (nothing precedes it),
    // and for every token when the choice ended before its prompt's logprobs came.
    json lps = json::array(), tops = json::array();
    const size_t first = std::min(c.prompt_ids.size(), size_t(req.prompt_logprobs_from));
    const size_t unscored = unscored_prompt_tokens(c.prompt_ids.size(), c.prompt_logprobs.size(),
                                                   c.prompt_logprobs_from);
    for (size_t i = first; i < c.prompt_ids.size(); ++i) {
      if (i < unscored) {
        lps.push_back(logprob_triple(nullptr, c.prompt_ids[i], tok, req.text_in_logprobs));
        tops.push_back(nullptr);
        continue;
      }
      const TokenLogprobs& lp = c.prompt_logprobs[i - unscored];
      lps.push_back(logprob_triple(lp.logprob, c.prompt_ids[i], tok, req.text_in_logprobs));
      json top = json::array();
      for (const auto& [id, v] : lp.top)
        top.push_back(logprob_triple(v, id, tok, req.text_in_logprobs));
      tops.push_back(std::move(top));
    }
    info["input_token_logprobs"] = std::move(lps);
    info["input_top_logprobs"] = std::move(tops);
  }
  json item = {{"text", c.text}, {"output_ids", c.token_ids}, {"meta_info", std::move(info)}};
  if (req.native_batch || req.n > 1) item["index"] = index;
  if (!c.error.empty()) item["error"] = c.error;
  return item;
}

}  // namespace strata
