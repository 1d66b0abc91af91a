// The one place that picks a concrete backend and communicator for a rank of a group (design.md
// §2: nothing outside backend/ includes backend/cpu/* or backend/cuda/*). The distributed runtime
// (dist/tp_driver.h) makes every rank's resources through make_rank_factory and never names
// the CPU reference, CUDA or NCCL itself.
//
//   cpu:  every rank a thread of this process, over the in-process communicator
//         (backend/cpu/comm_local.h: the test path);
//   cuda: one rank per GPU over NCCL (backend/cuda/nccl_comm.h), either every rank a thread of
//         this process, or, when a launcher (mpirun, srun, `strata serve --nnodes`) started one
//         process per rank, this process's rank alone, with the NCCL id from a file or
//         $STRATA_NCCL_ID.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "backend/comm.h"
#include "core/status.h"
#include "core/tensor.h"

namespace strata {

// One rank's device resources.
struct RankResources {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  // Binds the calling thread to this rank's device (CUDA); rank 0's forward calls it, since the
  // engine thread is not the thread that made the resources. Empty on the CPU.
  std::function<void()> bind_thread{};
};

// Makes rank r's backend and communicator on rank r's own thread (CUDA: binds the thread to the
// rank's GPU first; NCCL's init must run on all ranks at once). `group_failed` turns true when
// another rank failed: a factory that waits for its peers (NCCL init) gives up then.
using RankFactory =
    std::function<StatusOr<RankResources>(int rank, const std::atomic<bool>& group_failed)>;

// What a group's ranks run on.
struct RankGroup {
  Device device = Device::kCpu;
  int size = 1;
  // Set when a launcher started one process per rank: this process makes launch->rank's
  // resources only, on GPU launch->local_rank (or the one visible GPU), and reads the NCCL id
  // from `nccl_id_file` (or STRATA_NCCL_ID); cuda only.
  std::optional<LaunchRank> launch{};
  std::string nccl_id_file{};
  // Rank 0 alone on this process's first device, its collectives skipped and counted
  // (backend/solo_comm.h: --tp-one-rank, a benchmark mode); `launch` must be unset.
  bool one_rank = false;
};

// The factory for `group`. Errors say what is missing: fewer GPUs visible than ranks, a build
// without NCCL for cuda ranks, an unknown device.
StatusOr<RankFactory> make_rank_factory(const RankGroup& group);

// The NCCL id that NCCL derives from NCCL_COMM_ID=`addr` (the same on every node: SGLang's
// --dist-init-addr, dist/node_launch.h), as hex for STRATA_NCCL_ID. Sets NCCL_COMM_ID in this
// process. FailedPrecondition in a build without NCCL.
StatusOr<std::string> nccl_id_hex_from_address(const std::string& addr);

}  // namespace strata
