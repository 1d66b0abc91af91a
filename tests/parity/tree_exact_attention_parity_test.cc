// Deterministic mode's draft trees are exact at the attention op (issue 26): with
// CudaTunables::deterministic, the paged-attention output row of every node of a random draft
// tree is bitwise equal (==, every bit of every head) to the last row of a plain causal chunk
// over the node's path: the same cached prefix, then the path's nodes' K/V and queries at
// contiguous positions. Over the simple kernel (head_dim 16/32) and the grouped wgmma kernel
// (64/128, 2 and 3 K/V stages), prefixes that put the tree across 64-key tiles, trees of up to
// 64 nodes, scrambled pages of several sizes.
//
// Negative control, same cases: with CudaTunables::deterministic_tree_paths off (the tree's rows
// share tiles, keys at their tree slots with masked siblings between: the layout before path
// tiles) some rows must differ, so the comparison above can fail. (The model-level test:
// tree_exact_model_parity_test.cc.)
#include <gtest/gtest.h>

#include <cstring>

#include "op_pair.h"

namespace strata {
namespace {

struct ExactCase {
  int heads, kv_heads, head_dim, page_size;
  int prefix;  // cached keys before the tree (P)
  int nodes;   // tree nodes, the root included (node i at KV row P + i)
};

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

// One paged-attention batch: sequences of (source rows of their keys, new tokens at the end).
struct Batch {
  std::vector<int32_t> q_indptr{0}, kv_lens, page_indptr{0}, pages, positions, slots;
  std::vector<int32_t> fill_slots, fill_rows;  // every context key: its slot, its source row
};

// The number of rows of `c`'s tree case whose output differs from its path's plain row.
int differing_rows(const ExactCase& c, bool tree_paths, std::mt19937& rng) {
  parity::Pair p;
  p.cuda().tune([&](cuda::CudaTunables& t) {
    t.deterministic = true;
    t.deterministic_tree_paths = tree_paths;
    t.prefill_split_mode = 0;
  });
  const RandomTree tree = random_tree(c.nodes, rng);
  const int P = c.prefix, n = c.nodes, k_dim = c.kv_heads * c.head_dim;
  const int qw = c.heads * c.head_dim;
  // Source rows: K/V rows 0..P-1 the prefix, P + i node i; q rows: node i's query at row i.
  const std::vector<float> k_src = p.random(int64_t(P + n) * k_dim);
  const std::vector<float> v_src = p.random(int64_t(P + n) * k_dim);
  const std::vector<float> q_src = p.random(int64_t(n) * qw);

  int next_page = 0;
  std::vector<int32_t> perm;
  auto add_seq = [&](Batch& b, const std::vector<int>& key_rows, int fresh) {
    const int len = int(key_rows.size());
    for (int i = 0; i < (len + c.page_size - 1) / c.page_size; ++i) {
      perm.push_back(next_page++);
      b.pages.push_back(0);  // assigned from the shuffled ids below
    }
    b.page_indptr.push_back(int32_t(b.pages.size()));
    b.kv_lens.push_back(len);
    b.q_indptr.push_back(b.q_indptr.back() + fresh);
    for (int j = 0; j < len; ++j) b.fill_rows.push_back(key_rows[size_t(j)]);
  };
  // The tree: the prefix, then every node at its tree slot.
  Batch tb;
  std::vector<int> rows(size_t(P + n));
  std::iota(rows.begin(), rows.end(), 0);
  add_seq(tb, rows, n);
  // One plain sequence a node: the prefix, then its path's nodes (all new tokens).
  Batch pb;
  for (int v = 0; v < n; ++v) {
    auto r = std::vector<int>(size_t(P));
    std::iota(r.begin(), r.end(), 0);
    for (int a : tree.path[size_t(v)]) r.push_back(P + a);
    add_seq(pb, r, int(tree.path[size_t(v)].size()));
  }
  std::shuffle(perm.begin(), perm.end(), p.rng());
  int used = 0;
  for (Batch* b : {&tb, &pb}) {
    for (size_t s = 0; s + 1 < b->page_indptr.size(); ++s) {
      for (int32_t i = b->page_indptr[s]; i < b->page_indptr[s + 1]; ++i)
        b->pages[size_t(i)] = perm[size_t(used++)];
      const int32_t* sp = b->pages.data() + b->page_indptr[s];
      const int len = b->kv_lens[s], fresh = b->q_indptr[s + 1] - b->q_indptr[s];
      for (int j = 0; j < len; ++j) {
        const int32_t slot = sp[j / c.page_size] * c.page_size + j % c.page_size;
        b->fill_slots.push_back(slot);
        if (j >= len - fresh) {
          b->slots.push_back(slot);
          b->positions.push_back(b == &tb ? P + int(tree.path[size_t(j - P)].size()) - 1 : j);
        }
      }
    }
  }
  KvLayout lay;
  lay.num_layers = 1;
  lay.num_pages = next_page;
  lay.page_size = c.page_size;
  lay.k_dim = lay.v_dim = k_dim;
  lay.dtype = DType::kBF16;
  auto kv = p.gpu_->alloc_kv(lay);
  AttentionArgs args{.scale = float(1.0 / std::sqrt(double(c.head_dim))),
                     .num_heads = c.heads,
                     .num_kv_heads = c.kv_heads,
                     .head_dim = c.head_dim,
                     .v_head_dim = c.head_dim};
  // Writes a batch's keys, runs it, returns its output rows.
  auto run = [&](const Batch& b, const std::vector<int>& q_rows, const uint64_t* tree_mask) {
    const int t_all = int(b.fill_slots.size()), t_new = b.q_indptr.back();
    std::vector<float> k(size_t(t_all) * k_dim), v(k.size()), q(size_t(t_new) * qw);
    for (int i = 0; i < t_all; ++i) {
      std::memcpy(&k[size_t(i) * k_dim], &k_src[size_t(b.fill_rows[size_t(i)]) * k_dim],
                  size_t(k_dim) * 4);
      std::memcpy(&v[size_t(i) * k_dim], &v_src[size_t(b.fill_rows[size_t(i)]) * k_dim],
                  size_t(k_dim) * 4);
    }
    for (int i = 0; i < t_new; ++i)
      std::memcpy(&q[size_t(i) * qw], &q_src[size_t(q_rows[size_t(i)]) * qw], size_t(qw) * 4);
    auto kt = p.gpu_->upload(Tensor::make(k.data(), DType::kF32, {t_all, k_dim}), DType::kBF16);
    auto vt = p.gpu_->upload(Tensor::make(v.data(), DType::kF32, {t_all, k_dim}), DType::kBF16);
    std::vector<int32_t> zeros(size_t(t_all), 0);
    AttentionMetadata fill{.num_seqs = 0,
                           .num_tokens = t_all,
                           .page_size = c.page_size,
                           .q_indptr = b.q_indptr.data(),
                           .kv_lens = b.kv_lens.data(),
                           .page_indptr = b.page_indptr.data(),
                           .page_indices = b.pages.data(),
                           .positions = zeros.data(),
                           .slot_mapping = b.fill_slots.data()};
    p.gpu_->kv_write(*kv, 0, *kt, *vt, fill);
    AttentionMetadata meta{.num_seqs = int(b.kv_lens.size()),
                           .num_tokens = t_new,
                           .page_size = c.page_size,
                           .q_indptr = b.q_indptr.data(),
                           .kv_lens = b.kv_lens.data(),
                           .page_indptr = b.page_indptr.data(),
                           .page_indices = b.pages.data(),
                           .positions = b.positions.data(),
                           .slot_mapping = b.slots.data(),
                           .tree_mask = tree_mask};
    auto qt = p.gpu_->upload(Tensor::make(q.data(), DType::kF32, {t_new, c.heads, c.head_dim}),
                             DType::kBF16);
    std::vector<float> nan(size_t(t_new) * qw, NAN);
    auto out = p.gpu_->upload(Tensor::make(nan.data(), DType::kF32, {t_new, c.heads, c.head_dim}),
                              DType::kBF16);
    p.gpu_->paged_attention(*qt, *kv, 0, meta, args, *out);
    return p.get(*out, true);
  };
  auto tree_q = std::vector<int>(size_t(n));
  std::vector<int> plain_q;
  std::iota(tree_q.begin(), tree_q.end(), 0);
  for (int v = 0; v < n; ++v)
    for (int a : tree.path[size_t(v)]) plain_q.push_back(a);
  const std::vector<float> got = run(tb, tree_q, tree.words.data());
  const std::vector<float> want = run(pb, plain_q, nullptr);
  int differ = 0;
  for (int v = 0; v < n; ++v) {
    const float* g = got.data() + size_t(v) * qw;
    const float* w = want.data() + size_t(pb.q_indptr[size_t(v) + 1] - 1) * qw;  // v's own row
    if (!std::all_of(g, g + qw, [](float x) { return std::isfinite(x); }))
      ADD_FAILURE() << "node " << v << ": a value not written (NaN) or not finite";
    differ += std::memcmp(g, w, size_t(qw) * sizeof(float)) != 0;
  }
  return differ;
}

// Heads / KV heads / head_dim / page / prefix / nodes. Trees past a 64-key edge (P = 60, 63,
// 120, 1000 ...), one right after it (P = 64), a 64-node tree, a tree with no prefix.
const std::vector<ExactCase> kCases = {
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

TEST(TreeExactParity, AttentionRowsEqualPlainPaths) {
  std::mt19937 rng(2026);
  for (const ExactCase& c : kCases)
    for (int rep = 0; rep < 3; ++rep) {
      const int d = differing_rows(c, /*tree_paths=*/true, rng);
      std::printf("exact heads %d/%d hd %d page %d prefix %d nodes %d: %d rows differ\n", c.heads,
                  c.kv_heads, c.head_dim, c.page_size, c.prefix, c.nodes, d);
      EXPECT_EQ(d, 0) << "heads " << c.heads << "/" << c.kv_heads << " hd " << c.head_dim
                      << " prefix " << c.prefix << " nodes " << c.nodes;
    }
}

TEST(TreeExactParity, AttentionControlWithoutPathTiles) {
  std::mt19937 rng(2026);
  int differ = 0, rows = 0;
  for (const ExactCase& c : kCases)
    for (int rep = 0; rep < 3; ++rep) {
      const int d = differing_rows(c, /*tree_paths=*/false, rng);
      std::printf("control heads %d/%d hd %d prefix %d nodes %d: %d of %d rows differ\n", c.heads,
                  c.kv_heads, c.head_dim, c.prefix, c.nodes, d, c.nodes);
      differ += d;
      rows += c.nodes;
    }
  std::printf("control: %d of %d rows differ without path tiles\n", differ, rows);
  EXPECT_GT(differ, 0) << "the shared-tile layout gave every row bitwise: the exactness test "
                          "above cannot tell path tiles from it";
}

}  // namespace
}  // namespace strata
