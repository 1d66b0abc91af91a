#include "server/http_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"

#ifdef STRATA_HAVE_MHD
#include <fmt/format.h>
#include <microhttpd.h>

#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "server/generation.h"
#include "server/openai_schema.h"
#include "server/sglang_generate.h"
#include "server/tokenize_api.h"
#endif

namespace strata {

namespace {

// --host:--port as the listener binds it: the first address getaddrinfo gives.
struct ListenAddress {
  sockaddr_storage addr{};
  socklen_t len = 0;
  bool v6 = false;
};

StatusOr<ListenAddress> resolve_listen_address(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 ||
      res == nullptr)
    return unavailable("cannot resolve --host '{}'", host);
  ListenAddress a;
  std::memcpy(&a.addr, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  a.v6 = res->ai_family == AF_INET6;
  ::freeaddrinfo(res);
  return a;
}

}  // namespace

std::string url_host(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

Status check_listen_address(const std::string& host, int port) {
  auto a = resolve_listen_address(host, port);
  if (!a.ok()) return a.status();
  const int fd = ::socket(a->v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return unavailable("cannot open a socket: {}", std::strerror(errno));
  const int one = 1, zero = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as the listener will
  if (a->v6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // dual stack
  const bool bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&a->addr), a->len) == 0;
  const int err = errno;
  ::close(fd);
  if (!bound)
    return unavailable("cannot listen on {}:{}: {}{}", url_host(host), port, std::strerror(err),
                       err == EADDRINUSE ? " (another server is on this port?)" : "");
  return Status();
}

#ifndef STRATA_HAVE_MHD

struct HttpServer::Impl {};
HttpServer::HttpServer(ServerState&) {}
HttpServer::~HttpServer() = default;
Status HttpServer::bind() {
  return unimplemented(
      "this strata was built without libmicrohttpd (Debian libmicrohttpd-dev): no HTTP server");
}
int HttpServer::port() const { return -1; }
Status HttpServer::run() { return bind(); }
void HttpServer::shutdown() {}

#else

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr auto kKeepAlive =
    std::chrono::seconds(1);  // a byte per idle second notices a client gone

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A few threads for work that blocks (tokenizing a prompt, the readiness probe, flushing the
// cache).
class WorkerPool {
 public:
  explicit WorkerPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()> > queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// A finished answer: status, body and its headers.
struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  bool retry_after = false;
  bool close = false;
  bool bearer_challenge = false;  // a 401 of --api-key: WWW-Authenticate: Bearer
};

Reply error_reply(const ApiError& e) {
  return Reply{.status = e.status, .body = dump(e.to_json()), .retry_after = e.status == 503};
}

}  // namespace

// One request on one connection, from its first header to the completion callback. Shared by the
// event loop, a worker and the engine-event notifier (weakly), hence shared_ptr.
struct Exchange {
  HttpServer::Impl* impl = nullptr;
  MHD_Connection* conn = nullptr;
  std::string method, url, body;
  bool too_large = false;
  bool dispatched = false;
  // The suspend/wake handshake (any thread, under mu): a wake that finds the connection running
  // leaves `wake` set, so the loop does not go to sleep over the news.
  std::mutex mu;
  bool suspended = false, wake = false, closed = false;
  // Set by a worker before it wakes the connection (read by the loop after the wake).
  std::optional<Reply> reply;
  std::shared_ptr<Generation> gen;
  // The response body of a generation (event loop only; `responding` is read by the tick too).
  std::atomic<bool> responding{false};
  std::string out;
  size_t out_pos = 0;
  bool end = false;
  Clock::time_point last_write = Clock::now();
};

struct HttpServer::Impl {
  explicit Impl(ServerState& s) : state(s), workers(std::max(1, s.config().http_threads)) {}
  ServerState& state;
  WorkerPool workers;
  MHD_Daemon* daemon = nullptr;
  int port = -1;
  std::atomic<int> open_connections{0};

  // Every live exchange, for the keep-alive tick and the resume-all before stopping.
  std::mutex live_mu;
  std::unordered_map<Exchange*, std::weak_ptr<Exchange> > live;
  std::atomic<bool> stopping{false};
  std::thread ticker;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopped = false, tick_stop = false;

  // Wakes a suspended connection (any thread).
  void wake(Exchange& ex) {
    std::lock_guard<std::mutex> lk(ex.mu);
    if (ex.closed) return;
    if (ex.suspended) {
      ex.suspended = false;
      MHD_resume_connection(ex.conn);
    } else {
      ex.wake = true;
    }
  }
  // Event loop only: suspends unless a wake arrived since the caller last looked (then false:
  // look again).
  bool suspend(Exchange& ex) {
    std::lock_guard<std::mutex> lk(ex.mu);
    if (ex.wake || stopping) {
      ex.wake = false;
      return false;
    }
    ex.suspended = true;
    MHD_suspend_connection(ex.conn);
    return true;
  }
  void resume_all() {
    std::vector<std::shared_ptr<Exchange> > all;
    {
      std::lock_guard<std::mutex> lk(live_mu);
      for (auto& [p, w] : live)
        if (auto s = w.lock()) all.push_back(std::move(s));
    }
    for (auto& ex : all) wake(*ex);
  }
  void tick_loop() {
    std::unique_lock<std::mutex> lk(stop_mu);
    while (!tick_stop) {
      stop_cv.wait_for(lk, kKeepAlive, [&] { return tick_stop; });
      if (tick_stop) break;
      lk.unlock();
      std::vector<std::shared_ptr<Exchange> > responding;
      {
        std::lock_guard<std::mutex> g(live_mu);
        for (auto& [p, w] : live)
          if (auto s = w.lock(); s && s->responding) responding.push_back(std::move(s));
      }
      for (auto& ex : responding) wake(*ex);
      lk.lock();
    }
  }

  MHD_Result send(Exchange& ex, const Reply& r);
  MHD_Result route(const std::shared_ptr<Exchange>& ex);
  MHD_Result on_async_done(const std::shared_ptr<Exchange>& ex);
  MHD_Result start_response(const std::shared_ptr<Exchange>& ex);
  MHD_Result run_async(const std::shared_ptr<Exchange>& ex, std::function<void(Exchange&)> work);
  json model_card() const;
  static ssize_t read_body(void* cls, uint64_t pos, char* buf, size_t max);
};

MHD_Result HttpServer::Impl::send(Exchange& ex, const Reply& r) {
  MHD_Response* resp = MHD_create_response_from_buffer(
      r.body.size(), const_cast<char*>(r.body.data()), MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(resp, "Content-Type", r.content_type.c_str());
  if (r.retry_after) MHD_add_response_header(resp, "Retry-After", "1");
  if (r.close) MHD_add_response_header(resp, "Connection", "close");
  if (r.bearer_challenge) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
  const MHD_Result ok = MHD_queue_response(ex.conn, unsigned(r.status), resp);
  MHD_destroy_response(resp);
  return ok;
}

// Suspends the connection and runs `work` on a worker; the worker leaves a reply or a generation
// in the exchange and wakes it (on_async_done answers then).
MHD_Result HttpServer::Impl::run_async(const std::shared_ptr<Exchange>& ex,
                                       std::function<void(Exchange&)> work) {
  {
    std::lock_guard<std::mutex> lk(ex->mu);
    ex->suspended = true;
    MHD_suspend_connection(ex->conn);
  }
  workers.post([this, ex, work = std::move(work)] {
    work(*ex);
    wake(*ex);
  });
  return MHD_YES;
}

json HttpServer::Impl::model_card() const {
  return json{{"id", state.config().served_model_name},
              {"object", "model"},
              {"created", state.start_time()},
              {"owned_by", "strata"},
              {"root", state.engine().config().model_path},
              {"max_model_len", state.context_limit().tokens}};  // what the server enforces
}

MHD_Result HttpServer::Impl::route(const std::shared_ptr<Exchange>& ex) {
  const std::string& m = ex->method;
  const std::string& u = ex->url;
  const bool get = m == "GET", post = m == "POST";
  // --api-key (server/api_key_auth.h), before anything else: every path but the health probes.
  const char* authorization =
      MHD_lookup_connection_value(ex->conn, MHD_HEADER_KIND, "Authorization");
  if (auto denied = state.auth().check(
          u, authorization ? std::optional<std::string_view>(authorization) : std::nullopt)) {
    Reply r = error_reply(*denied);
    r.bearer_challenge = true;
    return send(*ex, r);
  }
  if (ex->too_large)
    return send(*ex, error_reply(api_error(
                         413,
                         fmt::format("the request body is larger than this server's limit of "
                                     "{} MiB (--max-request-body-mb)",
                                     state.config().max_request_body_mb),
                         "invalid_request_error")));
  // Cheap answers, here on the event loop: never queued behind generation traffic.
  if (get && u == "/health") {
    if (auto problem = state.health_problem())
      return send(*ex, error_reply(server_error(503, *problem, "unhealthy")));
    return send(*ex, Reply{.body = R"({"status":"ok"})"});
  }
  if (get && u == "/metrics")
    return send(*ex, Reply{.body = state.render_metrics(),
                           .content_type = "text/plain; version=0.0.4; charset=utf-8"});
  if (get && u == "/v1/models")
    return send(*ex,
                Reply{.body = dump({{"object", "list"}, {"data", json::array({model_card()})}})});
  if (get && u.rfind("/v1/models/", 0) == 0) {
    const std::string id = u.substr(11);
    if (id != state.config().served_model_name)
      return send(*ex, error_reply(api_error(404, fmt::format("The model '{}' does not exist", id),
                                             "invalid_request_error", "model", "model_not_found")));
    return send(*ex, Reply{.body = dump(model_card())});
  }
  if (get && (u == "/get_server_info" || u == "/server_info"))
    return send(*ex, Reply{.body = dump(state.server_info())});
  if (get && (u == "/get_model_info" || u == "/model_info"))
    return send(*ex, Reply{.body = dump(state.model_info())});
  // Work that blocks: on a worker, the connection suspended meanwhile.
  if (get && u == "/health_generate") {
    return run_async(ex, [this](Exchange& e) {
      if (auto problem = state.readiness_problem())
        e.reply = error_reply(server_error(503, *problem, "unhealthy"));
      else
        e.reply = Reply{.body = R"({"status":"ok"})"};
    });
  }
  if ((get || post) && u == "/flush_cache") {
    return run_async(ex, [this](Exchange& e) {
      if (!state.engine().flush_cache())
        e.reply = error_reply(
            bad_request("the prefix cache was not flushed: requests are running or waiting"));
      else
        e.reply = Reply{.body = "Cache flushed.\n", .content_type = "text/plain"};
    });
  }
  if (post &&
      (u == "/tokenize" || u == "/v1/tokenize" || u == "/detokenize" || u == "/v1/detokenize")) {
    const bool detokenize = u.find("detokenize") != std::string::npos;
    return run_async(ex, [this, detokenize](Exchange& e) {
      auto r = detokenize ? detokenize_request(state, e.body) : tokenize_request(state, e.body);
      if (auto* err = std::get_if<ApiError>(&r))
        e.reply = error_reply(*err);
      else
        e.reply = Reply{.body = dump(std::get<json>(r))};
    });
  }
  if (post && (u == "/v1/completions" || u == "/v1/chat/completions" || u == "/generate")) {
    const int open = open_connections.load();
    if (open > state.config().max_connections) {
      state.metrics()->requests_rejected.inc();
      Reply r =
          error_reply(server_error(503,
                                   fmt::format("this server has {} open connections, more than "
                                               "--max-connections {}; retry later",
                                               open, state.config().max_connections),
                                   "too_many_connections"));
      r.close = true;
      return send(*ex, r);
    }
    const char* ct = MHD_lookup_connection_value(ex->conn, MHD_HEADER_KIND, "Content-Type");
    if (auto e = check_json_content_type(ct ? ct : "")) return send(*ex, error_reply(*e));
    const Endpoint endpoint = u == "/v1/completions" ? Endpoint::kCompletions
                              : u == "/generate"     ? Endpoint::kGenerate
                                                     : Endpoint::kChat;
    const auto arrival = Clock::now();
    return run_async(ex, [this, endpoint, arrival](Exchange& e) {
      OpenAiRequest r;
      if (auto err = endpoint == Endpoint::kGenerate ? parse_generate_request(e.body, &r)
                                                     : parse_openai_request(e.body, endpoint, &r)) {
        e.reply = error_reply(*err);
        return;
      }
      e.body.clear();
      e.body.shrink_to_fit();
      auto started = Generation::start(state, std::move(r), arrival);
      if (auto* err = std::get_if<ApiError>(&started)) {
        e.reply = error_reply(*err);
        return;
      }
      e.gen = std::move(std::get<std::unique_ptr<Generation> >(started));
    });
  }
  return send(*ex, error_reply(api_error(404, fmt::format("unknown endpoint: {} {}", m, u),
                                         "invalid_request_error")));
}

// The exchange woke after its work: answer the reply, or wait for the generation's admission and
// then start its body.
MHD_Result HttpServer::Impl::on_async_done(const std::shared_ptr<Exchange>& ex) {
  if (ex->reply) return send(*ex, *ex->reply);
  if (!ex->gen) return send(*ex, error_reply(server_error(500, "the request produced no answer")));
  std::weak_ptr<Exchange> weak = ex;
  ex->gen->set_notify([this, weak] {
    if (auto s = weak.lock()) wake(*s);
  });
  for (;;) {
    std::optional<ApiError> error;
    if (ex->gen->try_started(&error)) {
      if (error) return send(*ex, error_reply(*error));
      return start_response(ex);
    }
    if (suspend(*ex)) return MHD_YES;  // admission (or the end) wakes it
  }
}

MHD_Result HttpServer::Impl::start_response(const std::shared_ptr<Exchange>& ex) {
  ex->responding = true;
  ex->last_write = Clock::now();
  auto* cls = new std::shared_ptr<Exchange>(ex);
  MHD_Response* resp = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, 16 * 1024, &Impl::read_body, cls,
      [](void* p) { delete static_cast<std::shared_ptr<Exchange>*>(p); });
  if (ex->gen->streaming()) {
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
  } else {
    MHD_add_response_header(resp, "Content-Type", "application/json");
  }
  const MHD_Result ok = MHD_queue_response(ex->conn, 200, resp);
  MHD_destroy_response(resp);
  return ok;
}

// The body of a generation, chunked: SSE events (or, non-streaming, the JSON once every choice
// finished) as the engine produces them, a keep-alive each idle second; suspended in between.
// A non-streaming body's keep-alives are spaces before the JSON value, which parsers skip.
ssize_t HttpServer::Impl::read_body(void* cls, uint64_t /*pos*/, char* buf, size_t max) {
  Exchange& ex = **static_cast<std::shared_ptr<Exchange>*>(cls);
  Impl& impl = *ex.impl;
  for (;;) {
    if (ex.out_pos < ex.out.size()) {
      const size_t n = std::min(max, ex.out.size() - ex.out_pos);
      std::memcpy(buf, ex.out.data() + ex.out_pos, n);
      ex.out_pos += n;
      if (ex.out_pos == ex.out.size()) {
        ex.out.clear();
        ex.out_pos = 0;
      }
      ex.last_write = Clock::now();
      return ssize_t(n);
    }
    if (ex.end) return MHD_CONTENT_READER_END_OF_STREAM;
    const bool keepalive = Clock::now() - ex.last_write >= kKeepAlive;
    if (ex.gen->streaming()) {
      ex.end = ex.gen->next_sse(&ex.out, std::chrono::milliseconds(0), keepalive);
    } else if (std::optional<json> body = ex.gen->poll_response(std::chrono::milliseconds(0))) {
      ex.out = dump(*body);
      ex.end = true;
    } else if (keepalive) {
      ex.out = " ";
    }
    if (!ex.out.empty() || ex.end) continue;
    if (impl.suspend(ex)) return 0;  // an engine event or the tick wakes it
  }
}

namespace {

MHD_Result on_request(void* cls, MHD_Connection* conn, const char* url, const char* method,
                      const char* /*version*/, const char* upload, size_t* upload_size,
                      void** con_cls) {
  auto* impl = static_cast<HttpServer::Impl*>(cls);
  auto** slot = reinterpret_cast<std::shared_ptr<Exchange>**>(con_cls);
  if (*slot == nullptr) {  // the headers arrived; the body (if any) follows in later calls
    auto ex = std::make_shared<Exchange>();
    ex->impl = impl;
    ex->conn = conn;
    ex->method = method;
    ex->url = url;
    {
      std::lock_guard<std::mutex> lk(impl->live_mu);
      impl->live.emplace(ex.get(), ex);
    }
    *slot = new std::shared_ptr<Exchange>(std::move(ex));
    return MHD_YES;
  }
  const std::shared_ptr<Exchange>& ex = **slot;
  if (*upload_size > 0) {
    const size_t limit = size_t(impl->state.config().max_request_body_mb) << 20;
    if (!ex->too_large && ex->body.size() + *upload_size > limit) {
      ex->too_large = true;  // the rest is read and dropped, so the 413 reaches the client
      std::string().swap(ex->body);
    }
    if (!ex->too_large) ex->body.append(upload, *upload_size);
    *upload_size = 0;
    return MHD_YES;
  }
  if (!ex->dispatched) {
    ex->dispatched = true;
    return impl->route(ex);
  }
  return impl->on_async_done(ex);
}

void on_completed(void* cls, MHD_Connection* /*conn*/, void** con_cls,
                  MHD_RequestTerminationCode toe) {
  auto* impl = static_cast<HttpServer::Impl*>(cls);
  auto* slot = static_cast<std::shared_ptr<Exchange>*>(*con_cls);
  if (slot == nullptr) return;
  std::shared_ptr<Exchange> ex = std::move(*slot);
  delete slot;
  *con_cls = nullptr;
  {
    std::lock_guard<std::mutex> lk(ex->mu);
    ex->closed = true;
  }
  {
    std::lock_guard<std::mutex> lk(impl->live_mu);
    impl->live.erase(ex.get());
  }
  // A client that went away: its engine requests stop now, not at max_tokens.
  if (ex->gen && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) ex->gen->abort();
}

// libmicrohttpd's own messages: a client that hung up mid-response (most of them) at debug
// level; the listener's troubles (accept failing, a resource or connection limit, the epoll set)
// as warnings, since each leaves new connections unanswered.
void on_mhd_log(void* /*cls*/, const char* fmt, va_list ap) {
  char buf[512];
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  std::string msg(buf);
  while (!msg.empty() && msg.back() == '\n') msg.pop_back();
  const bool listener = msg.find("accept") != std::string::npos ||
                        msg.find("limit") != std::string::npos ||
                        msg.find("epoll") != std::string::npos;
  if (listener)
    LOG_WARN("http: {}", msg);
  else
    LOG_DEBUG("http: {}", msg);
}

void on_connection(void* cls, MHD_Connection* /*conn*/, void** /*socket_context*/,
                   MHD_ConnectionNotificationCode code) {
  auto* impl = static_cast<HttpServer::Impl*>(cls);
  if (code == MHD_CONNECTION_NOTIFY_STARTED)
    ++impl->open_connections;
  else if (code == MHD_CONNECTION_NOTIFY_CLOSED)
    --impl->open_connections;
}

}  // namespace

HttpServer::HttpServer(ServerState& state) : impl_(std::make_unique<Impl>(state)) {}

HttpServer::~HttpServer() {
  if (impl_->daemon != nullptr) {
    impl_->stopping = true;
    impl_->resume_all();  // MHD_stop_daemon must not find suspended connections
    MHD_stop_daemon(impl_->daemon);
  }
  {
    std::lock_guard<std::mutex> lk(impl_->stop_mu);
    impl_->tick_stop = true;
  }
  impl_->stop_cv.notify_all();
  if (impl_->ticker.joinable()) impl_->ticker.join();
}

Status HttpServer::bind() {
  Impl& impl = *impl_;
  const ServerConfig& c = impl.state.config();
  auto listen_address = resolve_listen_address(c.host, c.port);
  if (!listen_address.ok()) return listen_address.status();
  sockaddr_storage addr = listen_address->addr;
  const bool v6 = listen_address->v6;
  // IPv6 dual stack (no IPV6_V6ONLY): `--host ::` takes IPv4 clients too, as SGLang's (Python's)
  // listener does; an IPv4 --host is IPv4 only.
  // No MHD_OPTION_LISTENING_ADDRESS_REUSE: it sets SO_REUSEPORT, with which a second server on
  // the same port (or any SO_REUSEPORT socket of this user) listens beside this one and the
  // kernel deals the connections between them; MHD's default SO_REUSEADDR is what a restart needs
  // (a port with connections in TIME_WAIT).
  // Idle and half-sent connections cost a socket and a little memory, never a thread; the hard
  // cap leaves room above --max-connections to answer the 503s and the health checks.
  const unsigned hard_limit = unsigned(c.max_connections) + 256;
  impl.daemon = MHD_start_daemon(
      MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
          (v6 ? MHD_USE_DUAL_STACK : 0),
      uint16_t(c.port), nullptr, nullptr, &on_request, &impl, MHD_OPTION_SOCK_ADDR, &addr,
      MHD_OPTION_NOTIFY_COMPLETED, &on_completed, &impl, MHD_OPTION_NOTIFY_CONNECTION,
      &on_connection, &impl, MHD_OPTION_CONNECTION_TIMEOUT, unsigned(30),
      MHD_OPTION_CONNECTION_LIMIT, hard_limit, MHD_OPTION_LISTEN_BACKLOG_SIZE, unsigned(1024),
      MHD_OPTION_EXTERNAL_LOGGER, &on_mhd_log, nullptr, MHD_OPTION_END);
  if (impl.daemon == nullptr)
    return unavailable("cannot listen on {}:{} (address in use or not local?)", url_host(c.host),
                       c.port);
  const MHD_DaemonInfo* info = MHD_get_daemon_info(impl.daemon, MHD_DAEMON_INFO_BIND_PORT);
  impl.port = info != nullptr ? int(info->port) : c.port;
  impl.ticker = std::thread([p = &impl] { p->tick_loop(); });
  return Status();
}

int HttpServer::port() const { return impl_->port; }

Status HttpServer::run() {
  std::unique_lock<std::mutex> lk(impl_->stop_mu);
  impl_->stop_cv.wait(lk, [&] { return impl_->stopped; });
  return Status();
}

void HttpServer::shutdown() {
  Impl& impl = *impl_;
  ServerState& state = impl.state;
  if (state.draining()) return;
  state.begin_drain();
  const MHD_socket fd = MHD_quiesce_daemon(impl.daemon);  // no new connections; open ones go on
  if (fd != MHD_INVALID_SOCKET) ::close(fd);
  const auto timeout = std::chrono::milliseconds(int64_t(state.config().drain_timeout_s * 1000));
  LOG_INFO("draining: {} requests in flight, up to {:.0f}s", state.outstanding(),
           state.config().drain_timeout_s);
  if (!state.wait_drained(timeout)) {
    LOG_WARN("drain timeout: aborting {} requests", state.outstanding());
    state.abort_all();
    state.wait_drained(std::chrono::seconds(30));
  }
  impl.stopping = true;
  impl.resume_all();
  MHD_stop_daemon(impl.daemon);
  impl.daemon = nullptr;
  std::lock_guard<std::mutex> lk(impl.stop_mu);
  impl.stopped = true;
  impl.tick_stop = true;
  impl.stop_cv.notify_all();
}

#endif  // STRATA_HAVE_MHD

}  // namespace strata
