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
#include "engine/prompt.h"
#include "server/api_key_auth.h"
#include "server/metrics.h"
#include "server/request_log.h"

namespace strata {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string served_model_name;   // the name clients must use (or omit)
  int max_queued_requests = -1;    // beyond the running slots; -1: unbounded
  double drain_timeout_s = 30;     // SIGTERM: in-flight requests get this long, then are aborted
  double log_interval_s = 5;       // `Decode batch.` line while busy
  double health_timeout_s = 30;    // busy engine without a step this long (or a probe this slow) is unhealthy
  int http_threads = 512;          // one per open connection (a stream holds its thread)
  int max_request_body_mb = 64;    // larger request bodies are answered 413
  RequestLogConfig log_requests;   // --log-requests, --log-requests-level
  std::string api_key;             // --api-key: "" = none needed (server/api_key_auth.h); never logged
  nlohmann::json flags = nlohmann::json::object();  // the launch flags, for /get_server_info
};

// The metrics the server exports; shared with engine callbacks (which may outlive a request's
// HTTP handler), hence held by shared_ptr.
struct ServerMetrics {
  // host_tier_ranks: the ranks whose host KV tier is reported (0: the tier is off).
  ServerMetrics(const std::string& model_name, int host_tier_ranks);
  MetricsRegistry registry;
  Gauge& running;
  Gauge& queued;
  Gauge& http_in_flight;
  Gauge& kv_capacity;
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
  // The host KV tier per tensor-parallel rank (label rank="r"): each rank copies its own slice.
  struct RankHostTier {
    Gauge* capacity_bytes;
    Counter* hit_tokens;
    Counter* bytes_to_host;
    Counter* bytes_to_device;
    Counter* copy_seconds;
  };
  std::vector<RankHostTier> hicache_ranks;
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

  // /health: nullopt when healthy, else why not. Blocks up to health_timeout_s (probe).
  std::optional<std::string> health_problem();
  nlohmann::json server_info();
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
