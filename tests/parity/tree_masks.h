// Random draft-tree masks for the attention parity tests (AttentionMetadata::tree_mask;
// speculative verify with EAGLE topk > 1).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace strata::parity {

// A tree over each sequence's new tokens where there are 2..64 of them (the others causal: word
// 0): node i's parent uniform in [0, i), its word its ancestors' and itself.
inline std::vector<uint64_t> random_tree_mask(const std::vector<int32_t>& q_indptr,
                                              std::mt19937& rng) {
  std::vector<uint64_t> mask(size_t(q_indptr.back()), 0);
  for (size_t s = 0; s + 1 < q_indptr.size(); ++s) {
    const int n = q_indptr[s + 1] - q_indptr[s];
    if (n < 2 || n > 64) continue;
    uint64_t* w = mask.data() + q_indptr[s];
    w[0] = 1;
    for (int i = 1; i < n; ++i)
      w[i] = w[std::uniform_int_distribution<int>(0, i - 1)(rng)] | (uint64_t(1) << i);
  }
  return mask;
}

}  // namespace strata::parity
