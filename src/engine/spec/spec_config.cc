#include "engine/spec/spec_config.h"

#include "engine/spec/ngram_drafter.h"

namespace strata {

namespace {
constexpr int kDefaultNumSteps = 3;  // SGLang's usual EAGLE chain: 3 steps, 4 draft tokens
constexpr int kMaxNumSteps = 64;
}  // namespace

Status resolve_speculative_config(SpeculativeConfig* c) {
  if (!c->enabled()) {
    if (c->num_steps != 0 || c->num_draft_tokens != 0 || !c->draft_model_path.empty() ||
        c->eagle_topk != 1)
      return invalid_argument(
          "--speculative-num-steps/--speculative-num-draft-tokens/--speculative-eagle-topk/"
          "--speculative-draft-model-path need --speculative-algorithm");
    return Status::ok_status();
  }
  if (c->eagle_topk < 1)
    return invalid_argument("--speculative-eagle-topk must be >= 1, got {}", c->eagle_topk);
  if (c->eagle_topk > 1)
    return unimplemented(
        "--speculative-eagle-topk {}: draft trees (topk > 1) are not built yet; use "
        "--speculative-eagle-topk 1 (a chain)",
        c->eagle_topk);
  if (c->num_steps < 0 || c->num_steps > kMaxNumSteps)
    return invalid_argument("--speculative-num-steps must be in [1, {}], got {}", kMaxNumSteps,
                            c->num_steps);
  if (c->num_draft_tokens < 0 || c->num_draft_tokens == 1 || c->num_draft_tokens > kMaxNumSteps + 1)
    return invalid_argument("--speculative-num-draft-tokens must be in [2, {}], got {}",
                            kMaxNumSteps + 1, c->num_draft_tokens);
  if (c->num_steps == 0)
    c->num_steps = c->num_draft_tokens > 0 ? c->num_draft_tokens - 1 : kDefaultNumSteps;
  if (c->num_draft_tokens == 0) c->num_draft_tokens = c->num_steps + 1;
  if (c->num_draft_tokens != c->num_steps + 1)
    return invalid_argument(
        "--speculative-num-draft-tokens {} with --speculative-num-steps {} and topk 1: a chain "
        "verifies num-steps + 1 = {} tokens",
        c->num_draft_tokens, c->num_steps, c->num_steps + 1);
  if (c->ngram_max_match < 1)
    return invalid_argument("the NGRAM match length must be >= 1, got {}", c->ngram_max_match);
  switch (c->algorithm) {
    case SpeculativeAlgorithm::kNgram:
      if (!c->draft_model_path.empty())
        return invalid_argument(
            "--speculative-draft-model-path: NGRAM drafts from the request's own tokens, it "
            "takes no model");
      break;
    case SpeculativeAlgorithm::kEagle3:
      if (c->draft_model_path.empty())
        return invalid_argument(
            "--speculative-algorithm EAGLE3 needs --speculative-draft-model-path");
      break;
    case SpeculativeAlgorithm::kNone:
      break;
  }
  return Status::ok_status();
}

StatusOr<std::unique_ptr<Drafter>> create_drafter(const SpeculativeConfig& c) {
  switch (c.algorithm) {
    case SpeculativeAlgorithm::kNgram:
      return std::unique_ptr<Drafter>(new NgramDrafter(c.ngram_max_match));
    case SpeculativeAlgorithm::kEagle3:
      // The wiring point for the EAGLE-3 drafter model (arch/eagle3.*, built on another branch):
      // load c.draft_model_path against the target and return its Drafter here.
      return unimplemented(
          "--speculative-algorithm EAGLE3: the EAGLE-3 drafter model is not in this build yet "
          "(issue 26); --speculative-algorithm NGRAM works");
    case SpeculativeAlgorithm::kNone:
      break;
  }
  return invalid_argument("speculative decoding is off: no drafter");
}

}  // namespace strata
