// Test support: an EAGLE-3 drafter's forward on a backend against the PyTorch reference that
// tools/eagle3_train.py `reference` writes (reference.safetensors beside the drafter):
//   seq.ids [L + 2], seq.aux [L, 3·H_t]: random inputs
//   step1.hidden [L, H], step1.logits [L, Vd]: row p reads aux row p and token ids[p + 1] at
//     position p (one prefill over the L rows)
//   step2.hidden [L, H], step2.logits [L, Vd]: row p reads its own step-1 hidden and token
//     ids[p + 2] at position p + 1, attending to rows 0..p of step 1 and itself (the training
//     unroll's second step, i.e. a chain draft step after a prefix of p + 1 rows)
//   d2t [Vd] int32
// check_eagle3_reference runs step 1 as one sequence and step 2 for a few rows p as a ragged
// batch of sequences (prefix rows 0..p each, then one draft row each fed its own hidden back),
// pages handed out scrambled.
#pragma once

#include <gtest/gtest.h>

#include <numeric>

#include "arch/eagle3.h"
#include "support/golden.h"

namespace strata::testing {

struct Eagle3Errors {
  double step1_hidden = 0, step1_logits = 0;  // rel max error
  double step2_hidden = 0, step2_logits = 0;
  double step1_argmax = 0, step2_argmax = 0;  // argmax agreement (fraction of rows)
  double step1_nmse = 0, step2_nmse = 0;      // logits ‖a − b‖² / ‖b‖²
};

// A drafter batch over several sequences: sequence s has `lens[s]` rows already in the KV plus
// `news[s]` new rows; pages are reversed so page tables matter.
class DraftBatch {
 public:
  DraftBatch(int num_seqs, int page_size, int max_tokens_per_seq)
      : page_size_(page_size), pages_per_seq_((max_tokens_per_seq + page_size - 1) / page_size) {
    pages_.resize(size_t(num_seqs * pages_per_seq_));
    std::iota(pages_.rbegin(), pages_.rend(), 0);
  }
  int num_pages() const { return int(pages_.size()); }

  // Fills `b` (token_ids left to the caller) for sequences whose context before the step is
  // `before[s]` tokens and that add `news[s]` tokens.
  void plan(const std::vector<int>& before, const std::vector<int>& news, Eagle3Batch* b) {
    const int n = int(before.size());
    q_indptr_ = {0};
    kv_lens_.clear();
    page_indptr_ = {0};
    page_indices_.clear();
    positions_.clear();
    slots_.clear();
    for (int s = 0; s < n; ++s) {
      const int len = before[size_t(s)] + news[size_t(s)];
      q_indptr_.push_back(q_indptr_.back() + news[size_t(s)]);
      kv_lens_.push_back(len);
      const int used = (len + page_size_ - 1) / page_size_;
      for (int p = 0; p < used; ++p)
        page_indices_.push_back(pages_[size_t(s * pages_per_seq_ + p)]);
      page_indptr_.push_back(int32_t(page_indices_.size()));
      for (int i = before[size_t(s)]; i < len; ++i) {
        positions_.push_back(i);
        slots_.push_back(pages_[size_t(s * pages_per_seq_ + i / page_size_)] * page_size_ +
                         i % page_size_);
      }
    }
    b->attn.num_seqs = n;
    b->attn.num_tokens = q_indptr_.back();
    b->attn.page_size = page_size_;
    b->attn.q_indptr = q_indptr_.data();
    b->attn.kv_lens = kv_lens_.data();
    b->attn.page_indptr = page_indptr_.data();
    b->attn.page_indices = page_indices_.data();
    b->attn.positions = positions_.data();
    b->attn.slot_mapping = slots_.data();
  }

