// ServerState: what every HTTP handler shares: the engine, the prompt encoder, the served
// model's identity, admission control (the bounded queue), the drain state, the metrics and the
// health tracker. A monitor thread samples the engine once a second for the throughput gauge,
// the health check and the periodic `Decode batch.` log line.
// Thread-safe unless noted.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "server/api_key_auth.h"
#include "server/metrics.h"
#include "server/request_log.h"
#include "tokenizer/prompt_encoder.h"
#include "tokenizer/reasoning_parser.h"
#include "tokenizer/tool_call_parser.h"

namespace strata {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string served_model_name;  // the name clients must use (or omit)
  int max_queued_requests = -1;   // beyond the running slots; -1: unbounded
  double drain_timeout_s = 30;    // SIGTERM: in-flight requests get this long, then are aborted
  double log_interval_s = 5;      // `Decode batch.` line while busy
  // A busy engine without a completed step this long (or a probe this slow) is unhealthy;
  // 0: derived from the step times (10 x the longest recent step, at least 30 s).
  double health_timeout_s = 0;
  int http_threads = 8;  // workers for blocking work (tokenizing, probes); connections hold none
  int max_connections = 4096;     // open connections beyond this get 503 on generation requests
  int max_request_body_mb = 64;   // larger request bodies are answered 413
  RequestLogConfig log_requests;  // --log-requests, --log-requests-level
  std::string api_key;  // --api-key: "" = none needed (server/api_key_auth.h); never logged
  // --reasoning-parser: chat responses split the reasoning into reasoning_content (unset: off).
  std::optional<ReasoningFormat> reasoning;
  // --tool-call-parser: chat requests with tools get the calls as tool_calls (unset: such
  // requests are refused).
  std::optional<ToolCallFormat> tool_call;
  nlohmann::json flags = nlohmann::json::object();  // the launch flags, for /get_server_info
};

// The metrics the server exports; shared with engine callbacks (which may outlive a request's
// HTTP handler), hence held by shared_ptr.
struct ServerMetrics {
  // `fallback_ops`: the backend's ops that run on the CPU reference (EngineStats::
  // cpu_fallback_ops); when there are any, strata_cpu_fallback_ops_total{op} exports each.
  // host_tier_ranks: the ranks whose host KV tier is reported per rank (0: the tier is off).
  // spec_max_accept_length: speculative decoding's longest accept length (num_steps + 1; 0: off).
  explicit ServerMetrics(const std::string& model_name,
                         const std::vector<std::pair<std::string, int64_t>>& fallback_ops = {},
                         int host_tier_ranks = 0, int spec_max_accept_length = 0);
  // Mirrors the engine's speculative decoding counts (nothing while it is off).
  void set_spec_counts(const EngineStats& stats);
  // Mirrors the engine's counts into strata_cpu_fallback_ops_total (nothing without the table).
  void set_cpu_fallback_counts(const std::vector<std::pair<std::string, int64_t>>& counts);
  MetricsRegistry registry;
  Gauge& running;
  Gauge& queued;
  Gauge& http_in_flight;
  Gauge& kv_capacity;
  Gauge& dcp_size;
  Gauge& kv_used;
  Gauge& kv_cached;
  Gauge& kv_usage;
  Gauge& cache_hit_rate;
  Gauge& gen_throughput;
  Counter& prompt_tokens;
  Counter& generation_tokens;
  Counter& cache_hit_tokens;
  Counter& requests_finished;
  Counter& requests_aborted;
  Counter& requests_rejected;
  Counter& retractions;
  Histogram& ttft;
  Histogram& itl;
  Histogram& e2e;
  // Prefill work and the host KV tier (issue 10; zero while the tier is off).
  Counter& prefill_tokens;
  Counter& aborted_computed_tokens;
  Gauge& hicache_capacity;
  Gauge& hicache_cached;
  Counter& hicache_hit_tokens;
  Counter& hicache_promotions;
  Counter& hicache_demotions;
  Counter& hicache_demoted_tokens;
  Counter& hicache_dropped_tokens;
  Counter& hicache_bytes_to_host;
  Counter& hicache_bytes_to_device;
  Counter& hicache_copy_seconds;
  // The host KV tier per tensor-parallel rank, label rank="r" (each rank copies its own slice of
  // every page; null while the tier is off).
  CounterFamily* hicache_rank_hit_tokens = nullptr;
  CounterFamily* hicache_rank_bytes_to_host = nullptr;
  CounterFamily* hicache_rank_bytes_to_device = nullptr;
  CounterFamily* hicache_rank_copy_seconds = nullptr;
  // Calls of ops the backend runs on the CPU reference through host copies, per op (issue 21;
  // null when the backend declares none).
  CounterFamily* cpu_fallback_ops = nullptr;
  // Speculative decoding (null while off): verifies, drafts proposed and accepted, the mean
  // accept length so far, and how many verifies committed each accept length (label
  // accept_length="1".."num_steps + 1": the accept-length histogram, one count per length).
  Counter* spec_verifies = nullptr;
  Counter* spec_draft_tokens = nullptr;
  Counter* spec_accepted_tokens = nullptr;
  Gauge* spec_accept_length = nullptr;
  CounterFamily* spec_accept_length_count = nullptr;
};

