// Deterministic mode's draft trees are exact at the attention ops (issue 26): with
// CudaTunables::deterministic, the output row of every node of a random draft tree is bitwise
// equal (==, every bit of every head) to the last row of a plain causal chunk over the node's
// path: the same cached prefix, then the path's nodes' keys and queries at contiguous positions.
//  - paged attention (GQA): the simple kernel (head_dim 16/32) and the grouped wgmma kernel
//    (64/128, 2 and 3 K/V stages);
//  - absorbed MLA (the mma kernel deterministic mode runs: 48-key chunks over bf16 rows), head
//    counts below, at and above its 16-row tile;
// prefixes that put the tree across 64-key (GQA) and 48-key (MLA) tiles, trees of up to 64
// nodes, scrambled pages of several sizes, the paths' chunks batched together.
//
// Negative control, same cases: with CudaTunables::deterministic_tree_paths off (the tree's rows
// share tiles, keys at their tree slots with masked siblings between them: the layout before path
// tiles) some rows must differ, so the comparison can fail. (On a model:
// tree_exact_model_parity_test.cc.)
#include <gtest/gtest.h>

#include <cstring>

#include "op_pair.h"

namespace strata {
namespace {

// A random tree: node i's parent uniform in [0, i). path[v]: v's ancestors from the root, then v.
struct RandomTree {
  std::vector<uint64_t> words;
  std::vector<std::vector<int>> path;
};
RandomTree random_tree(int nodes, std::mt19937& rng) {
  RandomTree t;
  t.words.resize(size_t(nodes));
  t.path.resize(size_t(nodes));
  t.words[0] = 1;
  t.path[0] = {0};
  for (int i = 1; i < nodes; ++i) {
    const int parent = std::uniform_int_distribution<int>(0, i - 1)(rng);
    t.words[size_t(i)] = t.words[size_t(parent)] | (uint64_t(1) << i);
    t.path[size_t(i)] = t.path[size_t(parent)];
    t.path[size_t(i)].push_back(i);
  }
  return t;
}

// One attention batch over a shared cache: its metadata, every context key's slot and source row
// (rows 0..P-1 the prefix, P + i tree node i), and each new token's query source row (node i).
struct Batch {
  std::vector<int32_t> q_indptr{0}, kv_lens, page_indptr{0}, pages, positions, slots;
  std::vector<int32_t> fill_slots, fill_rows, q_rows;
  AttentionMetadata meta(int page_size, const uint64_t* tree_mask) const {
    return {.num_seqs = int(kv_lens.size()),
            .num_tokens = q_indptr.back(),
            .page_size = page_size,
            .q_indptr = q_indptr.data(),
            .kv_lens = kv_lens.data(),
            .page_indptr = page_indptr.data(),
            .page_indices = pages.data(),
            .positions = positions.data(),
            .slot_mapping = slots.data(),
            .tree_mask = tree_mask};
  }
};

// The tree (one sequence: the prefix, then node i at KV row P + i) and the plain batch (one
// sequence a node: the prefix, then its path's nodes, all new), on disjoint scrambled pages.
struct TreeAndPaths {
  RandomTree tree;
  Batch tree_batch, paths;
  int num_pages = 0;
};
TreeAndPaths make_batches(int prefix, int nodes, int page_size, std::mt19937& rng) {
  TreeAndPaths b;
  b.tree = random_tree(nodes, rng);
  const int P = prefix;
  auto add_seq = [&](Batch& bt, const std::vector<int>& path) {
    const int len = P + int(path.size());
    const int np = (len + page_size - 1) / page_size;
    for (int i = 0; i < np; ++i) bt.pages.push_back(b.num_pages++);
    bt.page_indptr.push_back(int32_t(bt.pages.size()));
    bt.kv_lens.push_back(len);
    bt.q_indptr.push_back(bt.q_indptr.back() + int(path.size()));
    for (int j = 0; j < P; ++j) bt.fill_rows.push_back(j);
    for (int a : path) {
      bt.fill_rows.push_back(P + a);
      bt.q_rows.push_back(a);
    }
  };
  auto all = std::vector<int>(size_t(nodes));
  std::iota(all.begin(), all.end(), 0);
  add_seq(b.tree_batch, all);
  for (int v = 0; v < nodes; ++v) add_seq(b.paths, b.tree.path[size_t(v)]);
  auto perm = std::vector<int32_t>(size_t(b.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (Batch* bt : {&b.tree_batch, &b.paths}) {
    for (int32_t& pg : bt->pages) pg = perm[size_t(pg)];
    for (size_t s = 0; s + 1 < bt->page_indptr.size(); ++s) {
      const int32_t* sp = bt->pages.data() + bt->page_indptr[s];
      const int len = bt->kv_lens[s], fresh = bt->q_indptr[s + 1] - bt->q_indptr[s];
      for (int j = 0; j < len; ++j) {
        const int32_t slot = sp[j / page_size] * page_size + j % page_size;
        bt->fill_slots.push_back(slot);
        if (j < len - fresh) continue;
        bt->slots.push_back(slot);
        // The tree's rope positions are P + depth (node j - P); a path's are contiguous.
        bt->positions.push_back(bt == &b.tree_batch ? P + int(b.tree.path[size_t(j - P)].size()) - 1
                                                    : j);
      }
    }
  }
  return b;
}

// Rows [n, width] gathered from `src` (rows of `width` floats) by index.
std::vector<float> gather(const std::vector<float>& src, const std::vector<int32_t>& rows,
                          int width) {
  std::vector<float> out(rows.size() * size_t(width));
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(&out[i * size_t(width)], &src[size_t(rows[i]) * size_t(width)],
                size_t(width) * sizeof(float));
  return out;
}

// A deterministic CUDA backend, path tiles on or off.
void deterministic(parity::Pair& p, bool tree_paths) {
  p.cuda().tune([&](cuda::CudaTunables& t) {
    t.deterministic = true;
    t.deterministic_tree_paths = tree_paths;
  });
}

// The nodes whose tree row (`tree_out`, [nodes, width]) differs from the last row of their path's
// sequence (`path_out`); a row not written (NaN poison) is a failure.
int differing(const TreeAndPaths& b, const std::vector<float>& tree_out,
              const std::vector<float>& path_out, int width) {
  int differ = 0;
  for (size_t v = 0; v < b.tree.words.size(); ++v) {
    const float* g = tree_out.data() + v * size_t(width);
    const float* w = path_out.data() + size_t(b.paths.q_indptr[v + 1] - 1) * size_t(width);
    if (!std::all_of(g, g + width, [](float x) { return std::isfinite(x); }))
      ADD_FAILURE() << "node " << v << ": a value not written (NaN) or not finite";
    differ += std::memcmp(g, w, size_t(width) * sizeof(float)) != 0;
  }
  return differ;
}

struct GqaCase {
  int heads, kv_heads, head_dim, page_size;
  int prefix;  // cached keys before the tree (P)
  int nodes;   // tree nodes, the root included
};

// GQA paged attention: the number of tree rows that differ from their path's plain row.
int gqa_differing(const GqaCase& c, bool tree_paths, std::mt19937& rng) {
  parity::Pair p;
  deterministic(p, tree_paths);
  const TreeAndPaths b = make_batches(c.prefix, c.nodes, c.page_size, rng);
  const int k_dim = c.kv_heads * c.head_dim, qw = c.heads * c.head_dim;
  const std::vector<float> k_src = p.random(int64_t(c.prefix + c.nodes) * k_dim);
  const std::vector<float> v_src = p.random(int64_t(c.prefix + c.nodes) * k_dim);
  const std::vector<float> q_src = p.random(int64_t(c.nodes) * qw);
  KvLayout lay;
  lay.num_layers = 1;
  lay.num_pages = b.num_pages;
  lay.page_size = c.page_size;
  lay.k_dim = lay.v_dim = k_dim;
  lay.dtype = DType::kBF16;
  auto kv = p.gpu_->alloc_kv(lay);
  const AttentionArgs args{.scale = float(1.0 / std::sqrt(double(c.head_dim))),
                           .num_heads = c.heads,
                           .num_kv_heads = c.kv_heads,
                           .head_dim = c.head_dim,
                           .v_head_dim = c.head_dim};
  auto run = [&](const Batch& bt, const uint64_t* tree_mask) {
    const int t_all = int(bt.fill_slots.size()), t_new = bt.q_indptr.back();
    std::vector<float> k = gather(k_src, bt.fill_rows, k_dim),
                       v = gather(v_src, bt.fill_rows, k_dim);
    std::vector<float> q = gather(q_src, bt.q_rows, qw);
    auto kt = p.gpu_->upload(Tensor::make(k.data(), DType::kF32, {t_all, k_dim}), DType::kBF16);
    auto vt = p.gpu_->upload(Tensor::make(v.data(), DType::kF32, {t_all, k_dim}), DType::kBF16);
    std::vector<int32_t> zeros(size_t(t_all), 0);
    AttentionMetadata fill = bt.meta(c.page_size, nullptr);
    fill.num_seqs = 0;
    fill.num_tokens = t_all;
    fill.positions = zeros.data();
    fill.slot_mapping = bt.fill_slots.data();
    p.gpu_->kv_write(*kv, 0, *kt, *vt, fill);
    auto qt = p.gpu_->upload(Tensor::make(q.data(), DType::kF32, {t_new, c.heads, c.head_dim}),
                             DType::kBF16);
    std::vector<float> nan(size_t(t_new) * qw, NAN);
    auto out = p.gpu_->upload(Tensor::make(nan.data(), DType::kF32, {t_new, c.heads, c.head_dim}),
                              DType::kBF16);
    p.gpu_->paged_attention(*qt, *kv, 0, bt.meta(c.page_size, tree_mask), args, *out);
    return p.get(*out, true);
  };
  const std::vector<float> tree_out = run(b.tree_batch, b.tree.words.data());
  return differing(b, tree_out, run(b.paths, nullptr), qw);
}

struct MlaCase {
  int heads, latent, rope, page_size;
  int prefix, nodes;
};

// Absorbed MLA over bf16 latent rows: the number of tree rows that differ from their path's.
int mla_differing(const MlaCase& c, bool tree_paths, std::mt19937& rng) {
  parity::Pair p;
  deterministic(p, tree_paths);
  const TreeAndPaths b = make_batches(c.prefix, c.nodes, c.page_size, rng);
  const int width = c.latent + c.rope, qw = c.heads * width, ow = c.heads * c.latent;
  const std::vector<float> k_src = p.random(int64_t(c.prefix + c.nodes) * width);
  const std::vector<float> q_src = p.random(int64_t(c.nodes) * qw);
  KvLayout lay;
  lay.num_layers = 1;
  lay.num_pages = b.num_pages;
  lay.page_size = c.page_size;
  lay.k_dim = width;
  lay.v_dim = 0;
  lay.rope_dim = c.rope;
  lay.dtype = DType::kBF16;
  auto kv = p.gpu_->alloc_kv(lay);
  const MlaArgs args{.scale = float(1.0 / std::sqrt(192.0)),
                     .num_heads = c.heads,
                     .kv_lora_rank = c.latent,
                     .rope_dim = c.rope};
  auto run = [&](const Batch& bt, const uint64_t* tree_mask) {
    const int t_all = int(bt.fill_slots.size()), t_new = bt.q_indptr.back();
    std::vector<float> k = gather(k_src, bt.fill_rows, width), q = gather(q_src, bt.q_rows, qw);
    auto kt = p.gpu_->upload(Tensor::make(k.data(), DType::kF32, {t_all, width}), DType::kBF16);
    std::vector<int32_t> zeros(size_t(t_all), 0);
    AttentionMetadata fill = bt.meta(c.page_size, nullptr);
    fill.num_seqs = 0;
    fill.num_tokens = t_all;
    fill.positions = zeros.data();
    fill.slot_mapping = bt.fill_slots.data();
    p.gpu_->kv_write(*kv, 0, *kt, Tensor(), fill);
    auto qt =
        p.gpu_->upload(Tensor::make(q.data(), DType::kF32, {t_new, c.heads, width}), DType::kBF16);
    std::vector<float> nan(size_t(t_new) * ow, NAN);
    auto out = p.gpu_->upload(Tensor::make(nan.data(), DType::kF32, {t_new, c.heads, c.latent}),
                              DType::kBF16);
    p.gpu_->mla_attention(*qt, *kv, 0, bt.meta(c.page_size, tree_mask), args, *out);
    return p.get(*out, true);
  };
  const std::vector<float> tree_out = run(b.tree_batch, b.tree.words.data());
  return differing(b, tree_out, run(b.paths, nullptr), ow);
}

// Heads / KV heads / head_dim / page / prefix / nodes.
const std::vector<GqaCase> kGqaCases = {
    {5, 1, 64, 16, 149, 9},      // house-llama's shape: grouped wgmma, head_dim 64 (3 stages)
    {5, 1, 64, 16, 60, 16},      // across keys 64
    {8, 2, 128, 16, 63, 24},     // head_dim 128 (2 stages), the root at key 63
    {32, 8, 128, 16, 1000, 40},  // across 1024
    {16, 1, 64, 8, 64, 12},      // the root at 64: inside one tile
    {6, 2, 64, 5, 100, 64},      // 64 nodes across 128
    {4, 4, 16, 4, 120, 16},      // the simple kernel (head_dim 16, 32)
    {4, 2, 32, 7, 50, 64},       //
    {8, 8, 128, 16, 0, 20},      // no prefix
};
// Heads / latent / rope / page / prefix / nodes. The bf16 mma kernel's chunks: 48 keys.
const std::vector<MlaCase> kMlaCases = {
    {5, 128, 32, 16, 40, 16},   // house-mla's shape, across keys 48
    {5, 128, 32, 16, 140, 9},   // across 144
    {16, 512, 64, 64, 90, 24},  // DeepSeek's rows, a whole tile of heads, across 96
    {20, 128, 32, 1, 127, 40},  // two tiles a token, pages of one row
    {8, 32, 8, 16, 200, 64},    // 64 nodes
    {3, 128, 32, 16, 0, 12},    // no prefix
};

template <typename Case, typename Fn>
void check_exact(const char* what, const std::vector<Case>& cases, Fn differing_rows) {
  std::mt19937 rng(2026);
  int differ = 0, rows = 0;
  for (const Case& c : cases)
    for (int rep = 0; rep < 3; ++rep) {
      const int d = differing_rows(c, /*tree_paths=*/true, rng);
      EXPECT_EQ(d, 0) << what << " heads " << c.heads << " prefix " << c.prefix << " nodes "
                      << c.nodes << " page " << c.page_size;
      differ += d;
      rows += c.nodes;
    }
  std::printf("%s exact: %d of %d tree rows differ from their plain paths\n", what, differ, rows);
}

template <typename Case, typename Fn>
void check_control(const char* what, const std::vector<Case>& cases, Fn differing_rows) {
  std::mt19937 rng(2026);
  int differ = 0, rows = 0;
  for (const Case& c : cases)
    for (int rep = 0; rep < 3; ++rep) {
      differ += differing_rows(c, /*tree_paths=*/false, rng);
      rows += c.nodes;
    }
  std::printf("%s control (shared tiles): %d of %d tree rows differ\n", what, differ, rows);
  EXPECT_GT(differ, 0) << what << ": the shared-tile layout gave every row bitwise, so the "
                       << "exactness test cannot tell path tiles from it";
}

TEST(TreeExactParity, AttentionRowsEqualPlainPaths) {
  check_exact("gqa", kGqaCases, gqa_differing);
}
TEST(TreeExactParity, AttentionControlWithoutPathTiles) {
  check_control("gqa", kGqaCases, gqa_differing);
}
TEST(TreeExactParity, MlaRowsEqualPlainPaths) { check_exact("mla", kMlaCases, mla_differing); }
TEST(TreeExactParity, MlaControlWithoutPathTiles) {
  check_control("mla", kMlaCases, mla_differing);
}

}  // namespace
}  // namespace strata
