// The engine's distributed runtime for --tp-size > 1 (engine/parallel_runtime.h): the ranks of
// dist/tp_driver.h, started as the launcher's environment says (threads of this process, or
// rank 0 of processes mpirun / srun / `strata serve --nnodes` started), and the host KV tier
// under them (dist/tp_host_tier.h). Callers that may run more than one rank pass it:
//   Engine::create(config, &tensor_parallel_runtime());
#pragma once

#include "engine/parallel_runtime.h"

namespace strata {

// Stateless; lives for the whole process.
const ParallelRuntime& tensor_parallel_runtime();

}  // namespace strata
