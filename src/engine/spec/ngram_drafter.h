// NgramDrafter: drafts by copying (SGLang's --speculative-algorithm NGRAM, prompt lookup
// decoding): the request's last n tokens (n from max_match down to 1) are looked up earlier in
// its own prompt + output, and what followed the most recent earlier occurrence is proposed.
// No model, no state: it helps where outputs repeat (code edits, quoting the prompt, loops) and
// costs one verify row per draft where they do not.
//
// Cost per request per step: O(tokens x max_match) comparisons in the worst case (a scan from
// the end, stopping at the first match of the longest n found).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/spec/drafter.h"

namespace strata {

class NgramDrafter : public Drafter {
 public:
  explicit NgramDrafter(int32_t max_match = 4) : max_match_(max_match) {}
  std::string_view name() const override { return "NGRAM"; }
  void observe(std::span<const CommittedTokens>, int64_t, DType, bool) override {}
  void propose(std::span<const DraftQuery> queries, std::vector<DraftTree>* drafts) override;
  void release(int64_t) override {}

  // The draft for a token sequence: up to max_tokens tokens that followed the most recent earlier
  // occurrence of its longest matching suffix (n <= max_match). Empty when nothing matches.
  static std::vector<int32_t> draft_for(std::span<const int32_t> tokens, int32_t max_match,
                                        int32_t max_tokens);

 private:
  int32_t max_match_;
};

}  // namespace strata
