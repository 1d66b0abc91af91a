#include "engine/prompt.h"

namespace strata {

StatusOr<PromptEncoder> PromptEncoder::load(const std::string& model_dir, const Tokenizer& tokenizer) {
  PromptEncoder p;
  p.tokenizer_ = &tokenizer;
  auto chat = ChatTemplate::load(model_dir);
  if (chat.ok()) {
    p.chat_ = std::move(chat).value();
  } else if (chat.status().code() != StatusCode::kNotFound) {
    return chat.status().with_context("loading the chat template of {}", model_dir);
  }
  return p;
}

StatusOr<std::string> PromptEncoder::render_chat(const nlohmann::json& messages,
                                                 bool add_generation_prompt) const {
  if (!chat_) return failed_precondition("this model has no chat template; use a raw prompt");
  if (!messages.is_array() || messages.empty()) return invalid_argument("messages must be a non-empty array");
  return chat_->render(messages, add_generation_prompt);
}

StatusOr<std::vector<int32_t>> PromptEncoder::encode_chat(const nlohmann::json& messages,
                                                          bool add_generation_prompt) const {
  STRATA_ASSIGN_OR_RETURN(std::string text, render_chat(messages, add_generation_prompt));
  return tokenizer_->encode(text, /*allow_special=*/true);
}

std::vector<int32_t> PromptEncoder::encode_raw(const std::string& text) const {
  // As Hugging Face tokenizer(text): special tokens written in the text are recognized.
  return tokenizer_->with_special_tokens(tokenizer_->encode(text, /*allow_special=*/true));
}

}  // namespace strata