 private:
  int page_size_, pages_per_seq_;
  std::vector<int32_t> pages_, q_indptr_, kv_lens_, page_indptr_, page_indices_, positions_, slots_;
};

inline std::vector<float> download(Backend& be, const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  be.download_f32(t, v.data());
  return v;
}

inline std::vector<float> rows_of(const std::vector<float>& m, int64_t width,
                                  const std::vector<int>& rows) {
  std::vector<float> out;
  for (int r : rows)
    out.insert(out.end(), m.begin() + long(r * width), m.begin() + long((r + 1) * width));
  return out;
}

// `step2_rows`: the rows p whose draft step is checked (each a sequence of p + 1 prefix rows).
inline Eagle3Errors check_eagle3_reference(Eagle3Drafter& d, const std::string& reference_path,
                                           const std::vector<int>& step2_rows, DType kv_dtype) {
  Eagle3Errors e;
  Reference ref(reference_path);
  if (!ref.ok()) return e;
  Backend& be = d.backend();
  const auto ids = ref.i32("seq.ids");
  const auto aux = ref.f32("seq.aux");
  const int L = int(ids.size()) - 2;
  const int64_t h = d.hidden_size(), dv = d.draft_vocab_size();
  const int64_t width = int64_t(aux.size()) / L;
  const DType act = be.activation_dtype();

  // d2t: the reference's mapping.
  const auto d2t = ref.i32("d2t");
  EXPECT_EQ(int64_t(d2t.size()), dv);
  for (int64_t i = 0; i < dv && i < int64_t(d2t.size()); ++i)
    EXPECT_EQ(d.target_token(int32_t(i)), int32_t(i) + d2t[size_t(i)]) << "draft id " << i;

  // Step 1: one sequence of L rows, logits of every row.
  {
    KvLayout layout = d.kv_layout();
    layout.page_size = 3;
    layout.num_pages = (L + 2) / 3 + 1;
    layout.dtype = kv_dtype;
    auto kv = be.alloc_kv(layout);
    DraftBatch plan(1, 3, L + 1);
    Eagle3Batch b;
    plan.plan({0}, {L}, &b);
    std::vector<int32_t> tokens(ids.begin() + 1, ids.begin() + 1 + L), rows(static_cast<size_t>(L));
    std::iota(rows.begin(), rows.end(), 0);
    auto feats =
        be.upload(Tensor::make(const_cast<float*>(aux.data()), DType::kF32, {L, width}), act);
    auto hidden = be.alloc(act, {L, h});
    b.token_ids = tokens.data();
    b.target_features = &feats->view();
    b.logit_rows = rows.data();
    b.num_logit_rows = L;
    std::vector<float> logits(size_t(L * dv));
    d.forward(b, *kv, *hidden, logits.data());
    e.step1_hidden = rel_max_error(download(be, *hidden), ref.f32("step1.hidden"));
    const auto expected = ref.f32("step1.logits");
    e.step1_logits = rel_max_error(logits, expected);
    e.step1_nmse = nmse(logits, expected);
    double gap = 0;
    e.step1_argmax = argmax_agreement(logits, expected, dv, &gap);
  }

  // Step 2: sequence s = rows 0..p of step 1, then one draft row fed its own last hidden.
  const int n = int(step2_rows.size());
  KvLayout layout = d.kv_layout();
  layout.page_size = 4;
  DraftBatch plan(n, 4, L + 2);
  layout.num_pages = plan.num_pages();
  layout.dtype = kv_dtype;
  auto kv = be.alloc_kv(layout);
  std::vector<int> before(size_t(n), 0), prefix, ones(size_t(n), 1);
  std::vector<int32_t> tokens, last_rows;
  std::vector<float> feats_host;
  for (int p : step2_rows) {
    prefix.push_back(p + 1);
    tokens.insert(tokens.end(), ids.begin() + 1, ids.begin() + 2 + p);
    feats_host.insert(feats_host.end(), aux.begin(), aux.begin() + long((p + 1) * width));
    last_rows.push_back(int32_t(tokens.size()) - 1);
  }
  const int t1 = int(tokens.size());
  Eagle3Batch b1;
  plan.plan(before, prefix, &b1);
  auto feats = be.upload(Tensor::make(feats_host.data(), DType::kF32, {t1, width}), act);
  auto hidden1 = be.alloc(act, {t1, h});
  b1.token_ids = tokens.data();
  b1.target_features = &feats->view();
  d.forward(b1, *kv, *hidden1, nullptr);

  auto prev = be.alloc(act, {n, h});
  be.gather_rows(*hidden1, last_rows.data(), n, *prev);
  std::vector<int32_t> draft_tokens, rows(static_cast<size_t>(n));
  for (int p : step2_rows) draft_tokens.push_back(ids[size_t(p + 2)]);
  std::iota(rows.begin(), rows.end(), 0);
  Eagle3Batch b2;
  plan.plan(prefix, ones, &b2);
  b2.token_ids = draft_tokens.data();
  b2.prev_hidden = &prev->view();  // hidden_out may be the tensor it reads
  b2.logit_rows = rows.data();
  b2.num_logit_rows = n;
  std::vector<float> logits(size_t(n * dv));
  d.forward(b2, *kv, *prev, logits.data());
  e.step2_hidden =
      rel_max_error(download(be, *prev), rows_of(ref.f32("step2.hidden"), h, step2_rows));
  const auto expected = rows_of(ref.f32("step2.logits"), dv, step2_rows);
  e.step2_logits = rel_max_error(logits, expected);
  e.step2_nmse = nmse(logits, expected);
  double gap = 0;
  e.step2_argmax = argmax_agreement(logits, expected, dv, &gap);
  return e;
}

}  // namespace strata::testing
