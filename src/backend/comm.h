// Communicator: the collectives a tensor-parallel group needs (design.md §4). One object per
// rank; every rank of a group calls the same collectives in the same order.
//
// Implementations: cpu/comm_local.h (N ranks as N threads of one process sharing memory, the
// test path and the CPU --tp-size path) and cuda/nccl_comm.h (one rank per GPU over NCCL).
//
// Failure: when any rank of a group fails (abort()), every rank's pending and later collectives
// return at once instead of waiting forever; data collectives then leave their output as it is,
// and status() says why the group stopped. Control collectives (broadcast_bytes, barrier) return
// the error directly, so a rank's driver loop stops with it.
//
// Thread-safety: a Communicator is used by its rank's thread only; abort() may be called from any
// thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace strata {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: x = Σ over ranks of x (f32 or bf16, the same shape on every rank; a device tensor
  // of this rank's backend). Sums in rank order 0, 1, …, so every rank gets bit-identical values
  // where the implementation can promise it (comm_local does; NCCL picks its own order).
  virtual void all_reduce_sum(const Tensor& x) = 0;
  // out [size, ...in's shape] = every rank's `in`, rank r's at out[r]. Same dtype as in.
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;
  // out [size, chunk...] = chunk r of every rank's in [size, chunk...]: out[j] is rank j's
  // in[rank()] (each rank sends in[k] to rank k). Same dtype and shapes on every rank. Decode
  // context parallelism returns each rank's attention partials to the ranks that own their heads
  // (arch/dcp.h). Default: CHECK-fails (a communicator that does not implement it).
  virtual void all_to_all(const Tensor& in, const Tensor& out);
  // A new communicator over this rank's group of `group_size` consecutive ranks
  // (rank / group_size; rank() in it is rank % group_size), for collectives inside that group
  // only (the DCP group of --dcp-size). Collective: every rank calls it with the same size,
  // which divides size(). Aborting the parent does not abort the child: the caller registers it
  // where the parent is. Default: Unimplemented.
  virtual StatusOr<std::unique_ptr<Communicator>> split(int group_size);
  // Copies root's `bytes` to every rank: other ranks' vectors are resized to root's length.
  virtual Status broadcast_bytes(std::vector<uint8_t>& bytes, int root) = 0;
  // Returns when every rank has reached it (or with the group's error).
  virtual Status barrier() = 0;

  // Stops the whole group with `reason` (the first reason wins): every rank's collectives return
  // at once from now on. Callable from any thread.
  virtual void abort(const Status& reason) = 0;
  // OK until the group was aborted; then the first reason.
  virtual Status status() const = 0;
};

// Rank and size of this process in a job started by an existing launcher (mpirun, srun,
// torchrun-style env): OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, SLURM_PROCID/NTASKS,
// RANK/WORLD_SIZE, in that order. {0, 1} when none is set.
struct LaunchRank {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank on this node (GPU index): *_LOCAL_RANK / SLURM_LOCALID, else rank
  std::string source;  // which variables said so ("" when none)
};
StatusOr<LaunchRank> launch_rank_from_env();

}  // namespace strata
