#include "core/json_limits.h"

namespace strata {

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // skips the escaped character (\" does not end the string)
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) {
        deepest = depth;
        if (deepest > limit) return limit + 1;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

Status check_json_depth(std::string_view text, std::string_view what, int max_depth) {
  if (json_nesting_depth(text, max_depth) > max_depth) {
    return invalid_argument("{}: JSON nests deeper than {} levels", what, max_depth);
  }
  return Status();
}

}  // namespace strata
