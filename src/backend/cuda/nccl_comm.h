// The NCCL communicator: one tensor-parallel rank per GPU (design.md §4).
//
// Ranks of one process (strata serve --tp-size N on one node): rank 0 makes an id with
// nccl_new_id() and each rank's thread binds its GPU and calls make_nccl_comm with it
// (ncclCommInitRankConfig; dist/tp_driver.cc does this). Ranks of several processes or nodes,
// started by an existing launcher (mpirun, srun): launch_rank_from_env() (backend/comm.h) gives
// rank and size, nccl_id_for_launch() shares the id through a file rank 0 writes on a shared
// filesystem (or STRATA_NCCL_ID, the hex id, set by a job script), and NCCL's own network
// transports carry the data. No RPC of our own.
//
// Environment: every NCCL_* variable the operator sets is left to NCCL (NCCL_ALGO, NCCL_PROTO,
// NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...); NCCL_NVLS_ENABLE is set to 0 unless set already (NVLink
// multicast stays off, as the device machines require). STRATA_NCCL_TIMEOUT_S (default 600):
// how long a collective or init may wait for its peers before the group is aborted.
//
// Streams and failure: collectives run on the rank's backend stream (the caller passes it), in
// stream order with the model's kernels. all_reduce_sum only enqueues; all_gather, broadcast and
// barrier wait for completion by polling the stream, NCCL's async error and the group's abort
// flag, so a dead peer or an aborted group ends in ncclCommAbort and an error, never a hang.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/comm.h"

namespace strata {

struct NcclId {
  std::array<char, 128> bytes{};  // ncclUniqueId (NCCL_UNIQUE_ID_BYTES)
};
std::string nccl_id_to_hex(const NcclId& id);
StatusOr<NcclId> nccl_id_from_hex(const std::string& hex);

// Sets NCCL_NVLS_ENABLE=0 unless the environment has it (once per process; before any NCCL call).
void nccl_apply_env_defaults();

// A new id (ncclGetUniqueId). Call on rank 0 only.
StatusOr<NcclId> nccl_new_id();

// The id of a launcher-started job: STRATA_NCCL_ID when set; else rank 0 makes one and writes it
// to `id_file` (temp file + rename) and the other ranks wait for that file (up to timeout_s).
StatusOr<NcclId> nccl_id_for_launch(const LaunchRank& launch, const std::string& id_file,
                                    double timeout_s);

// CUDA devices this process sees (after CUDA_VISIBLE_DEVICES).
StatusOr<int> cuda_visible_device_count();
// " (CUDA_VISIBLE_DEVICES=...)" when that variable is set, else "": for error messages.
std::string nccl_visible_devices_note();
// Binds the calling thread to `device`.
Status cuda_bind_device(int device);

// The stream of a CUDA backend (make_cuda_backend), where its kernels and this rank's collectives
// run; CHECK-fails for another backend.
void* cuda_backend_stream(Backend& backend);

// Rank `rank` of `size` on the calling thread's current GPU, its collectives on `stream` (a
// cudaStream_t; null: the legacy default stream). Blocks until every rank joined, the timeout
// passes, or *give_up turns true (another rank of this process failed).
StatusOr<std::unique_ptr<Communicator>> make_nccl_comm(const NcclId& id, int rank, int size,
                                                       void* stream,
                                                       const std::atomic<bool>* give_up = nullptr);

}  // namespace strata
