#include "backend/factory/rank_factory.h"

#include <cstdlib>
#include <mutex>
#include <vector>

#include "backend/cpu/comm_local.h"
#include "backend/solo_comm.h"
#include "core/check.h"
#ifdef STRATA_HAVE_NCCL
#include "backend/cuda/nccl_comm.h"
#endif

namespace strata {

StatusOr<RankFactory> make_rank_factory(const RankGroup& group) {
  if (group.size < 1) return invalid_argument("--tp-size must be >= 1, got {}", group.size);
  if (group.one_rank) {
    if (group.launch)
      return invalid_argument("--tp-one-rank runs one process alone: not under a launcher's ranks");
    const Device device = group.device;
    const int size = group.size;
    return RankFactory([device, size](int r, const std::atomic<bool>&) -> StatusOr<RankResources> {
      CHECK_EQ(r, 0);
      RankResources res;
      if (device == Device::kCuda) {
#ifdef STRATA_HAVE_NCCL
        STRATA_RETURN_IF_ERROR(cuda_bind_device(0));
        res.bind_thread = [] { CHECK_MSG(cuda_bind_device(0).ok(), "cannot bind GPU 0"); };
        res.backend = make_cuda_backend();
#else
        return failed_precondition(
            "--tp-one-rank on cuda: this build has no NCCL (configure with -DSTRATA_CUDA=ON where "
            "nccl.h and libnccl are found, or set NCCL_ROOT)");
#endif
      } else if (device == Device::kCpu) {
        res.backend = make_cpu_backend();
      } else {
        return invalid_argument("--device {}: no tensor-parallel ranks there", device_name(device));
      }
      res.comm = make_solo_comm(size, *res.backend);
      return res;
    });
  }
  if (group.launch) {
#ifdef STRATA_HAVE_NCCL
    const LaunchRank launch = *group.launch;
    const std::string id_file = group.nccl_id_file;
    return RankFactory([launch, id_file](
                           int r, const std::atomic<bool>& failed) -> StatusOr<RankResources> {
      CHECK_EQ(r, launch.rank);
      // One GPU visible per process (a launcher that sets CUDA_VISIBLE_DEVICES per rank): that
      // one; else the rank's GPU on its node.
      STRATA_ASSIGN_OR_RETURN(int gpus, cuda_visible_device_count());
      if (gpus < 1)
        return failed_precondition("rank {}: no CUDA device visible{}", r,
                                   nccl_visible_devices_note());
      const int device = gpus == 1 ? 0 : launch.local_rank;
      if (device >= gpus)
        return failed_precondition("rank {}: local rank {} but {} GPUs visible{}", r,
                                   launch.local_rank, gpus, nccl_visible_devices_note());
      STRATA_RETURN_IF_ERROR(cuda_bind_device(device));
      RankResources res;
      res.bind_thread = [device] {
        CHECK_MSG(cuda_bind_device(device).ok(), "cannot bind GPU {}", device);
      };
      res.backend = make_cuda_backend();
      STRATA_ASSIGN_OR_RETURN(NcclId id, nccl_id_for_launch(launch, id_file, 600));
      STRATA_ASSIGN_OR_RETURN(
          res.comm, make_nccl_comm(id, r, launch.size, cuda_backend_stream(*res.backend), &failed));
      return res;
    });
#else
    return failed_precondition("launcher-started ranks need a build with NCCL (-DSTRATA_CUDA=ON)");
#endif
  }
  if (group.device == Device::kCpu) {
    auto comms = std::make_shared<std::vector<std::unique_ptr<Communicator>>>(
        make_local_comm_group(group.size));
    auto taken = std::make_shared<std::mutex>();
    return RankFactory([comms, taken](int r, const std::atomic<bool>&) -> StatusOr<RankResources> {
      std::lock_guard<std::mutex> lk(*taken);
      CHECK_MSG((*comms)[size_t(r)] != nullptr, "rank {} taken twice", r);
      return RankResources{.backend = make_cpu_backend(), .comm = std::move((*comms)[size_t(r)])};
    });
  }
  if (group.device == Device::kCuda) {
#ifdef STRATA_HAVE_NCCL
    const int size = group.size;
    STRATA_ASSIGN_OR_RETURN(int gpus, cuda_visible_device_count());
    if (gpus < size)
      return failed_precondition("--tp-size {} runs one rank per GPU, but {} GPU{} visible{}", size,
                                 gpus, gpus == 1 ? " is" : "s are", nccl_visible_devices_note());
    STRATA_ASSIGN_OR_RETURN(NcclId id, nccl_new_id());
    return RankFactory(
        [id, size](int r, const std::atomic<bool>& failed) -> StatusOr<RankResources> {
          STRATA_RETURN_IF_ERROR(cuda_bind_device(r));
          RankResources res;
          res.bind_thread = [r] { CHECK_MSG(cuda_bind_device(r).ok(), "cannot bind GPU {}", r); };
          res.backend = make_cuda_backend();
          STRATA_ASSIGN_OR_RETURN(
              res.comm, make_nccl_comm(id, r, size, cuda_backend_stream(*res.backend), &failed));
          return res;
        });
#else
    return failed_precondition(
        "--device cuda --tp-size {}: this build has no NCCL (configure with -DSTRATA_CUDA=ON "
        "where nccl.h and libnccl are found, or set NCCL_ROOT)",
        group.size);
#endif
  }
  return invalid_argument("--device {}: no tensor-parallel ranks there", device_name(group.device));
}

StatusOr<std::string> nccl_id_hex_from_address(const std::string& addr) {
#ifdef STRATA_HAVE_NCCL
  ::setenv("NCCL_COMM_ID", addr.c_str(), 1);
  STRATA_ASSIGN_OR_RETURN(NcclId id, nccl_new_id());
  return nccl_id_to_hex(id);
#else
  return failed_precondition(
      "ranks on several nodes (--nnodes, --dist-init-addr {}) need a build with NCCL "
      "(-DSTRATA_CUDA=ON)",
      addr);
#endif
}

}  // namespace strata
