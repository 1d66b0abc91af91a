// Plans of sequences no Request holds (engine/slice_plan.h, eval's teacher forcing) are built by
// the engine's planning code: the same sequences as Requests give the same plan.
#include "engine/slice_plan.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

using V = std::vector<int32_t>;

TEST(SlicePlan, EqualsTheRequestPlanOfTheSameSequences) {
  // As batch_plan_test's: a whole prompt, a decode step, a middle prefill chunk not sampled.
  Request a(1, {10, 11, 12, 13, 14}, SamplingParams{});
  a.pages() = {3, 7};
  Request b(2, {1, 2, 3}, SamplingParams{});
  b.start_prefill();
  b.set_kv_len(3);
  EXPECT_EQ(b.append_output(4, {}), FinishReason::kNone);
  b.start_decode();
  b.pages() = {5};
  Request c(3, {20, 21, 22, 23, 24, 25, 26, 27, 28}, SamplingParams{});
  c.pages() = {0, 1, 2};
  c.set_kv_len(4);
  std::vector<ScheduledSeq> seqs = {{&a, 5, true}, {&b, 1, true}, {&c, 4, false}};
  const BatchPlan want = BatchPlan::build(seqs, 4);

  const V ta{10, 11, 12, 13, 14}, pa{3, 7}, tb{4}, pb{5}, tc{24, 25, 26, 27}, pc{0, 1};
  const std::vector<SeqSlice> slices = {
      {.tokens = ta, .start = 0, .pages = pa, .logits = SliceLogits::kLast},
      {.tokens = tb, .start = 3, .pages = pb, .logits = SliceLogits::kLast},
      {.tokens = tc, .start = 4, .pages = pc, .logits = SliceLogits::kNone}};
  const BatchPlan got = build_slice_plan(slices, 4);
  EXPECT_EQ(got.serialize(), want.serialize());  // every field
  EXPECT_EQ(got.logits_rows, (V{4, 5}));
}

TEST(SlicePlan, AllLogitsGivesARowPerNewTokenTaggedWithItsSequence) {
  const V t0{7, 8, 9}, p0{2}, t1{5, 6}, p1{0, 1};
  const std::vector<SeqSlice> slices = {
      {.tokens = t0, .start = 0, .pages = p0, .logits = SliceLogits::kAll},
      {.tokens = t1, .start = 3, .pages = p1, .logits = SliceLogits::kAll}};
  const BatchPlan p = build_slice_plan(slices, 4);
  EXPECT_EQ(p.token_ids, (V{7, 8, 9, 5, 6}));
  EXPECT_EQ(p.positions, (V{0, 1, 2, 3, 4}));
  EXPECT_EQ(p.kv_lens, (V{3, 5}));
  EXPECT_EQ(p.slot_mapping, (V{8, 9, 10, 3, 4}));  // position 4 is page 1's first slot
  EXPECT_EQ(p.page_indices, (V{2, 0, 1}));
  EXPECT_EQ(p.logits_rows, (V{0, 1, 2, 3, 4}));
  EXPECT_EQ(p.sampled_seqs, (V{0, 0, 0, 1, 1}));
  EXPECT_TRUE(BatchPlan::deserialize(p.serialize()).ok()) << "a plan the wire accepts";
}

TEST(SlicePlanDeathTest, PagesMustCoverTheNewTokens) {
  const V t{1, 2, 3, 4, 5}, pages{0};
  const std::vector<SeqSlice> slices = {{.tokens = t, .start = 0, .pages = pages}};
  EXPECT_DEATH(build_slice_plan(slices, 4), "1 pages for 5 tokens");
}

}  // namespace
}  // namespace strata
