#include "engine/kv_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "model/weight_names.h"
#include "model/weights.h"
#include "planner/planner.h"

namespace strata {
namespace {

bool is_fp8(DType t) { return t == DType::kFP8E4M3 || t == DType::kFP8E5M2; }

std::string join_layers(const std::vector<int>& layers) {
  std::string s;
  for (size_t i = 0; i < layers.size(); ++i) s += (i ? "," : "") + std::to_string(layers[i]);
  return s;
}

Status check_scales(const std::vector<float>& v, const std::string& what) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!(v[i] > 0) || !std::isfinite(v[i]))
      return invalid_argument("{}: layer {} scale {} must be finite and > 0", what, i, v[i]);
  return Status();
}

}  // namespace

bool KvCacheConfig::lossy() const { return is_fp8(dtype) && int(bf16_layers.size()) < num_layers; }

DType KvCacheConfig::layer_dtype(int layer) const {
  return std::binary_search(bf16_layers.begin(), bf16_layers.end(), layer) ? DType::kBF16 : dtype;
}

std::string KvCacheConfig::describe() const {
  std::string s = format == KvFormat::kFlashMlaFp8 ? "fp8_flashmla" : kv_cache_dtype_name(dtype);
  if (!bf16_layers.empty()) s += " · bf16 layers " + join_layers(bf16_layers);
  if (mla_rope_dtype) s += std::string(" · rope ") + kv_cache_dtype_name(*mla_rope_dtype);
  if (is_fp8(dtype) && format != KvFormat::kFlashMlaFp8) s += " · scales " + scales.source;
  return s;
}

std::string KvCacheConfig::key() const {
  std::string s =
      fmt::format("dtype={};format={};bf16_layers={};rope={}", kv_cache_dtype_name(dtype),
                  format == KvFormat::kFlashMlaFp8 ? "flashmla" : "plain", join_layers(bf16_layers),
                  mla_rope_dtype ? kv_cache_dtype_name(*mla_rope_dtype) : "same");
  if (is_fp8(dtype) && format != KvFormat::kFlashMlaFp8) {
    s += ";k_scale=";
    for (float x : scales.k) s += fmt::format("{:.9g},", x);
    s += ";v_scale=";
    for (float x : scales.v) s += fmt::format("{:.9g},", x);
  }
  return s;
}

StatusOr<std::vector<int>> parse_layer_list(const std::string& text, const std::string& flag) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used != item.size() || v < 0)
      return invalid_argument("{}: '{}' is not a layer index", flag, item);
    out.push_back(v);
  }
  return out;
}

KvCacheDtype kv_cache_dtype_of(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return KvCacheDtype::kBF16;
    case DType::kF32:
      return KvCacheDtype::kF32;
    case DType::kFP8E4M3:
      return KvCacheDtype::kFp8E4M3;
    case DType::kFP8E5M2:
      return KvCacheDtype::kFp8E5M2;
    default:
      return KvCacheDtype::kAuto;
  }
}

StatusOr<KvCacheConfig> resolve_kv_cache_config(const KvCacheOptions& o, const ModelSpec& spec,
                                                const WeightStore* weights, DType exact_dtype) {
  KvCacheConfig c;
  c.num_layers = spec.num_layers;
  switch (o.dtype) {
    case KvCacheDtype::kAuto:
      c.dtype = exact_dtype;
      break;
    case KvCacheDtype::kBF16:
      c.dtype = DType::kBF16;
      break;
    case KvCacheDtype::kF32:
      c.dtype = DType::kF32;
      break;
    case KvCacheDtype::kFp8E4M3:
      c.dtype = DType::kFP8E4M3;
      break;
    case KvCacheDtype::kFp8E5M2:
      c.dtype = DType::kFP8E5M2;
      break;
    case KvCacheDtype::kFp8FlashMla:
      if (!spec.is_mla())
        return invalid_argument(
            "--kv-cache-dtype fp8_flashmla is an MLA format; {} has no MLA cache", spec.model_type);
      c.dtype = DType::kFP8E4M3;
      c.format = KvFormat::kFlashMlaFp8;
      break;
  }
  for (int l : o.bf16_layers)
    if (l < 0 || l >= spec.num_layers)
      return invalid_argument("--kv-bf16-layers: layer {} outside [0, {})", l, spec.num_layers);
  if (is_fp8(c.dtype)) {
    c.bf16_layers = o.bf16_layers;
    std::sort(c.bf16_layers.begin(), c.bf16_layers.end());
    c.bf16_layers.erase(std::unique(c.bf16_layers.begin(), c.bf16_layers.end()),
                        c.bf16_layers.end());
  }
  if (o.mla_rope_dtype) {
    const DType rope = *o.mla_rope_dtype;
    if (!spec.is_mla())
      return invalid_argument("--kv-mla-rope-dtype: {} has no MLA cache", spec.model_type);
    if (c.format == KvFormat::kFlashMlaFp8 && rope != DType::kBF16)
      return invalid_argument("--kv-mla-rope-dtype: fp8_flashmla keeps the rope part in bf16");
    if (rope != DType::kBF16 && rope != DType::kF32 && !is_fp8(rope))
      return invalid_argument("--kv-mla-rope-dtype: {} is no KV cache dtype", dtype_name(rope));
    if (rope != c.dtype && c.format == KvFormat::kPlain) c.mla_rope_dtype = rope;
  }
  c.scales.k.assign(size_t(spec.num_layers), 1.0f);
  c.scales.v.assign(size_t(spec.num_layers), 1.0f);
  if (!o.scales_path.empty()) {
    STRATA_ASSIGN_OR_RETURN(c.scales, read_kv_scales(o.scales_path, spec.num_layers));
  } else if (weights && is_fp8(c.dtype)) {
    STRATA_ASSIGN_OR_RETURN(std::optional<KvScales> ck, checkpoint_kv_scales(*weights, spec));
    if (ck) c.scales = std::move(*ck);
  }
  return c;
}

