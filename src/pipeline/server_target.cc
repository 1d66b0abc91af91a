#include "pipeline/server_target.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "core/log.h"
#include "pipeline/replicas.h"

#if __has_include(<httplib.h>)
#include <httplib.h>
#define STRATA_HAVE_HTTPLIB 1
#endif

namespace strata {

StatusOr<ServerUrl> parse_server_url(const std::string& url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos)
    return invalid_argument("--server '{}': expected http://HOST:PORT", url);
  const std::string scheme = url.substr(0, scheme_end);
  if (scheme != "http") return invalid_argument("--server '{}': only http:// is supported", url);
  const size_t path_start = url.find('/', scheme_end + 3);
  ServerUrl u;
  u.scheme_host_port = url.substr(0, path_start);
  if (u.scheme_host_port.size() <= scheme_end + 3)
    return invalid_argument("--server '{}': no host", url);
  std::string path = path_start == std::string::npos ? "" : url.substr(path_start);
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (path.size() >= 3 && path.compare(path.size() - 3, 3, "/v1") == 0)
    path.resize(path.size() - 3);
  u.prefix = path;
  return u;
}

nlohmann::ordered_json openai_request_body(const PromptRecord& record, const JobSampling& job,
                                           const std::string& model, uint64_t seed) {
  const SamplingParams& s = job.params;
  nlohmann::ordered_json body = {{"model", model},
                                 {"max_tokens", s.max_new_tokens},
                                 {"temperature", s.temperature},
                                 {"top_p", s.top_p},
                                 {"seed", seed},
                                 {"stream", false}};
  // The rest only when set: SGLang/vLLM extensions a plain OpenAI server may refuse.
  if (s.top_k > 0) body["top_k"] = s.top_k;
  if (s.min_p != 0) body["min_p"] = s.min_p;
  if (s.repetition_penalty != 1) body["repetition_penalty"] = s.repetition_penalty;
  if (s.presence_penalty != 0) body["presence_penalty"] = s.presence_penalty;
  if (s.frequency_penalty != 0) body["frequency_penalty"] = s.frequency_penalty;
  if (!s.logit_bias.empty()) {
    nlohmann::json bias = nlohmann::json::object();
    for (const auto& [id, b] : s.logit_bias) bias[std::to_string(id)] = b;
    body["logit_bias"] = bias;
  }
  if (!s.stop_strings.empty()) body["stop"] = s.stop_strings;
  if (!s.stop_token_ids.empty()) body["stop_token_ids"] = s.stop_token_ids;
  if (s.ignore_eos) body["ignore_eos"] = true;
  if (s.min_new_tokens > 0) body["min_tokens"] = s.min_new_tokens;
  if (record.messages.is_null()) {
    body["prompt"] = record.prompt;
  } else {
    body["messages"] = prompt_messages(record.messages);
    if (!job.chat_template_kwargs.is_null())
      body["chat_template_kwargs"] = job.chat_template_kwargs;
    if (!record.tools.is_null()) body["tools"] = record.tools;
  }
  return body;
}

Status parse_openai_reply(const std::string& text, bool chat, GenerationOutcome& out) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return data_loss("the server's reply is not a JSON object");
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty() || !(*choices)[0].is_object())
    return data_loss("the server's reply has no choices");
  const auto& c = (*choices)[0];
  const nlohmann::json* content = nullptr;
  const nlohmann::json* reasoning = nullptr;
  if (chat) {
    if (auto m = c.find("message"); m != c.end() && m->is_object()) {
      if (auto t = m->find("content"); t != m->end()) content = &*t;
      if (auto t = m->find("tool_calls"); t != m->end() && t->is_array() && !t->empty())
        out.tool_calls = *t;
      // SGLang's and DeepSeek's reasoning_content; vLLM's newer `reasoning`.
      for (const char* key : {"reasoning_content", "reasoning"})
        if (auto r = m->find(key); !reasoning && r != m->end() && r->is_string()) reasoning = &*r;
    }
  } else if (auto t = c.find("text"); t != c.end()) {
    content = &*t;
  }
  if (content == nullptr || !(content->is_string() || content->is_null()))
    return data_loss("the server's reply has no {}",
                     chat ? "choices[0].message.content" : "choices[0].text");
  out.text = content->is_string() ? content->get<std::string>() : "";
  out.reasoning = reasoning ? reasoning->get<std::string>() : "";
  if (auto f = c.find("finish_reason"); f != c.end() && f->is_string())
    out.finish_reason = f->get<std::string>();
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    out.prompt_tokens = u->value("prompt_tokens", 0);
    out.completion_tokens = u->value("completion_tokens", 0);
  }
  return Status();
}

