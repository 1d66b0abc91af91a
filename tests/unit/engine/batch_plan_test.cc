#include "engine/batch_plan.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

using V = std::vector<int32_t>;

TEST(BatchPlan, FlattensPrefillAndDecodeWithPagedSlots) {
  Request a(1, {10, 11, 12, 13, 14}, SamplingParams{});
  a.pages() = {3, 7};  // page size 4: tokens 0-3 in page 3, token 4 in page 7
  Request b(2, {1, 2, 3}, SamplingParams{});
  b.start_prefill();
  b.set_kv_len(3);
  EXPECT_EQ(b.append_output(4, {}), FinishReason::kNone);
  b.start_decode();
  b.pages() = {5};
  Request c(3, {20, 21, 22, 23, 24, 25, 26, 27, 28}, SamplingParams{});
  c.pages() = {0, 1, 2};
  c.set_kv_len(4);  // second chunk: tokens 4..7, not the last, so not sampled

  std::vector<ScheduledSeq> seqs = {{&a, 5, true}, {&b, 1, true}, {&c, 4, false}};
  BatchPlan p = BatchPlan::build(seqs, 4);
  EXPECT_EQ(p.token_ids, (V{10, 11, 12, 13, 14, 4, 24, 25, 26, 27}));
  EXPECT_EQ(p.positions, (V{0, 1, 2, 3, 4, 3, 4, 5, 6, 7}));
  EXPECT_EQ(p.q_indptr, (V{0, 5, 6, 10}));
  EXPECT_EQ(p.kv_lens, (V{5, 4, 8}));
  EXPECT_EQ(p.page_indptr, (V{0, 2, 3, 5}));
  EXPECT_EQ(p.page_indices, (V{3, 7, 5, 0, 1}));  // c's third page is not needed yet
  EXPECT_EQ(p.slot_mapping, (V{12, 13, 14, 15, 28, 23, 4, 5, 6, 7}));
  EXPECT_EQ(p.logits_rows, (V{4, 5}));
  EXPECT_EQ(p.sampled_seqs, (V{0, 1}));

  AttentionMetadata m = p.view();
  EXPECT_EQ(m.num_seqs, 3);
  EXPECT_EQ(m.num_tokens, 10);
  EXPECT_EQ(m.page_size, 4);
  EXPECT_EQ(m.q_indptr, p.q_indptr.data());
  EXPECT_EQ(m.kv_lens, p.kv_lens.data());
  EXPECT_EQ(m.page_indptr, p.page_indptr.data());
  EXPECT_EQ(m.page_indices, p.page_indices.data());
  EXPECT_EQ(m.positions, p.positions.data());
  EXPECT_EQ(m.slot_mapping, p.slot_mapping.data());
}

// A draft tree (speculative decoding, topk > 1): node i at KV row kv_len + i, rope position
// kv_len + depth, its ancestor word; the other sequences' words 0; every node a logits row.
TEST(BatchPlan, DraftTreeRowsPositionsAndMask) {
  Request a(1, {10, 11, 12, 13, 14, 15}, SamplingParams{});
  a.pages() = {6, 2, 9};
  a.set_kv_len(5);  // the last token 15 is the root, at row 5
  ScheduledSeq tree{.request = &a, .num_new_tokens = 1, .sample = true};
  tree.draft = {20, 21, 22, 23};
  tree.draft_parents = {0, 0, 1, 2};  // 0 ─┬─ 1 ─── 3
                                      //    └─ 2 ─── 4
  Request b(2, {1, 2}, SamplingParams{});
  b.pages() = {0};
  b.set_kv_len(1);
  ScheduledSeq chain{.request = &b, .num_new_tokens = 1, .sample = true};
  chain.draft = {3};
  const std::vector<ScheduledSeq> seqs = {tree, chain};
  BatchPlan p = BatchPlan::build(seqs, 4);
  EXPECT_EQ(p.token_ids, (V{15, 20, 21, 22, 23, 2, 3}));
  EXPECT_EQ(p.positions, (V{5, 6, 6, 7, 7, 1, 2}));
  // Rows 5..9 of a: page 2 offsets 1..3, then page 9 offsets 0..1.
  EXPECT_EQ(p.slot_mapping, (V{9, 10, 11, 36, 37, 1, 2}));
  EXPECT_EQ(p.kv_lens, (V{10, 3}));
  EXPECT_EQ(p.logits_rows, (V{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(p.tree_mask, (std::vector<uint64_t>{0b1, 0b11, 0b101, 0b1011, 0b10101, 0, 0}));
  EXPECT_EQ(p.view().tree_mask, p.tree_mask.data());
  // No tree in the batch: no mask.
  const std::vector<ScheduledSeq> plain = {chain};
  EXPECT_EQ(BatchPlan::build(plain, 4).view().tree_mask, nullptr);
}

TEST(BatchPlan, EmptyBatch) {
  BatchPlan p = BatchPlan::build({}, 16);
  EXPECT_EQ(p.view().num_seqs, 0);
  EXPECT_EQ(p.q_indptr, V{0});
  EXPECT_EQ(p.page_indptr, V{0});
}

TEST(BatchPlanDeathTest, PageTableMustCoverTheNewTokens) {
  Request a(1, {1, 2, 3, 4, 5}, SamplingParams{});
  a.pages() = {0};
  std::vector<ScheduledSeq> seqs = {{&a, 5, true}};
  EXPECT_DEATH(BatchPlan::build(seqs, 4), "pages for 5 tokens");
}

}  // namespace
}  // namespace strata
