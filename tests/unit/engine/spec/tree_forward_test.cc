// The verify forward of a draft tree on the CPU reference (house-llama: paged attention;
// house-mla: absorbed MLA + MoE). A request with a committed prefix runs its last token and a
// branching tree of drafts in one forward (BatchPlan::build with draft_parents: KV rows in node
// order past kv_len, rope position kv_len + depth, the ancestor mask):
//  - each node's logits row equals the last row of a plain forward over the prefix and that
//    node's root-to-node path;
//  - a chain given as a tree and as plain drafts gives the same rows;
//  - after the accepted path's KV rows move into place (Backend::kv_move_rows,
//    accepted_kv_moves), the cache rows of the sequence equal a plain run's over the same tokens,
//    and the next decode step's logits equal the plain run's.
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

INSTANTIATE_TEST_SUITE_P(HouseModels, TreeForward, ::testing::Values("house-llama", "house-mla"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace strata::testing
