// The tensor-parallel driver (design.md §4): rank 0 runs the engine (scheduler, KV bookkeeping,
// sampling) and each step broadcasts its BatchPlan to ranks 1..N-1, which run the same forward on
// their weight slices and their own KV pools; the model's collectives join the ranks inside the
// forward. The ranks are threads of this process (CPU ranks over the in-process communicator:
// the test path; CUDA ranks one per GPU over NCCL), or processes a launcher started, one per rank.
// Every rank's backend and communicator come from the backend factory
// (backend/factory/rank_factory.h); the engine reaches all of this through
// dist/tensor_parallel.h.
//
// Messages (one broadcast each): kInitKv (the KV layout, pages and scales, once before the
// first step and whenever rank 0's pool changes: a worker keeps its pool and cached K/V when
// only the scales changed), kStep (the host tier's copies since the last step, then
// BatchPlan::serialize()), kShutdown; with a host KV tier (dist/tp_host_tier.h) kInitHost
// (every worker allocates its host memory and replies) and kHostStats (every worker replies
// with its copy counters). A reply is one broadcast rooted at each worker in turn.
// A rank that fails aborts the communicator group: every other rank's collectives return at
// once, rank 0's next forward stops the process with that rank's error (never a hang), and a
// failure while loading is returned by create_tp_model.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "arch/model.h"
#include "backend/comm.h"
#include "backend/factory/rank_factory.h"
#include "backend/kv_host_io.h"
#include "core/status.h"
#include "dist/tp_host_tier.h"
#include "model/sharding.h"

namespace strata {

class WeightStore;

struct TpConfig {
  int tp_size = 1;
  // --dcp-size: decode context parallelism over groups of this many consecutive ranks (arch/dcp.h;
  // divides tp_size; MLA models only). 1: every rank holds the whole latent cache.
  int dcp_size = 1;
  Device device = Device::kCpu;  // cpu: in-process ranks; cuda: one rank per visible GPU (NCCL)
  ShardingOptions sharding{};    // allow_uneven: tests only (model/sharding.h)
  // Set when an existing launcher (mpirun, srun) started one process per rank
  // (tp_launch_from_env): this process hosts only rank launch->rank, on GPU launch->local_rank,
  // and the NCCL id travels through `nccl_id_file` (or STRATA_NCCL_ID). Rank 0 runs the engine
  // (create_tp_model); every other rank runs run_tp_worker until rank 0 shuts the group down.
  std::optional<LaunchRank> launch{};
  std::string nccl_id_file{};
  // --tp-one-rank: rank 0's shards alone, collectives skipped and counted (backend/solo_comm.h).
  bool one_rank = false;
};

// The launcher's ranks when this process was started as one of several (size > 1), else nullopt.
// Errors: a launcher size that is not --tp-size (no silent clamping), or a CPU device (ranks of
// several processes talk through NCCL only). The id file: $STRATA_NCCL_ID_FILE, else
// ./.strata_nccl_id.<job id: PMIX_NAMESPACE, Open MPI's jobid, SLURM_JOB_ID.SLURM_STEP_ID,
// PMI_JOBID, or "0" when the launcher gives none> (on a filesystem every node sees; multi-node jobs
// may set STRATA_NCCL_ID, the hex id, instead).
StatusOr<std::optional<LaunchRank>> tp_launch_from_env(int tp_size, Device device,
                                                       std::string* nccl_id_file);

// The backend factory's ranks for `config` (backend/factory/rank_factory.h: an in-process CPU
// group, or NCCL over this process's GPUs with a clear error when fewer GPUs are visible than
// tp_size, or this launcher-started process's rank).
StatusOr<RankFactory> make_tp_rank_factory(const TpConfig& config);

// Starts the group: every rank loads its slices on its own thread. Returns rank 0's model, whose
// forward() drives the others; `rank0_backend` receives rank 0's backend (the engine's backend).
// Destroying the model shuts the workers down. Errors name the failing rank.
StatusOr<std::unique_ptr<Model>> create_tp_model(const ModelSpec& spec, const WeightStore& weights,
                                                 const TpConfig& config, const RankFactory& factory,
                                                 std::unique_ptr<Backend>* rank0_backend);

// Rank 0 of a tensor-parallel model (made by create_tp_model): puts a host KV tier behind the
// pool `kv` on every rank. Each other rank allocates host_pages pages of its own host memory
// (copier `io`, as --hicache-io-backend resolved on rank 0) before this returns; errors name the
// rank. `rank0_io` is rank 0's own copier. The returned tier is the HiCacheIo rank 0's HiCache
// uses, and must be destroyed before the model. Engine thread only (it sends messages).
StatusOr<std::unique_ptr<TpHostTier>> attach_tp_host_tier(Model& tp_model, const KvStorage& kv,
                                                          int64_t host_pages, KvIoBackend io,
                                                          std::unique_ptr<HiCacheIo> rank0_io);

// A launcher-started rank other than 0 (config.launch set): loads this rank's slices, then runs
// rank 0's broadcast steps until its shutdown message. Returns the group's error if any rank
// failed (the process should then exit non-zero, which makes the launcher stop the others).
Status run_tp_worker(const std::string& model_path, const TpConfig& config);

}  // namespace strata
