// Draft-tree masking in the attention kernels (AttentionMetadata::tree_mask; speculative decoding
// with EAGLE topk > 1, engine/spec/draft_tree.h). A kernel keeps its causal limit (a tree node's
// ancestors are all earlier new tokens) and also hides, for a row with a non-zero word, the new
// tokens that are not its ancestors. Uniform cost: one 64-bit load per row, one shift per score.
#pragma once

#include <cstdint>

namespace strata::cuda {

// The tree word of new token `token` (its index in the batch), 0 (causal) when the batch has no
// trees or the row is padding (`valid` false).
__device__ __forceinline__ uint64_t tree_word(const uint64_t* tree_mask, int token, bool valid) {
  return tree_mask != nullptr && valid ? tree_mask[token] : uint64_t(0);
}

// Whether a row with tree word `word` must not see key `key`; `first` is the sequence's first new
// key (kv_len - new tokens). Keys past the row are hidden by the causal limit already (the clamp
// only keeps the shift defined).
__device__ __forceinline__ bool tree_hides(uint64_t word, int key, int first) {
  return word != 0 && key >= first && ((word >> min(key - first, 63)) & 1) == 0;
}

}  // namespace strata::cuda
