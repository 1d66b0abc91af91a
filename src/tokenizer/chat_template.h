// Chat templates: renders a conversation to the prompt text exactly as Hugging Face's
// tokenizer.apply_chat_template(..., tokenize=False) does, with our own Jinja-subset interpreter
// (jinja/*.h). The HF environment is reproduced: trim_blocks and lstrip_blocks on, loop controls
// ({% break %}/{% continue %}), {% generation %} blocks, raise_exception(), strftime_now(), and
// tojson as json.dumps(x, ensure_ascii=False, indent, separators, sort_keys).
//
// A ChatTemplate is parsed once and is immutable; render() is const and safe to call from many
// threads at once. Copies share the parsed tree.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/eval.h"

namespace strata {

class ChatTemplate {
 public:
  static constexpr size_t kMaxTemplateBytes = 1u << 20;

  // From a Hugging Face checkpoint directory: chat_template.jinja, else chat_template.json's
  // "chat_template", else tokenizer_config.json's "chat_template" (a string, or a list of
  // {"name", "template"} from which "default" is taken). Special tokens named in
  // tokenizer_config.json (bos_token, eos_token, unk_token, pad_token, sep_token, cls_token,
  // mask_token, additional_special_tokens) become template variables, as HF passes them.
  // NotFound when the directory has no template; InvalidArgument when it does not parse.
  static StatusOr<ChatTemplate> load(const std::string& model_dir);
  // From template text. InvalidArgument on syntax errors (with the line), or when larger than
  // kMaxTemplateBytes.
  static StatusOr<ChatTemplate> from_source(std::string source);
  // A template given on its own (--chat-template), with the special-token variables of
  // `tokenizer_dir`'s tokenizer_config.json (absent: none), as load() sets them.
  static StatusOr<ChatTemplate> from_source_for(std::string source,
                                                const std::string& tokenizer_dir);
  // The --chat-template argument: a file (Jinja text, or a chat_template.json /
  // tokenizer_config.json style JSON object with "chat_template"), else a built-in name
  // (builtin_chat_template_names()). NotFound names both possibilities when it is neither.
  static StatusOr<ChatTemplate> from_argument(const std::string& file_or_name,
                                              const std::string& tokenizer_dir);

  // Renders `messages` (a JSON array of message objects). `extra_context` (a JSON object or null)
  // adds or overrides variables: tools, documents, bos_token, enable_thinking... `tools` and
  // `documents` are None unless given, as in HF. Errors: InvalidArgument for bad inputs, template
  // runtime errors and raise_exception() (its message is kept); ResourceExhausted when a render
  // limit is hit. Pass ordered_json to keep the key order of objects that the template prints with
  // tojson (HF keeps insertion order; nlohmann::json sorts keys).
  StatusOr<std::string> render(const nlohmann::json& messages, bool add_generation_prompt,
                               const nlohmann::json& extra_context = {}) const;
  StatusOr<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                               const nlohmann::ordered_json& extra_context = {}) const;

  const std::string& source() const { return source_; }
  // Variables set from tokenizer_config.json when loaded from a directory.
  const jinja::Dict& default_context() const { return defaults_; }
  // Budgets against hostile templates (output size, loop iterations, steps, macro depth).
  void set_limits(const jinja::RenderLimits& limits) { limits_ = limits; }
  const jinja::RenderLimits& limits() const { return limits_; }

 private:
  template <typename Json>
  StatusOr<std::string> render_impl(const Json& messages, bool add_generation_prompt,
                                    const Json& extra_context) const;

  std::string source_;
  std::shared_ptr<const jinja::NodeList> body_;
  jinja::Dict defaults_;
  jinja::RenderLimits limits_;
};

}  // namespace strata
