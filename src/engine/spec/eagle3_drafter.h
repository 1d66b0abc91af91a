// Eagle3Proposer: speculative decoding's proposer with an EAGLE-3 drafter model (arch/eagle3.h),
// as SGLang's EAGLE worker: a chain (--speculative-eagle-topk 1) or a draft tree (topk > 1).
//
//   observe(): one batched "extend" forward of the drafter over every request's newly committed
//     positions (and a verify's rejected ones, below): row p reads the target's aux-layer states at
//     p and the token at p + 1, writes the drafter's KV at p, and predicts the token at p + 2. Per
//     request it keeps the last row's hidden_out and its argmax (topk 1: the first draft of the
//     next step) or its topk best tokens and log-probabilities (a tree's depth-1 candidates); that
//     row pairs the last committed state with the request's last token. After a tree's verify the
//     committed positions read the accepted path's rows of the verify block
//     (CommittedTokens::hidden_rows).
//   propose(), chain: draft j + 1 (j >= 1) comes from one batched forward over every request still
//     drafting: its kept hidden_out row and draft j at position kv_len - 1 + j, its output row
//     kept for the next forward. num_steps drafts cost num_steps - 1 forwards. A request near its
//     limit still drafts all num_steps (the extra ones dropped) where its pages hold them, so
//     every forward of a step has one row per request (a fixed shape per batch size).
//   observe(drafts_next = false) (speculation paused above --speculative-batch-size-threshold):
//     the same forward, its KV writes kept, no kept rows (one logit row ends the forward); the
//     requests get drafts again after the next observe() with drafts_next.
//   propose(), tree (engine/spec/draft_tree.h's DraftTreeBuilder, SGLang's EAGLE-2 tree): step 0
//     takes observe()'s topk candidates; each of the num_steps - 1 draft steps forwards the
//     frontier (topk nodes of one depth d, at position kv_len - 1 + d, each fed its own token and
//     the hidden_out row of the forward that proposed it: its parent's, or observe()'s kept row at
//     depth 1) and expands each frontier node by its topk best continuations (scored by cumulative
//     log-probability); the tree keeps the num_draft_tokens - 1 best nodes. A node attends to the
//     request's drafter KV and its own ancestors only (a tree mask): each draft step's forward
//     runs every node forwarded so far (depths 1..d, their KV at rows kv_len.. past the prefix,
//     recomputed alike), so that the ancestors' KV rows are the step's own new rows, which the
//     tree mask can select. Rows past the request's pages use scratch pages of the drafter's KV
//     (after the target's page ids), `kScratchRequests` requests' worth per forward.
//
// Draft ids are argmaxes (top-k: the best logits, the lower index first on ties) over the draft
// vocabulary, mapped to the target's ids through d2t. The drafter's KV is one layer indexed by the
// target's page ids (engine/spec/drafter.h explains why pages, retraction and the prefix cache
// need nothing new). observe() runs a verify's rejected rows too (SGLang's draft extend: every
// request then has 1 + k rows; what they write lies past the committed positions and is
// rewritten before it is read; a tree's accepted nodes need no drafter KV move, since observe()
// writes the committed positions' rows itself). Draft steps and observe()s after decode or
// verify steps, of at most `graph_max_batch` requests, run as CUDA graphs
// (Backend::set_graph_mode: fixed shapes, one graph per batch size; a tree's mask and positions
// are staged metadata, not part of a graph's signature); observe()s with prefill chunks run
// eagerly.
// A request whose kept row is not at kv_len - 1 (the drafter missed its last commit) gets no
// drafts that step; one whose context came from the prefix cache reads the drafter rows of the
// request that computed those pages (the row at a shared page's last position paired that
// request's next token: acceptance may drop, never exactness).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "arch/eagle3.h"
#include "engine/spec/drafter.h"

namespace strata {

// OK when `dir` (--speculative-draft-model-path) is a directory; else an error naming the flag.
Status check_eagle3_dir(const std::string& dir);

// Bytes per token of the KV of the drafter in `dir` (one layer of K and V rows in `dtype`, the
// activation dtype it is kept in): the engine fits the target pool and this one in the bytes the
// planner gave the target's pool.
StatusOr<int64_t> eagle3_kv_bytes_per_token(const std::string& dir, DType dtype);

// The drafts a proposer makes per step (SGLang's --speculative-num-steps, --speculative-eagle-topk,
// --speculative-num-draft-tokens; engine/spec/spec_config.h checks them).
struct DraftShape {
  int32_t num_steps = 3;
  int32_t topk = 1;              // 1: a chain of num_steps drafts
  int32_t num_draft_tokens = 4;  // a tree's nodes, the root included (a chain: num_steps + 1)
};

class Eagle3Proposer : public Drafter {
 public:
  // Requests per tree draft forward: the drafter's KV has scratch pages for this many.
  static constexpr int kScratchRequests = 64;

