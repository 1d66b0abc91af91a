// Draft trees under tensor parallelism (CPU, in-process ranks, dist/tp_driver.h): house-llama at
// tp 2 runs greedy decoding by tree verify steps (each step's last token the root of a tree that
// mixes the right continuation with wrong branches, so accepted paths leave node order) beside
// tp 1 running the same steps. Every step's logits rows equal tp 1's within float32 reordering
// (the workers attend under the step's tree mask: plan_of carries it), and after each step the
// accepted path's KV rows move on every rank (Model::move_kv_rows: rank 0 broadcasts kMoveKv), so
// the next steps still agree; the tokens are plain greedy decoding's.
#include <gtest/gtest.h>

#include <algorithm>

#include "dist/tp_driver.h"
#include "engine/spec/draft_tree.h"
#include "engine/spec/tree_verify.h"
#include "model/config.h"
#include "model/weights.h"
#include "support/golden.h"
#include "support/paged_request.h"

namespace strata::testing {
namespace {

constexpr int32_t kPageSize = 4;

int32_t argmax_of(const std::vector<float>& logits, int32_t row, int32_t vocab) {
  const auto first = logits.begin() + long(row) * vocab;
  return int32_t(std::max_element(first, first + vocab) - first);
}

TEST(TpTree, TreeStepsWithKvMovesEqualTp1) {
  const std::string dir = shared_dir() + "/models/house-llama";
  auto spec = load_model_spec(dir);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  auto weights = WeightStore::open(dir, spec->quant);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  auto backend1 = make_cpu_backend();
  auto tp1 = create_model(*spec, *weights, *backend1);
  ASSERT_TRUE(tp1.ok()) << tp1.status().to_string();
  // house-llama's 5 heads shard only unevenly (the test-only split).
  const TpConfig config{.tp_size = 2, .device = Device::kCpu, .sharding = {.allow_uneven = true}};
  auto factory = make_tp_rank_factory(config);
  ASSERT_TRUE(factory.ok()) << factory.status().to_string();
  std::unique_ptr<Backend> backend0;
  auto tp2 = create_tp_model(*spec, *weights, config, *factory, &backend0);
  ASSERT_TRUE(tp2.ok()) << tp2.status().to_string();
  const int32_t vocab = int32_t(spec->vocab_size);

  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 14; ++i) prompt.push_back((i * 7919 + 13) % vocab);
  constexpr int32_t kNew = 18;
  // Plain greedy on tp 1: the right continuation the trees hold.
  std::vector<int32_t> want;
  {
    PagedRequest plain(**tp1, prompt, kPageSize);
    plain.request().start_prefill();
    plain.prefill(int32_t(prompt.size()) - 1);
    for (int32_t i = 0; i < kNew; ++i) {
      want.push_back(argmax_of(plain.run({.num_new_tokens = 1, .sample = true}), 0, vocab));
      plain.request().append_output(want.back(), {});
      plain.request().set_kv_len(plain.request().kv_len() + 1);
    }
  }

  PagedRequest one(**tp1, prompt, kPageSize), two(**tp2, prompt, kPageSize);
  for (PagedRequest* req : {&one, &two}) {
    req->request().start_prefill();
    req->prefill(int32_t(prompt.size()) - 1);
  }
  std::vector<int32_t> got;
  int moved_steps = 0;
  for (int step = 0; int32_t(got.size()) < kNew; ++step) {
    const size_t m = got.size();
    auto g = [&](size_t k) { return want[std::min(m + k, want.size() - 1)]; };
    auto w = [&](size_t k) { return (g(k) + 1 + int32_t(step) % 5) % vocab; };
    // The right token second among the root's children and under a wrong sibling's subtree.
    DraftTree t = DraftTree::root_only(one.request().token_at(one.request().kv_len()));
    const int32_t bad = t.add(0, w(0));
    const int32_t good = t.add(0, g(0));
    t.add(bad, g(1));
    t.add(good, w(1));
    const int32_t g1 = t.add(good, g(1));
    t.add(g1, g(2));
    ScheduledSeq seq{.num_new_tokens = 1, .sample = true};
    seq.draft.assign(t.tokens.begin() + 1, t.tokens.end());
    seq.draft_parents.assign(t.parents.begin() + 1, t.parents.end());
    const std::vector<float> a = one.run(seq), b = two.run(seq);
    ASSERT_LT(rel_max_error(b, a), 2e-6) << "step " << step;
    std::vector<int32_t> rows;
    for (int32_t v = 0; v < t.size(); ++v) rows.push_back(argmax_of(a, v, vocab));
    const TreeAcceptance acc = accept_tree(t, rows);
    const int32_t n = one.request().kv_len();
    std::vector<int32_t> from, to;
    for (auto [f, d] : accepted_kv_moves(acc.path)) {
      from.push_back(one.slot(n + f));
      to.push_back(one.slot(n + d));
    }
    moved_steps += from.empty() ? 0 : 1;
    (*tp1)->move_kv_rows(one.kv(), from, to);
    (*tp2)->move_kv_rows(two.kv(), from, to);
    for (int32_t x : acc.committed_tokens(t)) {
      got.push_back(x);
      for (PagedRequest* req : {&one, &two}) req->request().append_output(x, {});
    }
    for (PagedRequest* req : {&one, &two}) req->request().set_kv_len(n + 1 + acc.accepted());
  }
  got.resize(size_t(kNew));
  EXPECT_EQ(got, want);
  EXPECT_GT(moved_steps, 2);
  // The committed rows' next decode on both.
  const std::vector<float> a = one.run({.num_new_tokens = 1, .sample = true});
  const std::vector<float> b = two.run({.num_new_tokens = 1, .sample = true});
  EXPECT_LT(rel_max_error(b, a), 2e-6);
}

}  // namespace
}  // namespace strata::testing
