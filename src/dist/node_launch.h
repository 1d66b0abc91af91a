// SGLang's multi-node flags (--nnodes, --node-rank, --dist-init-addr) on strata's multi-process
// launch (dist/tp_driver.h: one process per rank, the NCCL id in STRATA_NCCL_ID). Each node runs
// the same command with its --node-rank; that process becomes the node's launcher: it starts one
// process per local rank of its node (the same binary and arguments, with RANK, WORLD_SIZE and
// LOCAL_RANK set as torchrun does), supervises them and exits with their status. Node n holds ranks
// n*L .. n*L+L-1 (L = --tp-size / --nnodes, one per GPU; rank 0, which serves HTTP, is on node 0).
//
// Bootstrap: NCCL's own. --dist-init-addr HOST:PORT becomes NCCL_COMM_ID in every rank, so the
// NCCL id is the same on every node without exchanging it (NCCL derives it from the address) and
// rank 0 opens NCCL's bootstrap socket on that address; the launcher puts the id in STRATA_NCCL_ID.
// A process that an existing launcher (mpirun, srun) started as one of --tp-size ranks runs as that
// rank whatever --nnodes says.
//
// Thread-safety: the launcher runs on the main thread before anything else starts.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace strata {

struct NodeLaunchFlags {
  int nnodes = 1;
  int node_rank = 0;
  std::string dist_init_addr;  // HOST:PORT (IPv6: [ADDR]:PORT)
};

// One process of this node: its ranks and the environment it starts with.
struct RankProcess {
  int rank = 0;
  int local_rank = 0;
  std::vector<std::pair<std::string, std::string>> set_env;  // set in the child
  std::vector<std::string> unset_env;                        // removed in the child
};

// The launcher variables of launch_rank_from_env that a rank process must not inherit (they
// would say who the node launcher is, not who the rank is).
const std::vector<std::string>& launcher_rank_variables();

// What this node must start, from the flags (pure; `nccl_id_hex` goes to STRATA_NCCL_ID). An empty
// plan: nothing to start (--nnodes 1). Errors: values out of range, --tp-size not a multiple of
// --nnodes, a missing or malformed --dist-init-addr, ranks of several nodes on a cpu device.
StatusOr<std::vector<RankProcess>> plan_node_ranks(const NodeLaunchFlags& flags, int tp_size,
                                                   Device device, const std::string& nccl_id_hex);

// HOST:PORT or [ADDR]:PORT; the error names --dist-init-addr.
Status check_dist_init_addr(const std::string& addr);

// Starts `argv` (argv[0] the executable) once per process of `plan`, forwards SIGTERM and SIGINT
// to all of them, and when one exits non-zero stops the others (SIGTERM, then SIGKILL after
// grace_s). Returns when all have exited: the first non-zero exit status (128 + signal for a
// killed one), else 0. Blocks SIGTERM/SIGINT in the calling process.
int run_rank_processes(const std::vector<std::string>& argv, const std::vector<RankProcess>& plan,
                       double grace_s = 30);

}  // namespace strata
