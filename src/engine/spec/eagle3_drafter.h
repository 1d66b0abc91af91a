// Eagle3ChainDrafter: speculative decoding's proposer with an EAGLE-3 drafter model
// (arch/eagle3.h), drafting a chain (--speculative-eagle-topk 1), as SGLang's EAGLE worker does:
//
//   observe(): one batched "extend" forward of the drafter over every request's newly committed
//     positions (and a verify's rejected ones, below): row p reads the target's aux-layer states at
//     p and the token at p + 1, writes the drafter's KV at p, and predicts the token at p + 2. Per
//     request it keeps the last row's hidden_out and its argmax: the first draft of the next step
//     (that row pairs the last committed state with the request's last token).
//   propose(): draft j + 1 (j >= 1) comes from one batched forward over every request still
//     drafting: its kept hidden_out row and draft j at position kv_len - 1 + j, its output row
//     kept for the next forward. num_steps drafts cost num_steps - 1 forwards.
//
// Draft ids are argmaxes over the draft vocabulary (the first index of the max), mapped to the
// target's ids through d2t. The drafter's KV is one layer indexed by the target's page ids
// (engine/spec/drafter.h explains why pages, retraction and the prefix cache need nothing new).
// observe() runs a verify's rejected rows too (SGLang's draft extend: every request then has
// 1 + k rows; what they write lies past the committed positions and is rewritten before it is
// read). Draft steps and observe()s after decode or verify steps, of at most `graph_max_batch`
// requests, run as CUDA graphs (Backend::set_graph_mode: fixed shapes, one graph per batch size);
// observe()s with prefill chunks run eagerly.
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

class Eagle3ChainDrafter : public Drafter {
 public:
  // `model` on the target's backend; `aux_layers` its resolved target layers (capture_spec());
  // its KV gets `num_pages` pages of `page_size` tokens: the target pool's. `graph_max_batch`:
  // the engine's --cuda-graph-max-bs (0: every forward eager).
  Eagle3ChainDrafter(std::unique_ptr<Eagle3Drafter> model, std::vector<int> aux_layers,
                     int64_t num_pages, int page_size, int graph_max_batch = 0);

  std::string_view name() const override { return "EAGLE3"; }
  CaptureSpec capture_spec() const override { return CaptureSpec{.layers = aux_layers_}; }
  void observe(std::span<const CommittedTokens> committed, int64_t capture_width,
               DType capture_dtype) override;
  void propose(std::span<const DraftQuery> queries,
               std::vector<std::vector<int32_t>>* drafts) override;
  void release(int64_t request_id) override { states_.erase(request_id); }

  const Eagle3Drafter& model() const { return *model_; }

 private:
  // What the last observe() left of a request.
  struct RequestState {
    int32_t position = -1;        // the committed position of the kept row (kv_len - 1 then)
    int32_t first_draft = -1;     // the kept row's prediction, a target id
    std::vector<uint8_t> hidden;  // the kept row's hidden_out, [hidden_size] activation bytes
  };

  // Runs `batch` (recorded as a graph when `graph`) and returns each logit row's draft as a
  // target id; hidden_out as the forward.
  std::vector<int32_t> forward_drafts(const Eagle3Batch& batch, const Tensor& hidden_out,
                                      bool graph);

  // The first `rows` rows of *buffer (made or grown to hold them): device inputs and outputs
  // kept across steps, so that the graphs recorded over them find the same addresses (an upload
  // or pool allocation per step would capture a new graph whenever its address moved).
  Tensor rows_of(DeviceTensorPtr* buffer, DType dtype, int64_t rows, int64_t cols);

  std::unique_ptr<Eagle3Drafter> model_;
  std::vector<int> aux_layers_;
  std::unique_ptr<KvStorage> kv_;
  int page_size_;
  int graph_max_batch_;
  std::unordered_map<int64_t, RequestState> states_;  // by request id
  std::vector<float> logits_;                         // scratch: [rows, draft vocab]
  // rows_of's buffers: observe's features, hidden out and kept rows; propose's two row sets.
  DeviceTensorPtr feats_, hidden_, kept_, prev_[2];
};

}  // namespace strata
