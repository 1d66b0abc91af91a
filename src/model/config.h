// config.json -> ModelSpec.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "model/spec.h"

namespace strata {

// Reads `dir`/config.json. Errors name the file and the offending field.
StatusOr<ModelSpec> load_model_spec(const std::string& dir);

// Parses an already-read config object (the top level of config.json).
StatusOr<ModelSpec> parse_model_spec(const nlohmann::json& config);

}  // namespace strata
