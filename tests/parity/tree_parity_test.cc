// Draft trees on the GPU (speculative decoding with EAGLE topk > 1; engine/spec/draft_tree.h)
// against the CPU reference:
//  - paged attention with AttentionMetadata::tree_mask over every GQA kernel that takes more than
//    one new token a sequence: the simple prefill kernel (head_dim 16/32), the grouped wgmma
//    kernel (64/128), split-KV prefill (forced, and the automatic choice), deterministic mode;
//    NMSE < 1e-4 as the causal cases (ops_parity_test.cc). (MLA: mla_attention_parity_test.cc,
//    MlaAttention.DraftTrees.)
//  - Backend::kv_move_rows: after moves (chained: a move reads a row an earlier one wrote) the
//    device cache's bytes equal the moves applied one by one to its bytes on the host; bf16 and
//    fp8 GQA layers and FlashMLA rows.
//  - the verify forward of a tree on house-llama and house-mla (BatchPlan::build with
//    draft_parents): each node's logits row against the CPU reference's same row and against
//    the GPU's plain forward over the node's path (NMSE < 1e-3, the model bound 5e-4 of
//    model_parity_test with room for the tree; argmax equal to the CPU's but at most one row).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "engine/spec/draft_tree.h"
#include "op_pair.h"
#include "support/golden.h"
#include "support/paged_request.h"

