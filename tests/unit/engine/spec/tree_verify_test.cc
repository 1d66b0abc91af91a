// Tree verification (engine/spec/tree_verify.h). Greedy walks by hand; then the sampling rule with
// the toy target of spec_stats.h and a fixed branching drafter, generating 3 tokens at a time many
// times: a chi-squared test over the 216 sequences for the engine's rule (each node's row sampled
// with the draw of its depth's output position, follow the child equal to the sample) and for the
// sequential rule written out (try children in order, each against p without the rejected
// siblings), and the same test must reject the classic bug (a later child accepted with its
// probability under p, the rejected siblings not removed), so it has the power to see one.
#include "engine/spec/tree_verify.h"

#include <gtest/gtest.h>

#include <random>

#include "engine/sampler.h"
#include "engine/spec/verify.h"
#include "spec_stats.h"

namespace strata {
namespace {

using spec_stats::ChiSquaredTest;
using spec_stats::generate_by_steps;
using spec_stats::kVocab;
using spec_stats::plain_tokens;
using spec_stats::sequences_chi_squared;
using spec_stats::ToyTarget;

// Nodes as index(token):
//   0(100) ─┬─ 1(1) ─── 3(3)
//           └─ 2(2) ─── 4(5) ─┬─ 5(7)
//                             └─ 6(8)
DraftTree example_tree() {
  DraftTree t = DraftTree::root_only(100);
  t.add(0, 1);
  t.add(0, 2);
  t.add(1, 3);
  t.add(2, 5);
  t.add(4, 7);
  t.add(4, 8);
  return t;
}

TEST(TreeVerify, GreedyFollowsTheTargetsTokens) {
  const DraftTree t = example_tree();
  // Row v: the target's token after node v's path. Root → 2 → 5 → 8 (a leaf): bonus 42.
  const std::vector<int32_t> rows = {2, 9, 5, 9, 8, 9, 42};
  const TreeAcceptance a = accept_tree(t, rows);
  EXPECT_EQ(a.path, (std::vector<int32_t>{0, 2, 4, 6}));
  EXPECT_EQ(a.accepted(), 3);
  EXPECT_EQ(a.next_token, 42);
  EXPECT_EQ(a.committed_tokens(t), (std::vector<int32_t>{2, 5, 8, 42}));
  // Root → 1, then the target wants 4 where the draft has 3: correction 4.
  const TreeAcceptance b = accept_tree(t, std::vector<int32_t>{1, 4, 0, 0, 0, 0, 0});
  EXPECT_EQ(b.path, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(b.committed_tokens(t), (std::vector<int32_t>{1, 4}));
  // Nothing accepted.
  const TreeAcceptance c = accept_tree(t, std::vector<int32_t>{6, 0, 0, 0, 0, 0, 0});
  EXPECT_EQ(c.path, (std::vector<int32_t>{0}));
  EXPECT_EQ(c.committed_tokens(t), (std::vector<int32_t>{6}));
}

TEST(TreeVerify, OnAChainItIsTheChainRule) {
  std::mt19937 g(1);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int32_t> drafts, rows;
    const int k = int(g() % 6);
    for (int i = 0; i < k; ++i) drafts.push_back(int32_t(g() % 3));
    for (int i = 0; i <= k; ++i) rows.push_back(int32_t(g() % 3));
    const DraftTree t = DraftTree::chain(7, drafts);
    const TreeAcceptance a = accept_tree(t, rows);
    const int32_t chain = accepted_drafts(rows, drafts);
    ASSERT_EQ(a.accepted(), chain);
    ASSERT_EQ(a.next_token, rows[size_t(chain)]);
  }
}

TEST(TreeVerify, AcceptedKvMoves) {
  // Path 0 → 2 → 4 → 6: rows at offsets 2, 4, 6 move to 1, 2, 3 (in that order: a row is read
  // before its offset is written).
  EXPECT_EQ(accepted_kv_moves(std::vector<int32_t>{0, 2, 4, 6}),
            (std::vector<std::pair<int32_t, int32_t>>{{2, 1}, {4, 2}, {6, 3}}));
  // A path along node order moves nothing.
  EXPECT_TRUE(accepted_kv_moves(std::vector<int32_t>{0, 1, 3}) ==
              (std::vector<std::pair<int32_t, int32_t>>{{3, 2}}));
  EXPECT_TRUE(accepted_kv_moves(std::vector<int32_t>{0, 1, 2}).empty());
}

// The fixed drafter: after `last`, children a, a+1, a+2 (mod kVocab) with a = 5·last + 1; under a
// two children, under a+1 one.
DraftTree draft_tree(int last) {
  DraftTree t = DraftTree::root_only(last);
  const int a = (last * 5 + 1) % kVocab;
  const int32_t na = t.add(0, a);
  const int32_t nb = t.add(0, (a + 1) % kVocab);
  t.add(0, (a + 2) % kVocab);
  const int a1 = (a * 5 + 1) % kVocab;
  t.add(na, a1);
  t.add(na, (a1 + 3) % kVocab);
  t.add(nb, ((a + 1) * 5 + 1) % kVocab);
  return t;
}

enum class Rule { kEngine, kSequential, kSequentialBuggy };

// The classic bug: child j accepted with probability p(c_j) (the rejected siblings not removed),
// the residual still p without the children.
int32_t buggy_node_step(std::span<const double> p, std::span<const int32_t> child_tokens,
                        SamplerRng& rng, int32_t* correction) {
  for (size_t j = 0; j < child_tokens.size(); ++j)
    if (rng.uniform() < p[size_t(child_tokens[j])]) return int32_t(j);
  std::vector<double> q(p.begin(), p.end());
  for (int32_t c : child_tokens) q[size_t(c)] = 0;
  // Draw from q by the sequential rule with no children (just the residual draw).
  return sequential_node_step(
      q, {}, [&] { return rng.uniform(); }, correction);
}

// One verify step of the tree after `last` by `rule`: the committed tokens.
std::vector<int32_t> tree_step(const ToyTarget& t, int last, Rule rule, SamplerRng& rng,
                               SamplerRng& other, std::vector<std::pair<float, int32_t>>& scratch) {
  const DraftTree tree = draft_tree(last);
  if (rule == Rule::kEngine) {
    // Row v samples after node v's token (the toy target is Markov) with its depth's draw.
    std::vector<int32_t> rows;
    for (int32_t v = 0; v < tree.size(); ++v)
      rows.push_back(
          t.sample(tree.tokens[size_t(v)], rng.peek(uint64_t(tree.depths[size_t(v)])), scratch));
    return accept_tree(tree, rows).committed_tokens(tree);
  }
  std::vector<int32_t> out;
  int32_t node = 0;
  while (true) {
    const std::vector<int32_t> children = tree.children(node);
    std::vector<int32_t> child_tokens;
    for (int32_t c : children) child_tokens.push_back(tree.tokens[size_t(c)]);
    const std::vector<double> p = t.probs(tree.tokens[size_t(node)]);
    int32_t correction = -1;
    const int32_t j = rule == Rule::kSequential
                          ? sequential_node_step(
                                p, child_tokens, [&] { return other.uniform(); }, &correction)
                          : buggy_node_step(p, child_tokens, other, &correction);
    if (j < 0) {
      out.push_back(correction);
      return out;
    }
    node = children[size_t(j)];
    out.push_back(tree.tokens[size_t(node)]);
  }
}

std::vector<int32_t> generate(const ToyTarget& t, int start, Rule rule, SamplerRng& rng,
                              SamplerRng& other, std::vector<std::pair<float, int32_t>>& scratch) {
  return generate_by_steps(start, rng,
                           [&](int last) { return tree_step(t, last, rule, rng, other, scratch); });
}

ChiSquaredTest run(Rule rule, int64_t draws) {
  ToyTarget t;
  SamplerRng rng(4242), other(77);
  std::vector<std::pair<float, int32_t>> scratch;
  return sequences_chi_squared(t, /*start=*/2, draws, [&](int start) {
    return generate(t, start, rule, rng, other, scratch);
  });
}

TEST(TreeSpeculativeSampling, EnginesRuleMatchesTheTargetDistribution) {
  const ChiSquaredTest r = run(Rule::kEngine, 200000);
  EXPECT_GT(r.df, 20);
  EXPECT_LT(r.stat, r.crit) << "chi2 " << r.stat << " with " << r.df << " df";
}

TEST(TreeSpeculativeSampling, SequentialRuleMatchesTheTargetDistribution) {
  const ChiSquaredTest r = run(Rule::kSequential, 200000);
  EXPECT_GT(r.df, 20);
  EXPECT_LT(r.stat, r.crit) << "chi2 " << r.stat << " with " << r.df << " df";
}

TEST(TreeSpeculativeSampling, TheTestRejectsNotRemovingRejectedSiblings) {
  const ChiSquaredTest r = run(Rule::kSequentialBuggy, 200000);
  EXPECT_GT(r.stat, r.crit) << "chi2 " << r.stat << " with " << r.df << " df";
}

// The engine's rule takes plain sampling's tokens, draw for draw, whatever the tree.
TEST(TreeSpeculativeSampling, SameDrawsGiveThePlainSamplersTokens) {
  ToyTarget t;
  std::vector<std::pair<float, int32_t>> scratch;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SamplerRng spec_rng(seed), other(1), plain_rng(seed);
    const std::vector<int32_t> spec = generate(t, 1, Rule::kEngine, spec_rng, other, scratch);
    EXPECT_EQ(spec, plain_tokens(t, 1, plain_rng, scratch)) << "seed " << seed;
    EXPECT_EQ(spec_rng.draws(), plain_rng.draws());
  }
}

}  // namespace
}  // namespace strata