Status check_not_cut_short(const GenerationOutcome& o, const JobSampling& sampling) {
  if (o.finish_reason == "abort")
    return unavailable("the server aborted the completion after {} tokens (finish_reason abort)",
                       o.completion_tokens);
  if (o.finish_reason == "length" && o.completion_tokens < sampling.params.max_new_tokens)
    return unavailable(
        "the server cut the completion short: finish_reason length after {} of {} tokens (a "
        "server draining at shutdown does this)",
        o.completion_tokens, sampling.params.max_new_tokens);
  return Status();
}

namespace {

// The server's error message from an OpenAI-shaped error body, else the body itself (cut).
std::string error_message(int status, const std::string& body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  std::string msg;
  if (j.is_object()) {
    if (auto e = j.find("error"); e != j.end()) {
      if (e->is_object() && e->contains("message") && (*e)["message"].is_string())
        msg = (*e)["message"].get<std::string>();
      else if (e->is_string())
        msg = e->get<std::string>();
    } else if (auto m = j.find("message"); m != j.end() && m->is_string()) {
      msg = m->get<std::string>();
    }
  }
  if (msg.empty()) msg = body.substr(0, 500);
  return fmt::format("HTTP {}: {}", status, msg);
}

}  // namespace

#ifdef STRATA_HAVE_HTTPLIB

using Clock = std::chrono::steady_clock;

struct ServerTarget::Impl {
  struct Item {
    GenerationTask task;
    OutcomeCallback done;
  };
  // The result of one HTTP exchange.
  enum class Try { kOk, kUnavailable, kRetryable, kFatal };
  using Clients =
      std::vector<std::unique_ptr<httplib::Client>>;  // one per replica, made when first used

