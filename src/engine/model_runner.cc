#include "engine/model_runner.h"

#include <algorithm>

#include "core/check.h"
#include "engine/plan_forward.h"

namespace strata {

Status ModelRunner::set_capture(const CaptureSpec& spec, int64_t max_tokens) {
  capture_tokens_ = spec.empty() ? 0 : max_tokens;
  return model_.set_capture(spec, max_tokens);
}

void ModelRunner::run(const BatchPlan& plan, const StepInputs& in) {
  ForwardBatch fb = forward_batch(plan);
  captured_valid_ = false;
  if (in.capture && captures()) {
    const int64_t t = plan.num_tokens();
    if (t > capture_tokens_) {  // a step beyond the planned bound: grow (never expected)
      capture_tokens_ = std::max<int64_t>(t, 2 * capture_tokens_);
      Status st = model_.set_capture(model_.capture_spec(), capture_tokens_);
      CHECK_MSG(st.ok(), "growing the capture buffer: {}", st.to_string());
    }
    captured_.resize(size_t(t * capture_width() * dtype_size(capture_dtype())),
                     host_pinning(model_.backend()));
    fb.captured = captured_.data();
    captured_valid_ = true;
  }
  const size_t n = plan.logits_rows.size();
  const int64_t vocab = model_.spec().vocab_size;
  sampled_.assign(n, 0);
  kept_logits_.resize(in.keep_rows.size() * size_t(vocab));
  if (in.graphs) model_.backend().set_graph_mode(true);
  model_.forward_sample(fb, kv_,
                        SampleArgs{.params = in.row_params.data(),
                                   .token_ids = sampled_.data(),
                                   .keep_rows = in.keep_rows.data(),
                                   .num_keep = int(in.keep_rows.size()),
                                   .kept_logits = kept_logits_.data(),
                                   .edits = in.edits.data(),
                                   .num_edits = int64_t(in.edits.size())});
  if (in.graphs) model_.backend().set_graph_mode(false);
}

}  // namespace strata