  // `model` on the target's backend; `aux_layers` its resolved target layers (capture_spec());
  // its KV gets `num_pages` pages of `page_size` tokens: the target pool's (plus scratch pages
  // for trees). `graph_max_batch`: the engine's --cuda-graph-max-bs (0: every forward eager).
  Eagle3Proposer(std::unique_ptr<Eagle3Drafter> model, std::vector<int> aux_layers,
                 int64_t num_pages, int page_size, int graph_max_batch = 0,
                 DraftShape shape = DraftShape{});

  std::string_view name() const override { return "EAGLE3"; }
  CaptureSpec capture_spec() const override { return CaptureSpec{.layers = aux_layers_}; }
  void observe(std::span<const CommittedTokens> committed, int64_t capture_width,
               DType capture_dtype, bool drafts_next) override;
  void propose(std::span<const DraftQuery> queries, std::vector<DraftTree>* drafts) override;
  void release(int64_t request_id) override { states_.erase(request_id); }

  const Eagle3Drafter& model() const { return *model_; }

 private:
  // What the last observe() left of a request.
  struct RequestState {
    int32_t position = -1;        // the committed position of the kept row (kv_len - 1 then)
    int32_t first_draft = -1;     // the kept row's prediction, a target id
    std::vector<uint8_t> hidden;  // the kept row's hidden_out, [hidden_size] activation bytes
    // A tree's depth-1 candidates: the kept row's topk best target ids and log-probabilities.
    std::vector<int32_t> top_tokens;
    std::vector<float> top_logprobs;
  };

  // Runs `batch` (recorded as a graph when `graph`): each logit row's topk best draft ids and
  // their log-probabilities in top_ids_/top_logprobs_ (backend/top_k.h's op where the backend has
  // it: only those leave the device; else the rows are downloaded and ranked on the host by the
  // op's reference), hidden_out as the forward.
  void forward_rows(const Eagle3Batch& batch, const Tensor& hidden_out, bool graph);
  // Logit row i's argmax as a target id.
  int32_t argmax_token(int i) const;
  // Logit row i's `k` (<= topk) best target ids and their log-probabilities (log_softmax over the
  // draft vocabulary), best first, appended.
  void top_tokens(int i, int k, std::vector<int32_t>* tokens, std::vector<float>* logprobs) const;
  void propose_chain(std::span<const DraftQuery> queries,
                     std::vector<std::vector<int32_t>>* drafts);
  // Drafter KV pages a tree's draft steps may need past a request's own pages.
  static int64_t scratch_pages_per_request(const DraftShape& shape, int page_size);
  // Trees for queries[i] for i in `which` (at most kScratchRequests, each with a kept row).
  void propose_trees(std::span<const DraftQuery> queries, std::span<const size_t> which,
                     std::vector<DraftTree>* drafts);

  // The first `rows` rows of *buffer (made or grown to hold them): device inputs and outputs
  // kept across steps, so that the graphs recorded over them find the same addresses (an upload
  // or pool allocation per step would capture a new graph whenever its address moved).
  Tensor rows_of(DeviceTensorPtr* buffer, DType dtype, int64_t rows, int64_t cols);

  std::unique_ptr<Eagle3Drafter> model_;
  std::vector<int> aux_layers_;
  std::unique_ptr<KvStorage> kv_;
  int64_t num_pages_;  // the target's; the drafter's KV has scratch pages after them (trees)
  int page_size_;
  int graph_max_batch_;
  DraftShape shape_;
  std::unordered_map<int64_t, RequestState> states_;  // by request id
  std::vector<float> logits_;  // scratch: [rows, draft vocab] (no device top-k op)
  // The last forward's logit rows' topk best draft ids and log-probabilities: [rows, topk].
  std::vector<int32_t> top_ids_;
  std::vector<float> top_logprobs_;
  // rows_of's buffers: observe's features, hidden out and kept rows; propose's two row sets; a
  // tree's rows (kept rows, then the last draft forward's hidden_out) and its forward's inputs.
  DeviceTensorPtr feats_, hidden_, kept_, prev_[2], tree_table_, tree_prev_;
};

}  // namespace strata