  ServerConfig config;
  std::vector<ServerUrl> urls;  // config.urls parsed, one per replica
  std::unique_ptr<ReplicaSet> replicas;
  std::string model;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> queue;
  bool stop = false;              // destructor: workers exit
  uint64_t replica_epoch = 0;     // under mu: bumped when a replica changes state, to wake waiters
  std::atomic<bool> down{false};  // every replica stayed unavailable too long: interrupt everything
  std::atomic<bool> waiting{false};  // logged that no replica answers; log when one is back
  std::atomic<int64_t> last_contact_ms{
      0};  // steady clock ms of the last HTTP response (any replica)
  std::vector<std::thread> workers;

  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
        .count();
  }
  static double now_s() {
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  }

  // What the logs call the server: its URL, or every replica's.
  std::string label() const {
    if (config.urls.size() == 1) return config.urls[0];
    std::string all;
    for (const auto& u : config.urls) all += (all.empty() ? "" : ", ") + u;
    return fmt::format("every replica ({})", all);
  }

  // `read_timeout_s`: the request timeout for generations; the connect timeout for GET /v1/models,
  // so a replica that accepts connections and never answers cannot hold the job's start.
  std::unique_ptr<httplib::Client> make_client(size_t replica,
                                               std::optional<double> read_timeout_s = {}) const {
    auto c = std::make_unique<httplib::Client>(urls[replica].scheme_host_port);
    c->set_keep_alive(true);
    const auto us = [](double s) { return std::chrono::microseconds(int64_t(s * 1e6)); };
    c->set_connection_timeout(us(config.connect_timeout_s));
    c->set_read_timeout(us(read_timeout_s.value_or(config.request_timeout_s)));
    c->set_write_timeout(us(config.connect_timeout_s));
    if (!config.api_key.empty()) c->set_bearer_token_auth(config.api_key.c_str());
    return c;
  }
  httplib::Client& client(Clients& clients, size_t replica) const {
    if (!clients[replica]) clients[replica] = make_client(replica);
    return *clients[replica];
  }

  // Sleeps `seconds` unless the target stops first. Returns false when stopping.
  bool wait(double seconds) {
    std::unique_lock<std::mutex> lk(mu);
    return !cv.wait_for(lk, std::chrono::microseconds(int64_t(seconds * 1e6)),
                        [&] { return stop; });
  }
  // The same, but also ends when a replica changes state (a probe ended, one came back).
  bool wait_for_replicas(double seconds) {
    std::unique_lock<std::mutex> lk(mu);
    const uint64_t epoch = replica_epoch;
    cv.wait_for(lk, std::chrono::microseconds(int64_t(seconds * 1e6)),
                [&] { return stop || replica_epoch != epoch; });
    return !stop;
  }
  void replica_changed() {
    {
      std::lock_guard<std::mutex> lk(mu);
      ++replica_epoch;
    }
    cv.notify_all();
  }

  // Classifies one exchange; fills `status` and `error`.
  Try classify(const httplib::Result& res, int& status, std::string& error) {
    if (!res) {
      status = 0;
      error = "HTTP request failed: " + httplib::to_string(res.error());
      const bool refused = res.error() == httplib::Error::Connection ||
                           res.error() == httplib::Error::ConnectionTimeout;
      return refused ? Try::kUnavailable : Try::kRetryable;
    }
    last_contact_ms = now_ms();
    status = res->status;
    if (status == 200) return Try::kOk;
    error = error_message(status, res->body);
    if (status == 502 || status == 503) return Try::kUnavailable;
    if (status >= 500 || status == 408 || status == 429) return Try::kRetryable;
    return Try::kFatal;
  }

  // One line when no replica answers (whichever worker sees it first) and one when one answers
  // again, so a user watching the job knows why progress paused and that nothing is lost.
  void report_unavailable(const std::string& error) {
    if (!waiting.exchange(true))
      LOG_WARN(
          "{} is unavailable ({}); retrying with backoff, unfinished prompts are kept; giving up "
          "after {:g}s without a reply (--server-down-timeout)",
          label(), error, config.retry.server_down_timeout_s);
  }
  void report_back(size_t replica) {
    if (waiting.exchange(false)) LOG_INFO("{} answers again; continuing", config.urls[replica]);
  }

  // Ends one request's hold on its replica: no reply (or 502/503) marks the replica down, so the
  // retry goes elsewhere; with several replicas each change is logged.
  void finish_on(const ReplicaTicket& t, Try result, int http_status, const std::string& error) {
    const bool no_reply = result == Try::kUnavailable || http_status == 0;
    const ReplicaChange c =
        replicas->release(t, no_reply ? ReplicaResult::kDown : ReplicaResult::kAnswered, now_s());
    if (!no_reply) report_back(t.replica);
    if (replicas->size() > 1 && c == ReplicaChange::kWentDown)
      LOG_WARN(
          "replica {} is down ({}); its requests go to the other replicas ({} of {} up), trying it "
          "again "
          "in {:g}s",
          config.urls[t.replica], error, replicas->up_count(), replicas->size(),
          replicas->down_delay_s(1));
    if (replicas->size() > 1 && c == ReplicaChange::kCameBack)
      LOG_INFO("replica {} answers again ({} of {} up)", config.urls[t.replica],
               replicas->up_count(), replicas->size());
    if (t.probe || c != ReplicaChange::kNone) replica_changed();
  }

  // True while some replica answered less than the timeout ago; flips `down` after.
  bool still_waiting_for_server() {
    if (down) return false;
    if (double(now_ms() - last_contact_ms) / 1e3 > config.retry.server_down_timeout_s) down = true;
    return !down;
  }

  // Runs one prompt to an outcome, retrying as the policy says: on another replica at once when
  // its replica stopped answering, with backoff otherwise.
  GenerationOutcome run(Clients& clients, const GenerationTask& task, std::mt19937_64& rng) {
    const bool chat = !task.record->messages.is_null();
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    const std::string body =
        openai_request_body(*task.record, config.sampling, model, task.seed).dump();
    GenerationOutcome out;
    out.attempts = 0;
    while (true) {
      if (down || stop) {
        out.kind = OutcomeKind::kInterrupted;
        if (out.error.empty()) out.error = "the job is stopping";
        return out;
      }
      const std::optional<ReplicaTicket> ticket = replicas->acquire(now_s());
      if (!ticket) {  // every replica is down: wait for the next probe, or for the one in flight
        if (!still_waiting_for_server()) continue;  // ends kInterrupted above
        report_unavailable(out.error.empty() ? "no replica takes requests" : out.error);
        const std::optional<double> next = replicas->next_probe_s();
        wait_for_replicas(next ? std::max(0.0, *next - now_s()) : config.retry.max_delay_s);
        continue;
      }
      auto res = client(clients, ticket->replica)
                     .Post(urls[ticket->replica].prefix + path, body, "application/json");
      std::string error;
      const Try t = classify(res, out.http_status, error);
      finish_on(*ticket, t, out.http_status, error);
      if (t == Try::kOk) {
        ++out.attempts;
        Status s = parse_openai_reply(res->body, chat, out);
        if (s.ok()) s = check_not_cut_short(out, config.sampling);
        if (s.ok()) return out;
        error = s.message();
      } else if (t == Try::kFatal) {
        ++out.attempts;
        out.kind = OutcomeKind::kFailed;
        out.error = error;
        return out;
      }
      out.error = error;
      // Unavailable costs no attempt: the next pass takes another replica, or waits above.
      if (t == Try::kUnavailable) continue;
      if (t != Try::kOk) ++out.attempts;
      if (out.attempts >= config.retry.max_attempts) {
        out.kind = OutcomeKind::kFailed;
        out.error = fmt::format("gave up after {} attempts: {}", out.attempts, error);
        return out;
      }
      // The replica went away mid-request and another is up: retry there at once.
      if (out.http_status == 0 && replicas->up_count() > 0) continue;
      if (!wait(backoff_delay_s(config.retry, out.attempts, rng))) continue;
    }
  }

  void worker(int index) {
    std::mt19937_64 rng(0x5eed0000u + uint64_t(index));  // jitter only; results never depend on it
    Clients clients(urls.size());
    while (true) {
      Item item;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;  // stop with nothing queued
        item = std::move(queue.front());
        queue.pop_front();
      }
      item.done(run(clients, item.task, rng));
    }
  }

  // GET /v1/models of one replica: the model ids, or why not.
  StatusOr<std::vector<std::string>> model_ids(size_t replica, Try& t) {
    auto res =
        make_client(replica, config.connect_timeout_s)->Get(urls[replica].prefix + "/v1/models");
    int status = 0;
    std::string error;
    t = classify(res, status, error);
    if (t != Try::kOk) return unavailable("{}/v1/models: {}", config.urls[replica], error);
    nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
    std::vector<std::string> ids;
    if (j.is_object() && j.contains("data") && j["data"].is_array())
      for (const auto& m : j["data"])
        if (m.is_object() && m.contains("id") && m["id"].is_string())
          ids.push_back(m["id"].get<std::string>());
    if (ids.empty())
      return data_loss("{}/v1/models: no model id in the reply; pass --server-model",
                       config.urls[replica]);
    return ids;
  }

  // The model: --server-model, else the first id of GET /v1/models of the first replica to answer
  // (waiting for one like a prompt would). Every other replica that answers now must serve it too:
  // replicas of different models would mix two models' answers in one dataset.
  Status resolve_model() {
    std::mt19937_64 rng(0x5eed);
    std::optional<size_t> first;
    if (!config.model.empty()) model = config.model;
    for (int streak = 1; model.empty(); ++streak) {
      std::string last_error;
      for (size_t r = 0; r < urls.size() && model.empty(); ++r) {
        Try t;
        auto ids = model_ids(r, t);
        if (ids.ok()) {
          report_back(r);
          model = ids->front();
          first = r;
        } else if (t == Try::kOk || t == Try::kFatal ||
                   (t == Try::kRetryable && streak >= config.retry.max_attempts)) {
          return ids.status();
        } else {
          last_error = ids.status().message();
        }
      }
      if (!model.empty()) break;
      if (!still_waiting_for_server())
        return unavailable("{} stayed unavailable for {:g}s: {}", label(),
                           config.retry.server_down_timeout_s, last_error);
      report_unavailable(last_error);
      if (!wait(backoff_delay_s(config.retry, streak, rng))) return unavailable("stopped");
    }
    for (size_t r = 0; r < urls.size() && urls.size() > 1; ++r) {
      if (first == r) continue;
      Try t;
      auto ids = model_ids(r, t);
      if (ids.ok() && std::find(ids->begin(), ids->end(), model) == ids->end())
        return failed_precondition(
            "replica {} serves {}, not {}: every --server must serve the same model",
            config.urls[r], ids->front(), model);
    }
    return Status();
  }
};

