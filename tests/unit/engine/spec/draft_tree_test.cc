// DraftTree and EAGLE's tree construction (engine/spec/draft_tree.h): a worked example by hand,
// and random builds checked against the definition (the kept nodes are the best by cumulative
// log-probability, every kept node's parent is kept, the frontier is the step's best).
#include "engine/spec/draft_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace strata {
namespace {

TEST(DraftTree, ChainAndMask) {
  const std::vector<int32_t> drafts = {7, 8, 9};
  const DraftTree t = DraftTree::chain(5, drafts);
  t.check();
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{5, 7, 8, 9}));
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, 0, 1, 2}));
  EXPECT_EQ(t.depths, (std::vector<int32_t>{0, 1, 2, 3}));
  // A chain's mask is causal: node i sees nodes 0..i.
  EXPECT_EQ(t.ancestor_mask(), (std::vector<uint64_t>{0b1, 0b11, 0b111, 0b1111}));
  EXPECT_EQ(t.path_tokens(3), drafts);
}

TEST(DraftTree, BranchingMaskChildrenAndPaths) {
  // 0 ─┬─ 1 ─┬─ 3
  //    │      └─ 4
  //    └─ 2 ─── 5
  DraftTree t = DraftTree::root_only(100);
  t.add(0, 10);
  t.add(0, 20);
  t.add(1, 11);
  t.add(1, 12);
  t.add(2, 21);
  t.check();
  EXPECT_EQ(t.depths, (std::vector<int32_t>{0, 1, 1, 2, 2, 2}));
  EXPECT_EQ(t.ancestor_mask(),
            (std::vector<uint64_t>{0b1, 0b11, 0b101, 0b1011, 0b10011, 0b100101}));
  EXPECT_EQ(t.children(0), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(t.children(1), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(t.children(3), (std::vector<int32_t>{}));
  EXPECT_EQ(t.path_to(5), (std::vector<int32_t>{0, 2, 5}));
  EXPECT_EQ(t.path_tokens(4), (std::vector<int32_t>{10, 12}));
}

// topk 2, three steps. Scores (cumulative log-probabilities) of the nodes created:
//   step 0: t1 -0.1, t2 -1.0                        frontier {t1, t2}
//   step 1: t3 -0.3, t4 -2.1 (under t1); t5 -1.05, t6 -4.0 (under t2)   frontier {t3, t5}
//   step 2: t7 -0.4, t8 -0.8 (under t3); t9 -1.06, t10 -2.05 (under t5)
struct Example {
  DraftTreeBuilder b;
  explicit Example(int32_t num_draft_tokens) : b(100, 2, num_draft_tokens) {
    EXPECT_EQ(std::vector<int32_t>(b.frontier().begin(), b.frontier().end()),
              (std::vector<int32_t>{0}));
    b.expand(std::vector<int32_t>{1, 2}, std::vector<float>{-0.1f, -1.0f});
    EXPECT_EQ(b.frontier().size(), 2u);
    EXPECT_EQ(b.token(b.frontier()[0]), 1);
    EXPECT_EQ(b.token(b.frontier()[1]), 2);
    b.expand(std::vector<int32_t>{3, 4, 5, 6}, std::vector<float>{-0.2f, -2.0f, -0.05f, -3.0f});
    EXPECT_EQ(b.token(b.frontier()[0]), 3);
    EXPECT_EQ(b.token(b.frontier()[1]), 5);
    EXPECT_EQ(b.depth(b.frontier()[1]), 2);
    b.expand(std::vector<int32_t>{7, 8, 9, 10}, std::vector<float>{-0.1f, -0.5f, -0.01f, -1.0f});
  }
};

TEST(DraftTreeBuilder, KeepsTheBestNodesByCumulativeLogProb) {
  // The 4 best: t1 -0.1, t3 -0.3, t7 -0.4, t8 -0.8.
  const DraftTree t4 = Example(5).b.finish();
  t4.check();
  EXPECT_EQ(t4.tokens, (std::vector<int32_t>{100, 1, 3, 7, 8}));
  EXPECT_EQ(t4.parents, (std::vector<int32_t>{-1, 0, 1, 2, 2}));
  // The 6 best add t2 -1.0 and t5 -1.05 (t9 -1.06 just misses), in creation order.
  const DraftTree t6 = Example(7).b.finish();
  t6.check();
  EXPECT_EQ(t6.tokens, (std::vector<int32_t>{100, 1, 2, 3, 5, 7, 8}));
  EXPECT_EQ(t6.parents, (std::vector<int32_t>{-1, 0, 0, 1, 2, 3, 3}));
  EXPECT_EQ(t6.depths, (std::vector<int32_t>{0, 1, 1, 2, 2, 3, 3}));
  // num_draft_tokens 1: the root alone (no drafts).
  EXPECT_EQ(Example(1).b.finish().size(), 1);
}

TEST(DraftTreeBuilder, ProbabilityOneContinuationsKeepTheirParents) {
  // Log-probability 0 makes a child tie with its parent: the parent (created first) wins.
  DraftTreeBuilder b(9, 1, 2);
  b.expand(std::vector<int32_t>{4}, std::vector<float>{0.0f});
  b.expand(std::vector<int32_t>{5}, std::vector<float>{0.0f});
  const DraftTree t = b.finish();
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{9, 4}));
}

