// PagedRequest: one Request with its own KV cache and pages (in reverse order, so its rows cross
// page boundaries out of order), and forwards of BatchPlans over it (BatchPlan::build, the
// engine's planning): the harness of the draft-tree forward tests (speculative decoding) on the
// CPU reference and on the GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "arch/model.h"
#include "engine/batch_plan.h"

namespace strata::testing {

// One request's KV and pages, and forwards of BatchPlans over it.
class PagedRequest {
 public:
  PagedRequest(Model& model, std::vector<int32_t> prompt, int32_t page_size,
               DType kv_dtype = DType::kF32, int32_t max_tokens = 64)
      : model_(model), page_size_(page_size) {
    KvLayout layout = model.kv_layout();
    layout.page_size = page_size;
    layout.num_pages = (max_tokens + page_size - 1) / page_size;
    layout.dtype = kv_dtype;
    kv_ = model.backend().alloc_kv(layout);
    request_ = std::make_unique<Request>(1, std::move(prompt), SamplingParams{});
    request_->pages().resize(size_t(layout.num_pages));
    std::iota(request_->pages().rbegin(), request_->pages().rend(), 0);
  }

  // Runs `seq` (its request is ours) and returns its logits rows [rows, vocab]. `drop_tree_mask`
  // (a negative control of the tree tests): the plan's tree mask is removed, so a draft tree is
  // attended causally in node order.
  std::vector<float> run(ScheduledSeq seq, bool drop_tree_mask = false) {
    seq.request = request_.get();
    const std::vector<ScheduledSeq> seqs = {seq};
    BatchPlan plan = BatchPlan::build(seqs, page_size_);
    if (drop_tree_mask) plan.tree_mask.clear();
    ForwardBatch b;
    b.token_ids = plan.token_ids.data();
    b.attn = plan.view();
    b.logit_rows = plan.logits_rows.data();
    b.num_logit_rows = int(plan.logits_rows.size());
    std::vector<float> logits(plan.logits_rows.size() * size_t(model_.spec().vocab_size));
    model_.forward(b, *kv_, logits.data());
    return logits;
  }
  // Prefills the first `count` prompt tokens (a chunk that samples nothing): kv_len = count.
  void prefill(int32_t count) {
    run({.num_new_tokens = count, .sample = false});
    request_->set_kv_len(count);
  }
  int32_t slot(int32_t row) const {
    return request_->pages()[size_t(row / page_size_)] * page_size_ + row % page_size_;
  }
  // Every layer's stored K and V bytes of KV row `row` (a host-memory cache: the CPU backend).
  std::vector<uint8_t> kv_row(int32_t row) const {
    std::vector<uint8_t> out;
    const KvLayout& lay = kv_->layout();
    for (int l = 0; l < lay.num_layers; ++l) {
      const auto* k = static_cast<const uint8_t*>(kv_->k(l).data) + slot(row) * lay.k_row_bytes(l);
      out.insert(out.end(), k, k + lay.k_row_bytes(l));
      if (lay.v_dim > 0) {
        const auto* v =
            static_cast<const uint8_t*>(kv_->v(l).data) + slot(row) * lay.v_row_bytes(l);
        out.insert(out.end(), v, v + lay.v_row_bytes(l));
      }
    }
    return out;
  }
  KvStorage& kv() { return *kv_; }
  Request& request() { return *request_; }

 private:
  Model& model_;
  int32_t page_size_;
  std::unique_ptr<KvStorage> kv_;
  std::unique_ptr<Request> request_;
};

}  // namespace strata::testing
