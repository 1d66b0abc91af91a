#include "server/sse.h"

namespace strata {

// Invalid UTF-8 cannot reach here (engine text is UTF-8-safe), but replace rather than throw.
std::string sse_event(const nlohmann::json& data) {
  return "data: " + data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string sse_keepalive() { return "\n\n"; }

}  // namespace strata
