#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace strata {

Scheduler::Scheduler(const SchedulerConfig& config) : config_(config) {
  CHECK_GE(config_.page_size, 1);
  CHECK_GE(config_.max_running_requests, 1);
  CHECK_GE(config_.num_continuous_decode_steps, 1);
  CHECK(config_.min_new_token_ratio <= config_.init_new_token_ratio);
  CHECK_GE(config_.decode_tokens_per_step, 1);
}

double Scheduler::reservation_tokens(int32_t remaining, double ratio) const {
  return std::min(std::max(remaining, 0), config_.clip_max_new_tokens) * ratio;
}

Decision Scheduler::decide(const SchedulerSnapshot& s) const {
  Decision d;
  d.new_token_ratio = s.new_token_ratio;
  for (const WaitingEntry& w : s.waiting) {
    if (pages_for(int64_t{w.total_len} + 1) > s.total_pages) d.reject.push_back(w.id);
  }
  if (schedule_prefill(s, &d)) return d;
  schedule_decode(s, &d);
  return d;
}

// Fills d->prefill; returns whether there is prefill work this step.
bool Scheduler::schedule_prefill(const SchedulerSnapshot& s, Decision* d) const {
  const int64_t page = config_.page_size;
  double reserved = 0;
  for (const RunningEntry& r : s.running)
    reserved += reservation_tokens(r.remaining_new_tokens, s.new_token_ratio);
  // Tokens the step may still claim: pages obtainable now minus running requests' reservations.
  double budget = double(s.free_pages + s.evictable_pages) * page - reserved;
  int64_t rem_chunk = config_.chunked_prefill_size > 0 ? config_.chunked_prefill_size
                                                       : std::numeric_limits<int64_t>::max();
  int64_t rem_input = config_.max_prefill_tokens;
  // Prompt-scoring requests' tokens this step (whole pages, at least one).
  int64_t rem_score = std::max<int64_t>(config_.score_rows_per_step / page * page, page);
  bool chunk_open = false;

  for (const RunningEntry& r : s.running) {
    if (r.decoding) continue;
    chunk_open = true;  // until its last chunk is scheduled, nobody else is admitted
    // Its own reservation does not hold back its own prefill.
    double own = budget + reservation_tokens(r.remaining_new_tokens, s.new_token_ratio);
    int64_t budget_pages = own > 0 ? int64_t(std::floor(own / page)) : 0;
    int64_t max_tokens = (r.held_pages + budget_pages) * page - r.kv_len;
    const int64_t score_cap = r.scores_prompt ? rem_score : std::numeric_limits<int64_t>::max();
    int64_t end =
        r.kv_len + std::min({int64_t{r.total_len - r.kv_len}, rem_chunk, max_tokens, score_cap});
    if (end < r.total_len) end = end / page * page;  // a non-final chunk ends on a page boundary
    if (end <= r.kv_len) continue;                   // no room this step: it waits
    int64_t n = end - r.kv_len;
    budget -= double(std::max<int64_t>(0, pages_for(end) - r.held_pages) * page);
    rem_chunk -= n;
    rem_input -= n;
    if (r.scores_prompt) rem_score -= n;
    d->prefill.push_back({.id = r.id, .num_tokens = int32_t(n), .last_chunk = end == r.total_len});
    chunk_open = end < r.total_len;
  }
  if (chunk_open) return !d->prefill.empty();

  int64_t num_running = int64_t(s.running.size());
  for (const WaitingEntry& w : s.waiting) {
    if (pages_for(int64_t{w.total_len} + 1) > s.total_pages) continue;  // rejected
    if (num_running >= config_.max_running_requests) break;
    CHECK_LT(w.cached_tokens, w.total_len);
    CHECK_EQ(w.cached_tokens % page, 0);
    int64_t extend = w.total_len - w.cached_tokens;
    int64_t extend_pages = pages_for(w.total_len) - w.cached_tokens / page;
    double lock_cost = double(w.cached_evictable_pages) * page;  // locked prefix leaves evictable
    double decode_reserve =
        std::min(std::max(w.remaining_new_tokens, 0), config_.clip_max_new_tokens);
    bool idle = num_running == 0;
    double need = double(extend_pages * page) + lock_cost;
    if (need + decode_reserve > budget && !(idle && need <= budget)) break;
    if (extend_pages * page > rem_input && !d->prefill.empty()) break;
    const int64_t room = w.scores_prompt ? std::min(rem_chunk, rem_score) : rem_chunk;
    if (extend <= room) {
      d->prefill.push_back({.id = w.id, .num_tokens = int32_t(extend), .last_chunk = true});
      budget -= need + decode_reserve;
      rem_chunk -= extend;
      rem_input -= extend;
      if (w.scores_prompt) rem_score -= extend;
      ++num_running;
      continue;
    }
    int64_t trunc = room / page * page;  // the prefix is whole pages, so the chunk end is too
    if (trunc <= 0) break;
    d->prefill.push_back({.id = w.id, .num_tokens = int32_t(trunc), .last_chunk = false});
    break;  // at most one chunked request
  }
  return !d->prefill.empty();
}

