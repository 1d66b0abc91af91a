#include "engine/spec/spec_config.h"

#include "arch/decoder.h"
#include "arch/eagle3.h"
#include "engine/spec/eagle3_drafter.h"
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

namespace {

// The EAGLE-3 drafter in c.draft_model_path, checked against the target it drafts for.
StatusOr<std::unique_ptr<Drafter>> create_eagle3_drafter(const SpeculativeConfig& c,
                                                         const DrafterTarget& target) {
  const std::string& dir = c.draft_model_path;
  CHECK(target.model != nullptr);
  STRATA_RETURN_IF_ERROR(check_eagle3_dir(dir));
  const ModelSpec& t = target.model->spec();
  // The drafter borrows the target's embedding table unless it ships its own.
  const auto* decoder = dynamic_cast<const DecoderModel*>(target.model);
  const Tensor* embedding = decoder != nullptr ? decoder->input_embedding() : nullptr;
  STRATA_ASSIGN_OR_RETURN(Eagle3Spec spec, load_eagle3_spec(dir));
  const std::string what = fmt::format("--speculative-draft-model-path {}", dir);
  if (spec.layer.vocab_size != t.vocab_size)
    return invalid_argument(
        "{}: the drafter's vocab_size is {}, the target's ({}) is {}: a drafter of another model?",
        what, spec.layer.vocab_size, target.model_dir, t.vocab_size);
  if (spec.target_hidden_size != t.hidden_size)
    return invalid_argument(
        "{}: the drafter reads target states of width {} (target_hidden_size), the target's "
        "hidden_size is {}: a drafter of another model?",
        what, spec.target_hidden_size, t.hidden_size);
  if (embedding != nullptr && spec.layer.hidden_size != t.hidden_size) embedding = nullptr;
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<Eagle3Drafter> model,
      Eagle3Drafter::load(dir, target.model->backend(), embedding, target.model_dir));
  auto aux = model->aux_layers(t.num_layers);
  if (!aux.ok()) return invalid_argument("{}: {}", what, aux.status().to_string());
  return std::unique_ptr<Drafter>(new Eagle3ChainDrafter(std::move(model), std::move(aux).value(),
                                                         target.num_pages, target.page_size,
                                                         target.cuda_graph_max_bs));
}

}  // namespace

StatusOr<std::unique_ptr<Drafter>> create_drafter(const SpeculativeConfig& c,
                                                  const DrafterTarget& target) {
  switch (c.algorithm) {
    case SpeculativeAlgorithm::kNgram:
      return std::unique_ptr<Drafter>(new NgramDrafter(c.ngram_max_match));
    case SpeculativeAlgorithm::kEagle3:
      return create_eagle3_drafter(c, target);
    case SpeculativeAlgorithm::kNone:
      break;
  }
  return invalid_argument("speculative decoding is off: no drafter");
}

}  // namespace strata
