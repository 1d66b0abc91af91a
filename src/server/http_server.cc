#include "server/http_server.h"

#include "core/log.h"

#ifdef STRATA_HAVE_HTTPLIB
#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>

#include "server/generation.h"
#include "server/openai_schema.h"
#endif

namespace strata {

#ifndef STRATA_HAVE_HTTPLIB

struct HttpServer::Impl {};
HttpServer::HttpServer(ServerState&) {}
HttpServer::~HttpServer() = default;
Status HttpServer::bind() {
  return unimplemented("this strata was built without cpp-httplib (Debian libcpp-httplib-dev): no HTTP server");
}
int HttpServer::port() const { return -1; }
Status HttpServer::run() { return bind(); }
void HttpServer::shutdown() {}

#else

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(dump(e.to_json()), "application/json");
}

}  // namespace

struct HttpServer::Impl {
  explicit Impl(ServerState& s) : state(s) {}
  ServerState& state;
  httplib::Server svr;
  std::atomic<int> listen_fd{-1};
  int port = -1;

  void routes();
  void generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  static void respond_when_done(std::shared_ptr<Generation> gen, httplib::Response& res);
};

void HttpServer::Impl::generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  const auto arrival = Clock::now();
  OpenAiRequest r;
  if (auto e = parse_openai_request(req.body, endpoint, &r)) return send_error(res, *e);
  auto started = Generation::start(state, std::move(r), arrival);
  if (auto* e = std::get_if<ApiError>(&started)) return send_error(res, *e);
  std::shared_ptr<Generation> gen = std::move(std::get<std::unique_ptr<Generation>>(started));
  if (!gen->streaming()) return respond_when_done(std::move(gen), res);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // The provider runs on this connection's thread until [DONE]; a failed write means the client
  // is gone: abort its engine requests so their KV is freed now, not at max_tokens.
  res.set_chunked_content_provider(
      "text/event-stream",
      [gen](size_t /*offset*/, httplib::DataSink& sink) {
        std::string out;
        const bool done = gen->next_sse(&out, std::chrono::milliseconds(1000));
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          gen->abort();
          return false;
        }
        if (done) sink.done();
        return true;
      },
      [gen](bool success) {
        if (!success) gen->abort();
      });
}

// Non-streaming: the JSON body goes out in one piece once every choice finished. While it runs,
// the provider writes one space per second: insignificant whitespace before a JSON value, which
// every JSON parser skips, and the only way to learn that the client hung up (cpp-httplib hands
// the handler no socket to watch; a write to a closed connection fails). The request is then
// aborted instead of generating to max_tokens. A request that finishes within the first second
// sends the bare JSON.
void HttpServer::Impl::respond_when_done(std::shared_ptr<Generation> gen, httplib::Response& res) {
  res.set_chunked_content_provider(
      "application/json",
      [gen](size_t /*offset*/, httplib::DataSink& sink) {
        std::optional<json> body = gen->poll_response(std::chrono::milliseconds(1000));
        const std::string out = body ? dump(*body) : std::string(" ");
        if (!sink.write(out.data(), out.size())) {
          gen->abort();
          return false;
        }
        if (body) sink.done();
        return true;
      },
      [gen](bool success) {
        if (!success) gen->abort();
      });
}

