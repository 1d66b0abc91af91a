#include "model/quant.h"

#include <cstring>
#include <regex>
#include <unordered_map>

#include "core/check.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace strata {
namespace {

using json = nlohmann::json;

constexpr const char* kSupported =
    "supported: compressed-tensors pack-quantized INT4 (W4A16), fp8 with weight_block_size";

// Compiles "re:" patterns once per thread; patterns were validated by parse_quant_spec.
const std::regex* cached_regex(const std::string& pattern) {
  thread_local std::unordered_map<std::string, std::regex> cache;
  auto it = cache.find(pattern);
  if (it == cache.end()) {
    try {
      it = cache.emplace(pattern, std::regex(pattern, std::regex::ECMAScript)).first;
    } catch (const std::regex_error&) {
      return nullptr;
    }
  }
  return &it->second;
}

bool matches_ignore_entry(const std::string& entry, const std::string& name) {
  if (entry.rfind("re:", 0) == 0) {
    const std::regex* re = cached_regex(entry.substr(3));
    // Python's re.match: anchored at the start, not at the end.
    return re != nullptr && std::regex_search(name, *re, std::regex_constants::match_continuous);
  }
  if (name == entry) return true;
  // Trailing components: "lm_head" also names "language_model.lm_head" in a VL wrapper.
  return name.size() > entry.size() && name.ends_with(entry) &&
         name[name.size() - entry.size() - 1] == '.';
}

Status parse_compressed_tensors(const json& qc, const std::string& where, QuantSpec* spec) {
  std::string format = qc.value("format", std::string());
  auto groups = qc.find("config_groups");
  if (groups == qc.end() || !groups->is_object() || groups->empty()) {
    return invalid_argument("{}: quantization_config.config_groups missing or empty", where);
  }
  if (groups->size() != 1) {
    return unimplemented(
        "{}: quantization_config has {} config_groups; only one scheme is supported", where,
        groups->size());
  }
  const std::string group_name = groups->begin().key();
  const json& group = groups->begin().value();
  if (group.contains("format") && group["format"].is_string())
    format = group["format"].get<std::string>();
  if (format != "pack-quantized") {
    return unimplemented("{}: compressed-tensors format '{}' is not supported ({})", where, format,
                         kSupported);
  }
  auto act = group.find("input_activations");
  if (act != group.end() && !act->is_null()) {
    return unimplemented("{}: config_groups.{}: activation quantization is not supported ({})",
                         where, group_name, kSupported);
  }
  auto w = group.find("weights");
  if (w == group.end() || !w->is_object()) {
    return invalid_argument("{}: config_groups.{}.weights missing", where, group_name);
  }
  int num_bits = w->value("num_bits", 0);
  std::string type = w->value("type", std::string("int"));
  if (num_bits != 4 || type != "int") {
    return unimplemented("{}: config_groups.{}.weights: {}-bit {} weights are not supported ({})",
                         where, group_name, num_bits, type, kSupported);
  }
  spec->symmetric = w->value("symmetric", true);
  if (!spec->symmetric) {
    return unimplemented(
        "{}: config_groups.{}.weights: asymmetric (zero-point) INT4 is not supported", where,
        group_name);
  }
  std::string strategy = w->value("strategy", std::string());
  if (strategy == "group") {
    auto gs = w->find("group_size");
    if (gs == w->end() || !gs->is_number_integer() || gs->get<int64_t>() <= 0) {
      return invalid_argument("{}: config_groups.{}.weights.group_size must be a positive integer",
                              where, group_name);
    }
    spec->group_size = gs->get<int>();
  } else if (strategy == "channel") {
    spec->group_size = 0;  // one scale per output row
  } else {
    return unimplemented(
        "{}: config_groups.{}.weights.strategy '{}' is not supported (group, channel)", where,
        group_name, strategy);
  }
  spec->method = QuantMethod::kInt4PackQuantized;
  return Status();
}

Status parse_fp8(const json& qc, const std::string& where, QuantSpec* spec) {
  std::string fmt = qc.value("fmt", std::string("e4m3"));
  if (fmt != "e4m3") {
    return unimplemented("{}: fp8 fmt '{}' is not supported (e4m3)", where, fmt);
  }
  auto bs = qc.find("weight_block_size");
  if (bs == qc.end() || bs->is_null()) {
    return unimplemented("{}: fp8 without weight_block_size (per-tensor fp8) is not supported ({})",
                         where, kSupported);
  }
  if (!bs->is_array() || bs->size() != 2) {
    return invalid_argument("{}: quantization_config.weight_block_size must be [out, in], got {}",
                            where, bs->dump());
  }
  for (const json& v : *bs) {
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
      return invalid_argument(
          "{}: quantization_config.weight_block_size must hold positive integers, got {}", where,
          bs->dump());
    }
    spec->weight_block_size.push_back(v.get<int>());
  }
  spec->method = QuantMethod::kFp8Block;
  return Status();
}

}  // namespace

StatusOr<QuantSpec> parse_quant_spec(const json& qc, const std::string& where) {
  QuantSpec spec;
  if (qc.is_null()) return spec;
  if (!qc.is_object()) return invalid_argument("{}: quantization_config must be an object", where);
  auto m = qc.find("quant_method");
  if (m == qc.end() || !m->is_string()) {
    return invalid_argument("{}: quantization_config.quant_method missing or not a string", where);
  }
  const std::string method = m->get<std::string>();
  if (method == "compressed-tensors") {
    STRATA_RETURN_IF_ERROR(parse_compressed_tensors(qc, where, &spec));
  } else if (method == "fp8") {
    STRATA_RETURN_IF_ERROR(parse_fp8(qc, where, &spec));
  } else {
    return unimplemented("{}: quant_method '{}' is not supported ({})", where, method, kSupported);
  }
  // compressed-tensors says `ignore`; transformers' fp8 config says `modules_to_not_convert`.
  for (const char* key : {"ignore", "modules_to_not_convert"}) {
    auto it = qc.find(key);
    if (it == qc.end() || it->is_null()) continue;
    if (!it->is_array())
      return invalid_argument("{}: quantization_config.{} must be a list", where, key);
    for (const json& e : *it) {
      if (!e.is_string()) {
        return invalid_argument("{}: quantization_config.{} entries must be strings, got {}", where,
                                key, e.dump());
      }
      std::string s = e.get<std::string>();
      if (s.rfind("re:", 0) == 0) {
        try {
          std::regex re(s.substr(3), std::regex::ECMAScript);
        } catch (const std::regex_error& err) {
          return invalid_argument("{}: quantization_config.{}: bad regex '{}': {}", where, key, s,
                                  err.what());
        }
      }
      spec.ignore.push_back(std::move(s));
    }
  }
  return spec;
}

bool is_quantized_module(const QuantSpec& quant, const std::string& module_name) {
  if (quant.method == QuantMethod::kNone) return false;
  size_t dot = module_name.rfind('.');
  std::string last = dot == std::string::npos ? module_name : module_name.substr(dot + 1);
  // Not Linear layers: embeddings, norms, the MoE router (its `gate`; experts use `gate_proj`).
  if (last == "embed_tokens" || last == "gate" || last.find("norm") != std::string::npos) {
    return false;
  }
  // transformers' fp8 quantizer always keeps the lm_head in high precision.
  if (quant.method == QuantMethod::kFp8Block && last == "lm_head") return false;
  for (const std::string& entry : quant.ignore) {
    if (matches_ignore_entry(entry, module_name)) return false;
  }
  return true;
}

}  // namespace strata
