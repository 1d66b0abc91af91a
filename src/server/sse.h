// Server-sent events framing for the OpenAI streaming responses: `data: <json>\n\n` events, a
// final `data: [DONE]`, and `: comment` lines used as keep-alives (clients ignore them; writing
// one is how a stream notices that its client has gone).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace strata {

std::string sse_event(const nlohmann::json& data);
std::string sse_done();
std::string sse_comment(const std::string& text);

}  // namespace strata
