// A step's AttentionMetadata as one int32 array, the way a device backend uploads it in one copy
// (the CUDA backend's device_meta): q_indptr, kv_lens, page_indptr, positions, slot_mapping, the
// draft-tree words if any (as int32 pairs, 8-byte aligned), then page_indices. Every offset but
// the page table's end depends on the sequence and token counts alone, so a graph recorded over
// the copy replays while sequences gain pages.
//
// Every attention op of a step asks for the metadata again (one to three per layer), so the
// question "is this the metadata already uploaded?" is on the host's path once per op: packs_to
// answers it in place, section by section, with no allocation or copy (at batch 128 and 4,096
// tokens of context the page table alone is 8,192 to 32,768 entries).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/attention_metadata.h"

namespace strata {

struct PackedMetadata {
  std::vector<int32_t> values;
  int num_seqs = 0, num_tokens = 0, page_size = 0;
  bool tree = false;
  size_t tree_at = 0;   // the draft-tree words (when tree)
  size_t pages_at = 0;  // page_indices
  // Offsets of the other sections in `values`.
  size_t q_indptr_at() const { return 0; }
  size_t kv_lens_at() const { return size_t(num_seqs) + 1; }
  size_t page_indptr_at() const { return 2 * size_t(num_seqs) + 1; }
  size_t positions_at() const { return 3 * size_t(num_seqs) + 2; }
  size_t slot_mapping_at() const { return 3 * size_t(num_seqs) + 2 + size_t(num_tokens); }
};

PackedMetadata pack_attention_metadata(const AttentionMetadata& m);

// Whether pack_attention_metadata(m) would equal p, compared in place.
bool packs_to(const AttentionMetadata& m, const PackedMetadata& p);

}  // namespace strata
