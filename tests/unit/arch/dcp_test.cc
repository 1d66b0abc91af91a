// Decode context parallelism's attention (arch/dcp.h, backend/dcp_attention.h) on the CPU
// reference without communicators: N shard pools written through DcpLocalBatch (each rank its
// owned tokens), each shard's partial attention with its LSE, and the merge, against
// Backend::mla_attention over the whole pool. Chunked prefill, decodes and two sequences whose
// lengths fall anywhere in the shards; agreement within float32 rounding (measured ~1e-7).
#include "arch/dcp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace strata {
namespace {

constexpr int kHeads = 3, kRank = 16, kRope = 8, kWidth = kRank + kRope, kPoolPage = 2;

std::vector<float> randn(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

KvLayout layout(int pages, int page_size) {
  KvLayout l;
  l.num_layers = 1;
  l.num_pages = pages;
  l.page_size = page_size;
  l.k_dim = kWidth;
  l.v_dim = 0;
  l.dtype = DType::kF32;
  return l;
}

TEST(DcpAttention, ShardsMergedEqualWholeAttention) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE("dcp " + std::to_string(n));
    std::mt19937 rng(uint32_t(7 + n));
    auto be = make_cpu_backend();
    DcpAttention* ops = dcp_attention(*be);
    ASSERT_NE(ops, nullptr);
    const int page = kPoolPage * n, pages = 16;
    auto whole = be->alloc_kv(layout(pages, page));
    std::vector<std::unique_ptr<KvStorage>> shards;
    for (int r = 0; r < n; ++r) shards.push_back(be->alloc_kv(layout(pages, kPoolPage)));
    // Two sequences on interleaved, out-of-order pages.
    const std::vector<std::vector<int32_t>> tables = {{9, 2, 14, 5, 0}, {3, 11, 7, 1, 12}};
    std::vector<int32_t> lens = {0, 0};
    const MlaArgs args{
        .scale = 0.3f, .num_heads = kHeads, .kv_lora_rank = kRank, .rope_dim = kRope};
    // Steps: a prefill chunk each, decodes, a chunk beside a decode.
    for (const std::vector<int32_t>& step :
         std::vector<std::vector<int32_t>>{{7, 5}, {1, 1}, {3, 1}, {1, 6}, {1, 1}}) {
      std::vector<int32_t> q_indptr{0}, kv_lens, page_indptr{0}, page_indices, positions, slots;
      for (int s = 0; s < 2; ++s) {
        for (int i = 0; i < step[size_t(s)]; ++i) {
          const int32_t pos = lens[size_t(s)] + i;
          positions.push_back(pos);
          slots.push_back(tables[size_t(s)][size_t(pos / page)] * page + pos % page);
        }
        lens[size_t(s)] += step[size_t(s)];
        q_indptr.push_back(int32_t(positions.size()));
        kv_lens.push_back(lens[size_t(s)]);
        const int used = (lens[size_t(s)] + page - 1) / page;
        page_indices.insert(page_indices.end(), tables[size_t(s)].begin(),
                            tables[size_t(s)].begin() + used);
        page_indptr.push_back(int32_t(page_indices.size()));
      }
      const int t = int(positions.size());
      const AttentionMetadata meta{.num_seqs = 2,
                                   .num_tokens = t,
                                   .page_size = page,
                                   .q_indptr = q_indptr.data(),
                                   .kv_lens = kv_lens.data(),
                                   .page_indptr = page_indptr.data(),
                                   .page_indices = page_indices.data(),
                                   .positions = positions.data(),
                                   .slot_mapping = slots.data()};
      auto rows = randn(rng, size_t(t * kWidth));
      auto q = randn(rng, size_t(t * kHeads * kWidth));
      const Tensor rows_t = Tensor::make(rows.data(), DType::kF32, {t, kWidth});
      const Tensor q_t = Tensor::make(q.data(), DType::kF32, {t, kHeads, kWidth});
      be->kv_write(*whole, 0, rows_t, Tensor{}, meta);
      std::vector<float> expected(size_t(t * kHeads * kRank));
      be->mla_attention(q_t, *whole, 0, meta, args,
                        Tensor::make(expected.data(), DType::kF32, {t, kHeads, kRank}));

      std::vector<float> parts(size_t(n * t * kHeads * (kRank + 1)));
      int owned_total = 0;
      for (int r = 0; r < n; ++r) {
        DcpLocalBatch local;
        local.build(meta, DcpShard{.rank = r, .size = n}, kPoolPage);
        owned_total += int(local.owned_rows.size());
        for (int s = 0; s < 2; ++s)  // positions r, r + n, … below the length
          EXPECT_EQ(local.kv_lens[size_t(s)], (lens[size_t(s)] - r + n - 1) / n) << "rank " << r;
        if (!local.owned_rows.empty()) {
          const int owned = int(local.owned_rows.size());
          auto mine = be->alloc(DType::kF32, {owned, kWidth});
          be->gather_rows(rows_t, local.owned_rows.data(), owned, *mine);
          be->kv_write(*shards[size_t(r)], 0, *mine, Tensor{}, local.write);
        }
        ops->mla_attention_partial(q_t, *shards[size_t(r)], 0, local.attn, args,
                                   DcpShard{.rank = r, .size = n},
                                   Tensor::make(parts.data() + size_t(r * t * kHeads * (kRank + 1)),
                                                DType::kF32, {t, kHeads, kRank + 1}));
      }
      EXPECT_EQ(owned_total, t);  // every new token has exactly one owner
      std::vector<float> merged(expected.size());
      ops->merge_attention_partials(
          Tensor::make(parts.data(), DType::kF32, {n, t, kHeads, kRank + 1}),
          Tensor::make(merged.data(), DType::kF32, {t, kHeads, kRank}));
      double worst = 0;
      for (size_t i = 0; i < merged.size(); ++i)
        worst = std::max(worst, double(std::fabs(merged[i] - expected[i])));
      EXPECT_LT(worst, 2e-6) << "step of " << t << " tokens";
    }
  }
}

// The merge of one partial is that partial; an empty partial (-inf) weighs nothing.
TEST(DcpAttention, MergeWeighsByLogSumExp) {
  auto be = make_cpu_backend();
  DcpAttention* ops = dcp_attention(*be);
  ASSERT_NE(ops, nullptr);
  // One token, one head, D = 2: partial a = (1, 0) with lse log 3, b = (0, 1) with lse log 1,
  // c empty: (3·a + 1·b) / 4.
  std::vector<float> parts = {1, 0, std::log(3.0f), 0, 1, 0, 5, 5, -INFINITY};
  std::vector<float> out(2);
  ops->merge_attention_partials(Tensor::make(parts.data(), DType::kF32, {3, 1, 1, 3}),
                                Tensor::make(out.data(), DType::kF32, {1, 1, 2}));
  EXPECT_NEAR(out[0], 0.75f, 1e-7);
  EXPECT_NEAR(out[1], 0.25f, 1e-7);
}

}  // namespace
}  // namespace strata
