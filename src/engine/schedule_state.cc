#include "engine/schedule_state.h"

#include <algorithm>
#include <unordered_set>

#include "core/check.h"

namespace strata {

ScheduleState::ScheduleState(const SchedulerConfig& config, PagePool* pool, RadixCache* cache,
                             std::vector<int32_t> eos_token_ids, HiCache* hicache)
    : config_(config),
      pool_(pool),
      cache_(cache),
      hicache_(hicache),
      eos_token_ids_(std::move(eos_token_ids)),
      new_token_ratio_(config.init_new_token_ratio) {
  CHECK_EQ(config_.page_size, pool_->page_size());
  CHECK_EQ(config_.page_size, cache_->page_size());
}

Status ScheduleState::submit(Request* r) {
  CHECK(r->state() == RequestState::kWaiting);
  CHECK_MSG(!live_.contains(r->id()), "request id {} submitted twice", r->id());
  // Engine::submit refuses these first (engine/request_validation.h); direct callers get the same.
  if (r->prompt_len() == 0) {
    r->abort("the prompt has no tokens");
    return invalid_argument("request {}: the prompt has no tokens", r->id());
  }
  int64_t capacity = pool_->capacity_tokens();
  if (r->prompt_len() < capacity) r->set_max_new_tokens_limit(int32_t(capacity - r->prompt_len()));
  if (r->urgent()) {
    waiting_.insert(waiting_.begin(), r);
  } else {
    waiting_.push_back(r);
  }
  live_[r->id()] = r;
  return Status::ok_status();
}

Request* ScheduleState::lookup(int64_t id) const {
  auto it = live_.find(id);
  CHECK_MSG(it != live_.end(), "decision names unknown request {}", id);
  return it->second;
}

SchedulerSnapshot ScheduleState::snapshot() const {
  SchedulerSnapshot s;
  s.total_pages = pool_->num_pages();
  // Pages evicted ahead to the host tier count as free: the allocation that needs them waits for
  // their copies (HiCache::evict_device).
  s.free_pages = pool_->num_free_pages() + (hicache_ ? hicache_->pages_pending_free() : 0);
  s.evictable_pages = cache_->evictable_pages();
  s.new_token_ratio = new_token_ratio_;
  for (const Request* r : running_) {
    s.running.push_back(
        RunningEntry{.id = r->id(),
                     .decoding = r->state() == RequestState::kDecoding,
                     .kv_len = r->kv_len(),
                     .total_len = r->total_len(),
                     .held_pages = int32_t(r->pages().size()),
                     .prompt_len = r->prompt_len(),
                     .output_len = r->output_len(),
                     .remaining_new_tokens = r->remaining_new_tokens(),
                     .max_new_tokens = r->max_new_tokens(),
                     .releasable_pages = int32_t(r->pages().size()) - r->cached_pages() +
                                         cache_->exclusive_locked_pages(r->cache_node()),
                     .scores_prompt = r->prompt_score_from() >= 0});
  }
  // Admission is FCFS and stops at the first request that does not fit, so the head of the queue
  // is enough: the free slots plus one.
  int64_t fitting = 0;
  int64_t slots = std::max<int64_t>(0, config_.max_running_requests - int64_t(running_.size()));
  for (const Request* r : waiting_) {
    if (fitting > slots) break;
    WaitingEntry w{.id = r->id(),
                   .total_len = r->total_len(),
                   .remaining_new_tokens = r->remaining_new_tokens(),
                   .scores_prompt = r->prompt_score_from() >= 0};
    if (pool_->pages_for_tokens(int64_t{r->total_len()} + 1) <= pool_->num_pages()) {
      // The last token is always computed: its logits are needed. A request that shares no
      // prefix (admit) has no hit either: the decision must not count pages it will not share.
      RadixPeek peek = config_.disable_radix_cache || !r->use_prefix_cache()
                           ? RadixPeek{}
                           : cache_->peek_prefix(r->tokens(r->total_len() - 1));
      w.cached_tokens = peek.matched_tokens;
      w.cached_evictable_pages = peek.evictable_pages;
      ++fitting;
    }
    s.waiting.push_back(w);
  }
  s.more_waiting = s.waiting.size() < waiting_.size();
  return s;
}

void ScheduleState::remove_running(Request* r) {
  auto it = std::find(running_.begin(), running_.end(), r);
  CHECK(it != running_.end());
  running_.erase(it);
}

void ScheduleState::remove_waiting(Request* r) {
  auto it = std::find(waiting_.begin(), waiting_.end(), r);
  CHECK(it != waiting_.end());
  waiting_.erase(it);
}

// Takes the cached prefix of a waiting request: lock, retain, and start its prefill.
void ScheduleState::admit(Request* r) {
  // Without the prefix cache every request starts at the root, with nothing to share.
  const bool share = !config_.disable_radix_cache && r->use_prefix_cache();
  const std::vector<int32_t> key = share ? r->tokens(r->total_len() - 1) : std::vector<int32_t>();
  RadixMatch m = cache_->match_prefix(key);
  if (hicache_) hicache_->on_match(key, m.matched_tokens);
  cache_->inc_lock_ref(m.node);
  pool_->retain(m.pages);
  r->pages() = std::move(m.pages);
  r->set_cache_lock(m.node, int32_t(r->pages().size()));
  r->set_kv_len(m.matched_tokens);
  r->set_prefix_hit_tokens(m.matched_tokens);
  r->start_prefill();
  remove_waiting(r);
  running_.push_back(r);
}

// Grows r's page table to cover `tokens` tokens, evicting cached prefixes when the pool is short.
void ScheduleState::ensure_pages(Request* r, int32_t tokens) {
  int64_t need = pool_->pages_for_tokens(tokens) - int64_t(r->pages().size());
  if (need <= 0) return;
  if (pool_->num_free_pages() < need) evict(int32_t(need - pool_->num_free_pages()));
  bool ok = pool_->allocate_into(int32_t(need), &r->pages());
  CHECK_MSG(ok, "request {}: the decision over-committed the pool ({} pages wanted, {} free)",
            r->id(), need, pool_->num_free_pages());
}

void ScheduleState::evict(int32_t pages) {
  if (hicache_)
    hicache_->evict_device(pages);  // demotes to host per the write policy
  else
    cache_->evict(pages);
}

// Extends r's cached prefix with pages the host tier holds, up to end - 1 (this step's chunk
// keeps at least one token to compute): promoted pages join the device tree and r's locked path.
// Only when r holds exactly its locked prefix (admission, or a chunk that ended on a page).
void ScheduleState::promote_from_host(Request* r, int32_t end) {
  const int32_t ps = config_.page_size;
  if (r->kv_len() != r->cached_pages() * ps || int32_t(r->pages().size()) != r->cached_pages())
    return;
  const std::vector<int32_t> key = r->tokens(r->total_len() - 1);
  const int32_t promoted =
      hicache_->promote(key, r->kv_len(), std::min(end - 1, int32_t(key.size())));
  if (promoted == 0) return;
  const int32_t n = r->kv_len() + promoted;
  RadixMatch m = cache_->match_prefix(std::span(key).first(size_t(n)), /*record_stats=*/false);
  CHECK_EQ(m.matched_tokens, n);
  pool_->retain(m.pages);
  pool_->release(r->pages());
  r->pages() = std::move(m.pages);
  cache_->inc_lock_ref(m.node);
  cache_->dec_lock_ref(r->cache_node());
  r->set_cache_lock(m.node, n / ps);
  r->set_kv_len(n);
  r->set_prefix_hit_tokens(r->prefix_hit_tokens() + promoted);
}

// Gives back everything r holds: full computed pages go to the radix cache (so a retried or
// retracted request finds them; with the cache disabled, to the pool too), the rest to the pool;
// the prefix lock is dropped.
void ScheduleState::release_kv(Request* r) {
  if (r->cache_node() == nullptr) return;
  const int32_t full = config_.disable_radix_cache ? 0 : r->kv_len() / config_.page_size;
  std::vector<PageId>& pages = r->pages();
  CHECK_LE(full, int32_t(pages.size()));
  if (full > 0) {
    const std::vector<int32_t> tokens = r->tokens(full * config_.page_size);
    cache_->insert(tokens, std::span(pages).first(full));
    if (hicache_) hicache_->on_insert(tokens);
  }
  pool_->release(std::span(pages).subspan(full));
  pages.clear();
  cache_->dec_lock_ref(r->cache_node());
  r->set_cache_lock(nullptr, 0);
}

// After a non-final chunk: caches its full pages now so other requests can share them, and
// switches the request to the tree's pages (a page computed twice is released).
void ScheduleState::cache_unfinished(Request* r) {
  if (config_.disable_radix_cache) return;  // the request keeps its own pages
  const int32_t full = r->kv_len() / config_.page_size;
  if (full <= r->cached_pages()) return;
  std::vector<int32_t> tokens = r->tokens(full * config_.page_size);
  std::vector<PageId>& pages = r->pages();
  cache_->insert(tokens, std::span(pages).first(full));  // consumes r's references to them
  if (hicache_) hicache_->on_insert(tokens);
  RadixMatch m = cache_->match_prefix(tokens, /*record_stats=*/false);
  CHECK_EQ(m.matched_tokens, full * config_.page_size);
  pool_->retain(m.pages);
  std::copy(m.pages.begin(), m.pages.end(), pages.begin());
  cache_->inc_lock_ref(m.node);
  cache_->dec_lock_ref(r->cache_node());
  r->set_cache_lock(m.node, full);
}

ScheduledStep ScheduleState::apply(const Decision& d) {
  ScheduledStep step;
  if (hicache_) hicache_->poll();  // retire landed copies (unlocks host prefixes)
  for (int64_t id : d.reject) {
    Request* r = lookup(id);
    remove_waiting(r);
    live_.erase(id);
    r->abort(
        fmt::format("the prompt ({} tokens) and one generated token can never fit the KV "
                    "cache ({} tokens); raise --mem-fraction-static or shorten the prompt",
                    r->total_len(), pool_->capacity_tokens()));
    step.rejected.push_back(r);
  }
  // Retracted requests go back to the head of the queue, in the decision's order.
  for (auto it = d.retract.rbegin(); it != d.retract.rend(); ++it) {
    Request* r = lookup(*it);
    release_kv(r);
    r->retract();
    remove_running(r);
    waiting_.push_front(r);
    step.retracted.insert(step.retracted.begin(), r);
  }
  for (int64_t id : d.truncate) {
    Request* r = lookup(id);
    release_kv(r);
    r->finish(FinishReason::kLength);
    remove_running(r);
    live_.erase(id);
    step.truncated.push_back(r);
  }
  // Lock every admitted prefix before allocating, so no allocation evicts a prefix just chosen.
  for (const PrefillWork& w : d.prefill) {
    Request* r = lookup(w.id);
    if (!r->is_running()) admit(r);
  }
  // The chunk's end stays where the decision put it, so pages promoted from host replace pages
  // the decision budgeted for computing: the step never needs more pages than decided.
  for (const PrefillWork& w : d.prefill) {
    Request* r = lookup(w.id);
    const int32_t end = std::min(r->kv_len() + w.num_tokens, r->total_len());
    if (hicache_) promote_from_host(r, end);
    int32_t n = end - r->kv_len();
    CHECK_GT(n, 0);
    ensure_pages(r, r->kv_len() + n);
    prefill_tokens_total_ += n;
    step.seqs.push_back(
        {.request = r, .num_new_tokens = n, .sample = r->kv_len() + n == r->total_len()});
  }
  if (hicache_ && !d.prefill.empty()) hicache_->wait_promotions();  // the forward reads them
  step.is_prefill = !d.prefill.empty();
  for (int64_t id : d.decode) {
    Request* r = lookup(id);
    CHECK(r->state() == RequestState::kDecoding);
    int32_t steps = std::min(d.num_decode_steps, std::max(1, r->remaining_new_tokens()));
    ensure_pages(r, r->kv_len() + steps);  // reserved for the whole continuous decode
    step.seqs.push_back({.request = r, .num_new_tokens = 1, .sample = true});
  }
  const int32_t threshold = config_.speculative_batch_size_threshold;
  step.speculative = config_.decode_tokens_per_step > 1 && !d.decode.empty() &&
                     (threshold <= 0 || int64_t(d.decode.size()) <= threshold);
  if (step.speculative) reserve_draft_room(step);
  step.num_decode_steps = d.decode.empty() ? 1 : d.num_decode_steps;
  new_token_ratio_ = d.new_token_ratio;
  // Under write_back an allocation that evicts waits for the demoted pages' copies. Demoting now
  // what the next step may need lets those copies run beside this step's forward instead.
  if (hicache_) hicache_->evict_ahead(evict_ahead_pages());
  return step;
}

// Speculative decoding: each decode of `step` (one token secured by the decision) grows its pages
// toward decode_tokens_per_step tokens, in step order, while free or evictable pages last. The
// drafter then proposes only what fits and what the request may still produce (draft_room); the
// rest of the room holds the verify's pad rows (engine/spec/verify_shape.h), so that every verify
// of the step has decode_tokens_per_step rows.
void ScheduleState::reserve_draft_room(const ScheduledStep& step) {
  for (const ScheduledSeq& seq : step.seqs) {
    Request* r = seq.request;
    if (r->state() != RequestState::kDecoding) continue;
    const int32_t want = config_.decode_tokens_per_step;
    const int64_t extra = pool_->pages_for_tokens(r->kv_len() + want) - int64_t(r->pages().size());
    if (extra <= 0) continue;
    const int64_t available = int64_t(pool_->num_free_pages()) +
                              (hicache_ ? hicache_->pages_pending_free() : 0) +
                              cache_->evictable_pages();
    const int64_t pages = std::min(extra, available);
    if (pages <= 0) break;
    ensure_pages(
        r, int32_t(std::min<int64_t>(r->kv_len() + want,
                                     (int64_t(r->pages().size()) + pages) * config_.page_size)));
  }
}

int32_t ScheduleState::draft_room(const Request& r) const {
  const int32_t room = int32_t(r.pages().size()) * config_.page_size - (r.kv_len() + 1);
  return std::max(
      0, std::min({room, config_.decode_tokens_per_step - 1, r.remaining_new_tokens() - 1}));
}

// Pages the next step may allocate: a page per running request (a decode step crosses at most one
// page boundary), plus a prefill chunk; capped at 1/16 of the pool, so the prefix cache keeps the
// rest of what it holds on the device.
int32_t ScheduleState::evict_ahead_pages() const {
  const int64_t chunk = pool_->pages_for_tokens(std::max(0, config_.chunked_prefill_size));
  return int32_t(std::min<int64_t>(int64_t(running_.size()) + chunk, pool_->num_pages() / 16));
}

ScheduledStep ScheduleState::continue_decode() {
  ScheduledStep step;
  for (Request* r : running_) {
    if (r->state() != RequestState::kDecoding) continue;
    if (pool_->pages_for_tokens(r->kv_len() + 1) > int64_t(r->pages().size())) return {};
    step.seqs.push_back({.request = r, .num_new_tokens = 1, .sample = true});
  }
  return step;
}

std::vector<Request*> ScheduleState::complete(const ScheduledStep& step,
                                              std::span<const int32_t> sampled) {
  std::vector<std::vector<int32_t>> tokens;
  tokens.reserve(sampled.size());
  for (int32_t t : sampled) tokens.push_back({t});
  return complete(step, tokens);
}

std::vector<Request*> ScheduleState::complete(const ScheduledStep& step,
                                              std::span<const std::vector<int32_t>> committed) {
  std::vector<Request*> finished;
  size_t next = 0;
  for (const ScheduledSeq& seq : step.seqs) {
    Request* r = seq.request;
    const std::vector<int32_t>* tokens = seq.sample ? &committed[next++] : nullptr;
    if (!r->is_running()) continue;  // aborted since the step was planned
    r->add_computed_tokens(seq.num_tokens());
    if (!seq.sample) {
      r->set_kv_len(r->kv_len() + seq.num_new_tokens);
      cache_unfinished(r);
      continue;
    }
    // The accepted drafts' KV is the committed tokens' KV; the rejected drafts' slots are
    // garbage past kv_len, overwritten by later steps or released with their pages below.
    const int32_t accepted = int32_t(tokens->size()) - 1;
    CHECK_MSG(accepted >= 0 && accepted <= int32_t(seq.draft.size()),
              "request {}: {} tokens committed for {} drafts", r->id(), tokens->size(),
              seq.draft.size());
    r->set_kv_len(r->kv_len() + seq.num_new_tokens);
    CHECK_EQ(r->kv_len(), r->total_len());
    FinishReason reason = FinishReason::kNone;
    for (int32_t i = 0; i <= accepted && reason == FinishReason::kNone; ++i) {
      if (i > 0) r->set_kv_len(r->kv_len() + 1);  // draft i - 1 (now output) has its KV
      reason = r->append_output((*tokens)[size_t(i)], eos_token_ids_);
    }
    if (reason == FinishReason::kNone) {
      if (r->state() == RequestState::kPrefilling) r->start_decode();
      if (config_.decode_tokens_per_step > 1) release_unneeded_pages(r);
      continue;
    }
    release_kv(r);
    r->finish(reason);
    remove_running(r);
    live_.erase(r->id());
    finished.push_back(r);
  }
  CHECK_EQ(next, committed.size());
  return finished;
}

// After a speculative decode: pages past the committed tokens (and the next token's slot) held
// only rejected drafts' slots; they go back to the pool. Never a cached page: those end at or
// before kv_len.
void ScheduleState::release_unneeded_pages(Request* r) {
  std::vector<PageId>& pages = r->pages();
  const int64_t keep = pool_->pages_for_tokens(r->total_len());
  if (int64_t(pages.size()) <= keep) return;
  CHECK_GE(keep, r->cached_pages());
  pool_->release(std::span(pages).subspan(size_t(keep)));
  pages.resize(size_t(keep));
}

void ScheduleState::truncate_output(Request* r, int32_t output_len) {
  r->truncate_output(output_len);
}

void ScheduleState::finish(Request* r, FinishReason reason) {
  CHECK(r->is_running());
  release_kv(r);
  r->finish(reason);
  remove_running(r);
  live_.erase(r->id());
}

void ScheduleState::abort(Request* r, std::string error) {
  CHECK(r->is_live());
  if (r->is_running()) {
    release_kv(r);
    remove_running(r);
  } else {
    remove_waiting(r);
  }
  live_.erase(r->id());
  r->abort(std::move(error));
}

bool ScheduleState::flush_cache() {
  if (!running_.empty()) return false;
  if (!cache_->reset()) return false;
  return hicache_ == nullptr || hicache_->reset();
}

void ScheduleState::check_invariants() const {
  pool_->check_invariants();
  cache_->check_invariants();
  std::vector<int32_t> holders(pool_->num_pages(), 0);
  cache_->for_each_page([&](PageId p) { ++holders[p]; });
  if (hicache_) {
    hicache_->check_invariants();
    hicache_->for_each_held_device_page([&](PageId p) { ++holders[p]; });
  }
  std::unordered_set<PageId> locked;
  for (const Request* r : running_) {
    CHECK(r->is_running());
    CHECK(r->cache_node() != nullptr);
    CHECK(live_.at(r->id()) == r);
    std::vector<PageId> path = cache_->path_pages(r->cache_node());
    CHECK_EQ(int32_t(path.size()), r->cached_pages());
    CHECK_MSG(std::equal(path.begin(), path.end(), r->pages().begin()),
              "request {}: prefix pages differ from its cache path", r->id());
    CHECK_GE(r->kv_len(), r->cached_pages() * config_.page_size);
    CHECK_GE(int64_t(r->pages().size()), pool_->pages_for_tokens(r->kv_len()));
    if (r->state() == RequestState::kDecoding) CHECK_EQ(r->kv_len(), r->total_len() - 1);
    std::unordered_set<PageId> own(r->pages().begin(), r->pages().end());
    CHECK_MSG(own.size() == r->pages().size(), "request {} holds a page twice", r->id());
    for (PageId p : r->pages()) ++holders[p];
    locked.insert(path.begin(), path.end());
  }
  for (PageId p = 0; p < pool_->num_pages(); ++p)
    CHECK_MSG(pool_->refcount(p) == holders[p], "page {}: refcount {} but {} holders", p,
              pool_->refcount(p), holders[p]);
  CHECK_EQ(int32_t(locked.size()), cache_->locked_pages());
  for (const Request* r : waiting_) {
    CHECK(r->state() == RequestState::kWaiting || r->state() == RequestState::kRetracted);
    CHECK(r->pages().empty() && r->cache_node() == nullptr && r->kv_len() == 0);
    CHECK(live_.at(r->id()) == r);
  }
  CHECK_EQ(live_.size(), waiting_.size() + running_.size());
}

}  // namespace strata
