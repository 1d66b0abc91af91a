// The engine thread: drain submissions and aborts, decide, apply, run the forward pass, sample,
// stream, finalize. Everything here runs on the engine thread only.
#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "core/capture_counters.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/batch_plan.h"
#include "engine/live_request.h"
#include "engine/parallel_runtime.h"
#include "engine/schedule_state.h"
#include "kv/page_pool.h"
#include "kv/radix_cache.h"

namespace strata {
namespace {

// Largest prefix length <= n that does not cut a UTF-8 sequence.
size_t utf8_safe_prefix(const std::string& s, size_t n) {
  while (n > 0 && n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

using StepClock = std::chrono::steady_clock;

// STRATA_STEP_TIMING=1: every 256 steps, the engine logs how a step's wall time splits between
// forward_sample (the GPU's work, with the host's launches overlapping it) and the rest
// (scheduling, batch plan, streaming: time the GPU idles). Engine thread only.
struct StepTiming {
  bool on = [] {
    const char* e = std::getenv("STRATA_STEP_TIMING");
    return e != nullptr && e[0] == '1';
  }();
  double forward_s = 0, rest_s = 0;
  int64_t steps = 0, rows = 0;
  void add(StepClock::time_point begin, StepClock::time_point fwd_begin,
           StepClock::time_point fwd_end, size_t n) {
    if (!on) return;
    const auto now = StepClock::now();
    forward_s += std::chrono::duration<double>(fwd_end - fwd_begin).count();
    rest_s += std::chrono::duration<double>((fwd_begin - begin) + (now - fwd_end)).count();
    rows += int64_t(n);
    if (++steps < 256) return;
    LOG_INFO(
        "engine steps: {} steps, {:.1f} rows each: forward + sampling {:.2f} ms, the rest of the "
        "step (host only) {:.2f} ms per step",
        steps, double(rows) / double(steps), 1e3 * forward_s / double(steps),
        1e3 * rest_s / double(steps));
    forward_s = rest_s = 0;
    steps = rows = 0;
  }
};

}  // namespace

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] {
        return stop_ || !inbox_.empty() || !abort_inbox_.empty() || flush_requested_ ||
               !live_.empty() || !retiring_.empty();
      });
      if (stop_) break;
    }
    drain_inbox();
    if (!live_.empty()) run_step();
    // Nothing left to run: the last finished requests wait for their rows here.
    retire_written(/*wait=*/live_.empty());
    update_stats();
  }
  // Shutdown: everything still live ends with an abort event (after the writer is done with it).
  drain_inbox();
  if (capture_writer_) capture_writer_->wait(capture_writer_->last_submitted());
  retire_written(/*wait=*/true);
  for (auto& [id, live] : live_) {
    if (live->request.is_live()) state_->abort(&live->request);
    finalize(*live);
  }
  live_.clear();
  update_stats();
}

void Engine::drain_inbox() {
  std::deque<std::unique_ptr<Live>> incoming;
  std::vector<int64_t> aborts;
  bool flush = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    incoming.swap(inbox_);
    aborts.swap(abort_inbox_);
    flush = flush_requested_;
    flush_requested_ = false;
  }
  for (auto& live : incoming) {
    Status st = stop_ ? unavailable("the engine is shutting down") : state_->submit(&live->request);
    if (!st.ok()) {
      if (live->request.is_live()) live->request.abort(st.message());
      finalize(*live);
      continue;
    }
    const int64_t id = live->request.id();
    import_kv(*live);  // checkpointed KV rows become a cached prefix its admission hits
    if (!live->resume_output_ids.empty())
      emit(*live, std::move(live->resume_output_ids), {}, /*resumed=*/true);
    live_[id] = std::move(live);
  }
  for (int64_t id : aborts) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    if (it->second->request.is_live()) state_->abort(&it->second->request);
    std::unique_ptr<Live> live = std::move(it->second);
    live_.erase(it);
    retire(std::move(live));
  }
  if (flush) {
    const bool ok = state_->flush_cache();
    update_stats();  // the caller reads stats right after: they must show the flush
    std::lock_guard<std::mutex> lk(mu_);
    flush_result_ = ok;
    flush_done_ = true;
    idle_cv_.notify_all();
  }
}

