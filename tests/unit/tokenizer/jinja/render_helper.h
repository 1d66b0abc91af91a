// Helpers for chat-template tests: render template text with a JSON context.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/chat_template.h"

namespace strata::testing {

using ojson = nlohmann::ordered_json;

// Renders `source` with the variables in `context` (its "messages", if any, become the messages).
inline StatusOr<std::string> try_render(const std::string& source,
                                        const ojson& context = ojson::object(),
                                        bool add_generation_prompt = false) {
  StatusOr<ChatTemplate> t = ChatTemplate::from_source(source);
  if (!t.ok()) return t.status();
  ojson messages = context.contains("messages") ? context["messages"] : ojson::array();
  return t->render(messages, add_generation_prompt, context);
}

// The rendering, or "<error: ...>" (which never equals an expected string) plus a test failure.
inline std::string render(const std::string& source, const ojson& context = ojson::object(),
                          bool add_generation_prompt = false) {
  StatusOr<std::string> out = try_render(source, context, add_generation_prompt);
  if (!out.ok()) {
    ADD_FAILURE() << "render failed: " << out.status().to_string() << "\ntemplate: " << source;
    return "<error: " + out.status().to_string() + ">";
  }
  return *out;
}

}  // namespace strata::testing