// Random builds against the definition.
TEST(DraftTreeBuilder, RandomBuildsMatchTheDefinition) {
  std::mt19937 g(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t topk = 1 + int32_t(g() % 4), steps = 1 + int32_t(g() % 5);
    const int32_t num_draft_tokens = 1 + int32_t(g() % 20);
    DraftTreeBuilder b(0, topk, num_draft_tokens);
    std::vector<int32_t> all;  // builder ids of every node created
    int32_t next_token = 1;
    for (int32_t s = 0; s < steps; ++s) {
      const std::vector<int32_t> frontier(b.frontier().begin(), b.frontier().end());
      std::vector<int32_t> tokens;
      std::vector<float> logprobs;
      for (size_t f = 0; f < frontier.size(); ++f)
        for (int32_t k = 0; k < topk; ++k) {
          tokens.push_back(next_token++);
          // Coarse values so that ties happen.
          logprobs.push_back(-float(g() % 8) * 0.5f);
        }
      const int32_t first_new = int32_t(all.size()) + 1;
      b.expand(tokens, logprobs);
      const int32_t created = int32_t(tokens.size());
      for (int32_t i = 0; i < created; ++i) all.push_back(first_new + i);
      // The frontier: min(topk, created) of this step's nodes, none beaten by one left out.
      ASSERT_EQ(b.frontier().size(), size_t(std::min(topk, created)));
      const std::set<int32_t> front(b.frontier().begin(), b.frontier().end());
      for (int32_t f : front) {
        ASSERT_GE(f, first_new);
        for (int32_t i = first_new; i < first_new + created; ++i) {
          if (!front.count(i)) {
            ASSERT_GE(b.score(f), b.score(i));
          }
        }
      }
      for (int32_t i = first_new; i < first_new + created; ++i) {
        ASSERT_EQ(b.depth(i), s + 1);
        ASSERT_EQ(b.score(i), b.score(b.parent(i)) + logprobs[size_t(i - first_new)]);
      }
    }
    const DraftTree t = b.finish();
    t.check();
    ASSERT_EQ(t.num_drafts(), std::min<int32_t>(num_draft_tokens - 1, int32_t(all.size())));
    // Tokens are unique per builder node here, so a tree node's token names its builder node.
    std::set<int32_t> kept;
    float worst_kept = 0;
    for (int32_t i = 1; i < t.size(); ++i) {
      const int32_t id = t.tokens[size_t(i)];
      kept.insert(id);
      worst_kept = std::min(worst_kept, b.score(id));
      ASSERT_EQ(t.tokens[size_t(t.parents[size_t(i)])], b.token(b.parent(id)));
      ASSERT_EQ(t.depths[size_t(i)], b.depth(id));
    }
    for (int32_t id : all) {
      if (!kept.count(id)) {
        ASSERT_LE(b.score(id), worst_kept);
      }
    }
  }
}

}  // namespace
}  // namespace strata
