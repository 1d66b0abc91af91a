// Turns user input into prompt token ids the way Hugging Face does: chat messages through the
// model's chat template (then tokenized without adding special tokens, since the template writes
// them), raw text through the tokenizer's post-processor (e.g. a BOS token).
// Thread-safe after load: the server's HTTP threads share one.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace strata {

class PromptEncoder {
 public:
  // `tokenizer` must outlive the encoder. The chat template is tokenizer_dir's own unless
  // `chat_template` (--chat-template: a file or a built-in name, tokenizer/chat_template.h) is
  // given. A model without a chat template is fine: chat requests then fail with an error that
  // says so.
  static StatusOr<PromptEncoder> load(const std::string& tokenizer_dir, const Tokenizer& tokenizer,
                                      const std::string& chat_template = "");

  bool has_chat_template() const { return chat_.has_value(); }
  // `template_kwargs` (a JSON object or null): extra template variables, as SGLang's
  // chat_template_kwargs (e.g. {"enable_thinking": false}); they override the defaults.
  StatusOr<std::string> render_chat(const nlohmann::json& messages, bool add_generation_prompt,
                                    const nlohmann::json& template_kwargs = {}) const;
  // OutOfRange, before tokenizing, when the rendered text is longer than `max_text_bytes`.
  StatusOr<std::vector<int32_t>> encode_chat(const nlohmann::json& messages,
                                             bool add_generation_prompt = true,
                                             size_t max_text_bytes = SIZE_MAX,
                                             const nlohmann::json& template_kwargs = {}) const;
  // The same with key order kept (the server's chat requests: tools and tool-call arguments are
  // printed by the template as the client sent them).
  StatusOr<std::string> render_chat(const nlohmann::ordered_json& messages,
                                    bool add_generation_prompt,
                                    const nlohmann::ordered_json& template_kwargs = {}) const;
  StatusOr<std::vector<int32_t>> encode_chat(
      const nlohmann::ordered_json& messages, bool add_generation_prompt = true,
      size_t max_text_bytes = SIZE_MAX, const nlohmann::ordered_json& template_kwargs = {}) const;
  // The conversation with its final message left open for the model to go on writing (vLLM's
  // continue_final_message): the template rendered without a generation prompt, cut right after
  // the final message's content (its last occurrence in the text). InvalidArgument when the final
  // message is not an assistant message of non-empty string content, or the template does not
  // write that content as sent.
  StatusOr<std::vector<int32_t>> encode_chat_continuing(
      const nlohmann::ordered_json& messages, size_t max_text_bytes = SIZE_MAX,
      const nlohmann::ordered_json& template_kwargs = {}) const;
  std::vector<int32_t> encode_raw(const std::string& text) const;

  // The most text bytes that `max_tokens` tokens can cover: the longest vocabulary entry times
  // max_tokens, times 4 for normalizers that shrink text. A longer prompt cannot fit, so the
  // server refuses it before tokenizing (the BPE takes minutes on 64 MiB of spaces).
  size_t max_prompt_bytes(int64_t max_tokens) const;

 private:
  template <typename Json>
  StatusOr<std::string> render_impl(const Json& messages, bool add_generation_prompt,
                                    const Json& template_kwargs) const;
  template <typename Json>
  StatusOr<std::vector<int32_t>> encode_impl(const Json& messages, bool add_generation_prompt,
                                             size_t max_text_bytes,
                                             const Json& template_kwargs) const;
  // A rendered chat prompt's tokens; OutOfRange past max_text_bytes (before the BPE runs).
  StatusOr<std::vector<int32_t>> encode_rendered(const std::string& text,
                                                 size_t max_text_bytes) const;

  const Tokenizer* tokenizer_ = nullptr;
  size_t max_token_bytes_ = 1;  // longest vocabulary entry (added tokens included)
  std::optional<ChatTemplate> chat_;
};

}  // namespace strata
