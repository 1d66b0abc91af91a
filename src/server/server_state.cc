#include "server/server_state.h"

#include <fmt/format.h>

#include <ctime>
#include <filesystem>

#include "core/log.h"

namespace strata {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

ServerMetrics::ServerMetrics(const std::string& model_name,
                             const std::vector<std::pair<std::string, int64_t>>& fallback_ops,
                             int host_tier_ranks, int spec_max_accept_length)
    : registry({{"model_name", model_name}}),
      running(registry.gauge("strata_num_running_requests",
                             "Requests prefilling or decoding in the engine.")),
      queued(registry.gauge("strata_num_queued_requests",
                            "Requests waiting for admission in the engine.")),
      http_in_flight(
          registry.gauge("strata_http_requests_in_flight",
                         "Engine requests admitted by the HTTP server and not yet finished.")),
      kv_capacity(registry.gauge("strata_kv_cache_capacity_tokens", "Tokens the KV pool holds.")),
      dcp_size(registry.gauge(
          "strata_dcp_size",
          "Ranks each sequence's KV is split over (--dcp-size); the capacity counts the group's "
          "tokens.")),
      kv_used(registry.gauge("strata_kv_cache_used_tokens",
                             "KV tokens in use (running requests and the prefix cache).")),
      kv_cached(registry.gauge("strata_kv_cache_prefix_cached_tokens",
                               "KV tokens held only by the prefix cache (evictable).")),
      kv_usage(registry.gauge("strata_kv_cache_usage_ratio", "Used KV tokens / capacity.")),
      cache_hit_rate(
          registry.gauge("strata_prefix_cache_hit_ratio",
                         "Prompt tokens served from the prefix cache / prompt tokens looked up.")),
      gen_throughput(registry.gauge("strata_generation_throughput_tokens_per_second",
                                    "Generated tokens per second over the last monitor interval.")),
      prompt_tokens(
          registry.counter("strata_prompt_tokens_total", "Prompt tokens of finished requests.")),
      generation_tokens(registry.counter("strata_generation_tokens_total", "Generated tokens.")),
      cache_hit_tokens(registry.counter("strata_prefix_cache_hit_tokens_total",
                                        "Prompt tokens served from the prefix cache.")),
      requests_finished(
          registry.counter("strata_requests_finished_total", "Requests that finished.")),
      requests_aborted(
          registry.counter("strata_requests_aborted_total",
                           "Requests aborted (client gone, drain timeout, engine error).")),
      requests_rejected(
          registry.counter("strata_requests_rejected_total",
                           "HTTP requests refused with 503 (queue full or draining).")),
      retractions(registry.counter("strata_retractions_total", "Requests retracted to free KV.")),
      ttft(registry.histogram("strata_time_to_first_token_seconds",
                              "From HTTP arrival to the first generated token.",
                              latency_buckets_seconds())),
      itl(registry.histogram("strata_inter_token_latency_seconds", "Time between generated tokens.",
                             latency_buckets_seconds())),
      e2e(registry.histogram("strata_e2e_request_latency_seconds",
                             "From HTTP arrival to the last token.", latency_buckets_seconds())),
      prefill_tokens(registry.counter(
          "strata_prefill_computed_tokens_total",
          "Prompt tokens computed by prefill (not served from the prefix cache or host tier).")),
      aborted_computed_tokens(registry.counter("strata_aborted_computed_tokens_total",
                                               "Tokens computed (prefill and decode) for requests "
                                               "that were then aborted: work thrown away.")),
      hicache_capacity(registry.gauge("strata_hicache_capacity_tokens",
                                      "Tokens the host KV tier holds (0: off).")),
      hicache_cached(
          registry.gauge("strata_hicache_cached_tokens", "Tokens cached in the host KV tier.")),
      hicache_hit_tokens(registry.counter(
          "strata_hicache_hit_tokens_total",
          "Prompt tokens promoted from the host KV tier (extending device cache hits).")),
      hicache_promotions(
          registry.counter("strata_hicache_promotions_total", "Promotions from the host KV tier.")),
      hicache_demotions(registry.counter(
          "strata_hicache_demotions_total",
          "Prefixes evicted from the device pool and kept whole in the host tier.")),
      hicache_demoted_tokens(registry.counter("strata_hicache_demoted_tokens_total",
                                              "Evicted device tokens the host tier kept.")),
      hicache_dropped_tokens(
          registry.counter("strata_hicache_dropped_tokens_total",
                           "Evicted device tokens the host tier did not hold (lost).")),
      hicache_bytes_to_host(registry.counter("strata_hicache_bytes_to_host_total",
                                             "KV bytes copied device -> host.")),
      hicache_bytes_to_device(registry.counter("strata_hicache_bytes_to_device_total",
                                               "KV bytes copied host -> device.")),
      hicache_copy_seconds(
          registry.counter("strata_hicache_copy_seconds_total",
                           "Time the host-tier copies took (device time on cuda).")) {
  if (spec_max_accept_length > 0) {
    spec_verifies =
        &registry.counter("strata_spec_verify_total",
                          "Speculative decoding: verifies (one request's step with drafts).");
    spec_draft_tokens = &registry.counter("strata_spec_draft_tokens_total",
                                          "Speculative decoding: draft tokens proposed.");
    spec_accepted_tokens = &registry.counter("strata_spec_accepted_tokens_total",
                                             "Speculative decoding: draft tokens accepted.");
    spec_accept_length = &registry.gauge(
        "strata_spec_accept_length",
        "Speculative decoding: mean tokens committed per verify (accepted drafts + 1) so far.");
    spec_accept_length_count = &registry.counter_family(
        "strata_spec_accept_length_count_total",
        "Speculative decoding: verifies that committed accept_length tokens (the histogram).",
        "accept_length");
    for (int len = 1; len <= spec_max_accept_length; ++len)
      spec_accept_length_count->with(std::to_string(len));
  }
  if (host_tier_ranks > 0) {
    auto family = [&](const char* name, const char* help) {
      CounterFamily& f = registry.counter_family(name, help, "rank");
      for (int r = 0; r < host_tier_ranks; ++r)
        f.with(std::to_string(r));  // every rank, 0 included
      return &f;
    };
    hicache_rank_hit_tokens =
        family("strata_hicache_rank_hit_tokens_total",
               "Prompt tokens promoted from host memory into this rank's KV pool.");
    hicache_rank_bytes_to_host = family("strata_hicache_rank_bytes_to_host_total",
                                        "KV bytes this rank copied device -> host.");
    hicache_rank_bytes_to_device = family("strata_hicache_rank_bytes_to_device_total",
                                          "KV bytes this rank copied host -> device.");
    hicache_rank_copy_seconds =
        family("strata_hicache_rank_copy_seconds_total",
               "Time this rank's host-tier copies took (device time on cuda).");
  }
  if (fallback_ops.empty()) return;
  CounterFamily& f = registry.counter_family("strata_cpu_fallback_ops_total",
                                             "Calls of ops the backend has no kernel for yet, run "
                                             "on the CPU reference through host copies (slow).",
                                             "op");
  for (const auto& [op, n] : fallback_ops) f.with(op);  // every declared op, 0 included
  cpu_fallback_ops = &f;
  set_cpu_fallback_counts(fallback_ops);
}

void ServerMetrics::set_spec_counts(const EngineStats& s) {
  if (spec_verifies == nullptr) return;
  spec_verifies->set_total(double(s.spec_verify_total));
  spec_draft_tokens->set_total(double(s.spec_draft_tokens_total));
  spec_accepted_tokens->set_total(double(s.spec_accepted_tokens_total));
  spec_accept_length->set(s.spec_verify_total > 0
                              ? double(s.spec_accepted_tokens_total + s.spec_verify_total) /
                                    double(s.spec_verify_total)
                              : 0.0);
  for (size_t len = 1; len < s.spec_accept_length_counts.size(); ++len)
    spec_accept_length_count->with(std::to_string(len))
        .set_total(double(s.spec_accept_length_counts[len]));
}

void ServerMetrics::set_cpu_fallback_counts(
    const std::vector<std::pair<std::string, int64_t>>& counts) {
  if (cpu_fallback_ops == nullptr) return;
  for (const auto& [op, n] : counts) cpu_fallback_ops->with(op).set_total(double(n));
}

ServerState::ServerState(ServerConfig config, Engine& engine, const PromptEncoder& encoder)
    : config_(std::move(config)),
      auth_(config_.api_key),
      engine_(engine),
      encoder_(encoder),
      metrics_(std::make_shared<ServerMetrics>(
          config_.served_model_name, engine.stats().cpu_fallback_ops,
          engine.config().enable_hierarchical_cache ? std::max(1, engine.config().tp_size) : 0,
          engine.config().speculative.enabled() ? engine.config().speculative.num_steps + 1 : 0)),
      start_time_(int64_t(std::time(nullptr))),
      last_progress_(Clock::now()) {
  if (config_.max_queued_requests >= 0)
    capacity_ = int64_t(engine_.plan().max_running_requests) + config_.max_queued_requests;
  refresh_engine_metrics(engine_.stats());
  monitor_ = std::thread([this] { monitor_loop(); });
}

ServerState::~ServerState() {
  {
    std::lock_guard<std::mutex> lk(monitor_mu_);
    stop_monitor_ = true;
  }
  monitor_cv_.notify_all();
  monitor_.join();
}

std::string ContextLimit::why() const {
  return RequestLimits{.context_length = model_context, .kv_capacity_tokens = pool_tokens}
      .limit_reason();
}

ContextLimit ServerState::context_limit() const {
  const int64_t ctx = engine_.context_length(), pool = engine_.kv_capacity_tokens();
  return {.tokens = std::min(ctx, pool), .model_context = ctx, .pool_tokens = pool};
}

ServerState::Admit ServerState::admit(int n) {
  std::lock_guard<std::mutex> lk(mu_);
  if (draining_) return Admit::kDraining;
  if (capacity_ >= 0 && outstanding_ + n > capacity_) return Admit::kQueueFull;
  outstanding_ += n;
  metrics_->http_in_flight.set(double(outstanding_));
  return Admit::kOk;
}

void ServerState::release(int n) {
  std::lock_guard<std::mutex> lk(mu_);
  outstanding_ -= n;
  metrics_->http_in_flight.set(double(outstanding_));
  if (outstanding_ == 0) drained_cv_.notify_all();
}

int64_t ServerState::outstanding() const {
  std::lock_guard<std::mutex> lk(mu_);
  return outstanding_;
}

void ServerState::track(int64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  live_ids_.insert(id);
}

void ServerState::untrack(int64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  live_ids_.erase(id);
}

void ServerState::begin_drain() { draining_ = true; }

bool ServerState::wait_drained(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  return drained_cv_.wait_for(lk, timeout, [&] { return outstanding_ == 0; });
}

void ServerState::abort_all() {
  std::set<int64_t> ids;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ids = live_ids_;
  }
  for (int64_t id : ids) engine_.abort(id);
}

