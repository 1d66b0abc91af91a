#include "eval/paged_runner.h"

#include <algorithm>

#include "core/check.h"
#include "engine/plan_forward.h"
#include "engine/slice_plan.h"

namespace strata {

PagedRunner::PagedRunner(Model& model, const KvCacheConfig& kv, int page_size, int max_seqs,
                         int max_len)
    : model_(model), page_size_(page_size), max_seqs_(max_seqs) {
  CHECK(page_size >= 1 && max_seqs >= 1 && max_len >= 1);
  pages_per_seq_ = (max_len + page_size - 1) / page_size;
  KvLayout layout = apply_kv_layout(kv, model.spec(), model.kv_layout());
  layout.page_size = page_size;
  layout.num_pages = int64_t(pages_per_seq_) * max_seqs;
  kv_ = model.backend().alloc_kv(layout);
  apply_kv_scales(kv, *kv_);
  // Sequence s owns pages s, s + max_seqs, s + 2·max_seqs, ... (interleaved, never contiguous).
  pages_.resize(size_t(pages_per_seq_) * size_t(max_seqs));
  for (int s = 0; s < max_seqs; ++s)
    for (int p = 0; p < pages_per_seq_; ++p)
      pages_[size_t(s) * size_t(pages_per_seq_) + size_t(p)] = p * max_seqs + s;
  lens_.assign(size_t(max_seqs), 0);
}

void PagedRunner::reset() { std::fill(lens_.begin(), lens_.end(), 0); }

BatchPlan PagedRunner::plan_step(const std::vector<std::pair<int, std::vector<int32_t>>>& chunks,
                                 bool all_logits) {
  std::vector<SeqSlice> slices;
  slices.reserve(chunks.size());
  for (const auto& [seq, toks] : chunks) {
    CHECK(seq >= 0 && seq < max_seqs_ && !toks.empty());
    const int32_t start = lens_[size_t(seq)];
    const int32_t end = start + int32_t(toks.size());
    CHECK_MSG(end <= pages_per_seq_ * page_size_, "sequence {} grows to {} tokens, room for {}",
              seq, end, pages_per_seq_ * page_size_);
    const int32_t used = (end + page_size_ - 1) / page_size_;
    slices.push_back(
        SeqSlice{.tokens = toks,
                 .start = start,
                 .pages = std::span<const int32_t>(
                     pages_.data() + size_t(seq) * size_t(pages_per_seq_), size_t(used)),
                 .logits = all_logits ? SliceLogits::kAll : SliceLogits::kLast});
    lens_[size_t(seq)] = end;
  }
  return build_slice_plan(slices, page_size_);
}

std::vector<float> PagedRunner::step(
    const std::vector<std::pair<int, std::vector<int32_t>>>& chunks, bool all_logits) {
  const BatchPlan plan = plan_step(chunks, all_logits);
  std::vector<float> logits(plan.logits_rows.size() * size_t(vocab()));
  forward_plan(model_, *kv_, plan, logits.data());
  return logits;
}

void PagedRunner::step_on_device(const std::vector<std::pair<int, std::vector<int32_t>>>& chunks,
                                 const Model::LogitsConsumer& consumer) {
  forward_plan_logits(model_, *kv_, plan_step(chunks, true), consumer);
}

std::vector<float> PagedRunner::prefill_all(int seq, const std::vector<int32_t>& ids, int chunk) {
  lens_[size_t(seq)] = 0;
  std::vector<float> out;
  out.reserve(ids.size() * size_t(vocab()));
  for (size_t i = 0; i < ids.size(); i += size_t(chunk)) {
    std::vector<int32_t> part(ids.begin() + long(i),
                              ids.begin() + long(std::min(ids.size(), i + size_t(chunk))));
    std::vector<float> l = step({{seq, std::move(part)}}, true);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

std::vector<int32_t> PagedRunner::greedy(int seq, const std::vector<int32_t>& prompt,
                                         int new_tokens, int chunk) {
  lens_[size_t(seq)] = 0;
  std::vector<float> logits;
  for (size_t i = 0; i < prompt.size(); i += size_t(chunk)) {
    std::vector<int32_t> part(prompt.begin() + long(i),
                              prompt.begin() + long(std::min(prompt.size(), i + size_t(chunk))));
    logits = step({{seq, std::move(part)}}, false);
  }
  std::vector<int32_t> out;
  for (int i = 0; i < new_tokens; ++i) {
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    if (i + 1 < new_tokens) logits = step({{seq, {next}}}, false);
  }
  return out;
}

}  // namespace strata