KvLayout apply_kv_layout(const KvCacheConfig& c, const ModelSpec& spec, KvLayout layout) {
  layout.dtype = c.dtype;
  layout.layer_dtypes.clear();
  if (!c.bf16_layers.empty())
    for (int l = 0; l < layout.num_layers; ++l) layout.layer_dtypes.push_back(c.layer_dtype(l));
  layout.format = c.format;
  layout.rope_dtype = c.mla_rope_dtype;
  layout.rope_dim = spec.is_mla() ? spec.mla.qk_rope_head_dim : 0;
  return layout;
}

void apply_kv_scales(const KvCacheConfig& c, KvStorage& kv) {
  for (int l = 0; l < c.num_layers; ++l) {
    if (is_fp8(c.layer_dtype(l)) && c.format == KvFormat::kPlain)
      kv.set_scales(l, c.scales.k[size_t(l)], c.scales.v[size_t(l)]);
    else
      kv.set_scales(l, 1.0f, 1.0f);
  }
}

Status write_kv_scales(const std::string& path, const KvScales& s, const nlohmann::json& extra) {
  nlohmann::json j = extra.is_object() ? extra : nlohmann::json::object();
  j["format"] = "strata-kv-scales/1";
  j["num_layers"] = s.k.size();
  j["k_scale"] = s.k;
  j["v_scale"] = s.v;
  std::ofstream f(path);
  if (!f) return invalid_argument("--kv-scales: cannot write '{}'", path);
  f << j.dump(2) << "\n";
  if (!f) return data_loss("--kv-scales: writing '{}' failed", path);
  return Status();
}

StatusOr<KvScales> read_kv_scales(const std::string& path, int num_layers) {
  std::ifstream f(path);
  if (!f) return not_found("--kv-scales: cannot open '{}'", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    return invalid_argument("--kv-scales '{}': not JSON: {}", path, e.what());
  }
  if (!j.is_object() || j.value("format", "") != "strata-kv-scales/1")
    return invalid_argument("--kv-scales '{}': \"format\" must be \"strata-kv-scales/1\"", path);
  KvScales s;
  s.source = "file:" + path;
  try {
    s.k = j.at("k_scale").get<std::vector<float>>();
    s.v = j.at("v_scale").get<std::vector<float>>();
  } catch (const std::exception& e) {
    return invalid_argument("--kv-scales '{}': k_scale/v_scale must be arrays of numbers ({})",
                            path, e.what());
  }
  if (int(s.k.size()) != num_layers || int(s.v.size()) != num_layers)
    return invalid_argument("--kv-scales '{}': {} k and {} v scales for a model of {} layers", path,
                            s.k.size(), s.v.size(), num_layers);
  STRATA_RETURN_IF_ERROR(check_scales(s.k, "--kv-scales '" + path + "' k_scale"));
  STRATA_RETURN_IF_ERROR(check_scales(s.v, "--kv-scales '" + path + "' v_scale"));
  return s;
}

StatusOr<std::optional<KvScales>> checkpoint_kv_scales(const WeightStore& w,
                                                       const ModelSpec& spec) {
  KvScales s;
  s.source = "checkpoint";
  bool any = false;
  namespace wn = weight_names;
  const WeightNames names(spec);
  for (int l = 0; l < spec.num_layers; ++l) {
    float ks = 1.0f, vs = 1.0f;
    for (const std::string_view which : {wn::kKScale, wn::kVScale, wn::kKvScale}) {
      const std::string name = names.attn(l, which);
      if (!w.find(name)) continue;
      STRATA_ASSIGN_OR_RETURN(HostTensor t, w.load_f32(name));
      if (t.numel() != 1) return invalid_argument("checkpoint tensor {} must be a scalar", name);
      const float x = t.f32()[0];
      if (!(x > 0) || !std::isfinite(x))
        return invalid_argument("checkpoint tensor {} = {} must be finite and > 0", name, x);
      any = true;
      if (which != wn::kVScale) ks = x;
      if (which != wn::kKScale) vs = x;
    }
    s.k.push_back(ks);
    s.v.push_back(vs);
  }
  if (!any) return std::optional<KvScales>();
  return std::optional<KvScales>(std::move(s));
}

}  // namespace strata
