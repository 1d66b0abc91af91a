#include "engine/spec/ngram_drafter.h"

#include <algorithm>

namespace strata {

std::vector<int32_t> NgramDrafter::draft_for(std::span<const int32_t> tokens, int32_t max_match,
                                             int32_t max_tokens) {
  const int64_t len = int64_t(tokens.size());
  if (max_tokens <= 0 || len < 2) return {};
  for (int64_t n = std::min<int64_t>(max_match, len - 1); n >= 1; --n) {
    const auto suffix = tokens.subspan(size_t(len - n));
    // An earlier occurrence ends at `end` (exclusive) < len; the most recent one wins (the
    // freshest context), scanning back from the end.
    for (int64_t end = len - 1; end >= n; --end) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + (end - n))) continue;
      const int64_t count = std::min<int64_t>(max_tokens, len - end);
      return std::vector<int32_t>(tokens.begin() + end, tokens.begin() + end + count);
    }
  }
  return {};
}

void NgramDrafter::propose(std::span<const DraftQuery> queries, std::vector<DraftTree>* drafts) {
  drafts->clear();
  std::vector<int32_t> tokens;
  for (const DraftQuery& q : queries) {
    const Request& r = *q.request;
    tokens = r.tokens(r.total_len());
    drafts->push_back(
        DraftTree::chain(r.token_at(r.kv_len()), draft_for(tokens, max_match_, q.max_tokens)));
  }
}

}  // namespace strata
