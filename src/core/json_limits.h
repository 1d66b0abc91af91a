// Limits on untrusted JSON text (HTTP bodies, dataset lines, checkpoint headers and configs).
// nlohmann::json parses iteratively, but copying, comparing, dumping and our own walkers recurse
// once per nesting level: a 1 MB body of "[[[[..." parses fine and then overflows the stack.
// Callers check the depth of the text before parsing it. Pure functions; thread-safe.
#pragma once

#include <string_view>

#include "core/status.h"

namespace strata {

// Far deeper than any real request, config, tokenizer or dataset line (they nest < 20 levels),
// far shallower than what overflows a thread's stack.
inline constexpr int kMaxJsonDepth = 512;

// The deepest nesting of arrays and objects in `text` (brackets inside strings do not count);
// stops scanning once the depth exceeds `limit` and returns limit + 1. Malformed text gets a
// best-effort answer: the parser reports its errors. Cost: one pass over the bytes.
int json_nesting_depth(std::string_view text, int limit = kMaxJsonDepth);

// InvalidArgument "<what>: JSON nests deeper than <max_depth> levels" when it does.
Status check_json_depth(std::string_view text, std::string_view what,
                        int max_depth = kMaxJsonDepth);

}  // namespace strata
