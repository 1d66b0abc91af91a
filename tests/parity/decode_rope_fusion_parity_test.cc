// Graph mode's merge of qkv_rope_kv_write into the decode attention launch
// (CudaTunables::decode_rope_fusion_max_seqs; attention_decode_rope.cuh): the merged launch must
// leave q, the attention's output and the whole KV cache with the bits of the two launches it
// replaces — the eager step, whose ops the suite checks against the CPU reference (CudaFusedParity.
// QkvRopeKvWrite, CudaParity.DecodeAttention) — and must really be one launch fewer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace strata::parity {
namespace {

struct RopeDecodeCase {
  const char* name;
  int heads, kv_heads, hd, page;
  std::vector<int> lens;  // each sequence's keys, its new token last
  DType kv;
  float k_scale, v_scale;
  bool interleaved;
  int rotary;
  float factor;
  int32_t position_offset;  // positions len - 1 + offset (large: rope's long range reduction)
  bool merges;              // the conditions of CudaBackend::merge_decode_rope hold
};

void run_case(const RopeDecodeCase& c) {
  auto backend = make_cuda_backend();
  auto& gpu = dynamic_cast<cuda::CudaBackend&>(*backend);
  const cuda::CudaTunables defaults = gpu.tunables();
  ASSERT_TRUE(defaults.fusion);
  std::mt19937 rng(7);
  const int n = int(c.lens.size()), hd = c.hd, kvd = c.kv_heads * hd;
  const int width = (c.heads + 2 * c.kv_heads) * hd;

  // Pages scrambled over the pool; every sequence decodes one token (its last key).
  std::vector<int32_t> q_indptr{0}, kv_lens, page_indptr{0}, pages, positions, slots, old_slots;
  int64_t total_pages = 0;
  for (int len : c.lens) total_pages += (len + c.page - 1) / c.page;
  std::vector<int32_t> perm(size_t(total_pages + 2));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
  for (int len : c.lens) {
    const size_t first = pages.size();
    for (int i = 0; i < (len + c.page - 1) / c.page; ++i) pages.push_back(perm[next++]);
    page_indptr.push_back(int32_t(pages.size()));
    kv_lens.push_back(len);
    q_indptr.push_back(q_indptr.back() + 1);
    for (int j = 0; j < len; ++j) {
      const int32_t slot = pages[first + size_t(j / c.page)] * c.page + j % c.page;
      (j + 1 < len ? old_slots : slots).push_back(slot);
    }
    positions.push_back(len - 1 + c.position_offset);
  }
  KvLayout lay;
  lay.num_layers = 1;
  lay.num_pages = int64_t(perm.size());
  lay.page_size = c.page;
  lay.k_dim = kvd;
  lay.v_dim = kvd;
  lay.dtype = c.kv;
  auto kv = gpu.alloc_kv(lay);
  kv->set_scales(0, c.k_scale, c.v_scale);
  const int32_t none[1] = {0};
  std::vector<int32_t> zeros(std::max(old_slots.size(), slots.size()) + 1, 0);
  auto write_meta = [&](std::vector<int32_t>& s) {
    return AttentionMetadata{.num_seqs = 0,
                             .num_tokens = int(s.size()),
                             .page_size = c.page,
                             .q_indptr = none,
                             .kv_lens = none,
                             .page_indptr = none,
                             .page_indices = none,
                             .positions = zeros.data(),
                             .slot_mapping = s.data()};
  };
  // The old keys: written once, never again (the step writes only the new tokens' rows).
  const int64_t t_old = int64_t(old_slots.size());
  if (t_old > 0) {
    auto k_old = gpu.alloc(DType::kBF16, {t_old, kvd}),
         v_old = gpu.alloc(DType::kBF16, {t_old, kvd});
    gpu.fill_random(*k_old, 11, c.k_scale);
    gpu.fill_random(*v_old, 12, c.v_scale);
    gpu.kv_write(*kv, 0, *k_old, *v_old, write_meta(old_slots));
  }
  const AttentionMetadata meta{.num_seqs = n,
                               .num_tokens = n,
                               .page_size = c.page,
                               .q_indptr = q_indptr.data(),
                               .kv_lens = kv_lens.data(),
                               .page_indptr = page_indptr.data(),
                               .page_indices = pages.data(),
                               .positions = positions.data(),
                               .slot_mapping = slots.data()};
  std::vector<float> inv_freq(size_t(c.rotary / 2));
  for (int i = 0; i < c.rotary / 2; ++i)
    inv_freq[size_t(i)] = float(1.0 / std::pow(500000.0, 2.0 * i / c.rotary));
  const RopeArgs rope{.inv_freq = inv_freq.data(),
                      .attention_factor = c.factor,
                      .rotary_dim = c.rotary,
                      .offset = 0,
                      .interleaved = c.interleaved};
  const AttentionArgs args{.scale = float(1.0 / std::sqrt(double(hd))),
                           .num_heads = c.heads,
                           .num_kv_heads = c.kv_heads,
                           .head_dim = hd,
                           .v_head_dim = hd};
  auto qkv = gpu.alloc(DType::kBF16, {n, width});
  auto poison_k = gpu.alloc(DType::kBF16, {n, kvd}), poison_v = gpu.alloc(DType::kBF16, {n, kvd});
  // One decode step as arch/llama.cc records it: the new rows first poisoned (so a merged launch
  // that failed to store them shows), then qkv_rope_kv_write and the attention. Out: the
  // attention's output, q, then the whole K and V caches, as floats.
  auto step = [&](uint64_t seed) {
    gpu.fill_random(*qkv, seed, 2.0f);
    gpu.fill_random(*poison_k, seed + 100, 3.0f);
    gpu.fill_random(*poison_v, seed + 200, 3.0f);
    auto q = gpu.alloc(DType::kBF16, {n, c.heads, hd});
    auto out = gpu.alloc(DType::kBF16, {n, c.heads, hd});
    gpu.kv_write(*kv, 0, *poison_k, *poison_v, write_meta(slots));
    gpu.qkv_rope_kv_write(*qkv, c.heads, c.kv_heads, hd, rope, *kv, 0, meta, *q);
    gpu.paged_attention(*q, *kv, 0, meta, args, *out);
    const int64_t qn = int64_t(n) * c.heads * hd, cn = kv->k(0).numel();
    std::vector<float> got(size_t(2 * qn + 2 * cn));
    gpu.download_f32(*out, got.data());  // ends the step (graph mode: capture or replay)
    gpu.download_f32(*q, got.data() + qn);
    gpu.download_f32(kv->k(0), got.data() + 2 * qn);
    gpu.download_f32(kv->v(0), got.data() + 2 * qn + cn);
    return got;
  };
  std::vector<std::vector<float>> eager;
  for (uint64_t seed : {1, 2}) eager.push_back(step(seed));
  for (float x : eager[0]) ASSERT_TRUE(std::isfinite(x)) << c.name << ": eager step not finite";

  // Modes: 0 unmerged; 1 merged, the old keys copied after the PDL wait (decode_early_kv off);
  // 2 merged, copied before it.
  int64_t launches[3] = {0, 0, 0};
  for (int mode : {2, 1, 0}) {
    gpu.tune([&](cuda::CudaTunables& t) {
      t.decode_rope_fusion_max_seqs = mode > 0 ? 1 << 20 : 0;
      t.decode_early_kv = mode != 1;
    });
    gpu.set_graph_mode(true);
    const cuda::GraphStats before = gpu.graph_stats();
    for (uint64_t seed : {1, 2, 1}) {
      const auto got = step(seed);
      EXPECT_EQ(0, std::memcmp(got.data(), eager[seed - 1].data(), got.size() * 4))
          << c.name << " mode " << mode << " seed " << seed;
    }
    const cuda::GraphStats& after = gpu.graph_stats();
    EXPECT_EQ(after.replays - before.replays, 2) << c.name;
    launches[mode] = after.launches - before.launches;
    gpu.set_graph_mode(false);
  }
  gpu.set_tunables(defaults);
  for (int mode : {1, 2})
    EXPECT_EQ(launches[0] - launches[mode], c.merges ? 3 : 0) << c.name << ": launches merged";
  std::printf(
      "decode rope fusion %-22s %s: eager bits, %lld / %lld launches in 3 steps (copies "
      "after / before the wait) against %lld\n",
      c.name, dtype_name(c.kv), (long long)launches[1], (long long)launches[2],
      (long long)launches[0]);
}

TEST(CudaParity, DecodeRopeFusion) {
  const RopeDecodeCase cases[] = {
      // Llama-3.1-8B's attention at batch 1 (one 64-key chunk a split) and longer contexts
      // (the new token in a later chunk of its split: the loop's table skips its slot).
      {"llama b1 512", 32, 8, 128, 16, {512}, DType::kBF16, 1, 1, false, 128, 1, 0, true},
      {"llama b1 5000", 32, 8, 128, 16, {5000}, DType::kBF16, 1, 1, false, 128, 1, 0, true},
      {"llama ragged",
       32,
       8,
       128,
       16,
       {1, 64, 65, 300, 1000, 4097},
       DType::kBF16,
       1,
       1,
       false,
       128,
       1,
       0,
       true},
      {"far positions",
       32,
       8,
       128,
       16,
       {129, 2},
       DType::kBF16,
       1,
       1,
       false,
       128,
       1.0f,
       120000,
       true},
      // fp8 caches with scales; interleaved partial rotary; YaRN factor; odd pages, groups 1-5.
      {"e4m3 interleaved",
       8,
       2,
       64,
       5,
       {7, 130, 2000},
       DType::kFP8E4M3,
       0.37f,
       2.5f,
       true,
       48,
       1.3f,
       17,
       true},
      {"e5m2 head 32", 4, 4, 32, 3, {33, 2, 129}, DType::kFP8E5M2, 1, 1, false, 32, 1, 0, true},
      {"group 5 interleaved", 5, 1, 64, 7, {500, 1}, DType::kBF16, 1, 1, true, 64, 1, 3, true},
      {"e4m3 group 8", 16, 2, 128, 16, {3000, 70}, DType::kFP8E4M3, 1, 1, false, 128, 1, 0, true},
      // Not merged: neox over part of the head; head_dim 16.
      {"neox partial", 8, 2, 64, 16, {100, 40}, DType::kBF16, 1, 1, false, 32, 1, 0, false},
      {"head 16", 4, 4, 16, 4, {33, 129}, DType::kBF16, 1, 1, false, 16, 1, 0, false},
  };
  for (const RopeDecodeCase& c : cases) run_case(c);
}

}  // namespace
}  // namespace strata::parity