namespace strata {
namespace {

using parity::AttnCase;
using parity::run_attention;

std::function<void(cuda::CudaBackend&)> tune(int split_mode, bool deterministic) {
  return [=](cuda::CudaBackend& be) {
    be.tune([&](cuda::CudaTunables& t) {
      t.prefill_split_mode = split_mode;
      t.deterministic = deterministic;
    });
  };
}

// Trees of 2..64 new tokens next to causal prefill chunks and decodes.
const std::vector<AttnCase> kTreeCases = {
    {4, 4, 16, 4, {{100, 9}, {0, 65}, {30, 1}}},
    {4, 2, 32, 7, {{10, 64}, {0, 3}, {300, 17}}},
    {32, 8, 128, 16, {{200, 8}, {0, 77}, {50, 13}, {0, 1}, {1000, 64}}},
    {6, 2, 64, 5, {{37, 43}, {0, 2}, {129, 16}}},
    {8, 8, 128, 16, {{64, 64}, {3000, 24}}},
    {16, 1, 64, 8, {{3000, 33}, {5, 9}}},
};

TEST(TreeParity, PagedAttentionRegularKernels) {
  for (const AttnCase& c : kTreeCases) run_attention(c, tune(0, false), /*trees=*/true);
}

TEST(TreeParity, PagedAttentionSplitKv) {
  for (const AttnCase& c : kTreeCases) run_attention(c, tune(2, false), /*trees=*/true);
  for (const AttnCase& c : kTreeCases) run_attention(c, tune(1, false), /*trees=*/true);
}

TEST(TreeParity, PagedAttentionDeterministic) {
  for (const AttnCase& c : kTreeCases) run_attention(c, tune(0, true), /*trees=*/true);
}

// The moves applied one by one to host copies of every layer's rows.
void move_on_host(std::vector<std::vector<uint8_t>>& rows, const std::vector<int64_t>& row_bytes,
                  const std::vector<int32_t>& from, const std::vector<int32_t>& to) {
  for (size_t l = 0; l < rows.size(); ++l)
    for (size_t i = 0; i < from.size(); ++i)
      std::memmove(rows[l].data() + to[i] * row_bytes[l], rows[l].data() + from[i] * row_bytes[l],
                   size_t(row_bytes[l]));
}

void check_kv_move(const KvLayout& lay) {
  parity::Pair p;
  auto kv = p.gpu_->alloc_kv(lay);
  const int64_t slots = lay.num_pages * lay.page_size;
  // Every slot written with random rows through kv_write.
  std::vector<int32_t> all(static_cast<size_t>(slots));
  std::iota(all.begin(), all.end(), 0);
  std::vector<int32_t> zeros(all.size(), 0);
  const int32_t none[1] = {0};
  AttentionMetadata fill{.num_seqs = 0,
                         .num_tokens = int(slots),
                         .page_size = lay.page_size,
                         .q_indptr = none,
                         .kv_lens = none,
                         .page_indptr = none,
                         .page_indices = none,
                         .positions = zeros.data(),
                         .slot_mapping = all.data()};
  for (int l = 0; l < lay.num_layers; ++l) {
    auto k = p.make(p.random(slots * lay.k_dim), {slots, lay.k_dim});
    if (lay.v_dim > 0) {
      auto v = p.make(p.random(slots * lay.v_dim), {slots, lay.v_dim});
      p.gpu_->kv_write(*kv, l, *k.gpu, *v.gpu, fill);
    } else {
      p.gpu_->kv_write(*kv, l, *k.gpu, Tensor(), fill);
    }
  }
  // Host copies of K and V of every layer (the tensors as stored).
  auto read_all = [&] {
    std::vector<std::vector<uint8_t>> rows;
    for (int l = 0; l < lay.num_layers; ++l)
      for (int is_v = 0; is_v < (lay.v_dim > 0 ? 2 : 1); ++is_v) {
        const Tensor t = is_v ? kv->v(l) : kv->k(l);
        rows.emplace_back(size_t(t.numel()) * dtype_size(t.dtype));
        p.gpu_->download(t, rows.back().data());
      }
    return rows;
  };
  std::vector<int64_t> row_bytes;
  for (int l = 0; l < lay.num_layers; ++l) {
    row_bytes.push_back(lay.k_row_bytes(l));
    if (lay.v_dim > 0) row_bytes.push_back(lay.v_row_bytes(l));
  }
  std::vector<std::vector<uint8_t>> want = read_all();
  // An accepted path's moves (rows past kv_len 40: nodes 3, 7, 12 to 1, 2, 3), then a chain where
  // a move reads what an earlier one wrote (5 -> 2, then 2 -> 30), across pages.
  const std::vector<int32_t> from = {43, 47, 52, 5, 2}, to = {41, 42, 43, 2, 30};
  move_on_host(want, row_bytes, from, to);
  p.gpu_->kv_move_rows(*kv, from.data(), to.data(), int(from.size()));
  p.gpu_->synchronize();
  const std::vector<std::vector<uint8_t>> got = read_all();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(got[i] == want[i]) << "kv_move_rows: tensor " << i << " differs";
}

TEST(TreeParity, KvMoveRows) {
  KvLayout gqa;
  gqa.num_layers = 3;
  gqa.num_pages = 16;
  gqa.page_size = 4;
  gqa.k_dim = gqa.v_dim = 256;
  gqa.dtype = DType::kBF16;
  gqa.layer_dtypes = {DType::kBF16, DType::kFP8E4M3, DType::kBF16};
  check_kv_move(gqa);
  KvLayout mla;
  mla.num_layers = 2;
  mla.num_pages = 8;
  mla.page_size = 16;
  mla.k_dim = 576;
  mla.v_dim = 0;
  mla.dtype = DType::kFP8E4M3;
  mla.rope_dim = 64;
  mla.format = KvFormat::kFlashMlaFp8;
  check_kv_move(mla);
  mla.format = KvFormat::kPlain;
  mla.dtype = DType::kBF16;
  check_kv_move(mla);
}

// The test tree: 0 ─┬─ 1 ─┬─ 3 ─── 6
//                   │     └─ 4
//                   └─ 2 ─── 5 ─── 7 ─── 8
DraftTree test_tree(int32_t root, int32_t vocab) {
  DraftTree t = DraftTree::root_only(root);
  const int32_t parents[] = {0, 0, 1, 1, 2, 3, 5, 7};
  for (int32_t i = 0; i < 8; ++i) t.add(parents[i], (root * 31 + 97 * (i + 1)) % vocab);
  return t;
}

ScheduledSeq tree_seq(const DraftTree& t) {
  ScheduledSeq s{.num_new_tokens = 1, .sample = true};
  s.draft.assign(t.tokens.begin() + 1, t.tokens.end());
  s.draft_parents.assign(t.parents.begin() + 1, t.parents.end());
  return s;
}

double nmse(const float* got, const float* want, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += double(got[i] - want[i]) * (got[i] - want[i]);
    den += double(want[i]) * want[i];
  }
  return num / den;
}

int64_t argmax(const float* x, int64_t n) { return std::max_element(x, x + n) - x; }

class TreeModelParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TreeModelParity, VerifyForwardRows) {
  const std::string dir = testing::shared_dir() + "/models/" + GetParam();
  // A device carry holds one house model or both (bench/cuda/make_carry.sh): say which is absent.
  if (!std::filesystem::exists(dir + "/config.json"))
    GTEST_SKIP() << GetParam() << " is not in this carry (" << dir << ")";
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  auto cm = load_model(dir, *cpu);
  auto gm = load_model(dir, *gpu);
  ASSERT_TRUE(cm.ok() && gm.ok());
  const int64_t vocab = (*cm)->spec().vocab_size;
  constexpr int32_t kPage = 16;
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 150; ++i) prompt.push_back((i * 7919 + 13) % int32_t(vocab));
  const DraftTree tree = test_tree(prompt.back(), int32_t(vocab));
  const int32_t n = int32_t(prompt.size()) - 1;
  auto tree_rows = [&](Model& m, DType kv) {
    testing::PagedRequest r(m, prompt, kPage, kv, 256);
    r.prefill(n);
    return r.run(tree_seq(tree));
  };
  const std::vector<float> want = tree_rows(**cm, DType::kF32);
  const std::vector<float> got = tree_rows(**gm, DType::kBF16);
  ASSERT_EQ(got.size(), want.size());
  int disagree = 0;
  for (int32_t v = 0; v < tree.size(); ++v) {
    const float* g = got.data() + v * vocab;
    // The GPU's plain forward over the node's path, last row.
    std::vector<int32_t> ids = prompt;
    for (int32_t t : tree.path_tokens(v)) ids.push_back(t);
    testing::PagedRequest plain(**gm, ids, kPage, DType::kBF16, 256);
    const std::vector<float> path =
        plain.run({.num_new_tokens = int32_t(ids.size()), .sample = true});
    const double e_cpu = nmse(g, want.data() + v * vocab, vocab);
    const double e_path = nmse(g, path.data(), vocab);
    std::printf("%s tree node %d (depth %d): nmse vs cpu %.3g, vs gpu plain path %.3g\n",
                GetParam().c_str(), v, tree.depths[size_t(v)], e_cpu, e_path);
    EXPECT_LT(e_cpu, 1e-3) << "node " << v;
    EXPECT_LT(e_path, 1e-3) << "node " << v;
    disagree += argmax(g, vocab) != argmax(want.data() + v * vocab, vocab);
  }
  // bf16 against float32: an argmax may flip at a near-tie, not more than once in 9 rows.
  EXPECT_LE(disagree, 1);
}

INSTANTIATE_TEST_SUITE_P(HouseModels, TreeModelParity,
                         ::testing::Values("house-llama", "house-mla"), [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace strata
