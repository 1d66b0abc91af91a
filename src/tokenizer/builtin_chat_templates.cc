#include "tokenizer/builtin_chat_templates.h"

#include <utility>

namespace strata {
namespace {

// ChatML: <|im_start|>ROLE\nCONTENT<|im_end|>\n per message (Qwen, Yi, many fine-tunes).
constexpr std::string_view kChatMl = R"({%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%})";

// Llama 3 instruct: BOS, then a header per message and <|eot_id|> after its trimmed content.
constexpr std::string_view kLlama3Instruct = R"({{- bos_token if bos_token is defined else '' -}}
{%- for message in messages -%}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%})";

constexpr std::pair<std::string_view, std::string_view> kTemplates[] = {
    {"chatml", kChatMl},
    {"llama-3-instruct", kLlama3Instruct},
};

}  // namespace

std::optional<std::string_view> builtin_chat_template(std::string_view name) {
  for (const auto& [n, source] : kTemplates)
    if (n == name) return source;
  return std::nullopt;
}

std::vector<std::string_view> builtin_chat_template_names() {
  std::vector<std::string_view> names;
  for (const auto& [n, source] : kTemplates) names.push_back(n);
  return names;
}

}  // namespace strata
