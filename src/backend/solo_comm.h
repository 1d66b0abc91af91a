// One rank of a tensor-parallel group run alone (--tp-one-rank): the shards rank 0 of `size`
// ranks holds, on this process's device, with every collective skipped and counted. It answers
// "what does each of N GPUs do per step" on one GPU — the weights, KV and kernels of one rank,
// exactly — when N GPUs are not at hand (issue 24: one Kimi-K2.5 rank of eight on one H200).
//
// Skipping means the values are not the model's: all_reduce_sum leaves this rank's partial sum,
// all_gather writes this rank's part into every rank's slot (so the gathered tensor has the
// shape, bytes and finite values later ops expect; samplers then pick among this rank's vocab
// columns, repeated). A benchmark mode, never a way to serve: the engine logs it at startup.
// Each skipped collective still marks its place in the backend's op stream
// (Backend::skipped_collective), so the backend merges no ops across it: until 2026-12-04 CUDA
// graph mode merged a MoE layer's combine with the next norm across the skipped all-reduce, one
// launch a layer fewer than a real rank runs.
//
// The counts (calls and payload bytes of each collective) are process-wide totals, read by the
// benchmarks around the steps they time and printed in the engine's exit line, so a projected
// N-GPU step = this rank's step + the collectives' time at a stated bus bandwidth.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "backend/comm.h"

namespace strata {

// Payload counts of the collectives a one-rank group skipped, since the process started.
struct SkippedCollectives {
  int64_t all_reduce_calls = 0;
  int64_t all_reduce_bytes = 0;  // Σ of each call's tensor bytes (the per-rank payload)
  int64_t all_gather_calls = 0;
  int64_t all_gather_bytes = 0;  // Σ of each call's input bytes (what this rank contributes)
  int64_t broadcast_calls = 0;   // control messages (the driver's step plans)
  int64_t broadcast_bytes = 0;
  int64_t barrier_calls = 0;
};
SkippedCollectives skipped_collectives();
// a - b, field by field (the collectives of the steps between two readings).
SkippedCollectives operator-(const SkippedCollectives& a, const SkippedCollectives& b);

// The communicator of rank 0 of a `size`-rank group run alone on `backend` (which must outlive
// it; all_gather copies through it).
std::unique_ptr<Communicator> make_solo_comm(int size, Backend& backend);

}  // namespace strata
