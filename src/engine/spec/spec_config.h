// Speculative decoding's configuration (SGLang's flags) and the one place that turns it into a
// Drafter. EAGLE3 is refused until the drafter model lands (arch/eagle3.*, issue 26): wiring it is
// create_drafter's kEagle3 case.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/enum_names.h"
#include "core/status.h"
#include "engine/spec/drafter.h"

namespace strata {

enum class SpeculativeAlgorithm { kNone, kNgram, kEagle3 };
inline constexpr EnumName<SpeculativeAlgorithm> kSpeculativeAlgorithmNames[] = {
    {SpeculativeAlgorithm::kNone, "NONE"},
    {SpeculativeAlgorithm::kNgram, "NGRAM"},
    {SpeculativeAlgorithm::kEagle3, "EAGLE3"}};
constexpr const auto& enum_names(SpeculativeAlgorithm) { return kSpeculativeAlgorithmNames; }

struct SpeculativeConfig {
  SpeculativeAlgorithm algorithm = SpeculativeAlgorithm::kNone;  // --speculative-algorithm
  std::string draft_model_path{};  // --speculative-draft-model-path (EAGLE3)
  // --speculative-num-steps: drafts per request per step (a chain's depth); 0: the default, 3,
  // or num_draft_tokens - 1 when that is given.
  int num_steps = 0;
  int eagle_topk = 1;  // --speculative-eagle-topk: 1 is a chain; a tree (> 1) is not built yet
  // --speculative-num-draft-tokens: tokens of one verify (the drafts plus the last token); for a
  // chain that is num_steps + 1. 0: derived.
  int num_draft_tokens = 0;
  int ngram_max_match = 4;  // NGRAM: the longest suffix it looks up

  bool enabled() const { return algorithm != SpeculativeAlgorithm::kNone; }
};

// Checks the flags together and fills the derived ones (num_steps, num_draft_tokens). Errors
// name the flag.
Status resolve_speculative_config(SpeculativeConfig* config);

// The drafter of a resolved, enabled config.
StatusOr<std::unique_ptr<Drafter>> create_drafter(const SpeculativeConfig& config);

}  // namespace strata
