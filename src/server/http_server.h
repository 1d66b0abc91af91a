// HttpServer: the OpenAI-compatible HTTP front end over a ServerState, on libmicrohttpd (Debian
// libmicrohttpd-dev) with one epoll event loop: no connection holds a thread.
//   POST /v1/completions, /v1/chat/completions   JSON or SSE (`stream: true`)
//   GET  /v1/models, /v1/models/{id}, /health, /health_generate, /get_server_info, /metrics
//   POST /flush_cache
// Every error is OpenAI-shaped JSON. Cheap requests (/health, /metrics, /v1/models, server info,
// errors) are answered on the event loop itself, so they never wait behind generation traffic or
// behind idle and half-sent connections. Work that blocks (parsing and tokenizing a prompt, the
// readiness probe, flushing the cache) runs on a small worker pool while its connection is
// suspended. A generation's connection sleeps (suspended) until its request is admitted, then its
// engine events wake it; a tick writes a keep-alive every second, which is how a client that hung
// up is noticed (its request is then aborted). Connections beyond --max-connections get a 503.
// Built only where libmicrohttpd is available (STRATA_HAVE_MHD); elsewhere bind() says so.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "server/server_state.h"

namespace strata {

// `host` as a URL writes it: an IPv6 address in brackets ("[::1]"), anything else as it is.
std::string url_host(const std::string& host);

// Whether host:port can be bound now (port 0 always can): checked before the model loads, so a
// port in use is reported in a second rather than after minutes of loading. The listener binds
// for real later (HttpServer::bind), which can still fail if another process takes it meanwhile.
Status check_listen_address(const std::string& host, int port);

class HttpServer {
 public:
  explicit HttpServer(ServerState& state);
  ~HttpServer();

  // Binds config().host:config().port (port 0: a free port, see port()) and starts serving.
  Status bind();
  int port() const;
  // Blocks until shutdown() has drained. Call after bind().
  Status run();
  // Graceful stop, from any thread (not from a signal handler): stop accepting connections,
  // refuse new requests with 503, let in-flight requests finish, abort what is left after
  // --drain-timeout (a request that had started still gets a complete response; one that had not
  // gets a 503), and make run() return.
  void shutdown();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
