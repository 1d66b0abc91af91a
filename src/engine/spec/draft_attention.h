// DraftAttention: the attention metadata of one drafter forward (engine/spec/eagle3_drafter.h),
// built per sequence over a page table of the drafter's KV (the target's page ids, plus scratch
// pages for draft trees). Host-side, rebuilt for every drafter forward.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/attention_metadata.h"
#include "core/check.h"

namespace strata {

class DraftAttention {
 public:
  explicit DraftAttention(int page_size) : page_size_(page_size) { clear(); }

  void clear() {
    q_indptr_.assign(1, 0);
    page_indptr_.assign(1, 0);
    kv_lens_.clear();
    page_indices_.clear();
    positions_.clear();
    slots_.clear();
    tree_mask_.clear();
    has_tree_ = false;
  }

  // `count` new rows at positions [first, first + count), KV rows at the same indices, causal.
  // The pages must cover positions [0, first + count).
  void add(std::span<const int32_t> pages, int32_t first, int32_t count) {
    add_rows(pages, first, count);
    for (int32_t p = first; p < first + count; ++p) positions_.push_back(p);
    tree_mask_.resize(positions_.size(), 0);
  }

  // Draft-tree nodes after a prefix of `prefix` rows: node j takes KV row prefix + j, rope
  // position positions[j], and attends to the prefix and the nodes whose bits masks[j] sets
  // (AttentionMetadata::tree_mask). The pages must cover prefix + positions.size() rows.
  void add_tree(std::span<const int32_t> pages, int32_t prefix, std::span<const int32_t> positions,
                std::span<const uint64_t> masks) {
    CHECK_EQ(positions.size(), masks.size());
    add_rows(pages, prefix, int32_t(positions.size()));
    positions_.insert(positions_.end(), positions.begin(), positions.end());
    tree_mask_.resize(positions_.size() - masks.size(), 0);
    tree_mask_.insert(tree_mask_.end(), masks.begin(), masks.end());
    has_tree_ = true;
  }

  int num_tokens() const { return q_indptr_.back(); }

  AttentionMetadata metadata() const {
    return AttentionMetadata{.num_seqs = int(kv_lens_.size()),
                             .num_tokens = num_tokens(),
                             .page_size = page_size_,
                             .q_indptr = q_indptr_.data(),
                             .kv_lens = kv_lens_.data(),
                             .page_indptr = page_indptr_.data(),
                             .page_indices = page_indices_.data(),
                             .positions = positions_.data(),
                             .slot_mapping = slots_.data(),
                             .tree_mask = has_tree_ ? tree_mask_.data() : nullptr};
  }

 private:
  // KV rows [first, first + count) of a sequence whose KV then ends there.
  void add_rows(std::span<const int32_t> pages, int32_t first, int32_t count) {
    const int32_t len = first + count;
    const int32_t used = (len + page_size_ - 1) / page_size_;
    CHECK_LE(used, int32_t(pages.size()));
    q_indptr_.push_back(q_indptr_.back() + count);
    kv_lens_.push_back(len);
    page_indices_.insert(page_indices_.end(), pages.begin(), pages.begin() + used);
    page_indptr_.push_back(int32_t(page_indices_.size()));
    for (int32_t row = first; row < len; ++row)
      slots_.push_back(pages[size_t(row / page_size_)] * page_size_ + row % page_size_);
  }

  int page_size_;
  bool has_tree_ = false;
  std::vector<int32_t> q_indptr_, page_indptr_, kv_lens_, page_indices_, positions_, slots_;
  std::vector<uint64_t> tree_mask_;
};

}  // namespace strata
