// Deterministic mode's draft trees are exact on a model (issue 26: greedy speculative decoding
// with EAGLE topk > 1 token for token identical to plain decoding): on the CUDA backend made
// with BackendOptions::deterministic, the verify forward of a random draft tree (BatchPlan::build
// with draft_parents, as the engine plans it) gives every node a logits row bitwise equal (==,
// every float) to the last row of a plain forward over the node's path: the same prefix, then
// the path's tokens as one chunk at contiguous positions. Prefixes that put the tree across
// attention tile edges (GQA: 64 keys; MLA's bf16 mma kernel: 48), trees of 9 to 40 nodes;
// house-llama (GQA) and house-mla (MLA, MoE).
//
// Negative control, same trees: with CudaTunables::deterministic_tree_paths off (the tree's rows
// share attention tiles: the layout before path tiles) some rows must differ.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "backend/backend_options.h"
#include "backend/cuda/cuda_backend.h"
#include "engine/spec/draft_tree.h"
#include "support/golden.h"
#include "support/paged_request.h"

namespace strata {
namespace {

// A random tree of `nodes` under `root`: node i's parent uniform in [0, i), random tokens.
DraftTree random_draft_tree(int32_t root, int32_t nodes, int32_t vocab, std::mt19937& rng) {
  DraftTree t = DraftTree::root_only(root);
  for (int32_t i = 1; i < nodes; ++i)
    t.add(std::uniform_int_distribution<int32_t>(0, i - 1)(rng),
          std::uniform_int_distribution<int32_t>(1, vocab - 1)(rng));
  return t;
}

struct TreeCase {
  int32_t prefix;  // committed tokens before the root (the root sits at KV row `prefix`)
  int32_t nodes;
  int32_t page_size;
};

class TreeExactModel : public ::testing::TestWithParam<std::string> {};

TEST_P(TreeExactModel, VerifyRowsEqualPlainPaths) {
  const std::string dir = testing::shared_dir() + "/models/" + GetParam();
  if (!std::filesystem::exists(dir + "/config.json"))
    GTEST_SKIP() << GetParam() << " is not in this carry (" << dir << ")";
  auto gpu = make_cuda_backend(BackendOptions{.deterministic = true});
  auto& cuda = dynamic_cast<cuda::CudaBackend&>(*gpu);
  auto gm = load_model(dir, *gpu);
  ASSERT_TRUE(gm.ok()) << gm.status().to_string();
  Model& model = **gm;
  const int32_t vocab = int32_t(model.spec().vocab_size);
  // Root at 60 (the tree across keys 64; MLA: inside 48..95), at 63, at 127 + a 40-node tree
  // across 128 and 192 (MLA: 144), 149 (keys 149..157: inside a GQA tile), 250 (across 256), 92
  // (MLA: across 96).
  const std::vector<TreeCase> cases = {{60, 16, 16}, {63, 9, 16},   {149, 9, 16},
                                       {127, 40, 8}, {250, 24, 16}, {92, 12, 16}};
  std::mt19937 rng(26);
  int differ[2] = {0, 0}, rows = 0;
  for (const TreeCase& c : cases) {
    std::vector<int32_t> prompt;
    for (int32_t i = 0; i <= c.prefix; ++i)
      prompt.push_back(std::uniform_int_distribution<int32_t>(1, vocab - 1)(rng));
    const DraftTree tree = random_draft_tree(prompt.back(), c.nodes, vocab, rng);
    const int32_t max_tokens = c.prefix + c.nodes + 16;
    ScheduledSeq verify{.num_new_tokens = 1, .sample = true};
    verify.draft.assign(tree.tokens.begin() + 1, tree.tokens.end());
    verify.draft_parents.assign(tree.parents.begin() + 1, tree.parents.end());
    // The plain forwards of every node's path (the reference), then the tree with and without
    // path tiles.
    std::vector<std::vector<float>> plain;
    for (int32_t v = 0; v < tree.size(); ++v) {
      std::vector<int32_t> ids = prompt;
      for (int32_t t : tree.path_tokens(v)) ids.push_back(t);
      testing::PagedRequest r(model, ids, c.page_size, DType::kBF16, max_tokens);
      r.prefill(c.prefix);
      plain.push_back(r.run({.num_new_tokens = int32_t(ids.size()) - c.prefix, .sample = true}));
      ASSERT_EQ(plain.back().size(), size_t(vocab));
    }
    for (int paths = 1; paths >= 0; --paths) {
      cuda.tune([&](cuda::CudaTunables& t) { t.deterministic_tree_paths = paths == 1; });
      testing::PagedRequest r(model, prompt, c.page_size, DType::kBF16, max_tokens);
      r.prefill(c.prefix);
      const std::vector<float> got = r.run(verify);
      ASSERT_EQ(got.size(), size_t(tree.size()) * size_t(vocab));
      int d = 0;
      for (int32_t v = 0; v < tree.size(); ++v) {
        const bool same = std::memcmp(got.data() + size_t(v) * size_t(vocab),
                                      plain[size_t(v)].data(), size_t(vocab) * sizeof(float)) == 0;
        d += !same;
        if (paths == 1) {
          EXPECT_TRUE(same) << GetParam() << " prefix " << c.prefix << " node " << v << " (depth "
                            << tree.depths[size_t(v)] << "): logits differ from its plain path";
        }
      }
      differ[paths] += d;
      std::printf("%s prefix %d nodes %d page %d, path tiles %s: %d of %d rows differ\n",
                  GetParam().c_str(), c.prefix, c.nodes, c.page_size, paths ? "on" : "off", d,
                  tree.size());
    }
    rows += tree.size();
  }
  std::printf("%s: %d of %d rows differ with path tiles, %d without\n", GetParam().c_str(),
              differ[1], rows, differ[0]);
  EXPECT_GT(differ[0], 0) << "the control (shared tiles) gave every row bitwise: this test "
                             "cannot tell path tiles from it";
}

INSTANTIATE_TEST_SUITE_P(HouseModels, TreeExactModel, ::testing::Values("house-llama", "house-mla"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace strata
