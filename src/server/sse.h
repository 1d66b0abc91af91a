// Server-sent events framing for the streaming responses: `data: <json>\n\n` events, a final
// `data: [DONE]`, and keep-alives (writing one is how a stream notices that its client has gone).
//
// A keep-alive is an empty line pair, not an SSE comment (`: ping`): comments are valid SSE, but
// SGLang's bench_serving and many scripts read a stream line by line, strip "data: " and parse
// every non-empty line as JSON, so a comment sent while a prefill or a queue takes over a second
// failed their request. Empty lines are skipped by those readers, dispatch nothing in an SSE
// parser (the spec: a blank line with no data is no event), and keep `\n\n` splitting intact.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace strata {

std::string sse_event(const nlohmann::json& data);
std::string sse_done();
std::string sse_keepalive();

}  // namespace strata
