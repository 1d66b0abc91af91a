// Chat templates known by name, for `--chat-template NAME` when a checkpoint ships none or the
// wrong one. The names are SGLang's for the same formats; the Jinja text is ours.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace strata {

// The template's Jinja source, nullopt for an unknown name.
std::optional<std::string_view> builtin_chat_template(std::string_view name);
std::vector<std::string_view> builtin_chat_template_names();

}  // namespace strata
