// ScheduleState: the engine thread's request queues and KV bookkeeping, and the one place that
// applies a scheduler Decision to the page pool, the radix cache and the requests. The engine loop:
//
//   ScheduledStep step = state.schedule(scheduler);   // snapshot -> decide -> apply
//   report step.rejected / step.truncated;             // errors / finished for those requests
//   for (int i = 0; i < step.num_decode_steps && !step.seqs.empty(); ++i) {
//     if (i > 0) step = state.continue_decode();
//     BatchPlan plan = BatchPlan::build(step.seqs, page_size);
//     ... forward(plan.view()), sample rows plan.logits_rows ...
//     finished = state.complete(step, sampled);       // one token per plan.logits_rows entry
//   }
//
// Requests are owned by the caller and must outlive their time here (until they are finished,
// aborted or rejected). Not thread-safe: the engine thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/batch_plan.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "kv/hicache.h"
#include "kv/page_pool.h"
#include "kv/radix_cache.h"

namespace strata {

struct ScheduledStep {
  std::vector<ScheduledSeq> seqs;  // prefill chunks, or decodes (one token each)
  bool is_prefill = false;
  int32_t num_decode_steps = 1;  // decode steps to run (continue_decode for steps 2..n)
  // Its decodes verify drafts (decode_tokens_per_step > 1 and at most
  // speculative_batch_size_threshold of them): they have draft room (draft_room()).
  bool speculative = false;
  std::vector<Request*> rejected;   // now kAborted with error(): can never fit the KV pool
  std::vector<Request*> retracted;  // sent back to the waiting queue
  std::vector<Request*> truncated;  // now kFinished with reason length (pool exhausted)
};

class ScheduleState {
 public:
  // eos_token_ids finish a request (reason stop) unless it sets ignore_eos.
  // hicache (optional) is the host KV tier behind pool/cache: evictions demote through it, and
  // prefill steps extend a request's device prefix with pages promoted from host.
  ScheduleState(const SchedulerConfig& config, PagePool* pool, RadixCache* cache,
                std::vector<int32_t> eos_token_ids, HiCache* hicache = nullptr);

  // Queues a new request (state kWaiting) and clamps its max_new_tokens so that prompt + output
  // fits the pool. An empty prompt is an error (the request is then aborted).
  Status submit(Request* request);

  // The scheduler's view: the head of the waiting queue (as many entries as could be admitted,
  // plus one), every running request, pool and cache counts. Cost: a radix peek per entry.
  SchedulerSnapshot snapshot() const;
  // Applies a decision made on snapshot() (no change in between). Allocates pages (evicting
  // cached prefixes as needed), locks and retains admitted prefixes, retracts, rejects.
  ScheduledStep apply(const Decision& decision);
  ScheduledStep schedule(const Scheduler& scheduler) { return apply(scheduler.decide(snapshot())); }
  // The next step of a continuous decode: every decoding request, one token each. Empty when a
  // request has no room for its token (the caller then schedules again).
  ScheduledStep continue_decode();

  // After the forward pass of `step`: advances kv_len, appends the sampled tokens (sampled[i] for
  // the i-th seq with sample set), caches the prefixes of finished requests and of non-final
  // chunks, and returns the requests that finished (stop token, EOS, length).
  std::vector<Request*> complete(const ScheduledStep& step, std::span<const int32_t> sampled);
  // The same for a step that verified drafts: committed[i], for the i-th seq with sample set, is
  // its accepted drafts (a prefix of seq.draft) then the target's own next token. They are
  // appended in order until one finishes the request (the rest are dropped); kv_len counts the
  // last token and the accepted drafts (KV rollback of the rejected ones), and pages past the
  // committed tokens go back to the pool.
  std::vector<Request*> complete(const ScheduledStep& step,
                                 std::span<const std::vector<int32_t>> committed);
  // Draft tokens a decoding request of this step may verify: what its pages hold past its last
  // token, at most decode_tokens_per_step - 1 and never more than it may still produce after
  // the target's own token.
  int32_t draft_room(const Request& request) const;
  // Drops a request's output tokens past `output_len` (a stop string found inside the tokens one
  // verify step committed): a running one's before finish(), or one complete() just finished.
  void truncate_output(Request* request, int32_t output_len);

  // Finishes a running request for a reason found outside (e.g. a stop string).
  void finish(Request* request, FinishReason reason);
  // Aborts a live request in any state; its pages are released (full pages stay cached).
  void abort(Request* request, std::string error = "");
  // Drops the whole prefix cache; refuses (false) while requests run.
  bool flush_cache();

  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  const std::vector<Request*>& running() const { return running_; }
  const std::deque<Request*>& waiting() const { return waiting_; }
  double new_token_ratio() const { return new_token_ratio_; }
  // Prompt tokens scheduled for computation by prefill steps (cache and host-tier hits excluded).
  int64_t prefill_tokens_total() const { return prefill_tokens_total_; }
  const SchedulerConfig& config() const { return config_; }
  std::span<const int32_t> eos_token_ids() const { return eos_token_ids_; }

  // CHECKs pool and cache invariants and that refcounts equal holders (tree + running requests),
  // every running request's prefix equals its locked cache path, locked pages equal the union of
  // those paths, and waiting requests hold nothing. O(pages + tokens); for tests.
  void check_invariants() const;

 private:
  void admit(Request* r);
  void ensure_pages(Request* r, int32_t tokens);
  void release_kv(Request* r);
  void cache_unfinished(Request* r);
  void reserve_draft_room(const ScheduledStep& step);
  void release_unneeded_pages(Request* r);
  void promote_from_host(Request* r, int32_t end);
  void evict(int32_t pages);
  int32_t evict_ahead_pages() const;
  void remove_running(Request* r);
  void remove_waiting(Request* r);
  Request* lookup(int64_t id) const;

  SchedulerConfig config_;
  PagePool* pool_;
  RadixCache* cache_;
  HiCache* hicache_;  // null without a host tier
  std::vector<int32_t> eos_token_ids_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;
  std::unordered_map<int64_t, Request*> live_;
  double new_token_ratio_;
  int64_t prefill_tokens_total_ = 0;
};

}  // namespace strata
