// Runs a batch job's prompts against any OpenAI-compatible server (strata serve, SGLang, vLLM):
// chat prompts through POST /v1/chat/completions, raw prompts through POST /v1/completions,
// non-streaming, from `concurrency` worker threads (one HTTP client each).
//
// Failures, by class:
//   - server unavailable (connection refused/failed, 502, 503): the worker waits with backoff and
//     tries again without spending an attempt; if the server stays unavailable for
//     server_down_timeout_s the target stops and every unfinished task ends kInterrupted (the
//     job saves what it has and exits; the same command resumes);
//   - retryable (other 5xx, 408, 429, read/write errors and resets, unparseable replies, replies
//     cut short: check_not_cut_short): up to
//     max_attempts per prompt with backoff, then kFailed;
//   - other 4xx (prompt too long, bad request): kFailed at once, with the server's message.
// Several URLs are replicas of one model (replicas.h): each request goes to the replica with the
// fewest of this job's requests in flight; a replica that stops answering is marked down and its
// requests (those in flight included) are retried on the others at once, without spending an
// attempt when the connection was refused; "unavailable" above then means every replica is.
// Built only where cpp-httplib is installed (<httplib.h>); elsewhere create() says so.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "pipeline/prompt_target.h"

namespace strata {

struct ServerConfig {
  // Replicas of one model: http://host:port, optionally with a path prefix; a trailing /v1 is
  // accepted.
  std::vector<std::string> urls{};
  std::string model;                // empty: the first id of GET /v1/models
  std::string api_key;              // sent as "Authorization: Bearer ..." when set
  int concurrency = 32;             // requests in flight, over all replicas
  double request_timeout_s = 3600;  // one generation may take long on a busy server
  double connect_timeout_s = 10;
  RetryPolicy retry;
  JobSampling sampling;
};

// The parts of a server URL. Errors name the URL.
struct ServerUrl {
  std::string scheme_host_port;  // "http://127.0.0.1:30000"
  std::string prefix;            // "" or "/some/prefix" (without /v1)
};
StatusOr<ServerUrl> parse_server_url(const std::string& url);

// The JSON body of one request (pure, for tests): chat or completions by the record's kind; a
// record's tools go as they were written (key order kept: the server's chat template prints them).
nlohmann::ordered_json openai_request_body(const PromptRecord& record, const JobSampling& sampling,
                                           const std::string& model, uint64_t seed);
// Reads an OpenAI reply into `out` (text, a chat reply's reasoning, finish reason, token counts).
Status parse_openai_reply(const std::string& body, bool chat, GenerationOutcome& out);
// A reply that ended before the job's limit without a stop ("abort", or "length" short of
// max_new_tokens: a server that drained at shutdown) is retried, never written as a result.
Status check_not_cut_short(const GenerationOutcome& out, const JobSampling& sampling);

class ServerTarget : public PromptTarget {
 public:
  // Resolves the model (waiting for the server as the retry policy allows) and starts the
  // workers.
  static StatusOr<std::unique_ptr<ServerTarget>> create(const ServerConfig& config);
  ~ServerTarget() override;  // stops the workers; queued tasks end kInterrupted

  std::string model_name() const override;
  int max_in_flight() const override;
  std::string progress_note() const override;  // "replicas 2/3 up" with several replicas
  void start(const GenerationTask& task, OutcomeCallback done) override;

  struct Impl;

 private:
  explicit ServerTarget(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
