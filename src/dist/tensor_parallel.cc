#include "dist/tensor_parallel.h"

#include "dist/tp_driver.h"
#include "dist/tp_host_tier.h"

namespace strata {
namespace {

class TensorParallelRuntime : public ParallelRuntime {
 public:
  StatusOr<ParallelModel> create_model(const EngineConfig& config, const ModelSpec& spec,
                                       const WeightStore& weights) const override {
    TpConfig tpc{.tp_size = config.tp_size,
                 .dcp_size = config.dcp_size,
                 .device = config.device,
                 .sharding = {.allow_uneven = config.tp_allow_uneven},
                 .one_rank = config.tp_one_rank};
    // Started by mpirun/srun as rank 0 of several processes: the others run run_tp_worker
    // (--tp-one-rank has no other ranks, whatever the environment says).
    if (!tpc.one_rank) {
      STRATA_ASSIGN_OR_RETURN(tpc.launch,
                              tp_launch_from_env(config.tp_size, config.device, &tpc.nccl_id_file));
    }
    STRATA_ASSIGN_OR_RETURN(RankFactory factory, make_tp_rank_factory(tpc));
    ParallelModel group;
    // One rank alone holds one host tier, as one process of a launcher's would.
    group.ranks_are_processes = tpc.launch.has_value() || tpc.one_rank;
    STRATA_ASSIGN_OR_RETURN(group.model,
                            create_tp_model(spec, weights, tpc, factory, &group.backend));
    return group;
  }

  StatusOr<std::unique_ptr<GroupHostTier>> attach_host_tier(
      Model& model, const KvStorage& kv, int64_t host_pages, KvIoBackend io,
      std::unique_ptr<HiCacheIo> rank0_io) const override {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<TpHostTier> tier,
                            attach_tp_host_tier(model, kv, host_pages, io, std::move(rank0_io)));
    return std::unique_ptr<GroupHostTier>(std::move(tier));
  }
};

}  // namespace

const ParallelRuntime& tensor_parallel_runtime() {
  static const TensorParallelRuntime runtime;
  return runtime;
}

}  // namespace strata
