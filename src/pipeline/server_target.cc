#include "pipeline/server_target.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "core/log.h"

#if __has_include(<httplib.h>)
#include <httplib.h>
#define STRATA_HAVE_HTTPLIB 1
#endif

namespace strata {

StatusOr<ServerUrl> parse_server_url(const std::string& url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return invalid_argument("--server '{}': expected http://HOST:PORT", url);
  const std::string scheme = url.substr(0, scheme_end);
  if (scheme != "http") return invalid_argument("--server '{}': only http:// is supported", url);
  const size_t path_start = url.find('/', scheme_end + 3);
  ServerUrl u;
  u.scheme_host_port = url.substr(0, path_start);
  if (u.scheme_host_port.size() <= scheme_end + 3) return invalid_argument("--server '{}': no host", url);
  std::string path = path_start == std::string::npos ? "" : url.substr(path_start);
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (path.size() >= 3 && path.compare(path.size() - 3, 3, "/v1") == 0) path.resize(path.size() - 3);
  u.prefix = path;
  return u;
}

nlohmann::json openai_request_body(const PromptRecord& record, const JobSampling& job,
                                   const std::string& model, uint64_t seed) {
  const SamplingParams& s = job.params;
  nlohmann::json body = {{"model", model},
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
  if (record.messages.is_null()) {
    body["prompt"] = record.prompt;
  } else {
    body["messages"] = prompt_messages(record.messages);
    if (!job.chat_template_kwargs.is_null())
      body["chat_template_kwargs"] = job.chat_template_kwargs;
  }
  return body;
}

Status parse_openai_reply(const std::string& text, bool chat, GenerationOutcome& out) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return data_loss("the server's reply is not a JSON object");
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty() || !(*choices)[0].is_object())
    return data_loss("the server's reply has no choices");
  const auto& c = (*choices)[0];
  const nlohmann::json* content = nullptr;
  if (chat) {
    if (auto m = c.find("message"); m != c.end() && m->is_object())
      if (auto t = m->find("content"); t != m->end()) content = &*t;
  } else if (auto t = c.find("text"); t != c.end()) {
    content = &*t;
  }
  if (content == nullptr || !(content->is_string() || content->is_null()))
    return data_loss("the server's reply has no {}", chat ? "choices[0].message.content" : "choices[0].text");
  out.text = content->is_string() ? content->get<std::string>() : "";
  if (auto f = c.find("finish_reason"); f != c.end() && f->is_string()) out.finish_reason = f->get<std::string>();
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    out.prompt_tokens = u->value("prompt_tokens", 0);
    out.completion_tokens = u->value("completion_tokens", 0);
  }
  return Status();
}