StatusOr<std::unique_ptr<ServerTarget>> ServerTarget::create(const ServerConfig& config) {
  if (config.concurrency < 1) return invalid_argument("--concurrency must be >= 1");
  if (config.retry.max_attempts < 1) return invalid_argument("--max-attempts must be >= 1");
  if (config.urls.empty()) return invalid_argument("--server: no URL given");
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  for (const std::string& u : config.urls) {
    STRATA_ASSIGN_OR_RETURN(ServerUrl parsed, parse_server_url(u));
    impl->urls.push_back(std::move(parsed));
  }
  impl->replicas = std::make_unique<ReplicaSet>(config.urls, config.retry);
  impl->last_contact_ms = Impl::now_ms();
  STRATA_RETURN_IF_ERROR(impl->resolve_model());
  for (int i = 0; i < config.concurrency; ++i)
    impl->workers.emplace_back([p = impl.get(), i] { p->worker(i); });
  return std::unique_ptr<ServerTarget>(new ServerTarget(std::move(impl)));
}

ServerTarget::~ServerTarget() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  // Workers finish the queue quickly (every remaining item ends kInterrupted), then exit.
  for (auto& t : impl_->workers) t.join();
}

void ServerTarget::start(const GenerationTask& task, OutcomeCallback done) {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->queue.push_back({task, std::move(done)});
  }
  impl_->cv.notify_one();
}

std::string ServerTarget::model_name() const { return impl_->model; }
int ServerTarget::max_in_flight() const { return impl_->config.concurrency; }
std::string ServerTarget::progress_note() const {
  const ReplicaSet& r = *impl_->replicas;
  return r.size() > 1 ? fmt::format("replicas {}/{} up", r.up_count(), r.size()) : "";
}

#else  // no cpp-httplib: server mode is not built here

struct ServerTarget::Impl {};

StatusOr<std::unique_ptr<ServerTarget>> ServerTarget::create(const ServerConfig&) {
  return unimplemented("this strata was built without cpp-httplib, so --server is unavailable");
}
ServerTarget::~ServerTarget() = default;
void ServerTarget::start(const GenerationTask&, OutcomeCallback done) {
  GenerationOutcome o;
  o.kind = OutcomeKind::kInterrupted;
  done(std::move(o));
}
std::string ServerTarget::model_name() const { return ""; }
int ServerTarget::max_in_flight() const { return 1; }
std::string ServerTarget::progress_note() const { return ""; }

#endif

ServerTarget::ServerTarget(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

}  // namespace strata
