// HttpServer: the OpenAI-compatible HTTP front end (cpp-httplib) over a ServerState.
//   POST /v1/completions, /v1/chat/completions   JSON or SSE (`stream: true`)
//   GET  /v1/models, /v1/models/{id}, /health, /get_server_info, /metrics
//   POST /flush_cache
// Every error is OpenAI-shaped JSON. One thread per connection (a stream holds its thread while
// it waits for tokens); a stream whose client went away aborts its engine requests.
// Built only where cpp-httplib is available (STRATA_HAVE_HTTPLIB); elsewhere bind() says so.
#pragma once

#include <memory>

#include "core/status.h"
#include "server/server_state.h"

namespace strata {

class HttpServer {
 public:
  explicit HttpServer(ServerState& state);
  ~HttpServer();

  // Binds config().host:config().port (port 0: a free port, see port()).
  Status bind();
  int port() const;
  // Serves until shutdown() has drained. Blocks; call after bind().
  Status run();
  // Graceful stop, from any thread (not from a signal handler): stop accepting connections,
  // refuse new requests with 503, let in-flight requests finish, abort what is left after
  // --drain-timeout (those clients still get a complete response), and make run() return.
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
