// A BatchPlan as the model's ForwardBatch, and its forward without sampling. ModelRunner::run
// builds its step's batch here; eval's teacher forcing (eval/paged_runner.h) runs its plans
// through the two forwards below, which keep every logits row of the plan.
#pragma once

#include "arch/model.h"
#include "engine/batch_plan.h"

namespace strata {

// Views into `plan` (valid while it lives): tokens, attention metadata and its logits rows.
ForwardBatch forward_batch(const BatchPlan& plan);

// Every logits row of the plan in full, float32 [plan.logits_rows.size(), vocab] (Model::forward).
void forward_plan(Model& model, KvStorage& kv, const BatchPlan& plan, float* logits);
// The same rows handed to `consumer` on the model's device (Model::forward_logits): nothing
// full-vocabulary reaches the host.
void forward_plan_logits(Model& model, KvStorage& kv, const BatchPlan& plan,
                         const Model::LogitsConsumer& consumer);

}  // namespace strata
