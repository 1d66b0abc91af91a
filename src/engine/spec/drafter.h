// Drafter: what speculative decoding asks of a draft proposer (design.md §1, the model runner's
// speculative step kind; issue 26). The engine loop drives it; it never touches the scheduler, the
// page pool or the radix cache.
//
// A step with speculation, on the engine thread:
//   1. schedule: each decoding request gets pages for 1 + k tokens (ScheduleState budgets
//      SchedulerConfig::decode_tokens_per_step);
//   2. propose(): a draft tree of up to k draft tokens per decoding request, rooted at its last
//      token (engine/spec/draft_tree.h; a chain is the tree whose node i has parent i - 1);
//   3. one target forward verifies every request's [last token, d1..dk] together with the rest of
//      the batch: a chain's at positions n..n+k (engine/spec/verify.h: the longest agreeing
//      prefix plus the target's own next token), a tree's nodes at KV rows n..n+k in node order,
//      rope positions n + depth, under the tree mask (engine/spec/tree_verify.h: the path the
//      target's own samples follow); the accepted path's KV rows then move to n+1..n+a;
//   4. observe(): per request, the positions whose target KV became committed this step, the
//      token that follows each, and (when capture_spec() is not empty) the target's captured
//      hidden states of those positions (a tree's: the accepted path's rows of the verify block);
//   5. ScheduleState rolls back what was rejected: kv_len counts committed tokens only, pages past
//      them go back to the pool, the radix cache only ever sees committed tokens.
//
// KV of a model drafter (EAGLE-3): one decoder layer whose KV is indexed by the SAME page ids and
// slots as the target's (a second KvStorage of the same page count). A position's target slot and
// drafter slot belong to the same page, so pages, retraction, the prefix cache and the host tier
// need nothing new. Draft steps write the drafter's KV at positions past kv_len, inside the pages
// the scheduler gave the request for this step (DraftQuery::max_tokens never exceeds them); those
// slots are either rewritten by a later observe() or released with the page. Where the drafter's
// KV is stale (a prefix shared through the radix cache that the drafter never saw, one promoted
// from the host tier, a request it was released for), only acceptance drops: verification by the
// target makes the output exact whatever the drafter proposes.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "arch/model.h"
#include "engine/request.h"
#include "engine/spec/draft_tree.h"

namespace strata {

// One request's news after a target forward (prefill chunk, plain decode or verify).
struct CommittedTokens {
  const Request* request = nullptr;
  // Positions [first_position, first_position + count) now hold committed target KV.
  int32_t first_position = 0;
  int32_t count = 0;
  // The token at position p + 1 for each such p (count of them): a prompt token for a prefill
  // chunk, else an accepted draft or the target's own new token. EAGLE-3's drafter reads
  // (next_tokens[i], target hidden state at first_position + i) for its KV row at that position.
  std::span<const int32_t> next_tokens;
  // [block rows, capture width] of the runner's capture dtype: the target's captured states of
  // the request's rows in the step's forward; null when the drafter captures nothing
  // (Drafter::capture_spec()). Position first_position + i reads block row hidden_rows[i], or
  // row i when hidden_rows is empty (a chain or a prefill: the committed positions first).
  const uint8_t* hidden = nullptr;
  // A draft tree's verify (empty otherwise): [rows] the block row of each of the `rows`
  // positions: the accepted path's rows (root first), then the other nodes' in node order.
  std::span<const int32_t> hidden_rows;
  // The request's rows in the step's forward (>= count): a verify's 1 + k rows at positions
  // [first_position, first_position + rows), its rejected drafts' after the committed ones.
  // step_tokens [rows]: the token after each such position as the step had it (next_tokens,
  // then the rejected drafts, the last one repeated at the end); step_pages: the page table of
  // the step's forward, covering those positions (pages past the committed tokens may have gone
  // back to the pool since: nothing else writes them before the next step). A drafter may run
  // the rejected rows too (a fixed shape per batch size, for CUDA graphs) when nothing reads what
  // they write before a later observe() or draft step rewrites those positions.
  int32_t rows = 0;
  std::span<const int32_t> step_tokens;
  std::span<const int32_t> step_pages;
};

// A decoding request that wants drafts this step. Its KV holds positions [0, kv_len()); its last
// token (position kv_len()) and the drafts follow. Pages cover kv_len() + 1 + max_tokens tokens.
struct DraftQuery {
  const Request* request = nullptr;
  int32_t max_tokens =
      0;  // at most this many drafts (pages, max_tokens and --speculative-num-steps)
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string_view name() const = 0;

  // Hidden states the target's forward must capture for observe() (ModelRunner::set_capture);
  // empty: none (NGRAM).
  virtual CaptureSpec capture_spec() const { return {}; }

  // After every target forward, every scheduled request that computed something this step, in the
  // step's order. `capture_width`/`capture_dtype` describe CommittedTokens::hidden.
  // `drafts_next`: the engine expects to ask for drafts before the next observe(). False while
  // speculation is paused (SpeculativeConfig::batch_size_threshold: plain decode steps at large
  // batches): a drafter then keeps only its own state current (EAGLE-3: its KV) and may skip
  // what only propose() reads; a request it has no proposal state for gets no drafts the next
  // time it is asked, and has them again after the next observe() with drafts_next set.
  virtual void observe(std::span<const CommittedTokens> committed, int64_t capture_width,
                       DType capture_dtype, bool drafts_next) = 0;

  // Fills (*drafts)[i] with queries[i]'s draft tree: rooted at the request's last token
  // (token_at(kv_len())), at most queries[i].max_tokens drafts (DraftTree::root_only: none, the
  // request then decodes one token as without speculation). A chain when each node's parent is
  // the node before. Deterministic given what it observed (verification treats each draft as a
  // proposal of probability 1: engine/spec/verify.h, tree_verify.h).
  virtual void propose(std::span<const DraftQuery> queries, std::vector<DraftTree>* drafts) = 0;

  // The request ended (finished, aborted) or was retracted: forget its state. A retracted
  // request comes back through observe() of its new prefill.
  virtual void release(int64_t request_id) = 0;
};

}  // namespace strata
