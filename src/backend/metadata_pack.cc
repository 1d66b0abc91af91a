#include "backend/metadata_pack.h"

#include <cstring>

namespace strata {

PackedMetadata pack_attention_metadata(const AttentionMetadata& m) {
  const int n = m.num_seqs, t = m.num_tokens;
  const int num_pages = m.page_indptr[n];
  PackedMetadata p;
  p.num_seqs = n;
  p.num_tokens = t;
  p.page_size = m.page_size;
  p.tree = m.tree_mask != nullptr;
  std::vector<int32_t>& v = p.values;
  v.reserve(size_t(3 * n + 3 + 4 * t + num_pages));
  v.insert(v.end(), m.q_indptr, m.q_indptr + n + 1);
  v.insert(v.end(), m.kv_lens, m.kv_lens + n);
  v.insert(v.end(), m.page_indptr, m.page_indptr + n + 1);
  v.insert(v.end(), m.positions, m.positions + t);
  v.insert(v.end(), m.slot_mapping, m.slot_mapping + t);
  if (p.tree) {
    if (v.size() % 2 != 0) v.push_back(0);
    p.tree_at = v.size();
    v.resize(p.tree_at + 2 * size_t(t));
    std::memcpy(v.data() + p.tree_at, m.tree_mask, size_t(t) * 8);
  }
  p.pages_at = v.size();
  v.insert(v.end(), m.page_indices, m.page_indices + num_pages);
  return p;
}

bool packs_to(const AttentionMetadata& m, const PackedMetadata& p) {
  const int n = m.num_seqs, t = m.num_tokens;
  if (n != p.num_seqs || t != p.num_tokens || m.page_size != p.page_size ||
      (m.tree_mask != nullptr) != p.tree)
    return false;
  const int32_t* v = p.values.data();
  auto same = [&](size_t at, const void* src, size_t bytes) {
    return bytes == 0 || std::memcmp(v + at, src, bytes) == 0;
  };
  // The page table's length first: it sizes the last section.
  if (!same(p.page_indptr_at(), m.page_indptr, (size_t(n) + 1) * 4)) return false;
  const size_t num_pages = size_t(m.page_indptr[n]);
  if (p.values.size() != p.pages_at + num_pages) return false;
  return same(p.q_indptr_at(), m.q_indptr, (size_t(n) + 1) * 4) &&
         same(p.kv_lens_at(), m.kv_lens, size_t(n) * 4) &&
         same(p.positions_at(), m.positions, size_t(t) * 4) &&
         same(p.slot_mapping_at(), m.slot_mapping, size_t(t) * 4) &&
         (!p.tree || same(p.tree_at, m.tree_mask, size_t(t) * 8)) &&
         same(p.pages_at, m.page_indices, num_pages * 4);
}

}  // namespace strata
