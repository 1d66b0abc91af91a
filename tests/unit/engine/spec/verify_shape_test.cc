// Fixed-shape verify (engine/spec/verify_shape.h): after pad_verify_rows every verifying request of
// a decode step has the same number of rows, so the batch plan's shape (rows, logits rows, each
// sequence's slice) is a function of the batch size alone, whatever each request drafted; pad rows
// write only the request's own slots past its drafts, no real row attends to them, and a tree's
// pads are nodes of their own. Requests whose pages do not hold the block keep their rows.
#include "engine/spec/verify_shape.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>

namespace strata {
namespace {

using V = std::vector<int32_t>;

// A decoding request: `prompt`, one output token (its last token, at position prompt.size()),
// `pages` of its KV.
std::unique_ptr<Request> decoding(int64_t id, V prompt, int32_t next, V pages) {
  auto r = std::make_unique<Request>(id, prompt, SamplingParams{});
  r->start_prefill();
  r->set_kv_len(int32_t(prompt.size()));
  EXPECT_EQ(r->append_output(next, {}), FinishReason::kNone);
  r->start_decode();
  r->pages() = std::move(pages);
  return r;
}

TEST(VerifyShape, ChainsOfAnyDraftCountBecomeOneShape) {
  // Page size 4, 1 + 3 rows per verify. kv_len 5 (rows 5..8): pages hold up to 12 tokens.
  auto a = decoding(1, {1, 2, 3, 4, 5}, 6, {3, 7, 8});
  auto b = decoding(2, {9, 8, 7, 6, 5}, 4, {0, 1, 2});
  auto c = decoding(3, {4, 4, 4, 4, 4}, 5, {4, 5, 6});
  std::vector<ScheduledSeq> seqs = {{.request = a.get(), .num_new_tokens = 1, .sample = true},
                                    {.request = b.get(), .num_new_tokens = 1, .sample = true},
                                    {.request = c.get(), .num_new_tokens = 1, .sample = true}};
  seqs[0].draft = {10, 11, 12};
  seqs[1].draft = {20};
  // c has no drafts (its drafter missed its last commit).
  EXPECT_EQ(pad_verify_rows(seqs, 4, 4), 0);
  EXPECT_EQ(seqs[0].pad_rows, 0);
  EXPECT_EQ(seqs[1].pad_rows, 2);
  EXPECT_EQ(seqs[2].pad_rows, 3);
  for (const ScheduledSeq& s : seqs) EXPECT_EQ(s.num_rows(), 4);
  EXPECT_EQ(seqs[1].num_tokens(), 2);  // pads are no computed tokens of the request

  const BatchPlan p = BatchPlan::build(seqs, 4);
  EXPECT_EQ(p.q_indptr, (V{0, 4, 8, 12}));
  // A chain's pads continue it: the last draft (or the last token) again, the next positions and
  // the request's own next slots, past every row a real row attends to (causal).
  EXPECT_EQ(p.token_ids, (V{6, 10, 11, 12, 4, 20, 20, 20, 5, 5, 5, 5}));
  EXPECT_EQ(p.positions, (V{5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8}));
  EXPECT_EQ(p.slot_mapping, (V{29, 30, 31, 32, 5, 6, 7, 8, 21, 22, 23, 24}));
  EXPECT_EQ(p.kv_lens, (V{9, 9, 9}));
  EXPECT_EQ(p.logits_rows, (V{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(p.sampled_seqs, (V{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}));
  EXPECT_TRUE(p.tree_mask.empty());

  // Padding twice changes nothing (a seq's pads are recomputed from its drafts).
  EXPECT_EQ(pad_verify_rows(seqs, 4, 4), 0);
  EXPECT_EQ(seqs[1].pad_rows, 2);
}

// The plan's shape for a batch size is the same whatever the drafts: random draft counts (0 to
// the most) over many steps give one (rows, logits rows, slices, pages per seq) signature.
TEST(VerifyShape, ThePlanShapeDependsOnTheBatchSizeOnly) {
  std::mt19937 rng(7);
  const int32_t rows = 5, page_size = 4;
  for (int batch : {1, 3, 16}) {
    std::vector<std::unique_ptr<Request>> reqs;
    for (int i = 0; i < batch; ++i) {
      V prompt(size_t(6 + i % 5), 3);
      const int32_t kv = int32_t(prompt.size());
      V pages;
      for (int32_t p = 0; p * page_size < kv + rows; ++p) pages.push_back(i * 8 + p);
      reqs.push_back(decoding(i, prompt, 9, pages));
    }
    std::vector<int32_t> first_shape;
    for (int step = 0; step < 20; ++step) {
      std::vector<ScheduledSeq> seqs;
      for (auto& r : reqs) {
        ScheduledSeq s{.request = r.get(), .num_new_tokens = 1, .sample = true};
        const int32_t drafts = int32_t(rng() % rows);  // 0..rows-1
        for (int32_t d = 0; d < drafts; ++d) s.draft.push_back(100 + d);
        if (step % 2 == 1 && drafts > 0) {  // every other step a tree: a random parent each
          for (int32_t d = 0; d < drafts; ++d) s.draft_parents.push_back(int32_t(rng() % (d + 1)));
        }
        seqs.push_back(std::move(s));
      }
      ASSERT_EQ(pad_verify_rows(seqs, rows, page_size), 0);
      const BatchPlan p = BatchPlan::build(seqs, page_size);
      std::vector<int32_t> shape = {p.num_tokens(), int32_t(p.logits_rows.size())};
      shape.insert(shape.end(), p.q_indptr.begin(), p.q_indptr.end());
      for (size_t s = 0; s + 1 < p.page_indptr.size(); ++s)
        shape.push_back(p.page_indptr[s + 1] - p.page_indptr[s]);
      if (first_shape.empty()) first_shape = shape;
      EXPECT_EQ(shape, first_shape) << "batch " << batch << ", step " << step;
      EXPECT_EQ(p.num_tokens(), batch * rows);
      EXPECT_EQ(int(p.logits_rows.size()), batch * rows);
      // The wire form accepts it (the tensor-parallel ranks' checks: masks, slots, lengths).
      EXPECT_TRUE(BatchPlan::deserialize(p.serialize()).ok());
    }
  }
}

// A tree's pads are nodes of their own: each attends to the committed tokens and itself (its own
// bit only), at rope position kv_len (a root's: its word's depth 0), so no real node attends to a
// pad.
TEST(VerifyShape, TreePadsAttendToThemselvesOnly) {
  auto a = decoding(1, {1, 2, 3, 4, 5}, 6, {3, 7, 8});
  ScheduledSeq s{.request = a.get(), .num_new_tokens = 1, .sample = true};
  s.draft = {20, 21, 22};
  s.draft_parents = {0, 0, 1};  // 0 ─┬─ 1 ─── 3
                                //    └─ 2
  std::vector<ScheduledSeq> seqs = {s};
  EXPECT_EQ(pad_verify_rows(seqs, 6, 4), 0);
  EXPECT_EQ(seqs[0].pad_rows, 2);
  const BatchPlan p = BatchPlan::build(seqs, 4);
  EXPECT_EQ(p.token_ids, (V{6, 20, 21, 22, 22, 22}));
  EXPECT_EQ(p.positions, (V{5, 6, 6, 7, 5, 5}));
  EXPECT_EQ(p.slot_mapping, (V{29, 30, 31, 32, 33, 34}));
  EXPECT_EQ(p.tree_mask,
            (std::vector<uint64_t>{0b1, 0b11, 0b101, 0b1011, uint64_t(1) << 4, uint64_t(1) << 5}));
  // No real node's word reaches a pad's bit.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(p.tree_mask[size_t(i)] >> 4, 0u);
  EXPECT_TRUE(BatchPlan::deserialize(p.serialize()).ok());
}

// Pages short of the block (the pool was short when the drafts' room was reserved): the request
// keeps its own rows, and is counted. Prefill chunks and non-decoding seqs are left alone.
TEST(VerifyShape, ShortPagesAndPrefillChunksKeepTheirRows) {
  auto a = decoding(1, {1, 2, 3, 4, 5}, 6, {3, 7});  // holds 8 tokens: rows 5..7 only
  a->pages().push_back(9);
  auto b = decoding(2, {1, 2, 3, 4, 5}, 6, {3, 7});
  Request c(3, {1, 2, 3, 4, 5, 6, 7, 8}, SamplingParams{});
  c.pages() = {10, 11};
  std::vector<ScheduledSeq> seqs = {{.request = a.get(), .num_new_tokens = 1, .sample = true},
                                    {.request = b.get(), .num_new_tokens = 1, .sample = true},
                                    {.request = &c, .num_new_tokens = 8, .sample = true}};
  seqs[1].draft = {20};
  EXPECT_EQ(pad_verify_rows(seqs, 4, 4), 1);
  EXPECT_EQ(seqs[0].pad_rows, 3);
  EXPECT_EQ(seqs[1].pad_rows, 0);  // 2 rows, pages for 8 tokens: 5 + 4 do not fit
  EXPECT_EQ(seqs[2].pad_rows, 0);
  const BatchPlan p = BatchPlan::build(seqs, 4);
  EXPECT_EQ(p.q_indptr, (V{0, 4, 6, 14}));
}

}  // namespace
}  // namespace strata