Status check_not_cut_short(const GenerationOutcome& o, const JobSampling& sampling) {
  if (o.finish_reason == "abort")
    return unavailable("the server aborted the completion after {} tokens (finish_reason abort)", o.completion_tokens);
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

  ServerConfig config;
  ServerUrl url;
  std::string model;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> queue;
  bool stop = false;          // destructor: workers exit
  std::atomic<bool> down{false};  // the server stayed unavailable too long: interrupt everything
  std::atomic<bool> waiting{false};  // logged that the server is unavailable; log when it is back
  std::atomic<int64_t> last_contact_ms{0};  // steady clock ms of the last HTTP response
  std::vector<std::thread> workers;

  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
  }

  std::unique_ptr<httplib::Client> make_client() const {
    auto c = std::make_unique<httplib::Client>(url.scheme_host_port);
    c->set_keep_alive(true);
    const auto us = [](double s) { return std::chrono::microseconds(int64_t(s * 1e6)); };
    c->set_connection_timeout(us(config.connect_timeout_s));
    c->set_read_timeout(us(config.request_timeout_s));
    c->set_write_timeout(us(config.connect_timeout_s));
    if (!config.api_key.empty()) c->set_bearer_token_auth(config.api_key.c_str());
    return c;
  }

  // Sleeps `seconds` unless the target stops first. Returns false when stopping.
  bool wait(double seconds) {
    std::unique_lock<std::mutex> lk(mu);
    return !cv.wait_for(lk, std::chrono::microseconds(int64_t(seconds * 1e6)), [&] { return stop; });
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

  // One line when the server stops answering (whichever worker sees it first) and one when it
  // answers again, so a user watching the job knows why progress paused and that nothing is lost.
  void report_unavailable(const std::string& error) {
    if (!waiting.exchange(true))
      LOG_WARN("{} is unavailable ({}); retrying with backoff, unfinished prompts are kept; giving up "
               "after {:g}s without a reply (--server-down-timeout)",
               config.url, error, config.retry.server_down_timeout_s);
  }
  void report_back() {
    if (waiting.exchange(false)) LOG_INFO("{} answers again; continuing", config.url);
  }

  // True while the server has been unavailable for less than the timeout; flips `down` after.
  bool still_waiting_for_server() {
    if (down) return false;
    if (double(now_ms() - last_contact_ms) / 1e3 > config.retry.server_down_timeout_s) down = true;
    return !down;
  }

  // Runs one prompt to an outcome, retrying as the policy says.
  GenerationOutcome run(httplib::Client& client, const GenerationTask& task, std::mt19937_64& rng) {
    const bool chat = !task.record->messages.is_null();
    const std::string path = url.prefix + (chat ? "/v1/chat/completions" : "/v1/completions");
    const std::string body = openai_request_body(*task.record, config.sampling, model, task.seed).dump();
    GenerationOutcome out;
    out.attempts = 0;
    int unavailable_streak = 0;
    while (true) {
      if (down || stop) {
        out.kind = OutcomeKind::kInterrupted;
        if (out.error.empty()) out.error = "the job is stopping";
        return out;
      }
      auto res = client.Post(path, body, "application/json");
      std::string error;
      const Try t = classify(res, out.http_status, error);
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
      double delay;
      if (t == Try::kUnavailable) {
        if (!still_waiting_for_server()) continue;  // ends kInterrupted above
        report_unavailable(error);
        delay = backoff_delay_s(config.retry, ++unavailable_streak, rng);
      } else {
        report_back();
        if (t != Try::kOk) ++out.attempts;
        unavailable_streak = 0;
        if (out.attempts >= config.retry.max_attempts) {
          out.kind = OutcomeKind::kFailed;
          out.error = fmt::format("gave up after {} attempts: {}", out.attempts, error);
          return out;
        }
        delay = backoff_delay_s(config.retry, out.attempts, rng);
      }
      if (!wait(delay)) continue;
    }
  }

  void worker(int index) {
    std::mt19937_64 rng(0x5eed0000u + uint64_t(index));  // jitter only; results never depend on it
    auto client = make_client();
    while (true) {
      Item item;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;  // stop with nothing queued
        item = std::move(queue.front());
        queue.pop_front();
      }
      item.done(run(*client, item.task, rng));
    }
  }

  // GET /v1/models, waiting for the server like a prompt would.
  Status resolve_model() {
    auto client = make_client();
    std::mt19937_64 rng(0x5eed);
    for (int streak = 1;; ++streak) {
      auto res = client->Get(url.prefix + "/v1/models");
      int status = 0;
      std::string error;
      const Try t = classify(res, status, error);
      if (t == Try::kOk) {
        report_back();
        nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
        if (j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
            j["data"][0].is_object() && j["data"][0].contains("id") && j["data"][0]["id"].is_string()) {
          model = j["data"][0]["id"].get<std::string>();
          return Status();
        }
        return data_loss("{}/v1/models: no model id in the reply; pass --server-model", config.url);
      }
      if (t == Try::kFatal || (t == Try::kRetryable && streak >= config.retry.max_attempts))
        return unavailable("{}/v1/models: {}", config.url, error);
      if (!still_waiting_for_server())
        return unavailable("{} stayed unavailable for {:g}s: {}", config.url,
                           config.retry.server_down_timeout_s, error);
      report_unavailable(error);
      if (!wait(backoff_delay_s(config.retry, streak, rng))) return unavailable("stopped");
    }
  }
};

StatusOr<std::unique_ptr<ServerTarget>> ServerTarget::create(const ServerConfig& config) {
  if (config.concurrency < 1) return invalid_argument("--concurrency must be >= 1");
  if (config.retry.max_attempts < 1) return invalid_argument("--max-attempts must be >= 1");
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  STRATA_ASSIGN_OR_RETURN(impl->url, parse_server_url(config.url));
  impl->last_contact_ms = Impl::now_ms();
  if (config.model.empty()) {
    STRATA_RETURN_IF_ERROR(impl->resolve_model());
  } else {
    impl->model = config.model;
  }
  for (int i = 0; i < config.concurrency; ++i) impl->workers.emplace_back([p = impl.get(), i] { p->worker(i); });
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

#endif

ServerTarget::ServerTarget(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

}  // namespace strata
