// Fuzzes config.json -> ModelSpec (parse_model_spec), then what `strata plan` and the engine do
// with an accepted spec: the tensor inventory and the KV capacity plan (for specs of at most 2048
// layer x expert pairs). Input: config.json text.
#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/json_limits.h"
#include "model/config.h"
#include "model/inventory.h"
#include "planner/planner.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (!strata::check_json_depth(text, "config.json").ok()) return 0;  // as load_model_spec does
  nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return 0;
  auto spec = strata::parse_model_spec(config);
  if (!spec.ok()) return 0;
  // Planning a full-size MoE (Kimi-K2.5: 23k routed experts, 70k tensors) takes seconds under
  // ASan; the planner's unit tests cover those, the fuzzer keeps to inventories it can afford.
  if (int64_t(spec->num_layers) * std::max(1, spec->moe.n_routed_experts) > 2048) return 0;
  strata::Deployment cpu;
  cpu.gpu_memory_bytes = int64_t(4) << 30;
  cpu.device = strata::PlanDevice::kCpu;
  (void)strata::plan_kv_capacity(*spec, cpu);
  strata::Deployment gpu;
  gpu.gpu_memory_bytes = int64_t(141) << 30;
  gpu.tp_size = 8;
  gpu.kv_cache_dtype = strata::DType::kFP8E4M3;
  gpu.page_size = 16;
  (void)strata::plan_kv_capacity(*spec, gpu);
  return 0;
}
