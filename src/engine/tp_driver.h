// The tensor-parallel driver (design.md §4): rank 0 runs the engine (scheduler, KV bookkeeping,
// sampling) and each step broadcasts its BatchPlan to ranks 1..N-1, which run the same forward on
// their weight slices and their own KV pools; the model's collectives join the ranks inside the
// forward. The ranks here are threads of this process: CPU ranks over the in-process
// communicator (the test path), CUDA ranks one per GPU over NCCL.
//
// Messages (one broadcast each): kInitKv (the KV layout, pages and scales, once before the
// first step and whenever rank 0's pool changes), kStep (BatchPlan::serialize()), kShutdown.
// A rank that fails aborts the communicator group: every other rank's collectives return at
// once, rank 0's next forward stops the process with that rank's error (never a hang), and a
// failure while loading is returned by create_tp_model.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "arch/model.h"
#include "backend/comm.h"
#include "core/status.h"
#include "model/sharding.h"

namespace strata {

class WeightStore;

struct TpConfig {
  int tp_size = 1;
  std::string device = "cpu";  // cpu: in-process ranks; cuda: one rank per visible GPU (NCCL)
  ShardingOptions sharding;    // allow_uneven: tests only (model/sharding.h)
};

// Makes rank r's backend and communicator on rank r's own thread (CUDA: binds the thread to GPU
// r first; NCCL's init must run on all ranks at once). `group_failed` turns true when another
// rank failed: a factory that waits for its peers (NCCL init) gives up then.
struct TpRankResources {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
};
using TpRankFactory =
    std::function<StatusOr<TpRankResources>(int rank, const std::atomic<bool>& group_failed)>;

// The factory for `config` (in-process CPU group, or NCCL over this process's GPUs with a clear
// error when fewer GPUs are visible than tp_size).
StatusOr<TpRankFactory> make_tp_rank_factory(const TpConfig& config);

// Starts the group: every rank loads its slices on its own thread. Returns rank 0's model, whose
// forward() drives the others; `rank0_backend` receives rank 0's backend (the engine's backend).
// Destroying the model shuts the workers down. Errors name the failing rank.
StatusOr<std::unique_ptr<Model>> create_tp_model(const ModelSpec& spec, const WeightStore& weights,
                                                 const TpConfig& config, const TpRankFactory& factory,
                                                 std::unique_ptr<Backend>* rank0_backend);

}  // namespace strata
