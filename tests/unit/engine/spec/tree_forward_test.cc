// The verify forward of a draft tree on the CPU reference (house-llama: paged attention;
// house-mla: absorbed MLA + MoE). A request with a committed prefix runs its last token and a
// branching tree of drafts in one forward (BatchPlan::build with draft_parents: KV rows in node
// order past kv_len, rope position kv_len + depth, the ancestor mask):
//  - each node's logits row equals the last row of a plain forward over the prefix and that
//    node's root-to-node path;
//  - a chain given as a tree and as plain drafts gives the same rows;
//  - after the accepted path's KV rows move into place (Backend::kv_move_rows,
//    accepted_kv_moves), the cache rows of the sequence equal a plain run's over the same tokens,
//    and the next decode step's logits equal the plain run's;
//  - greedy decoding by tree steps (accept_tree, kv_move_rows, commit, repeat; trees with wrong
//    branches before the right one) gives plain greedy decoding's tokens and KV (without the
//    moves the KV check fails: measured when this test was written).
// Page size 4 with the pages in reverse order, so the tree and the moves cross page boundaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "engine/batch_plan.h"
#include "engine/spec/draft_tree.h"
#include "engine/spec/tree_verify.h"
#include "support/golden.h"
#include "support/paged_request.h"

namespace strata::testing {
namespace {

constexpr int32_t kPageSize = 4;

std::vector<float> as_floats(const std::vector<uint8_t>& bytes) {
  std::vector<float> f(bytes.size() / 4);
  std::memcpy(f.data(), bytes.data(), f.size() * 4);
  return f;
}

// Nodes as index(token offset): 0 ─┬─ 1 ─┬─ 3 ─── 6
//                                  │     └─ 4
//                                  └─ 2 ─── 5 ─── 7 ─── 8
DraftTree test_tree(int32_t root, int32_t vocab) {
  DraftTree t = DraftTree::root_only(root);
  const int32_t parents[] = {0, 0, 1, 1, 2, 3, 5, 7};
  for (int32_t i = 0; i < 8; ++i) t.add(parents[i], (root * 31 + 97 * (i + 1)) % vocab);
  return t;
}

class TreeForward : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend();
    auto m = load_model(shared_dir() + "/models/" + GetParam(), *backend_);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value();
    vocab_ = int32_t(model_->spec().vocab_size);
    for (int32_t i = 0; i < 14; ++i) prompt_.push_back((i * 7919 + 13) % vocab_);
    tree_ = test_tree(prompt_.back(), vocab_);
  }
  // The drafts and parents of tree_ as a ScheduledSeq of one new token.
  ScheduledSeq tree_seq(const DraftTree& t) const {
    ScheduledSeq s{.num_new_tokens = 1, .sample = true};
    s.draft.assign(t.tokens.begin() + 1, t.tokens.end());
    s.draft_parents.assign(t.parents.begin() + 1, t.parents.end());
    return s;
  }
  // The last row of a plain prefill over the prompt and node's path.
  std::vector<float> plain_last_row(int32_t node) const {
    std::vector<int32_t> ids = prompt_;
    for (int32_t t : tree_.path_tokens(node)) ids.push_back(t);
    PagedRequest plain(*model_, ids, kPageSize);
    return plain.run({.num_new_tokens = int32_t(ids.size()), .sample = true});
  }
  std::vector<float> row(const std::vector<float>& logits, int32_t r) const {
    return {logits.begin() + long(r) * vocab_, logits.begin() + long(r + 1) * vocab_};
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  int32_t vocab_ = 0;
  std::vector<int32_t> prompt_;
  DraftTree tree_;
};

TEST_P(TreeForward, EachNodesRowIsAPlainForwardOfItsPath) {
  PagedRequest req(*model_, prompt_, kPageSize);
  req.prefill(int32_t(prompt_.size()) - 1);
  const std::vector<float> logits = req.run(tree_seq(tree_));
  ASSERT_EQ(logits.size(), size_t(tree_.size()) * size_t(vocab_));
  for (int32_t v = 0; v < tree_.size(); ++v) {
    const double err = rel_max_error(row(logits, v), plain_last_row(v));
    EXPECT_LT(err, 1e-5) << GetParam() << " node " << v;
  }
}

// The negative control: without the mask (causal over node order) the rows of nodes whose
// ancestors are not all the nodes before them differ from their paths' forwards, so the test
// above sees a mask that is ignored.
TEST_P(TreeForward, WithoutTheMaskRowsDiffer) {
  PagedRequest req(*model_, prompt_, kPageSize);
  req.prefill(int32_t(prompt_.size()) - 1);
  const std::vector<float> logits = req.run(tree_seq(tree_), /*drop_tree_mask=*/true);
  for (int32_t v : {2, 4, 5, 8}) {  // node 2 sees node 1, node 4 node 3, ...
    const double err = rel_max_error(row(logits, v), plain_last_row(v));
    EXPECT_GT(err, 1e-3) << GetParam() << " node " << v;
  }
}

TEST_P(TreeForward, AChainAsATreeIsTheChain) {
  const std::vector<int32_t> drafts = tree_.path_tokens(8);
  PagedRequest as_chain(*model_, prompt_, kPageSize), as_tree(*model_, prompt_, kPageSize);
  as_chain.prefill(int32_t(prompt_.size()) - 1);
  as_tree.prefill(int32_t(prompt_.size()) - 1);
  ScheduledSeq chain{.num_new_tokens = 1, .sample = true};
  chain.draft = drafts;
  const std::vector<float> a = as_chain.run(chain);
  const std::vector<float> b = as_tree.run(tree_seq(DraftTree::chain(prompt_.back(), drafts)));
  EXPECT_EQ(a, b) << GetParam();
}

TEST_P(TreeForward, MovedKvEqualsAPlainRun) {
  // The committed tokens after accepting the path 0 → 2 → 5 → 7, then one more token.
  std::vector<int32_t> ids = prompt_;
  for (int32_t t : tree_.path_tokens(7)) ids.push_back(t);
  const int32_t committed = int32_t(ids.size());
  ids.push_back(5);

  PagedRequest req(*model_, ids, kPageSize);
  const int32_t n = int32_t(prompt_.size()) - 1;
  req.prefill(n);
  req.run(tree_seq(tree_));  // the root is ids[n], the prompt's last token
  // Rows n+2, n+5, n+7 move to n+1, n+2, n+3.
  std::vector<int32_t> from, to;
  for (auto [f, t] : accepted_kv_moves(tree_.path_to(7))) {
    from.push_back(req.slot(n + f));
    to.push_back(req.slot(n + t));
  }
  ASSERT_EQ(from.size(), 3u);
  backend_->kv_move_rows(req.kv(), from.data(), to.data(), int(from.size()));
  req.request().set_kv_len(committed);

  PagedRequest plain(*model_, ids, kPageSize);
  plain.prefill(committed);
  for (int32_t r = 0; r < committed; ++r)
    EXPECT_LT(rel_max_error(as_floats(req.kv_row(r)), as_floats(plain.kv_row(r))), 1e-5)
        << GetParam() << " row " << r;
  // The next decode step from both caches.
  const std::vector<float> a = req.run({.num_new_tokens = 1, .sample = true});
  const std::vector<float> b = plain.run({.num_new_tokens = 1, .sample = true});
  EXPECT_LT(rel_max_error(a, b), 1e-5) << GetParam();
}

int32_t argmax_of(const std::vector<float>& logits, int32_t row, int32_t vocab) {
  const auto first = logits.begin() + long(row) * vocab;
  return int32_t(std::max_element(first, first + vocab) - first);
}

// Greedy decoding by tree verify steps, as an engine with a tree drafter runs them: each step the
// request's last token is the root of a tree that mixes the right continuation (from a plain
// greedy run) with wrong branches, so accepted paths leave node order and their KV rows move;
// accept_tree on the rows' argmax, kv_move_rows, commit, repeat. The tokens equal plain greedy
// decoding's, the accept lengths vary, and the request's KV equals a plain run's at the end.
TEST_P(TreeForward, GreedyDecodingByTreeStepsIsPlainGreedy) {
  constexpr int32_t kNew = 24;
  const int32_t n0 = int32_t(prompt_.size());
  // Plain greedy: one token a step.
  std::vector<int32_t> want;
  {
    PagedRequest plain(*model_, prompt_, kPageSize);
    plain.request().start_prefill();
    plain.prefill(n0 - 1);  // prefilling is running: outputs may be appended (no decode state)
    for (int32_t i = 0; i < kNew; ++i) {
      const std::vector<float> l = plain.run({.num_new_tokens = 1, .sample = true});
      want.push_back(argmax_of(l, 0, vocab_));
      plain.request().append_output(want.back(), {});
      plain.request().set_kv_len(plain.request().kv_len() + 1);
    }
  }
  PagedRequest req(*model_, prompt_, kPageSize);
  Request& r = req.request();
  r.start_prefill();
  req.prefill(n0 - 1);
  std::vector<int32_t> got, accept_lengths;
  for (int step = 0; int32_t(got.size()) < kNew; ++step) {
    // Right continuation g[0..3] of what is committed; w(x) a wrong token.
    const size_t m = got.size();
    auto g = [&](size_t k) { return want[std::min(m + k, want.size() - 1)]; };
    auto w = [&](size_t k) { return (g(k) + 1 + int32_t(step) % 7) % vocab_; };
    // Step kinds by step % 3: the right token second among the root's children (its subtree
    // after a wrong sibling's), first, or absent (nothing accepted).
    DraftTree t = DraftTree::root_only(r.token_at(r.kv_len()));
    if (step % 3 == 0) {
      const int32_t bad = t.add(0, w(0));
      const int32_t good = t.add(0, g(0));
      t.add(bad, g(1));
      const int32_t g1 = t.add(good, w(1));
      t.add(good, g(1));
      t.add(g1, g(2));
      t.add(t.size() - 2, g(2));  // under the right g(1)
    } else if (step % 3 == 1) {
      const int32_t good = t.add(0, g(0));
      t.add(0, w(0));
      const int32_t g1 = t.add(good, g(1));
      t.add(g1, w(2));
      t.add(g1, g(2));
      t.add(t.size() - 1, g(3));
    } else {
      t.add(0, w(0));
      t.add(1, g(1));
    }
    const std::vector<float> logits = req.run(tree_seq(t));
    std::vector<int32_t> rows;
    for (int32_t v = 0; v < t.size(); ++v) rows.push_back(argmax_of(logits, v, vocab_));
    const TreeAcceptance a = accept_tree(t, rows);
    accept_lengths.push_back(a.accepted() + 1);
    const int32_t n = r.kv_len();
    std::vector<int32_t> from, to;
    for (auto [f, d] : accepted_kv_moves(a.path)) {
      from.push_back(req.slot(n + f));
      to.push_back(req.slot(n + d));
    }
    backend_->kv_move_rows(req.kv(), from.data(), to.data(), int(from.size()));
    for (int32_t x : a.committed_tokens(t)) {
      got.push_back(x);
      r.append_output(x, {});
    }
    r.set_kv_len(n + 1 + a.accepted());
  }
  got.resize(size_t(kNew));
  EXPECT_EQ(got, want) << GetParam();
  EXPECT_NE(*std::min_element(accept_lengths.begin(), accept_lengths.end()),
            *std::max_element(accept_lengths.begin(), accept_lengths.end()));
  // The committed KV against a plain prefill of the same tokens.
  std::vector<int32_t> ids = prompt_;
  ids.insert(ids.end(), r.output_ids().begin(), r.output_ids().end());
  PagedRequest plain(*model_, ids, kPageSize);
  plain.prefill(r.kv_len());
  for (int32_t row = 0; row < r.kv_len(); ++row)
    ASSERT_LT(rel_max_error(as_floats(req.kv_row(row)), as_floats(plain.kv_row(row))), 1e-4)
        << GetParam() << " row " << row;
}

INSTANTIATE_TEST_SUITE_P(HouseModels, TreeForward, ::testing::Values("house-llama", "house-mla"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace strata::testing