void Engine::run_step() {
  static thread_local StepTiming timing;
  auto step_begin = StepClock::now();
  ScheduledStep step = state_->schedule(*scheduler_);
  auto end_request = [&](Request* r) {
    auto it = live_.find(r->id());
    if (it == live_.end()) return;
    std::unique_ptr<Live> live = std::move(it->second);
    live_.erase(it);
    retire(std::move(live));
  };
  for (Request* r : step.rejected) end_request(r);
  for (Request* r : step.truncated) end_request(r);
  {
    // Published before the forward pass, so /metrics shows this step's batch while it runs.
    std::lock_guard<std::mutex> lk(mu_);
    stats_.retractions_total += int64_t(step.retracted.size());
    stats_.num_running = int64_t(state_->num_running());
    stats_.num_waiting = int64_t(state_->num_waiting()) + int64_t(inbox_.size());
    stats_.kv_tokens_used = int64_t(pool_->num_used_pages()) * config_.page_size;
  }
  if (step.seqs.empty()) {
    // Nothing runnable (should not last): wait for new input instead of spinning.
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, std::chrono::milliseconds(5));
    return;
  }
  // Admission is news for a client waiting to send its response headers (server/generation.h).
  for (const ScheduledSeq& seq : step.seqs) {
    Live& live = *live_.at(seq.request->id());
    if (live.start_announced) continue;
    live.start_announced = true;
    StreamEvent ev;
    ev.started = true;
    ev.prompt_tokens = live.request.prompt_len();
    if (live.on_event) live.on_event(ev);
  }
  const int64_t vocab = model_->spec().vocab_size;
  for (int i = 0; i < step.num_decode_steps; ++i) {
    if (i > 0) {
      drain_inbox();  // aborts take effect between continuous decode steps
      step = state_->continue_decode();
      if (step.seqs.empty()) break;
    }
    // Apply: the step's host-side metadata.
    BatchPlan plan = BatchPlan::build(step.seqs, config_.page_size);
    // Each row's sampling parameters, with its request's draw (one per sampled token, in the
    // request's own stream); the backend samples where the logits are and only ids come back,
    // plus the full rows of requests that asked for logprobs.
    const size_t n = plan.logits_rows.size();
    std::vector<Live*> row_live(n);
    std::vector<SampleRowParams> row_params(n);
    std::vector<int32_t> keep_rows;
    std::vector<LogitEdit> edits;  // penalties and logit_bias (engine/logit_edits.h)
    for (size_t j = 0; j < n; ++j) {
      Live& live = *live_.at(step.seqs[size_t(plan.sampled_seqs[j])].request->id());
      row_live[j] = &live;
      const SamplingParams& p = live.request.params();
      row_params[j] = draw_row_params(p, live.rng);
      if (p.edits_logits()) append_logit_edits(p, live.output_counts, int32_t(j), &edits);
      if (live.top_logprobs >= 0) keep_rows.push_back(int32_t(j));
    }
    bool capture = false;
    for (const ScheduledSeq& seq : step.seqs)
      capture = capture || live_.at(seq.request->id())->capture != nullptr;
    // Small decode steps replay captured graphs (the host's launch work then leaves the step).
    // Graph mode covers this forward only, so nothing else (host-tier copies) is ever recorded.
    // Steps with logit edits run eagerly: their edit counts change every step, and so would a
    // graph's signature. Capture's device copies are part of the graph (fixed buffers).
    const bool graphs =
        !step.is_prefill && int(n) <= config_.cuda_graph_max_bs.value_or(0) && edits.empty();
    // Run.
    const auto fwd_begin = StepClock::now();
    runner_->run(plan, StepInputs{.row_params = row_params,
                                  .keep_rows = keep_rows,
                                  .edits = edits,
                                  .capture = capture,
                                  .graphs = graphs});
    const auto fwd_end = StepClock::now();
    // Post-process: captured states by position, logprobs, sampled tokens, stops.
    if (runner_->captured() != nullptr) store_captured(step, plan);
    const std::vector<int32_t>& sampled = runner_->sampled();
    const float* kept_logits = runner_->kept_logits();
    std::vector<TokenLogprobs> lps(n);
    for (size_t i = 0; i < keep_rows.size(); ++i) {
      const size_t j = size_t(keep_rows[i]);
      lps[j] = token_logprobs(kept_logits + i * size_t(vocab), vocab, sampled[j],
                              row_live[j]->top_logprobs);
    }
    std::vector<Request*> finished = state_->complete(step, sampled);
    {
      int64_t user_rows = 0;
      for (const Live* l : row_live) user_rows += l->internal ? 0 : 1;
      const double seconds = std::chrono::duration<double>(StepClock::now() - step_begin).count();
      step_seconds_[size_t(stats_.steps_total % int64_t(step_seconds_.size()))] = seconds;
      std::lock_guard<std::mutex> lk(mu_);
      ++stats_.steps_total;
      stats_.generation_tokens_total += user_rows;
      stats_.last_step_seconds = seconds;
      stats_.longest_recent_step_seconds =
          *std::max_element(step_seconds_.begin(), step_seconds_.end());
    }
    for (size_t j = 0; j < sampled.size(); ++j) {
      Request* r = step.seqs[size_t(plan.sampled_seqs[j])].request;
      Live& live = *live_.at(r->id());
      if (r->params().edits_logits()) live.output_counts.add(sampled[j]);
      std::vector<TokenLogprobs> lp;
      if (live.top_logprobs >= 0) lp.push_back(std::move(lps[j]));
      emit(live, {sampled[j]}, std::move(lp));
      if (live.stopped_by_string && r->state() == RequestState::kDecoding) {
        state_->finish(r, FinishReason::kStop);
        finished.push_back(r);
      }
    }
    export_kv(step.seqs);  // pages this step completed, for requests that checkpoint their KV
    for (Request* r : finished) end_request(r);
    retire_written(/*wait=*/false);  // requests of earlier steps whose rows are stored by now
    timing.add(step_begin, fwd_begin, fwd_end, n);
    step_begin = StepClock::now();
  }
}