double ServerState::no_progress_limit_s(const EngineStats& s) const {
  if (config_.health_timeout_s > 0) return config_.health_timeout_s;
  // Derived from what a step takes here: ten times the longest of the last steps, at least 30 s,
  // so a slow machine or a long prefill is never mistaken for a stuck engine.
  return std::max(30.0, 10.0 * s.longest_recent_step_seconds);
}

// Liveness: never blocks and runs nothing. Busy means requests in flight or queued; then a step
// must have completed within the no-progress limit.
std::optional<std::string> ServerState::health_problem() {
  if (draining_) return "the server is shutting down";
  const EngineStats s = engine_.stats();
  if (outstanding() > 0 || s.num_running > 0 || s.num_waiting > 0) {
    const double limit = no_progress_limit_s(s);
    std::lock_guard<std::mutex> lk(mu_);
    const double stalled = std::chrono::duration<double>(Clock::now() - last_progress_).count();
    if (stalled > limit)
      return fmt::format(
          "the engine has made no progress for {:.0f}s (limit {:.0f}s: {})", stalled, limit,
          config_.health_timeout_s > 0 ? "--health-timeout"
                                       : "10 x the longest recent step, at least 30 s");
  }
  return std::nullopt;
}

// Readiness: alive, and when idle the engine answers a one-token probe (not counted as traffic).
std::optional<std::string> ServerState::readiness_problem() {
  if (auto p = health_problem()) return p;
  const EngineStats s = engine_.stats();
  if (outstanding() > 0 || s.num_running > 0 || s.num_waiting > 0)
    return std::nullopt;  // progress checked
  if (!probe_engine()) return "the engine did not answer a one-token probe";
  return std::nullopt;
}

