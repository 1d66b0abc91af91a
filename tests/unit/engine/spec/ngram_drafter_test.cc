// NgramDrafter's lookup and the speculative flags' checks.
#include "engine/spec/ngram_drafter.h"

#include <gtest/gtest.h>

#include "engine/spec/spec_config.h"

namespace strata {
namespace {

using V = std::vector<int32_t>;

TEST(NgramDrafter, CopiesWhatFollowedTheLongestMatchingSuffix) {
  // Suffix [4, 5] occurred at 1..2, followed by 6, 7, 8.
  EXPECT_EQ(NgramDrafter::draft_for(V{3, 4, 5, 6, 7, 8, 9, 4, 5}, 4, 3), (V{6, 7, 8}));
  EXPECT_EQ(NgramDrafter::draft_for(V{3, 4, 5, 6, 7, 8, 9, 4, 5}, 4, 2), (V{6, 7}));
  // The longest suffix wins over a more recent shorter one: [1, 2] -> 10, not [2] -> 11.
  EXPECT_EQ(NgramDrafter::draft_for(V{1, 2, 10, 2, 11, 1, 2}, 4, 1), (V{10}));
  // Among equal matches, the most recent: [7] followed by 8 at 0, by 9 at 2.
  EXPECT_EQ(NgramDrafter::draft_for(V{7, 8, 7, 9, 7}, 1, 1), (V{9}));
  // A draft runs at most to the end of the sequence (a loop continues itself).
  EXPECT_EQ(NgramDrafter::draft_for(V{1, 2, 1, 2}, 2, 5), (V{1, 2}));
  EXPECT_EQ(NgramDrafter::draft_for(V{5, 5, 5}, 4, 3), (V{5}));
}

TEST(NgramDrafter, NothingWithoutAMatch) {
  EXPECT_TRUE(NgramDrafter::draft_for(V{1, 2, 3, 4}, 4, 3).empty());
  EXPECT_TRUE(NgramDrafter::draft_for(V{1}, 4, 3).empty());
  EXPECT_TRUE(NgramDrafter::draft_for(V{1, 1}, 4, 0).empty());
}

TEST(SpeculativeConfig, ResolvesDefaultsAndRefusesWhatIsNotBuilt) {
  SpeculativeConfig off;
  EXPECT_TRUE(resolve_speculative_config(&off).ok());
  off.num_steps = 3;
  EXPECT_FALSE(resolve_speculative_config(&off).ok());  // a spec flag without an algorithm

  SpeculativeConfig c{.algorithm = SpeculativeAlgorithm::kNgram};
  ASSERT_TRUE(resolve_speculative_config(&c).ok());
  EXPECT_EQ(c.num_steps, 3);
  EXPECT_EQ(c.num_draft_tokens, 4);

  SpeculativeConfig t{.algorithm = SpeculativeAlgorithm::kNgram, .num_draft_tokens = 6};
  ASSERT_TRUE(resolve_speculative_config(&t).ok());
  EXPECT_EQ(t.num_steps, 5);

  SpeculativeConfig bad{
      .algorithm = SpeculativeAlgorithm::kNgram, .num_steps = 3, .num_draft_tokens = 8};
  EXPECT_FALSE(resolve_speculative_config(&bad).ok());

  SpeculativeConfig tree{.algorithm = SpeculativeAlgorithm::kNgram, .eagle_topk = 4};
  Status st = resolve_speculative_config(&tree);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("draft trees are EAGLE3's"), std::string::npos) << st.message();

  SpeculativeConfig eagle{.algorithm = SpeculativeAlgorithm::kEagle3};
  EXPECT_FALSE(resolve_speculative_config(&eagle).ok());  // needs a draft model path
  eagle.draft_model_path = "/nonexistent";
  ASSERT_TRUE(resolve_speculative_config(&eagle).ok());
  // EAGLE3's drafter is made against a target: engine_eagle3_test checks its errors.

  auto ngram = create_drafter(c, DrafterTarget{});
  ASSERT_TRUE(ngram.ok());
  EXPECT_EQ((*ngram)->name(), "NGRAM");
}

// Draft trees: SGLang's bound on the tree (num_draft_tokens - 1 <= topk + (steps - 1) topk^2)
// and strata's (64 nodes per tree, 64 nodes per drafter step), with defaults.
TEST(SpeculativeConfig, ResolvesAndBoundsDraftTrees) {
  auto tree = [](int steps, int topk, int tokens) {
    SpeculativeConfig c{.algorithm = SpeculativeAlgorithm::kEagle3,
                        .draft_model_path = "/nonexistent",
                        .num_steps = steps,
                        .eagle_topk = topk,
                        .num_draft_tokens = tokens};
    const Status st = resolve_speculative_config(&c);
    return std::make_pair(st, c);
  };
  auto [st, c] = tree(0, 4, 0);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(c.num_steps, 3);
  EXPECT_EQ(c.num_draft_tokens, 13);  // 1 + steps * topk
  EXPECT_TRUE(tree(3, 4, 8).first.ok());
  EXPECT_TRUE(tree(5, 8, 32).first.ok());
  EXPECT_TRUE(tree(5, 8, 64).first.ok());  // SGLang's documented EAGLE-2 setting
  EXPECT_TRUE(tree(3, 4, 37).first.ok());  // 4 + 2 * 16 candidates
  st = tree(3, 4, 38).first;
  EXPECT_NE(st.message().find("36 candidate drafts"), std::string::npos) << st.to_string();
  st = tree(1, 2, 4).first;
  EXPECT_NE(st.message().find("at most 3 draft tokens"), std::string::npos) << st.to_string();
  st = tree(8, 48, 48).first;
  EXPECT_NE(st.message().find("336 tree nodes per draft step"), std::string::npos)
      << st.to_string();
  st = tree(2, 8, 65).first;
  EXPECT_FALSE(st.ok());
  st = tree(10, 8, 64).first;
  EXPECT_NE(st.message().find("72 tree nodes"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace strata