// Hands the step's captured block, with each row's request and position, to the capture writer,
// which scatters the rows into each capturing request's CapturedStates (by position: a recomputed
// position is written again) while the engine runs the next steps. The block changes hands by a
// swap; the engine waits here only when the writer is `depth` blocks behind.
void Engine::store_captured(const ScheduledStep& step, const BatchPlan& plan) {
  CaptureJob job;
  job.width = runner_->capture_width();
  job.dtype = runner_->capture_dtype();
  job.states.resize(step.seqs.size());
  std::vector<Live*> lives(step.seqs.size());
  for (size_t s = 0; s < step.seqs.size(); ++s) {
    lives[s] = live_.at(step.seqs[s].request->id()).get();
    job.states[s] = lives[s]->capture;
  }
  job.row_begin.assign(plan.q_indptr.begin(),
                       plan.q_indptr.begin() + int64_t(step.seqs.size()) + 1);
  job.positions.assign(plan.positions.begin(), plan.positions.begin() + plan.num_tokens());
  job.rows = capture_writer_->take_buffer();
  runner_->swap_captured(job.rows);
  const uint64_t seq = capture_writer_->submit(std::move(job));
  for (Live* live : lives)
    if (live->capture != nullptr) live->capture_fence = seq;
}

void Engine::retire(std::unique_ptr<Live> live) {
  if (!retiring_.empty() || (live->capture != nullptr && capture_writer_ != nullptr &&
                             !capture_writer_->written(live->capture_fence))) {
    retiring_.push_back(std::move(live));  // in order: events of requests keep their ending order
    return;
  }
  finalize(*live);
}

void Engine::retire_written(bool wait) {
  while (!retiring_.empty()) {
    Live& live = *retiring_.front();
    if (live.capture != nullptr && capture_writer_ != nullptr) {
      if (wait)
        capture_writer_->wait(live.capture_fence);
      else if (!capture_writer_->written(live.capture_fence))
        return;
    }
    finalize(live);
    retiring_.pop_front();
  }
}

// Streams one step's tokens of a request: detokenize, check stop strings, hold back text that
// could still begin a stop string.
void Engine::emit(Live& live, std::vector<int32_t> tokens, std::vector<TokenLogprobs> logprobs,
                  bool resumed) {
  if (live.stopped_by_string) return;
  for (int32_t t : tokens) live.pending_text += live.decoder.push(t);
  StreamEvent ev;
  ev.resumed = resumed;
  ev.rng_draws = live.rng.draws();
  ev.token_ids = std::move(tokens);
  ev.logprobs = std::move(logprobs);
  const auto& stops = live.request.params().stop_strings;
  size_t stop_at = std::string::npos;
  for (const auto& s : stops) {
    if (s.empty()) continue;
    size_t p = live.pending_text.find(s);
    if (p != std::string::npos) stop_at = std::min(stop_at, p);
  }
  if (stop_at != std::string::npos) {
    ev.text = live.pending_text.substr(0, stop_at);
    live.pending_text.clear();
    live.stopped_by_string = true;
  } else {
    const size_t hold = live.max_stop_len > 0 ? live.max_stop_len - 1 : 0;
    const size_t n = live.pending_text.size() > hold
                         ? utf8_safe_prefix(live.pending_text, live.pending_text.size() - hold)
                         : 0;
    ev.text = live.pending_text.substr(0, n);
    live.pending_text.erase(0, n);
  }
  ev.prompt_tokens = live.request.prompt_len();
  ev.completion_tokens = live.request.output_len();
  if (live.on_event) live.on_event(ev);
}

