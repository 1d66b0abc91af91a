// BatchPlan's wire form (what rank 0 broadcasts to the other tensor-parallel ranks): a round trip
// keeps every field, and truncated or inconsistent messages are DataLoss errors.
#include <gtest/gtest.h>

#include "engine/batch_plan.h"

namespace strata {
namespace {

BatchPlan sample_plan() {
  // A decode (7 cached + 1 new) and a prefill chunk (4 of 10 prompt tokens), page size 4.
  Request decode(1, {5, 6, 7, 8, 9, 10, 11, 12}, SamplingParams{});
  decode.pages() = {3, 0};
  Request prefill(2, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, SamplingParams{});
  prefill.pages() = {7, 5, 1};
  // kv_len() is 0 for fresh requests: schedule the whole of each (8 and 10 tokens).
  std::vector<ScheduledSeq> seqs = {{&decode, 8, true}, {&prefill, 4, false}};
  return BatchPlan::build(seqs, 4);
}

void expect_same(const BatchPlan& a, const BatchPlan& b) {
  EXPECT_EQ(a.page_size, b.page_size);
  EXPECT_EQ(a.token_ids, b.token_ids);
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_EQ(a.q_indptr, b.q_indptr);
  EXPECT_EQ(a.kv_lens, b.kv_lens);
  EXPECT_EQ(a.page_indptr, b.page_indptr);
  EXPECT_EQ(a.page_indices, b.page_indices);
  EXPECT_EQ(a.slot_mapping, b.slot_mapping);
  EXPECT_EQ(a.logits_rows, b.logits_rows);
  EXPECT_EQ(a.sampled_seqs, b.sampled_seqs);
  EXPECT_EQ(a.tree_mask, b.tree_mask);
}

TEST(BatchPlanWire, RoundTripKeepsEveryField) {
  const BatchPlan p = sample_plan();
  ASSERT_EQ(p.num_seqs(), 2);
  ASSERT_EQ(p.num_tokens(), 12);
  auto back = BatchPlan::deserialize(p.serialize());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same(p, *back);
  const AttentionMetadata v = back->view();
  EXPECT_EQ(v.num_tokens, 12);
  EXPECT_EQ(v.slot_mapping[8], 7 * 4);  // the prefill's first token: page 7, offset 0
  // An empty plan too.
  auto empty = BatchPlan::deserialize(BatchPlan{}.serialize());
  ASSERT_TRUE(empty.ok()) << empty.status().to_string();
  EXPECT_EQ(empty->num_seqs(), 0);
}

// A draft tree's mask words travel too, and a word that sees a later token is refused.
TEST(BatchPlanWire, TreeMaskRoundTrip) {
  Request r(1, {5, 6, 7}, SamplingParams{});
  r.pages() = {2, 4};
  r.set_kv_len(2);
  ScheduledSeq tree{.request = &r, .num_new_tokens = 1, .sample = true};
  tree.draft = {8, 9, 10};
  tree.draft_parents = {0, 0, 2};
  Request other(2, {1, 2, 3, 4}, SamplingParams{});
  other.pages() = {0};
  const std::vector<ScheduledSeq> seqs = {{&other, 4, true}, tree};
  const BatchPlan p = BatchPlan::build(seqs, 4);
  ASSERT_EQ(p.tree_mask.size(), 8u);
  auto back = BatchPlan::deserialize(p.serialize());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same(p, *back);
  EXPECT_EQ(back->view().tree_mask[7], 0b1101u);
  BatchPlan bad = p;
  bad.tree_mask[5] = 0b111;  // the tree's node 1 seeing node 2
  EXPECT_FALSE(BatchPlan::deserialize(bad.serialize()).ok());
}

TEST(BatchPlanWire, CorruptMessagesAreErrors) {
  const std::vector<uint8_t> good = sample_plan().serialize();
  // Every truncation.
  for (size_t n = 0; n < good.size(); ++n) {
    auto r = BatchPlan::deserialize(std::span<const uint8_t>(good.data(), n));
    EXPECT_FALSE(r.ok()) << n;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    }
  }
  // Trailing bytes, bad magic.
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_FALSE(BatchPlan::deserialize(longer).ok());
  std::vector<uint8_t> magic = good;
  magic[0] ^= 1;
  EXPECT_FALSE(BatchPlan::deserialize(magic).ok());
  // Inconsistent tables: a logits row past the tokens, a context longer than its pages.
  BatchPlan p = sample_plan();
  p.logits_rows[0] = 12;
  EXPECT_FALSE(BatchPlan::deserialize(p.serialize()).ok());
  p = sample_plan();
  p.kv_lens[0] = 9;  // 2 pages of 4 hold 8
  EXPECT_FALSE(BatchPlan::deserialize(p.serialize()).ok());
  p = sample_plan();
  p.q_indptr[1] = 13;
  EXPECT_FALSE(BatchPlan::deserialize(p.serialize()).ok());
  p = sample_plan();
  p.page_indices[0] = -1;
  EXPECT_FALSE(BatchPlan::deserialize(p.serialize()).ok());
}

}  // namespace
}  // namespace strata
