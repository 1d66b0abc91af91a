#include "engine/plan_forward.h"

namespace strata {

ForwardBatch forward_batch(const BatchPlan& plan) {
  ForwardBatch fb;
  fb.token_ids = plan.token_ids.data();
  fb.attn = plan.view();
  fb.logit_rows = plan.logits_rows.data();
  fb.num_logit_rows = int(plan.logits_rows.size());
  return fb;
}

void forward_plan(Model& model, KvStorage& kv, const BatchPlan& plan, float* logits) {
  model.forward(forward_batch(plan), kv, logits);
}

void forward_plan_logits(Model& model, KvStorage& kv, const BatchPlan& plan,
                         const Model::LogitsConsumer& consumer) {
  model.forward_logits(forward_batch(plan), kv, consumer);
}

}  // namespace strata
