// KV quality records and the quality gate (design.md §5): a server or `strata generate` started
// with a lossy KV configuration refuses to start unless a record for the same model and KV
// configuration shows mean KL divergence within the user's budget, or the user passes
// --allow-lossy-kv. Records are JSON files written by `strata eval-kv`.
//
// Where records live: --kv-quality-records DIR, else $STRATA_KV_QUALITY_DIR, else
// $XDG_CACHE_HOME/strata/kv-quality, else ~/.cache/strata/kv-quality (writable; checkpoint
// directories are often read-only). The gate also reads <model>/strata-kv-quality/ so a
// checkpoint can ship its own evidence.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/kv_config.h"

namespace strata {

constexpr const char* kKvRecordFormat = "strata-kv-quality/1";

// A checkpoint's identity: config.json and a sample of every safetensors file (its header and
// the first and last 64 KiB of data) hashed with FNV-1a 64, so a fine-tune with the same shapes
// is a different model, and hashing costs milliseconds even for terabyte checkpoints.
struct ModelIdentity {
  std::string name;  // the directory's name
  std::string path;
  std::string fingerprint;  // 16 hex digits
};
StatusOr<ModelIdentity> model_identity(const std::string& model_dir);

std::string default_kv_records_dir();
// The directories the gate reads: `dir` (or the default) and <model>/strata-kv-quality.
std::vector<std::string> kv_record_dirs(const std::string& dir, const std::string& model_dir);

// Writes `record` as <dir>/<model name>-<fingerprint>-<hash of KV key + deployment>-<UTC time>.json
// (creating dir). Returns the path.
StatusOr<std::string> save_kv_record(const std::string& dir, const nlohmann::json& record);

// Where a record was measured, or a server runs: the device, the tensor-parallel size and the
// decode-context-parallel size (always 1 here). Records carry it as "deployment"; records made
// before it existed were made on the CPU at tp 1.
struct KvDeployment {
  std::string device = "cpu";
  int tp_size = 1;
  int dcp_size = 1;
  nlohmann::json to_json() const;
  static KvDeployment from_record(const nlohmann::json& record);
  bool operator==(const KvDeployment&) const = default;
  std::string describe() const;  // "cuda tp 8"
};

// The newest record (by its "date") in `dirs` for this model fingerprint and KV key, preferring
// one measured on `deployment`; when none was, the newest of any deployment (the KV values are
// quantized the same way at every tp size — each rank holds whole heads or the whole MLA latent
// with the layer's dtype and scale — but the arithmetic around them differs by device). The
// returned record gets "deployment_matches" (bool). Unreadable or foreign JSON files are skipped.
std::optional<nlohmann::json> find_kv_record(const std::vector<std::string>& dirs,
                                             const std::string& fingerprint,
                                             const std::string& kv_key,
                                             const KvDeployment& deployment = {});

struct KvGateOptions {
  double budget_nats = 0.001;  // --kv-quality-budget: mean KLD allowed
  bool allow_lossy = false;    // --allow-lossy-kv
  std::string records_dir;     // --kv-quality-records ("" = default)
  KvDeployment deployment{};   // where the server runs (--device, --tp-size)
};

struct KvGateDecision {
  bool allowed = true;
  bool warn = false;    // allowed, but unmeasured or over budget
  std::string message;  // the line to log (or the error when refused)
};

// Pure decision: `record` is what find_kv_record returned for this configuration. The message
// names the record that admitted (or refused) the configuration, where it was measured, and the
// KLD as a multiple of the record's noise floor (bf16 vs bf16, measured the same way).
KvGateDecision decide_kv_gate(const KvCacheConfig& config,
                              const std::optional<nlohmann::json>& record,
                              const KvGateOptions& options);

// What `strata serve` / `strata generate` call before Engine::create: resolves the KV
// configuration of `model_dir` + `kv`, looks up records, logs the measured quality and returns
// FailedPrecondition when it refuses. Exact configurations pass without a lookup.
Status enforce_kv_quality_gate(const std::string& model_dir, const KvCacheOptions& kv,
                               const KvGateOptions& options);

}  // namespace strata
