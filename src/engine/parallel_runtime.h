// What the engine asks of a distributed runtime when --tp-size > 1. The engine is rank 0: it
// schedules, samples and keeps the KV bookkeeping; the runtime gives it a Model whose forward
// drives every rank, and, with a host KV tier, a copier that repeats rank 0's copies on every
// rank. src/dist/ implements it (dist/tensor_parallel.h); the engine never includes dist/
// (design.md §2: dist -> engine), so a caller that wants more than one rank passes the runtime
// to Engine::create.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "arch/model.h"
#include "backend/kv_host_io.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/host_tier_io.h"
#include "kv/hicache.h"

namespace strata {

class WeightStore;

// Rank 0's part of a group of ranks.
struct ParallelModel {
  std::unique_ptr<Model> model;      // its forward() drives every rank; destroying it stops them
  std::unique_ptr<Backend> backend;  // rank 0's: the engine's backend from then on
  bool ranks_are_processes = false;  // a launcher (mpirun, srun) started the other ranks
};

// Rank 0's host-tier copier under a group: every copy is repeated on every rank, each on its own
// KV pool and host memory. Engine thread only.
class GroupHostTier : public HiCacheIo {
 public:
  // Every rank's counters (rank 0 first). A collective: the engine thread, between steps.
  virtual StatusOr<std::vector<HostTierRankStats>> gather_rank_stats() = 0;
  // Whether copies were issued since the last gather_rank_stats().
  virtual bool stats_stale() const = 0;
};

class ParallelRuntime {
 public:
  virtual ~ParallelRuntime() = default;
  // Starts config.tp_size ranks, each loading its slice of `weights`; errors name the rank.
  virtual StatusOr<ParallelModel> create_model(const EngineConfig& config, const ModelSpec& spec,
                                               const WeightStore& weights) const = 0;
  // Puts a host KV tier of `host_pages` pages behind the pool `kv` on every rank of `model` (made
  // by create_model); `rank0_io` is rank 0's own copier, `io` how the other ranks copy. The tier
  // must be destroyed before the model.
  virtual StatusOr<std::unique_ptr<GroupHostTier>> attach_host_tier(
      Model& model, const KvStorage& kv, int64_t host_pages, KvIoBackend io,
      std::unique_ptr<HiCacheIo> rank0_io) const = 0;
};

}  // namespace strata