void Scheduler::schedule_decode(const SchedulerSnapshot& s, Decision* d) const {
  std::vector<const RunningEntry*> live;
  bool has_chunked = false;
  for (const RunningEntry& r : s.running) {
    if (r.decoding)
      live.push_back(&r);
    else
      has_chunked = true;
  }
  if (live.empty()) {
    if (s.running.empty()) d->new_token_ratio = config_.init_new_token_ratio;  // idle
    return;
  }
  const int64_t avail = int64_t{s.free_pages} + s.evictable_pages;
  // New pages the live requests need to run k more decode steps. Under speculative decoding
  // (decode_tokens_per_step > 1) one token each is what a step needs: the drafts' room is taken
  // from what is left when the decision is applied (ScheduleState::apply), so a short pool
  // shortens drafts instead of retracting requests.
  const int64_t per_step = config_.decode_tokens_per_step;
  auto need = [&](int32_t k) {
    int64_t n = 0;
    for (const RunningEntry* r : live) {
      int64_t steps = std::min(k, std::max(1, r->remaining_new_tokens));
      n += std::max<int64_t>(0, pages_for(r->kv_len + steps) - r->held_pages);
    }
    return n;
  };
  int32_t k = 1;
  if (s.waiting.empty() && !s.more_waiting && !has_chunked && per_step == 1)
    k = config_.num_continuous_decode_steps;
  while (k > 1 && need(k) > avail) --k;

  if (need(1) <= avail) {
    d->new_token_ratio =
        std::max(s.new_token_ratio - config_.new_token_ratio_decay, config_.min_new_token_ratio);
  } else {
    // Retract least progress first: pop from the back of (most output, shortest prompt) order.
    std::vector<const RunningEntry*> order;
    for (const RunningEntry& r : s.running) order.push_back(&r);
    std::stable_sort(order.begin(), order.end(), [](const RunningEntry* a, const RunningEntry* b) {
      if (a->output_len != b->output_len) return a->output_len > b->output_len;
      return a->prompt_len < b->prompt_len;
    });
    int64_t freed = 0;
    while (!live.empty() && need(1) > avail + freed) {
      const RunningEntry* victim = order.back();
      order.pop_back();
      freed += victim->releasable_pages;
      std::erase(live, victim);
      // The last one standing cannot be helped by retraction: it ends with reason length.
      (order.empty() ? d->truncate : d->retract).push_back(victim->id);
    }
    int64_t decoded = 0, max_new = 0;
    for (const RunningEntry* r : live) {
      decoded += r->output_len;
      max_new += r->max_new_tokens;
    }
    if (!live.empty()) {
      double estimate =
          double(decoded + int64_t{config_.retract_decode_steps} * int64_t(live.size())) /
          double(max_new + 1);
      d->new_token_ratio = std::max(s.new_token_ratio, std::min(1.0, estimate));
    }
    k = 1;
  }
  for (const RunningEntry* r : live) d->decode.push_back(r->id);
  d->num_decode_steps = d->decode.empty() ? 1 : k;
}

}  // namespace strata
