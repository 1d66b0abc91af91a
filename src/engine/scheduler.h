// Scheduler: the pure policy that picks what the next engine step runs (SGLang's policy, FCFS).
// decide() takes a snapshot of the request queues and the KV pool and returns a Decision; it
// touches nothing, so it is tested on hand-made snapshots. ScheduleState (schedule_state.h) builds
// snapshots and applies decisions to the pool, the radix cache and the requests.
//
// Policy, per step:
//  1. Prefill first. The chunked request (at most one) continues with its next chunk. Then waiting
//     requests are admitted in order while (a) fewer than max_running_requests run, (b) the step's
//     prefill tokens stay within max_prefill_tokens (the first request may exceed it) and
//     chunked_prefill_size, and (c) the pool has room: free + evictable pages, minus the decode
//     reservation of every running request (min(remaining, clip) x new_token_ratio tokens), must
//     hold the new request's uncached tokens plus min(remaining, clip) tokens for its own decode
//     (SGLang reserves the full clipped amount for the request being admitted and the ratio-scaled
//     amount for those already running). With nothing running, the first request is admitted
//     when its uncached tokens fit, so a request that fits the pool always runs eventually.
//     A request longer than chunked_prefill_size is split; its chunks end on page boundaries.
//     Requests that score their prompt (prompt logprobs: a full logits row a token) share
//     score_rows_per_step tokens a step on top of that, so their chunks are smaller.
//     A waiting request whose tokens + 1 exceed the whole pool is rejected.
//  2. Otherwise decode every decoding request, for num_continuous_decode_steps steps when nothing
//     waits (fewer if pages run short); under speculative decoding one step at a time, its
//     drafts' room given where pages are left (SchedulerConfig::decode_tokens_per_step). When even
//     one step does not fit, running requests are retracted, least progress first (fewest output
//     tokens, then longest prompt), until it does; new_token_ratio then rises to the observed need,
//     and otherwise decays by new_token_ratio_decay per decode step down to min_new_token_ratio.
#pragma once

#include <cstdint>
#include <vector>

namespace strata {

struct SchedulerConfig {
  int32_t page_size = 1;
  int32_t chunked_prefill_size = 8192;  // tokens per prefill step; <= 0 disables chunking
  int32_t max_prefill_tokens = 16384;   // prefill tokens per step (soft: one request may exceed)
  int32_t max_running_requests = 256;
  int32_t num_continuous_decode_steps = 1;
  double init_new_token_ratio = 0.7;
  double min_new_token_ratio = 0.1;
  double new_token_ratio_decay = 0.001;  // (init - min) / 600 steps, as SGLang
  int32_t clip_max_new_tokens = 4096;    // cap of a request's decode reservation, in tokens
  int32_t retract_decode_steps = 20;     // SGLang's estimate of steps a survivor keeps decoding
  // --disable-radix-cache: no prefix is shared or kept; a request's pages go back to the pool when
  // it ends (engine/schedule_state.h). The tree then stays empty.
  bool disable_radix_cache = false;
  // Tokens one decode step computes per request: 1, or 1 + the drafts it verifies under
  // speculative decoding (engine/spec/drafter.h). The decision secures one token per decoding
  // request (retracting only for that); ScheduleState::apply then gives each the room for its
  // drafts from the pages still free or evictable (fewer drafts when short), and a continuous
  // decode is one step.
  int32_t decode_tokens_per_step = 1;
  // --speculative-batch-size-threshold: a decode step of more decoding requests than this runs
  // without speculation (no drafts, no draft room: plain decode steps; ScheduledStep::speculative),
  // where verifying drafts costs more than it saves. 0: speculation at every batch size.
  int32_t speculative_batch_size_threshold = 0;
  // Prefill tokens a step gives requests that score their prompt (their entries' scores_prompt):
  // each such token takes a full logits row (vocab floats on the device and the host: 512 rows
  // of a 163,840-token vocabulary are ~0.3 GB of bf16 logits and ~0.3 GB of floats), so their
  // chunks stay this small whatever chunked_prefill_size is. At least one page a step.
  int32_t score_rows_per_step = 512;
};

struct WaitingEntry {
  int64_t id = 0;
  int32_t total_len = 0;      // prompt + output tokens (output is non-empty after retraction)
  int32_t cached_tokens = 0;  // radix hit, whole pages, < total_len
  int32_t cached_evictable_pages = 0;  // of the hit, pages now evictable (locking removes them)
  int32_t remaining_new_tokens = 0;
  bool scores_prompt = false;  // its prefill computes a logits row a token (prompt logprobs)
};

struct RunningEntry {
  int64_t id = 0;
  bool decoding = false;  // false: the chunked request, mid-prefill
  int32_t kv_len = 0;
  int32_t total_len = 0;
  int32_t held_pages = 0;  // pages in its page table
  int32_t prompt_len = 0;
  int32_t output_len = 0;
  int32_t remaining_new_tokens = 0;
  int32_t max_new_tokens = 0;
  int32_t releasable_pages = 0;  // pages that become free or evictable if it is retracted
  bool scores_prompt = false;    // its prefill computes a logits row a token (prompt logprobs)
};

struct SchedulerSnapshot {
  std::vector<WaitingEntry> waiting{};  // queue order (may be a prefix of the queue)
  bool more_waiting = false;            // the queue holds more than `waiting`
  std::vector<RunningEntry> running{};
  int32_t total_pages = 0;
  int32_t free_pages = 0;
  int32_t evictable_pages = 0;
  double new_token_ratio = 0.7;
};

struct PrefillWork {
  int64_t id = 0;
  int32_t num_tokens = 0;  // new tokens this step (a chunk, or the rest of the prompt)
  bool last_chunk = true;  // the step ends the prefill, so its last token is sampled
};

struct Decision {
  std::vector<int64_t> reject;    // waiting requests that can never fit the pool
  std::vector<int64_t> retract;   // running requests to send back to waiting (before the step)
  std::vector<int64_t> truncate;  // running requests to finish with reason length: the pool cannot
                                  // hold one more token for them even alone (not expected when
                                  // max_new_tokens is clamped to the pool)
  std::vector<PrefillWork> prefill;  // continuing chunk first, then admissions in queue order
  std::vector<int64_t> decode;       // decoding requests (empty when prefill is not)
  int32_t num_decode_steps = 1;      // decode steps to run before deciding again
  double new_token_ratio = 0.7;      // the ratio for the next snapshot
  bool idle() const { return prefill.empty() && decode.empty(); }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);
  const SchedulerConfig& config() const { return config_; }

  // Pure. Cost: O(waiting + running log running).
  Decision decide(const SchedulerSnapshot& snapshot) const;

  // Tokens of decode reservation for a request with `remaining` new tokens to go.
  double reservation_tokens(int32_t remaining, double ratio) const;

 private:
  bool schedule_prefill(const SchedulerSnapshot& s, Decision* d) const;
  void schedule_decode(const SchedulerSnapshot& s, Decision* d) const;
  int64_t pages_for(int64_t tokens) const {
    return (tokens + config_.page_size - 1) / config_.page_size;
  }

  SchedulerConfig config_;
};

}  // namespace strata
