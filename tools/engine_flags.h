// The engine flags shared by `strata serve` and `strata generate`, named as in SGLang so an
// operator's launch command carries over.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "eval/kv_quality.h"

namespace strata::tools {

struct EngineFlags {
  EngineConfig config;
  // Names of enum-valued flags, turned into EngineConfig's enums by finish_engine_flags (their
  // name tables: core/enum_names.h).
  std::string device = "cpu";
  std::string kv_cache_dtype = "auto";
  std::string kv_mla_rope_dtype;  // "": as --kv-cache-dtype
  std::string log_level = "info";
  double mem_fraction_static = 0;  // 0: planner default
  int64_t max_total_tokens = 0;    // 0: no cap
  int max_running_requests = 0;    // 0: planner default
  std::string kv_bf16_layers;      // "0,7"
  KvGateOptions kv_gate;           // --kv-quality-budget, --allow-lossy-kv, --kv-quality-records
  // Host KV tier: unset unless given on the command line (a value given without the tier
  // enabled is an error, never ignored).
  std::optional<double> hicache_size_gb, hicache_ratio;
  std::optional<std::string> hicache_write_policy, hicache_io_backend;
  bool disable_cuda_graph = false;
  // Unset: EngineConfig's defaults, or kCpuDefaultChunkedPrefillSize for both on cpu.
  std::optional<int> chunked_prefill_size, max_prefill_tokens;
  std::string speculative_algorithm;  // "": off
};

// Registers --model-path, --device, --kv-cache-dtype, --page-size, --mem-fraction-static,
// --device-memory-gib, --max-total-tokens, --max-running-requests, --chunked-prefill-size,
// --max-prefill-tokens, --num-continuous-decode-steps, --cuda-graph-max-bs, --disable-cuda-graph,
// --context-length, --random-seed,
// --log-level, the host KV tier (--enable-hierarchical-cache, --hicache-size, --hicache-ratio,
// --hicache-write-policy, --hicache-io-backend), and the KV quality flags (--kv-bf16-layers,
// --kv-scales, --kv-mla-rope-dtype,
// --kv-quality-budget, --allow-lossy-kv, --kv-quality-records).
// --speculative-algorithm, --speculative-draft-model-path, --speculative-num-steps,
// --speculative-eagle-topk, --speculative-num-draft-tokens.
void add_engine_flags(CLI::App& app, EngineFlags& flags, const std::string& default_model);
// Speculative decoding's flags alone (add_engine_flags registers them too).
void add_speculative_flags(CLI::App& app, EngineFlags& flags);

// Turns parsed flags into an EngineConfig (validating ranges) and applies --log-level. Runs the
// KV quality gate (eval/kv_quality.h): a lossy KV configuration without a record within budget
// (and no --allow-lossy-kv) is a FailedPrecondition error; the measured quality is logged.
StatusOr<EngineConfig> finish_engine_flags(EngineFlags& flags);

// When an existing launcher (mpirun, srun) started this process as tensor-parallel rank > 0, runs
// that rank until rank 0 shuts the group down (dist/tp_driver.h) and returns an OK or error
// status to exit with; nullopt for rank 0 and for plain runs, which go on to build the engine.
std::optional<Status> run_tp_worker_if_launched(const EngineConfig& config);

// The default model: ../shared/models/house-llama relative to the working directory, else
// relative to the binary's source checkout.
std::string default_model_path();

// Runs CLI11 parsing; on error prints a one-line message (or help) and returns the exit code.
// Returns -1 when parsing succeeded.
int parse_cli(CLI::App& app, int argc, char** argv);

}  // namespace strata::tools
