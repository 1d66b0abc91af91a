// eval-kv output: the JSON record of one candidate (what the quality gate reads), the console
// table, and the KLD-against-position plot (gnuplot, when installed).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "eval/kv_eval.h"
#include "eval/kv_quality.h"

namespace strata {

// {"format", "date", "label", "model": {name, path, fingerprint}, "kv": {key, describe, dtype,
//  format, bf16_layers, mla_rope_dtype, scales}, "deployment", "reference", "data": {...},
//  "metrics": {...}, "tokens_scored", "free_run", "noise_floor", "kld_vs_noise_floor"}. `noise`
// may be null.
// "deployment": where it was measured (KvDeployment's fields plus the backend and its
// activation dtype: KvEvaluator::deployment()); the gate prefers records of its own deployment.
nlohmann::json make_kv_record(const ModelIdentity& model, const CandidateResult& result,
                              const CandidateResult* noise, const EvalKvOptions& options,
                              const EvalData& data, const nlohmann::json& deployment,
                              const nlohmann::json& extra);

// One row per result: KLD mean ± SE, median, p99, p99.9, max, top-1 ± SE, Δp mean/RMS,
// ln PPL ratio ± SE, free-running divergences; then KLD by position bucket.
std::string format_kv_table(const std::vector<CandidateResult>& results);

// Writes `png` (mean KLD per position bucket, one line per result, log scale) through gnuplot,
// and the data beside it as <png>.dat. Errors when gnuplot is missing (the .dat stays).
Status write_kld_plot(const std::string& png, const std::vector<CandidateResult>& results);

}  // namespace strata
