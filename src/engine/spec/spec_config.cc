#include "engine/spec/spec_config.h"

#include <algorithm>

#include "arch/decoder.h"
#include "arch/eagle3.h"
#include "backend/top_k.h"
#include "engine/spec/draft_tree.h"
#include "engine/spec/eagle3_drafter.h"
#include "engine/spec/ngram_drafter.h"

namespace strata {

namespace {
constexpr int kDefaultNumSteps = 3;  // SGLang's usual EAGLE chain: 3 steps, 4 draft tokens
constexpr int kMaxNumSteps = 64;

// A draft tree's flags (topk > 1), as SGLang's EAGLE worker builds trees: step 0 gives topk
// candidates, each later step topk² (topk children of each of the topk frontier nodes), and the
// tree keeps the num_draft_tokens - 1 best of them, so SGLang needs num_draft_tokens - 1 <=
// topk + (num_steps - 1) · topk² (its top-k selection over the candidates). strata adds two
// bounds of its own: a tree of at most 64 nodes (kMaxDraftTreeNodes: one 64-bit ancestor word per
// node in the verify's tree mask), and at most 64 nodes forwarded by the drafter per draft step
// ((num_steps - 1) · topk: its own tree mask over them, engine/spec/eagle3_drafter.h). Defaults:
// 3 steps; num_draft_tokens 1 + num_steps · topk (at most 64).
Status resolve_tree(SpeculativeConfig* c) {
  if (c->algorithm != SpeculativeAlgorithm::kEagle3)
    return invalid_argument(
        "--speculative-eagle-topk {}: draft trees are EAGLE3's; {} drafts chains (topk 1)",
        c->eagle_topk, enum_name_in(kSpeculativeAlgorithmNames, c->algorithm));
  if (c->num_steps == 0) c->num_steps = kDefaultNumSteps;
  const int64_t k = c->eagle_topk, steps = c->num_steps;
  if (c->num_draft_tokens == 0)
    c->num_draft_tokens = int(std::min<int64_t>(kMaxDraftTreeNodes, 1 + steps * k));
  const int64_t candidates = k + (steps - 1) * k * k;
  if (c->num_draft_tokens - 1 > candidates)
    return invalid_argument(
        "--speculative-num-draft-tokens {}: a tree of --speculative-num-steps {} and "
        "--speculative-eagle-topk {} has {} candidate drafts (topk + (num_steps - 1) * topk^2), "
        "so at most {} draft tokens (the root included)",
        c->num_draft_tokens, steps, k, candidates, candidates + 1);
  if (c->num_draft_tokens > kMaxDraftTreeNodes)
    return invalid_argument(
        "--speculative-num-draft-tokens {}: a draft tree has at most {} nodes (the root "
        "included)",
        c->num_draft_tokens, kMaxDraftTreeNodes);
  if (k > kMaxTopK)
    return invalid_argument(
        "--speculative-eagle-topk {}: at most {} candidates a node (the drafter's top-k op)", k,
        kMaxTopK);
  if ((steps - 1) * k > kMaxDraftTreeNodes)
    return invalid_argument(
        "--speculative-num-steps {} with --speculative-eagle-topk {}: the drafter forwards "
        "(num_steps - 1) * topk = {} tree nodes per draft step, at most {}",
        steps, k, (steps - 1) * k, kMaxDraftTreeNodes);
  return Status::ok_status();
}

}  // namespace

Status resolve_speculative_config(SpeculativeConfig* c) {
  if (!c->enabled()) {
    if (c->num_steps != 0 || c->num_draft_tokens != 0 || !c->draft_model_path.empty() ||
        c->eagle_topk != 1 || c->batch_size_threshold != 0)
      return invalid_argument(
          "--speculative-num-steps/--speculative-num-draft-tokens/--speculative-eagle-topk/"
          "--speculative-draft-model-path/--speculative-batch-size-threshold need "
          "--speculative-algorithm");
    return Status::ok_status();
  }
  if (c->eagle_topk < 1)
    return invalid_argument("--speculative-eagle-topk must be >= 1, got {}", c->eagle_topk);
  if (c->num_steps < 0 || c->num_steps > kMaxNumSteps)
    return invalid_argument("--speculative-num-steps must be in [1, {}], got {}", kMaxNumSteps,
                            c->num_steps);
  if (c->num_draft_tokens < 0 || c->num_draft_tokens == 1 || c->num_draft_tokens > kMaxNumSteps + 1)
    return invalid_argument("--speculative-num-draft-tokens must be in [2, {}], got {}",
                            kMaxNumSteps + 1, c->num_draft_tokens);
  if (c->eagle_topk > 1) {
    STRATA_RETURN_IF_ERROR(resolve_tree(c));
  } else {
    if (c->num_steps == 0)
      c->num_steps = c->num_draft_tokens > 0 ? c->num_draft_tokens - 1 : kDefaultNumSteps;
    if (c->num_draft_tokens == 0) c->num_draft_tokens = c->num_steps + 1;
    if (c->num_draft_tokens != c->num_steps + 1)
      return invalid_argument(
          "--speculative-num-draft-tokens {} with --speculative-num-steps {} and topk 1: a chain "
          "verifies num-steps + 1 = {} tokens",
          c->num_draft_tokens, c->num_steps, c->num_steps + 1);
  }
  if (c->batch_size_threshold < 0)
    return invalid_argument("--speculative-batch-size-threshold must be >= 0 (0: no limit), got {}",
                            c->batch_size_threshold);
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
  return std::unique_ptr<Drafter>(new Eagle3Proposer(
      std::move(model), std::move(aux).value(), target.num_pages, target.page_size,
      target.cuda_graph_max_bs,
      DraftShape{
          .num_steps = c.num_steps, .topk = c.eagle_topk, .num_draft_tokens = c.num_draft_tokens}));
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
