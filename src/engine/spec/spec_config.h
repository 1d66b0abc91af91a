// Speculative decoding's configuration (SGLang's flags) and the one place that turns it into a
// Drafter: NGRAM (engine/spec/ngram_drafter.h) or EAGLE3, a chain or, with
// --speculative-eagle-topk > 1, a draft tree (engine/spec/eagle3_drafter.h).
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
  int eagle_topk = 1;  // --speculative-eagle-topk: 1 is a chain; > 1 a draft tree (EAGLE3)
  // --speculative-num-draft-tokens: tokens of one verify (the drafts plus the last token); for a
  // chain that is num_steps + 1, for a tree at most 1 + topk + (num_steps - 1) · topk² and 64
  // (spec_config.cc). 0: derived (a tree: 1 + num_steps · topk, at most 64).
  int num_draft_tokens = 0;
  int ngram_max_match = 4;  // NGRAM: the longest suffix it looks up
  // --speculative-batch-size-threshold (SGLang's flag): decode steps of more decoding requests
  // than this run plain, without drafts (at large batches the target's forward is no longer
  // bound by its weights' reads, so verifying k rows per request costs ~k times a decode while
  // the drafts save less). 0: speculation at every batch size. The drafter keeps observing the
  // plain steps (its KV stays current), so speculation resumes with full acceptance when the
  // batch shrinks (engine/spec/drafter.h).
  int batch_size_threshold = 0;
  // Fixed-shape verify (engine/spec/verify_shape.h, EAGLE3): pad rows on the device with CUDA
  // graphs (kGraphs, the default: every decode step on cuda, so that an eager step, beyond
  // --cuda-graph-max-bs or with --disable-cuda-graph, has the shapes a graph step would; none on
  // the CPU, where they would only cost), at every decode step (kAlways: tests of the padding on
  // the CPU), or never.
  enum class PadVerify { kGraphs, kAlways, kNever };
  PadVerify pad_verify = PadVerify::kGraphs;

  bool enabled() const { return algorithm != SpeculativeAlgorithm::kNone; }
};

// Checks the flags together and fills the derived ones (num_steps, num_draft_tokens). Errors
// name the flag.
Status resolve_speculative_config(SpeculativeConfig* config);

// What a model drafter (EAGLE3) needs of the engine: the target on its backend and the target
// KV pool's geometry (the drafter's KV has as many pages of as many tokens).
struct DrafterTarget {
  const Model* model = nullptr;
  std::string model_dir{};  // the target's checkpoint (embeddings a drafter may read)
  int64_t num_pages = 0;
  int page_size = 0;
  int cuda_graph_max_bs = 0;  // draft steps of at most this many requests replay CUDA graphs
};

// The drafter of a resolved, enabled config. NGRAM ignores `target`. Errors (EAGLE3): no
// drafter directory, an invalid drafter, a drafter of another vocabulary or hidden size.
StatusOr<std::unique_ptr<Drafter>> create_drafter(const SpeculativeConfig& config,
                                                  const DrafterTarget& target);

}  // namespace strata
