#include "engine/engine.h"

#include <algorithm>

#include "backend/kv_host_io.h"
#include "backend/solo_comm.h"
#include "core/log.h"
#include "engine/kv_rows_io.h"
#include "engine/live_request.h"
#include "engine/schedule_state.h"
#include "kv/host_pool.h"
#include "kv/page_pool.h"
#include "kv/radix_cache.h"

namespace strata {

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (drafter_) {
    const EngineStats s = stats();
    std::string hist;
    for (size_t len = 1; len < s.spec_accept_length_counts.size(); ++len)
      hist += fmt::format("{}{}: {}", len > 1 ? ", " : "", len, s.spec_accept_length_counts[len]);
    LOG_INFO(
        "Speculative decoding ({}): {} verifies, {} drafts, {} accepted, accept len {:.2f} "
        "(verifies by accept length: {})",
        drafter_->name(), s.spec_verify_total, s.spec_draft_tokens_total,
        s.spec_accepted_tokens_total,
        s.spec_verify_total > 0 ? double(s.spec_accepted_tokens_total + s.spec_verify_total) /
                                      double(s.spec_verify_total)
                                : 1.0,
        hist);
    LOG_INFO(
        "Speculative decoding: {} decode steps without drafts (decodes above "
        "--speculative-batch-size-threshold), {} pad rows verified (fixed-shape verify)",
        s.spec_paused_steps_total, s.spec_pad_rows_total);
  }
  if (stats_.retractions_total > 0)
    LOG_INFO("Retraction: {} requests retracted mid-decode to free KV (and recomputed)",
             stats_.retractions_total);
  if (hicache_) {
    const HiCacheStats h = hicache_->stats();
    LOG_INFO(
        "Host KV tier: {} tokens served from host in {} promotions · {} pages demoted ({} evicted "
        "ahead), "
        "{} dropped · {:.3f} GB to host, {:.3f} GB to device · copies {:.3f} s",
        h.host_hit_tokens, h.promotions, h.demoted_pages, h.evicted_ahead_pages, h.dropped_pages,
        double(h.bytes_to_host) / 1e9, double(h.bytes_to_device) / 1e9, h.copy_seconds);
  }
  if (kv_copier_) {
    // What KV checkpoints cost: on the GPU every row is downloaded once, as its page fills.
    const auto rate = [](int64_t bytes, double s) { return s > 0 ? double(bytes) / s / 1e6 : 0.0; };
    LOG_INFO(
        "KV checkpoints: {:.1f} MB of rows downloaded in {:.3f} s ({:.0f} MB/s), {:.1f} MB loaded "
        "in {:.3f} s "
        "({:.0f} MB/s, {} tokens not recomputed)",
        double(kv_copier_->bytes_read()) / 1e6, kv_copier_->read_seconds(),
        rate(kv_copier_->bytes_read(), kv_copier_->read_seconds()),
        double(kv_copier_->bytes_written()) / 1e6, kv_copier_->write_seconds(),
        rate(kv_copier_->bytes_written(), kv_copier_->write_seconds()),
        stats_.kv_import_tokens_total);
  }
  // The ops that ran on the CPU reference instead of the device (rank 0's under tensor
  // parallelism, where every rank runs the same ops), so a slow path never passes for a fast one.
  if (backend_) {
    const auto fallback = backend_->cpu_fallback_counts();
    int64_t calls = 0;
    std::string list;
    for (const auto& [op, n] : fallback) {
      calls += n;
      list += fmt::format("{}{} {}", list.empty() ? "" : ", ", op, n);
    }
    if (calls > 0)
      LOG_WARN(
          "CPU fallback: {} calls of ops not on the {} device yet, run on the CPU reference "
          "through host copies (slow): {}",
          calls, backend_->name(), list);
    else if (!fallback.empty())
      LOG_INFO("CPU fallback: no calls ({})", list);
  }
  if (config_.tp_one_rank) {
    const SkippedCollectives s = skipped_collectives();
    const double steps = double(std::max<int64_t>(1, stats_.steps_total));
    LOG_INFO(
        "--tp-one-rank: skipped collectives over {} steps: all_reduce {} calls, {:.3f} GB ({:.1f} "
        "calls, "
        "{:.1f} KB a step); all_gather {} calls, {:.3f} GB; {} step broadcasts",
        stats_.steps_total, s.all_reduce_calls, double(s.all_reduce_bytes) / 1e9,
        double(s.all_reduce_calls) / steps, double(s.all_reduce_bytes) / steps / 1e3,
        s.all_gather_calls, double(s.all_gather_bytes) / 1e9, s.broadcast_calls);
  }
}

int64_t Engine::kv_capacity_tokens() const { return plan_.kv_tokens; }

RequestLimits Engine::request_limits() const {
  return RequestLimits{.vocab_size = model_->spec().vocab_size,
                       .context_length = context_length_,
                       .kv_capacity_tokens = plan_.kv_tokens};
}

std::optional<RequestError> Engine::check(const GenerateRequest& g) const {
  if (g.capture && config_.capture.empty())
    return request_error(RequestErrorCode::kUnsupported, "",
                         "hidden-state capture was asked for but this engine captures no layers");
  if (g.prompt_logprobs_from < -1)
    return invalid_value("logprob_start_len", "must be -1 (none) or a prompt position, got {}",
                         g.prompt_logprobs_from);
  if (g.prompt_logprobs_from >= 0 && !g.resume_output_ids.empty())
    return request_error(RequestErrorCode::kUnsupported, "logprob_start_len",
                         "a resumed generation has no prompt logprobs (its prompt was scored "
                         "before it was cut short)");
  return validate_request(g.prompt_ids, g.params, g.resume_output_ids, request_limits());
}

SubmitResult Engine::submit(GenerateRequest g) {
  if (auto e = check(g)) return *e;
  std::lock_guard<std::mutex> lk(mu_);
  if (stop_)
    return request_error(RequestErrorCode::kUnavailable, "", "the engine is shutting down");
  const int64_t id = next_id_++;
  const uint64_t seed = g.params.seed ? *g.params.seed : config_.seed * 1000003u + uint64_t(id);
  auto live = std::make_unique<Live>(id, std::move(g), *tokenizer_, seed);
  for (const auto& s : live->request.params().stop_strings)
    live->max_stop_len = std::max(live->max_stop_len, s.size());
  inbox_.push_back(std::move(live));
  ++live_count_;
  cv_.notify_all();
  return id;
}

void Engine::abort(int64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  abort_inbox_.push_back(id);
  cv_.notify_all();
}

void Engine::wait_idle() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return live_count_ == 0; });
}

bool Engine::flush_cache() {
  std::unique_lock<std::mutex> lk(mu_);
  flush_requested_ = true;
  flush_done_ = false;
  cv_.notify_all();
  idle_cv_.wait(lk, [&] { return flush_done_ || stop_; });
  return flush_result_;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

}  // namespace strata
