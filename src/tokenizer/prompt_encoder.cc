#include "tokenizer/prompt_encoder.h"

#include <algorithm>

namespace strata {

StatusOr<PromptEncoder> PromptEncoder::load(const std::string& model_dir,
                                            const Tokenizer& tokenizer,
                                            const std::string& chat_template) {
  PromptEncoder p;
  p.tokenizer_ = &tokenizer;
  for (int64_t id = 0; id < tokenizer.vocab_size(); ++id) {
    p.max_token_bytes_ = std::max(p.max_token_bytes_, tokenizer.id_to_token(int32_t(id)).size());
  }
  if (!chat_template.empty()) {
    STRATA_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::from_argument(chat_template, model_dir));
    p.chat_ = std::move(t);
    return p;
  }
  auto chat = ChatTemplate::load(model_dir);
  if (chat.ok()) {
    p.chat_ = std::move(chat).value();
  } else if (chat.status().code() != StatusCode::kNotFound) {
    return chat.status().with_context("loading the chat template of {}", model_dir);
  }
  return p;
}

template <typename Json>
StatusOr<std::string> PromptEncoder::render_impl(const Json& messages, bool add_generation_prompt,
                                                 const Json& template_kwargs) const {
  if (!chat_) return failed_precondition("this model has no chat template; use a raw prompt");
  if (!messages.is_array() || messages.empty())
    return invalid_argument("messages must be a non-empty array");
  return chat_->render(messages, add_generation_prompt, template_kwargs);
}

template <typename Json>
StatusOr<std::vector<int32_t>> PromptEncoder::encode_impl(const Json& messages,
                                                          bool add_generation_prompt,
                                                          size_t max_text_bytes,
                                                          const Json& template_kwargs) const {
  STRATA_ASSIGN_OR_RETURN(std::string text,
                          render_impl(messages, add_generation_prompt, template_kwargs));
  return encode_rendered(text, max_text_bytes);
}

StatusOr<std::vector<int32_t>> PromptEncoder::encode_rendered(const std::string& text,
                                                              size_t max_text_bytes) const {
  if (text.size() > max_text_bytes) {
    return out_of_range(
        "the rendered chat prompt is {} bytes, more than the context can hold ({} bytes)",
        text.size(), max_text_bytes);
  }
  return tokenizer_->encode(text, /*allow_special=*/true);
}

StatusOr<std::string> PromptEncoder::render_chat(const nlohmann::json& messages,
                                                 bool add_generation_prompt,
                                                 const nlohmann::json& template_kwargs) const {
  return render_impl(messages, add_generation_prompt, template_kwargs);
}

StatusOr<std::string> PromptEncoder::render_chat(
    const nlohmann::ordered_json& messages, bool add_generation_prompt,
    const nlohmann::ordered_json& template_kwargs) const {
  return render_impl(messages, add_generation_prompt, template_kwargs);
}

StatusOr<std::vector<int32_t>> PromptEncoder::encode_chat(
    const nlohmann::json& messages, bool add_generation_prompt, size_t max_text_bytes,
    const nlohmann::json& template_kwargs) const {
  return encode_impl(messages, add_generation_prompt, max_text_bytes, template_kwargs);
}

StatusOr<std::vector<int32_t>> PromptEncoder::encode_chat(
    const nlohmann::ordered_json& messages, bool add_generation_prompt, size_t max_text_bytes,
    const nlohmann::ordered_json& template_kwargs) const {
  return encode_impl(messages, add_generation_prompt, max_text_bytes, template_kwargs);
}

StatusOr<std::vector<int32_t>> PromptEncoder::encode_chat_continuing(
    const nlohmann::ordered_json& messages, size_t max_text_bytes,
    const nlohmann::ordered_json& template_kwargs) const {
  const bool open = messages.is_array() && !messages.empty() && messages.back().is_object() &&
                    messages.back().value("role", "") == "assistant" &&
                    messages.back().contains("content") && messages.back()["content"].is_string() &&
                    !messages.back()["content"].get<std::string>().empty();
  if (!open)
    return invalid_argument(
        "continue_final_message needs the final message to be the assistant's, with its text "
        "as a non-empty string 'content'");
  STRATA_ASSIGN_OR_RETURN(std::string text, render_impl(messages, false, template_kwargs));
  const std::string& content = messages.back()["content"].get_ref<const std::string&>();
  const size_t at = text.rfind(content);
  if (at == std::string::npos)
    return invalid_argument(
        "continue_final_message: the chat template does not write the final message's content "
        "as sent, so there is no place to continue it from");
  text.resize(at + content.size());
  return encode_rendered(text, max_text_bytes);
}

std::vector<int32_t> PromptEncoder::encode_raw(const std::string& text) const {
  // As Hugging Face tokenizer(text): special tokens written in the text are recognized.
  return tokenizer_->with_special_tokens(tokenizer_->encode(text, /*allow_special=*/true));
}

size_t PromptEncoder::max_prompt_bytes(int64_t max_tokens) const {
  if (max_tokens <= 0) return 0;
  const size_t per_token = max_token_bytes_ * 4;
  return size_t(max_tokens) > SIZE_MAX / per_token ? SIZE_MAX : size_t(max_tokens) * per_token;
}

}  // namespace strata