// The longest prompt + completion the server accepts: the model's context length, or the KV cache
// pool when that is smaller.
struct ContextLimit {
  int64_t tokens = 0;
  int64_t model_context = 0;
  int64_t pool_tokens = 0;
  // RequestLimits::limit_reason: "" when the model's context is the limit, else why the pool is.
  std::string why() const;
};

class ServerState {
 public:
  ServerState(ServerConfig config, Engine& engine, const PromptEncoder& encoder);
  ~ServerState();  // stops the monitor thread

  const ServerConfig& config() const { return config_; }
  // Who may call (--api-key); the transport asks it before routing each request.
  const ApiKeyAuth& auth() const { return auth_; }
  Engine& engine() { return engine_; }
  const PromptEncoder& encoder() const { return encoder_; }
  const std::shared_ptr<ServerMetrics>& metrics() const { return metrics_; }
  int64_t start_time() const { return start_time_; }
  ContextLimit context_limit() const;

  // Admission of `n` engine requests (an HTTP request's choices). kQueueFull past
  // max running + --max-queued-requests; kDraining after begin_drain().
  enum class Admit { kOk, kQueueFull, kDraining };
  Admit admit(int n);
  void release(int n);
  int64_t outstanding() const;
  // Engine ids of live requests, so a drain can abort them.
  void track(int64_t id);
  void untrack(int64_t id);

  // SIGTERM: refuse new work; in-flight requests continue.
  void begin_drain();
  bool draining() const { return draining_.load(); }
  // Waits until nothing is outstanding; false on timeout.
  bool wait_drained(std::chrono::milliseconds timeout);
  // Aborts every live engine request (each still gets a complete response: finish_reason abort).
  void abort_all();

  // /health (liveness): nullopt when the engine loop is alive, else why not. Never blocks, runs
  // nothing: while busy, a step completed within the no-progress limit.
  std::optional<std::string> health_problem();
  // /health_generate (readiness): alive, and when idle a one-token probe generation answers
  // (an internal request: not counted in the request and token metrics). Blocks up to the limit.
  std::optional<std::string> readiness_problem();
  // The no-progress limit now: --health-timeout, or derived from the step times.
  double no_progress_limit_s(const EngineStats& s) const;
  nlohmann::json server_info();
  nlohmann::json internal_state(const EngineStats& s) const;
  // SGLang's /get_model_info: what SGLang's tools read of it (the paths, a generation model).
  nlohmann::json model_info() const;
  std::string render_metrics();

 private:
  void monitor_loop();
  void refresh_engine_metrics(const EngineStats& s);
  bool probe_engine();

  ServerConfig config_;
  ApiKeyAuth auth_;
  Engine& engine_;
  const PromptEncoder& encoder_;
  std::shared_ptr<ServerMetrics> metrics_;
  int64_t start_time_ = 0;
  int64_t capacity_ = -1;  // admitted engine requests at most; -1: unbounded

  mutable std::mutex mu_;
  std::condition_variable drained_cv_;
  int64_t outstanding_ = 0;
  std::set<int64_t> live_ids_;
  std::atomic<bool> draining_{false};
  // The generation throughput of the last busy second (SGLang's last_gen_throughput: kept while
  // idle), for /get_server_info.
  std::atomic<double> last_gen_throughput_{0};

  // Health: the monitor thread's view of progress.
  std::mutex probe_mu_;
  std::chrono::steady_clock::time_point last_probe_ok_{};
  std::chrono::steady_clock::time_point last_progress_;

  std::mutex monitor_mu_;
  std::condition_variable monitor_cv_;
  bool stop_monitor_ = false;
  std::thread monitor_;
};

}  // namespace strata