bool ServerState::probe_engine() {
  std::lock_guard<std::mutex> serial(probe_mu_);
  if (Clock::now() - last_probe_ok_ < std::chrono::seconds(1)) return true;
  struct Probe {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto probe = std::make_shared<Probe>();
  GenerateRequest g;
  g.prompt_ids = encoder_.encode_raw("health");
  if (g.prompt_ids.empty()) g.prompt_ids = {0};
  g.params.temperature = 0;
  g.params.max_new_tokens = 1;
  g.internal = true;
  g.on_event = [probe](const StreamEvent& ev) {
    if (!ev.finished) return;
    std::lock_guard<std::mutex> lk(probe->mu);
    probe->done = true;
    probe->cv.notify_all();
  };
  auto id = engine_.submit(std::move(g));
  if (!id.ok()) return false;
  std::unique_lock<std::mutex> lk(probe->mu);
  const bool ok =
      probe->cv.wait_for(lk, std::chrono::duration<double>(no_progress_limit_s(engine_.stats())),
                         [&] { return probe->done; });
  if (!ok) {
    engine_.abort(*id);
    return false;
  }
  last_probe_ok_ = Clock::now();
  return true;
}

json ServerState::server_info() {
  const EngineStats s = engine_.stats();
  const Plan& p = engine_.plan();
  const EngineConfig& c = engine_.config();
  return {{"model_path", c.model_path},
          {"served_model_name", config_.served_model_name},
          {"kv_capacity_tokens", engine_.kv_capacity_tokens()},
          {"max_total_num_tokens", engine_.kv_capacity_tokens()},
          {"max_running_requests", p.max_running_requests},
          {"max_queued_requests", config_.max_queued_requests},
          {"context_length", engine_.context_length()},
          {"max_model_len", context_limit().tokens},
          {"page_size", c.page_size},
          {"dcp_size", c.dcp_size},
          {"kv_bytes_per_token", p.kv_bytes_per_token},
          {"device", device_name(c.device)},
          {"num_running_requests", s.num_running},
          {"num_queued_requests", s.num_waiting},
          {"kv_tokens_used", s.kv_tokens_used},
          {"kv_tokens_cached", s.kv_tokens_cached},
          {"http_requests_in_flight", outstanding()},
          {"draining", draining()},
          {"start_time", start_time_},
          {"flags", config_.flags},
          {"internal_states", json::array({internal_state(s)})}};
}

// SGLang's per-scheduler state, as its tools read it (bench_one_batch_server reads
// last_gen_throughput; bench_serving avg_spec_accept_length when speculation is on).
json ServerState::internal_state(const EngineStats& s) const {
  json state = {{"last_gen_throughput", last_gen_throughput_.load()}};
  if (s.spec_verify_total > 0)
    state["avg_spec_accept_length"] =
        double(s.spec_accepted_tokens_total + s.spec_verify_total) / double(s.spec_verify_total);
  return state;
}

json ServerState::model_info() const {
  const EngineConfig& c = engine_.config();
  return {{"model_path", c.model_path},
          {"tokenizer_path", c.tokenizer_dir()},
          {"served_model_name", config_.served_model_name},
          {"is_generation", true},
          {"preferred_sampling_params", nullptr},
          {"weight_version", "default"},
          {"has_image_understanding", false},
          {"has_audio_understanding", false}};
}

void ServerState::refresh_engine_metrics(const EngineStats& s) {
  ServerMetrics& m = *metrics_;
  m.running.set(double(s.num_running));
  m.queued.set(double(s.num_waiting));
  m.kv_capacity.set(double(s.kv_tokens_total));
  m.dcp_size.set(double(engine_.config().dcp_size));
  m.kv_used.set(double(s.kv_tokens_used));
  m.kv_cached.set(double(s.kv_tokens_cached));
  m.kv_usage.set(s.kv_tokens_total > 0 ? double(s.kv_tokens_used) / double(s.kv_tokens_total)
                                       : 0.0);
  m.cache_hit_rate.set(s.cache_lookup_tokens_total > 0
                           ? double(s.cache_hit_tokens_total) / double(s.cache_lookup_tokens_total)
                           : 0.0);
  m.prompt_tokens.set_total(double(s.prompt_tokens_total));
  m.generation_tokens.set_total(double(s.generation_tokens_total));
  m.cache_hit_tokens.set_total(double(s.cache_hit_tokens_total));
  m.requests_finished.set_total(double(s.requests_finished_total));
  m.requests_aborted.set_total(double(s.requests_aborted_total));
  m.retractions.set_total(double(s.retractions_total));
  const int64_t page = engine_.config().page_size;
  m.prefill_tokens.set_total(double(s.prefill_tokens_total));
  m.aborted_computed_tokens.set_total(double(s.aborted_computed_tokens_total));
  m.hicache_capacity.set(double(s.hicache_capacity_tokens));
  m.hicache_cached.set(double(int64_t(s.hicache.host_cached_pages) * page));
  m.hicache_hit_tokens.set_total(double(s.hicache.host_hit_tokens));
  m.hicache_promotions.set_total(double(s.hicache.promotions));
  m.hicache_demotions.set_total(double(s.hicache.demotions));
  m.hicache_demoted_tokens.set_total(double(s.hicache.demoted_pages * page));
  m.hicache_dropped_tokens.set_total(double(s.hicache.dropped_pages * page));
  m.hicache_bytes_to_host.set_total(double(s.hicache.bytes_to_host));
  m.hicache_bytes_to_device.set_total(double(s.hicache.bytes_to_device));
  m.hicache_copy_seconds.set_total(s.hicache.copy_seconds);
  if (m.hicache_rank_hit_tokens != nullptr) {
    for (const HostTierRankStats& r : s.hicache_ranks) {
      const std::string rank = std::to_string(r.rank);
      m.hicache_rank_hit_tokens->with(rank).set_total(double(r.pages_to_device * page));
      m.hicache_rank_bytes_to_host->with(rank).set_total(double(r.bytes_to_host));
      m.hicache_rank_bytes_to_device->with(rank).set_total(double(r.bytes_to_device));
      m.hicache_rank_copy_seconds->with(rank).set_total(r.copy_seconds);
    }
  }
  m.set_cpu_fallback_counts(s.cpu_fallback_ops);
  m.set_spec_counts(s);
}

std::string ServerState::render_metrics() {
  refresh_engine_metrics(engine_.stats());
  return metrics_->registry.render();
}

void ServerState::monitor_loop() {
  EngineStats prev = engine_.stats();
  auto prev_time = Clock::now();
  auto last_log = prev_time;
  std::unique_lock<std::mutex> lk(monitor_mu_);
  while (!stop_monitor_) {
    monitor_cv_.wait_for(lk, std::chrono::seconds(1), [&] { return stop_monitor_; });
    if (stop_monitor_) break;
    const EngineStats s = engine_.stats();
    const auto now = Clock::now();
    const double secs = std::chrono::duration<double>(now - prev_time).count();
    const double throughput =
        double(s.generation_tokens_total - prev.generation_tokens_total) / std::max(secs, 1e-9);
    metrics_->gen_throughput.set(throughput);
    if (throughput > 0) last_gen_throughput_ = throughput;
    const bool busy = s.num_running > 0 || s.num_waiting > 0 || outstanding() > 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!busy || s.steps_total != prev.steps_total) last_progress_ = now;
    }
    if (busy && std::chrono::duration<double>(now - last_log).count() >= config_.log_interval_s) {
      LOG_INFO(
          "Decode batch. #running-req: {}, #token: {}, token usage: {:.2f}, gen throughput "
          "(token/s): {:.2f}, "
          "#queue-req: {}",
          s.num_running, s.kv_tokens_used,
          s.kv_tokens_total > 0 ? double(s.kv_tokens_used) / double(s.kv_tokens_total) : 0.0,
          throughput, s.num_waiting);
      last_log = now;
    }
    prev = s;
    prev_time = now;
  }
}

}  // namespace strata