void Engine::finalize(Live& live) {
  const Request& r = live.request;
  StreamEvent ev;
  ev.finished = true;
  if (!live.stopped_by_string) ev.text = live.pending_text + live.decoder.finish();
  ev.finish_reason = r.state() == RequestState::kAborted ? FinishReason::kAbort : r.finish_reason();
  if (live.stopped_by_string) ev.finish_reason = FinishReason::kStop;
  ev.error = r.error();
  ev.prompt_tokens = r.prompt_len();
  ev.completion_tokens = r.output_len();
  ev.cached_tokens = r.prefix_hit_tokens();
  if (live.on_event) live.on_event(ev);
  std::lock_guard<std::mutex> lk(mu_);
  if (!live.internal) {  // a health probe is no user traffic
    if (ev.finish_reason == FinishReason::kAbort) {
      ++stats_.requests_aborted_total;
      stats_.aborted_computed_tokens_total += r.computed_tokens();
    } else {
      ++stats_.requests_finished_total;
    }
    stats_.prompt_tokens_total += r.prompt_len();
  }
  ++finalized_pending_;  // leaves live_count_ after the stats reflect it (update_stats)
}

std::vector<HostTierRankStats> Engine::rank_host_stats(bool force) {
  if (!hicache_) return {};
  if (group_host_tier_ == nullptr) {
    const HiCacheStats h = hicache_->stats();
    return {HostTierRankStats{.rank = 0,
                              .host_bytes = host_io_->host_bytes(),
                              .pages_to_host = h.backed_up_pages,
                              .pages_to_device = h.promoted_pages,
                              .bytes_to_host = h.bytes_to_host,
                              .bytes_to_device = h.bytes_to_device,
                              .copy_seconds = h.copy_seconds}};
  }
  const auto now = StepClock::now();
  if (!force && (!group_host_tier_->stats_stale() ||
                 (!live_.empty() && now - last_rank_stats_ < std::chrono::seconds(1))))
    return {};
  last_rank_stats_ = now;
  auto ranks = group_host_tier_->gather_rank_stats();
  if (!ranks.ok()) {
    LOG_WARN("host KV tier: the ranks' statistics were not gathered: {}",
             ranks.status().to_string());
    return {};
  }
  return std::move(ranks).value();
}

void Engine::update_stats() {
  if (hicache_) hicache_->poll();  // landed copies let go of their pages before counting
  std::vector<HostTierRankStats> ranks = rank_host_stats(/*force=*/false);
  const RadixCacheStats cs = cache_->stats();
  std::lock_guard<std::mutex> lk(mu_);
  stats_.num_running = int64_t(state_->num_running());
  stats_.num_waiting = int64_t(state_->num_waiting()) + int64_t(inbox_.size());
  stats_.kv_tokens_total = plan_.kv_tokens;
  stats_.kv_tokens_used = int64_t(pool_->num_used_pages()) * config_.page_size;
  stats_.kv_tokens_cached = int64_t(cs.evictable_pages) * config_.page_size;
  stats_.cache_hit_tokens_total = cs.hit_tokens;
  stats_.cache_lookup_tokens_total = cs.lookup_tokens;
  stats_.new_token_ratio = state_->new_token_ratio();
  stats_.prefill_tokens_total = state_->prefill_tokens_total();
  if (hicache_) stats_.hicache = hicache_->stats();
  if (!ranks.empty()) stats_.hicache_ranks = std::move(ranks);
  stats_.cpu_fallback_ops = backend_->cpu_fallback_counts();
  // Requests finalized since the last update stop counting as live only now, so wait_idle()
  // returns with stats that already show them gone.
  live_count_ -= finalized_pending_;
  finalized_pending_ = 0;
  if (live_count_ == 0) idle_cv_.notify_all();
}

}  // namespace strata
