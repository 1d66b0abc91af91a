#include "server/tokenize_api.h"

#include <fmt/format.h>

namespace strata {

using nlohmann::json;

std::variant<ApiError, json> tokenize_request(ServerState& state, std::string_view body) {
  json b;
  if (auto e = parse_json_body(body, &b)) return *e;
  const int64_t max_len = state.context_limit().tokens;
  if (b.contains("messages")) {
    // A conversation: parsed and rendered as /v1/chat/completions would (tools included).
    OpenAiRequest r;
    if (auto e = parse_openai_request(body, Endpoint::kChat, &r)) return *e;
    bool generation_prompt = true;
    if (auto e = read_bool(b, "add_generation_prompt", &generation_prompt)) return *e;
    if (!state.encoder().has_chat_template())
      return bad_request("this model has no chat template; send 'prompt'", "messages");
    auto ids = state.encoder().encode_chat(r.messages, generation_prompt,
                                           state.encoder().max_prompt_bytes(INT32_MAX),
                                           chat_template_context(r));
    if (!ids.ok()) return bad_request(ids.status().message(), "messages");
    return json{{"tokens", *ids}, {"count", ids->size()}, {"max_model_len", max_len}};
  }
  bool special = true;
  if (auto e = read_bool(b, "add_special_tokens", &special)) return *e;
  auto it = b.find("prompt");
  if (it == b.end() || !(it->is_string() || it->is_array()))
    return bad_request("'prompt' must be a string or an array of strings (or send 'messages')",
                       "prompt");
  const bool batch = it->is_array();
  json tokens = json::array(), counts = json::array();
  for (const json& p : batch ? *it : json::array({*it})) {
    if (!p.is_string())
      return bad_request("'prompt' must be a string or an array of strings", "prompt");
    const std::string text = p.get<std::string>();
    const std::vector<int32_t> ids =
        special ? state.encoder().encode_raw(text)
                : state.engine().tokenizer().encode(text, /*allow_special=*/true);
    tokens.push_back(ids);
    counts.push_back(ids.size());
  }
  if (batch) return json{{"tokens", tokens}, {"count", counts}, {"max_model_len", max_len}};
  return json{{"tokens", tokens[0]}, {"count", counts[0]}, {"max_model_len", max_len}};
}

std::variant<ApiError, json> detokenize_request(ServerState& state, std::string_view body) {
  json b;
  if (auto e = parse_json_body(body, &b)) return *e;
  bool skip = true;
  if (auto e = read_bool(b, "skip_special_tokens", &skip)) return *e;
  auto it = b.find("tokens");
  if (it == b.end() || !it->is_array())
    return bad_request("'tokens' must be an array of token ids (or of such arrays)", "tokens");
  const Tokenizer& tok = state.engine().tokenizer();
  const bool batch = !it->empty() && (*it)[0].is_array();
  json texts = json::array();
  for (const json& seq : batch ? *it : json::array({*it})) {
    if (!seq.is_array()) return bad_request("'tokens' must not mix ids and arrays", "tokens");
    std::vector<int32_t> ids;
    for (const json& t : seq) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.vocab_size())
        return bad_request(fmt::format("'tokens' holds {}, not a token id of this model (0..{})",
                                       t.dump(), tok.vocab_size() - 1),
                           "tokens");
      ids.push_back(t.get<int32_t>());
    }
    texts.push_back(tok.decode(ids, skip));
  }
  const json text = batch ? texts : texts[0];
  return json{{"text", text}, {"prompt", text}};
}

}  // namespace strata
