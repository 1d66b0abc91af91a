#include "engine/batch_plan.h"

#include "core/check.h"

namespace strata {

BatchPlan BatchPlan::build(std::span<const ScheduledSeq> seqs, int32_t page_size) {
  CHECK_GE(page_size, 1);
  BatchPlan p;
  p.page_size = page_size;
  p.q_indptr.reserve(seqs.size() + 1);
  p.page_indptr.reserve(seqs.size() + 1);
  p.q_indptr.push_back(0);
  p.page_indptr.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const Request& r = *seqs[s].request;
    const int32_t start = r.kv_len();
    const int32_t end = start + seqs[s].num_new_tokens;
    CHECK_MSG(seqs[s].num_new_tokens > 0 && end <= r.total_len(),
              "request {}: {} new tokens from {} of {}", r.id(), seqs[s].num_new_tokens, start,
              r.total_len());
    const int32_t num_pages = (end + page_size - 1) / page_size;
    CHECK_MSG(static_cast<int32_t>(r.pages().size()) >= num_pages,
              "request {}: {} pages for {} tokens", r.id(), r.pages().size(), end);
    for (int32_t pos = start; pos < end; ++pos) {
      p.token_ids.push_back(r.token_at(pos));
      p.positions.push_back(pos);
      p.slot_mapping.push_back(r.pages()[pos / page_size] * page_size + pos % page_size);
    }
    p.q_indptr.push_back(static_cast<int32_t>(p.token_ids.size()));
    p.kv_lens.push_back(end);
    p.page_indices.insert(p.page_indices.end(), r.pages().begin(), r.pages().begin() + num_pages);
    p.page_indptr.push_back(static_cast<int32_t>(p.page_indices.size()));
    if (seqs[s].sample) {
      p.logits_rows.push_back(p.q_indptr.back() - 1);
      p.sampled_seqs.push_back(static_cast<int32_t>(s));
    }
  }
  return p;
}

AttentionMetadata BatchPlan::view() const {
  return AttentionMetadata{.num_seqs = num_seqs(),
                           .num_tokens = num_tokens(),
                           .page_size = page_size,
                           .q_indptr = q_indptr.data(),
                           .kv_lens = kv_lens.data(),
                           .page_indptr = page_indptr.data(),
                           .page_indices = page_indices.data(),
                           .positions = positions.data(),
                           .slot_mapping = slot_mapping.data()};
}

}  // namespace strata
