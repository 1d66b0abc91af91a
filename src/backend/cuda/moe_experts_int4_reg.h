// The INT4 experts' register-GEMV paths of the MoE decode step (moe_experts_int4_reg.cu).
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/moe_experts.h"

namespace strata::cuda {

// T · k <= p.int4_reg_max_assignments: gate_up and down by ids, one expert matrix per assignment;
// act and y rows in assignment order (the combine's pos is null).
bool launch_moe_int4_reg(const MoeExpertsParams& p, bf16_bits* act, bf16_bits* y,
                         cudaStream_t stream);
// Above it (p.int4_reg_planned): the plan with 4- or 8-row tiles into `plan`, then gate_up and
// down planned; act and y rows in the plan's permuted order (the combine reads them through
// plan.pos).
bool launch_moe_int4_reg_planned(const MoeExpertsParams& p, const MoePlan& plan, bf16_bits* act,
                                 bf16_bits* y, cudaStream_t stream);

}  // namespace strata::cuda