void HttpServer::Impl::routes() {
  // --api-key: decided before routing (and before a body is read), for every path.
  svr.set_pre_routing_handler([this](const httplib::Request& q, httplib::Response& s) {
    const std::string authorization = q.get_header_value("Authorization");
    const std::optional<ApiError> denied =
        state.auth().check(q.path, q.has_header("Authorization") ? std::optional<std::string_view>(authorization)
                                                                  : std::nullopt);
    if (!denied) return httplib::Server::HandlerResponse::Unhandled;
    send_error(s, *denied);
    s.set_header("WWW-Authenticate", "Bearer");
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& s) {
    generate(q, s, Endpoint::kCompletions);
  });
  svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& s) {
    generate(q, s, Endpoint::kChat);
  });
  auto model_card = [this] {
    return json{{"id", state.config().served_model_name},
                {"object", "model"},
                {"created", state.start_time()},
                {"owned_by", "strata"},
                {"root", state.engine().config().model_path},
                {"max_model_len", state.engine().context_length()}};
  };
  svr.Get("/v1/models", [model_card](const httplib::Request&, httplib::Response& s) {
    s.set_content(dump({{"object", "list"}, {"data", json::array({model_card()})}}), "application/json");
  });
  svr.Get("/v1/models/(.+)", [this, model_card](const httplib::Request& q, httplib::Response& s) {
    const std::string id = q.matches[1];
    if (id != state.config().served_model_name)
      return send_error(s, api_error(404, fmt::format("The model '{}' does not exist", id), "invalid_request_error",
                                     "model", "model_not_found"));
    s.set_content(dump(model_card()), "application/json");
  });
  auto health = [this](const httplib::Request&, httplib::Response& s) {
    if (auto problem = state.health_problem())
      return send_error(s, server_error(503, *problem, "unhealthy"));
    s.set_content(R"({"status":"ok"})", "application/json");
  };
  svr.Get("/health", health);
  svr.Get("/health_generate", health);
  auto info = [this](const httplib::Request&, httplib::Response& s) {
    s.set_content(dump(state.server_info()), "application/json");
  };
  svr.Get("/get_server_info", info);
  svr.Get("/server_info", info);
  auto flush = [this](const httplib::Request&, httplib::Response& s) {
    if (!state.engine().flush_cache())
      return send_error(s, bad_request("the prefix cache was not flushed: requests are running or waiting"));
    s.set_content("Cache flushed.\n", "text/plain");
  };
  svr.Post("/flush_cache", flush);
  svr.Get("/flush_cache", flush);
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& s) {
    s.set_content(state.render_metrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  // Unrouted paths (404), bodies over the limit (413), ...: OpenAI-shaped unless a handler wrote one.
  svr.set_error_handler([body_mb = state.config().max_request_body_mb](const httplib::Request& q,
                                                                         httplib::Response& s) {
    if (!s.body.empty()) return;
    const std::string msg =
        s.status == 404   ? fmt::format("unknown endpoint: {} {}", q.method, q.path)
        : s.status == 413 ? fmt::format("the request body is larger than this server's limit of {} MiB "
                                        "(--max-request-body-mb)", body_mb)
                          : fmt::format("HTTP {}", s.status);
    const ApiError e = s.status >= 500 ? server_error(s.status, msg) : api_error(s.status, msg, "invalid_request_error");
    s.set_content(dump(e.to_json()), "application/json");
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& s, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    LOG_ERROR("request handler failed: {}", what);
    send_error(s, server_error(500, what));
  });
}

HttpServer::HttpServer(ServerState& state) : impl_(std::make_unique<Impl>(state)) {
  const int threads = state.config().http_threads;
  impl_->svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  impl_->svr.set_payload_max_length(size_t(state.config().max_request_body_mb) << 20);
  impl_->svr.set_read_timeout(30, 0);
  impl_->svr.set_write_timeout(10, 0);
  // Capture the listening socket so shutdown() can stop accepting without httplib's stop(),
  // which would also cut off streams in progress.
  impl_->svr.set_socket_options([impl = impl_.get()](int fd) {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    impl->listen_fd = fd;
  });
  impl_->routes();
}

HttpServer::~HttpServer() = default;

Status HttpServer::bind() {
  const ServerConfig& c = impl_->state.config();
  if (c.port == 0) {
    impl_->port = impl_->svr.bind_to_any_port(c.host);
  } else {
    impl_->port = impl_->svr.bind_to_port(c.host, c.port) ? c.port : -1;
  }
  if (impl_->port < 0) return unavailable("cannot listen on {}:{} (address in use or not local?)", c.host, c.port);
  // httplib listens with a small backlog; many clients connecting at once need more.
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, 1024);
  return Status();
}

int HttpServer::port() const { return impl_->port; }

Status HttpServer::run() {
  const bool ok = impl_->svr.listen_after_bind();
  if (!ok && !impl_->state.draining()) return internal_error("the HTTP server stopped unexpectedly");
  return Status();
}

void HttpServer::shutdown() {
  ServerState& state = impl_->state;
  if (state.draining()) return;
  state.begin_drain();
  const int fd = impl_->listen_fd.exchange(-1);
  // Wakes the accept loop, which then closes the socket and waits for every connection's
  // thread, so run() returns once the last response is written.
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  const auto timeout = std::chrono::milliseconds(int64_t(state.config().drain_timeout_s * 1000));
  LOG_INFO("draining: {} requests in flight, up to {:.0f}s", state.outstanding(), state.config().drain_timeout_s);
  if (!state.wait_drained(timeout)) {
    LOG_WARN("drain timeout: aborting {} requests", state.outstanding());
    state.abort_all();
    state.wait_drained(std::chrono::seconds(30));
  }
}

#endif  // STRATA_HAVE_HTTPLIB

}  // namespace strata
