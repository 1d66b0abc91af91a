// Quantized checkpoint formats: parsing `quantization_config` into a QuantSpec, deciding which
// modules are quantized, and the host dequantization kernels that WeightStore::load_f32 uses.
//
// Formats:
// - compressed-tensors pack-quantized INT4 (Kimi-K2.5 routed experts): `<m>.weight_packed` int32
//   [out, ceil(in/8)] holding 8 nibbles per int32 along the input dim, least significant first,
//   value = nibble - 8; `<m>.weight_scale` bf16 [out, in/group]; `<m>.weight_shape` int32 [2].
//   Dequantized as compressed-tensors does: (nibble - 8) * scale computed in bf16 (the product
//   rounded to bf16), then widened to float32.
// - DeepSeek fp8 block: `<m>.weight` F8_E4M3 [out, in] with `<m>.weight_scale_inv` float32
//   [ceil(out/bo), ceil(in/bi)]; w * scale in float32 rounded to bf16, as DeepSeek's
//   weight_dequant / fp8_cast_bf16 (and SGLang's dequantize_fp8) produce bf16 weights.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "core/weight_format.h"  // the dequantization kernels
#include "model/spec.h"

namespace strata {

// Parses a `quantization_config` object. `where` names the file for error messages.
// Supported: quant_method "compressed-tensors" (format "pack-quantized", one config group of
// 4-bit symmetric int weights with strategy "group") and "fp8" (`weight_block_size`).
// Anything else is an error naming the method/format. A null/absent config is QuantMethod::kNone.
StatusOr<QuantSpec> parse_quant_spec(const nlohmann::json& quantization_config,
                                     const std::string& where);

// Whether the linear module `module_name` (e.g. "model.layers.3.mlp.experts.7.gate_proj", no
// ".weight" suffix) is stored quantized under `quant`. Honours the `ignore` list: plain entries
// match the full name or its last dotted components ("lm_head" matches
// "language_model.lm_head"); "re:<regex>" entries match from the start of the name as Python's
// re.match does. Embeddings, norms and the MoE router (`mlp.gate`) are never quantized.
// Thread-safe; compiled regexes are cached per thread.
bool is_quantized_module(const QuantSpec& quant, const std::string& module_name);

inline const char* quant_method_name(QuantMethod m) { return enum_name(m).data(); }

}  // namespace strata
