// Draft-tree masking in the attention kernels (AttentionMetadata::tree_mask; speculative decoding
// with EAGLE topk > 1, engine/spec/draft_tree.h). A kernel keeps its causal limit (a tree node's
// ancestors are all earlier new tokens) and also hides, for a row with a non-zero word, the new
// tokens that are not its ancestors. Uniform cost: one 64-bit load per row, one shift per score.
// Deterministic mode instead gives each tree row its own block with its keys in path order
// (path tiles, attention.h kTreePathTile; path_key below), so no key is masked out of place.
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

// Path tiles (attention.h kTreePathTile, deterministic mode): the KV row of logical key j of a
// tree row with word `word` (0: not a path tile, or a causal row: j itself). Keys before `first`
// (the cached prefix) keep their place; logical key first + i is the i-th set bit of the word
// (ancestors have smaller slots than their descendants, so slot order is path order). j must be
// below first + popcount(word) when word != 0. At most 63 steps, for the row's last <= 64 keys.
__device__ __forceinline__ int path_key(uint64_t word, int j, int first) {
  if (word == 0 || j < first) return j;
  for (int i = first; i < j; ++i) word &= word - 1;  // drop the lowest j - first set bits
  return first + __ffsll(static_cast<long long>(word)) - 1;
}

// A path tile's row position (logical: first + depth, depth = ancestors, popcount - 1) or, for a
// causal row (word 0), its position in the sequence.
__device__ __forceinline__ int path_position(uint64_t word, int first, int token) {
  return word != 0 ? first + __popcll(static_cast<unsigned long long>(word)) - 1 : first + token;
}

}  // namespace strata::cuda
