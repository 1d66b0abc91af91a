// ModelRunner: between the engine loop and the model. One step's run takes the batch plan (what
// the scheduler decided and ScheduleState applied) and the rows' sampling inputs, runs the
// forward on the device, and hands back the sampled ids, the logits rows asked for in full and,
// when the step captures, the hidden states of every token at the model's capture layers
// (Model::set_capture: copied into fixed device buffers inside the forward, downloaded once per
// step). The loop's step is then: decide -> apply -> run (this) -> post-process.
// Engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "arch/model.h"
#include "engine/batch_plan.h"
#include "engine/capture_block.h"

namespace strata {

struct StepInputs {
  std::span<const SampleRowParams> row_params;  // one per logits row
  std::span<const int32_t> keep_rows;           // logits rows downloaded in full
  std::span<const LogitEdit> edits;
  bool capture = false;  // download the step's captured hidden states
  bool graphs = false;   // replay/capture a CUDA graph for this step (decode steps)
};

class ModelRunner {
 public:
  ModelRunner(Model& model, KvStorage& kv) : model_(model), kv_(kv) {}

  // Sizes the capture buffer for steps of up to `max_tokens` tokens (Model::set_capture). A
  // longer step later grows it (a new buffer: graphs recorded with the old one are re-captured).
  Status set_capture(const CaptureSpec& spec, int64_t max_tokens);
  bool captures() const { return !model_.capture_spec().empty(); }
  int64_t capture_width() const { return model_.capture_width(); }

  // Runs one step. Results stay valid until the next run().
  void run(const BatchPlan& plan, const StepInputs& in);
  const std::vector<int32_t>& sampled() const { return sampled_; }
  // [keep_rows.size(), vocab] float32, as the model computed them (before the edits).
  const float* kept_logits() const { return kept_logits_.data(); }
  // [plan.num_tokens(), capture_width()] of capture_dtype() when the step captured, else null.
  const uint8_t* captured() const { return captured_valid_ ? captured_.data() : nullptr; }
  // Swaps the captured block with `buffer` (any size: the next capturing step sizes it, page-
  // locked by the backend when it grows), so the block goes to the capture writer without a
  // copy. Only after a capturing step.
  void swap_captured(CaptureBlock& buffer) {
    std::swap(captured_, buffer);
    captured_valid_ = false;
  }
  DType capture_dtype() const { return model_.capture_dtype(); }

 private:
  Model& model_;
  KvStorage& kv_;
  int64_t capture_tokens_ = 0;
  std::vector<int32_t> sampled_;
  std::vector<float> kept_logits_;
  CaptureBlock captured_;
  bool captured_valid_ = false;
};

}  // namespace strata
