// What the backend-level MLA parity tests share (mla_backend_parity_test.cc,
// mla_dcp_parity_test.cc, mla_model_parity_test.cc): the MLA dims they cover, the count of MLA
// calls the CUDA backend ran on its CPU twin, and sequences on scrambled pages grown step by step,
// each step's metadata.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "backend/attention_metadata.h"
#include "backend/backend.h"

namespace strata::testing {

struct MlaDims {
  int latent, rope, heads;
};
// The tiny fixtures' (32 + 8, 4 heads), house-mla's (128 + 32, 5 heads) and the real models'
// (512 + 64, 16 heads).
inline constexpr MlaDims kMlaDims[] = {{32, 8, 4}, {128, 32, 5}, {512, 64, 16}};

// The MLA KV layouts the tests cover: bf16 rows; fp8 e4m3 / e5m2 with non-unit per-layer
// scales; fp8 latents with a bf16, fp8 or f32 rope part; FlashMLA rows; and a model's own layout
// without its rope split (rope_dim 0), as tests and tools allocate it.
struct MlaFormat {
  const char* name;
  DType dtype;
  std::optional<DType> rope_dtype;
  bool flashmla;
  float scale;
  bool split_layout = true;  // false: rope_dim 0 (the model's own kv_layout())
};
inline const MlaFormat kMlaFormats[] = {
    {"bf16", DType::kBF16, std::nullopt, false, 1.0f},
    {"bf16, rope_dim 0", DType::kBF16, std::nullopt, false, 1.0f, false},
    {"e4m3 scale 0.37", DType::kFP8E4M3, std::nullopt, false, 0.37f},
    {"e5m2 scale 2.5", DType::kFP8E5M2, std::nullopt, false, 2.5f},
    {"e4m3 scale 0.5, rope_dim 0", DType::kFP8E4M3, std::nullopt, false, 0.5f, false},
    {"e4m3 + bf16 rope, scale 0.37", DType::kFP8E4M3, DType::kBF16, false, 0.37f},
    {"e5m2 + e4m3 rope, scale 1.7", DType::kFP8E5M2, DType::kFP8E4M3, false, 1.7f},
    {"e4m3 + f32 rope", DType::kFP8E4M3, DType::kF32, false, 1.0f},
    {"fp8_flashmla", DType::kFP8E4M3, std::nullopt, true, 1.0f},
};

// A two-layer layout of format `f` at dims `d` (layer 0 bf16, layer 1 the format's dtype:
// per-layer dtypes); the tests write and read layer 1, whose scale they set to f.scale.
inline KvLayout mla_test_layout(const MlaFormat& f, const MlaDims& d, int page, int64_t num_pages) {
  KvLayout lay;
  lay.num_layers = 2;
  lay.num_pages = num_pages;
  lay.page_size = page;
  lay.k_dim = d.latent + d.rope;
  lay.dtype = f.dtype;
  lay.layer_dtypes = {DType::kBF16, f.dtype};
  if (f.split_layout) {
    lay.rope_dim = d.rope;
    lay.rope_dtype = f.rope_dtype;
    if (f.flashmla) lay.format = KvFormat::kFlashMlaFp8;
  }
  return lay;
}

// Calls of mla_attention that ran on the CPU twin (Backend::cpu_fallback_counts); -1: the table
// has no mla_attention row.
inline int64_t mla_fallbacks(const Backend& b) {
  for (const auto& [op, n] : b.cpu_fallback_counts())
    if (op == "mla_attention") return n;
  return -1;
}

// Sequences whose pages (`page` tokens each, enough for each one's capacity) are scrambled over a
// pool of their pages + 2, grown by grow(): the metadata of each step's new tokens.
class GrowingSequences {
 public:
  GrowingSequences(std::mt19937& rng, int page, const std::vector<int>& capacity)
      : page_(page), len_(capacity.size(), 0) {
    int64_t total = 0;
    for (int c : capacity) total += (c + page - 1) / page;
    std::vector<int32_t> perm(size_t(total + 2));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    size_t next = 0;
    for (int c : capacity) {
      for (int i = 0; i < (c + page - 1) / page; ++i) pages_.push_back(perm[next++]);
      page_indptr_.push_back(int32_t(pages_.size()));
    }
    num_pages_ = int64_t(perm.size());
  }

  int64_t num_pages() const { return num_pages_; }  // the pool's (KvLayout::num_pages)

  // Appends fresh[s] tokens to sequence s: the step's metadata (valid until the next grow).
  const AttentionMetadata& grow(const std::vector<int>& fresh) {
    const int n = int(fresh.size());
    q_indptr_.assign(1, 0);
    kv_lens_.clear();
    positions_.clear();
    slots_.clear();
    for (int s = 0; s < n; ++s) {
      for (int j = len_[size_t(s)]; j < len_[size_t(s)] + fresh[size_t(s)]; ++j) {
        positions_.push_back(j);
        slots_.push_back(pages_[size_t(page_indptr_[size_t(s)] + j / page_)] * page_ + j % page_);
      }
      len_[size_t(s)] += fresh[size_t(s)];
      q_indptr_.push_back(int32_t(positions_.size()));
      kv_lens_.push_back(len_[size_t(s)]);
    }
    meta_ = AttentionMetadata{.num_seqs = n,
                              .num_tokens = int(positions_.size()),
                              .page_size = page_,
                              .q_indptr = q_indptr_.data(),
                              .kv_lens = kv_lens_.data(),
                              .page_indptr = page_indptr_.data(),
                              .page_indices = pages_.data(),
                              .positions = positions_.data(),
                              .slot_mapping = slots_.data()};
    return meta_;
  }
  const std::vector<int32_t>& slots() const { return slots_; }  // the last step's

 private:
  int page_;
  int64_t num_pages_ = 0;
  std::vector<int> len_;
  std::vector<int32_t> page_indptr_{0}, pages_;
  std::vector<int32_t> q_indptr_, kv_lens_, positions_, slots_;
  AttentionMetadata meta_{};
};

}  // namespace strata::testing
