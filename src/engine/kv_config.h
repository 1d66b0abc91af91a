// The KV cache configuration beyond one dtype: layers kept in bf16 (mixed precision), per-layer
// K/V scales (from a calibration file, the checkpoint's k_scale/v_scale, or 1.0), the MLA rope
// part's dtype, and DeepSeek FlashMLA FP8 rows. Resolved once by Engine::create and by
// `strata eval-kv`, so both build byte-identical KV pools from the same options; key() names a
// configuration for the quality records (eval/kv_quality.h).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/spec.h"

namespace strata {

class WeightStore;

// Per-layer dequantization scales (stored = value / scale). Vectors are [num_layers].
struct KvScales {
  std::vector<float> k, v;
  std::string source = "unit";  // unit | checkpoint | file:<path>
};

// What --kv-cache-dtype names: the backend's exact dtype (auto), a dtype, or fp8_flashmla (MLA
// only: DeepSeek FlashMLA's FP8 rows, latent e4m3 in 128-wide tiles with float32 scales, rope
// bf16).
enum class KvCacheDtype : uint8_t { kAuto, kBF16, kF32, kFp8E4M3, kFp8E5M2, kFp8FlashMla };
inline constexpr EnumName<KvCacheDtype> kKvCacheDtypeNames[] = {
    {KvCacheDtype::kAuto, "auto"},        {KvCacheDtype::kBF16, "bf16"},
    {KvCacheDtype::kF32, "f32"},          {KvCacheDtype::kFp8E4M3, "fp8_e4m3"},
    {KvCacheDtype::kFp8E5M2, "fp8_e5m2"}, {KvCacheDtype::kFp8FlashMla, "fp8_flashmla"},
    {KvCacheDtype::kBF16, "bfloat16"},    {KvCacheDtype::kF32, "float32"}};
constexpr const auto& enum_names(KvCacheDtype) { return kKvCacheDtypeNames; }
// The choice that stores plain `dtype` (bf16, f32, fp8_e4m3, fp8_e5m2; others: kAuto).
KvCacheDtype kv_cache_dtype_of(DType dtype);

// What the user asked for (EngineConfig / eval-kv flags).
struct KvCacheOptions {
  KvCacheDtype dtype = KvCacheDtype::kAuto;
  std::vector<int> bf16_layers{};         // kept in bf16 when dtype is fp8
  std::string scales_path{};              // JSON written by `strata eval-kv --calibrate`
  std::optional<DType> mla_rope_dtype{};  // unset: as dtype | bf16 | fp8_e4m3 | fp8_e5m2; MLA only
};

struct KvCacheConfig {
  DType dtype = DType::kBF16;  // of every layer not in bf16_layers
  KvFormat format = KvFormat::kPlain;
  std::vector<int> bf16_layers;         // sorted, unique, only when dtype is fp8
  std::optional<DType> mla_rope_dtype;  // set only when it differs from dtype
  KvScales scales;
  int num_layers = 0;

  bool lossy() const;  // some layer is stored in fp8
  DType layer_dtype(int layer) const;
  // Human-readable, for logs and tables: "fp8_e4m3 · bf16 layers 0,7 · scales file:x.json".
  std::string describe() const;
  // Canonical identity for quality records: every field that changes what is stored, scale
  // values included (printed with 9 significant digits).
  std::string key() const;
};

// Validates the options against the model. `exact_dtype` is what "auto" means on this backend.
// `weights` may be null (no checkpoint scales looked up). Errors name the flag at fault.
StatusOr<KvCacheConfig> resolve_kv_cache_config(const KvCacheOptions& options,
                                                const ModelSpec& spec, const WeightStore* weights,
                                                DType exact_dtype);

// The model's KV layout (widths) completed with the configuration's dtypes and row formats.
KvLayout apply_kv_layout(const KvCacheConfig& config, const ModelSpec& spec, KvLayout layout);
// Sets every layer's scales on `kv` (1.0 for layers not stored in fp8).
void apply_kv_scales(const KvCacheConfig& config, KvStorage& kv);

// The scales file: {"format": "strata-kv-scales/1", "num_layers": N, "k_scale": [...],
// "v_scale": [...], ...extra}. `extra` (model, dataset, method) is written alongside.
Status write_kv_scales(const std::string& path, const KvScales& scales,
                       const nlohmann::json& extra);
StatusOr<KvScales> read_kv_scales(const std::string& path, int num_layers);
// `<prefix>layers.N.self_attn.{k_scale,v_scale}` (or a shared kv_scale) as vLLM/ModelOpt/
// compressed-tensors checkpoints store them; nullopt when the checkpoint has none.
StatusOr<std::optional<KvScales>> checkpoint_kv_scales(const WeightStore& weights,
                                                       const ModelSpec& spec);

// "0,7" -> {0, 7}; errors name `flag`.
StatusOr<std::vector<int>> parse_layer_list(const std::string& text, const std::string& flag);

}  // namespace strata
