// ModelSpec: what a Hugging Face checkpoint's config.json says, normalized across the config
// layouts (classic `rope_theta`/`rope_scaling`, transformers-5 `rope_parameters`, VL wrappers
// with `text_config`). A description only: no weights, no math.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace strata {

enum class ArchKind : uint8_t {
  kLlama,     // llama, mistral, qwen2, qwen3 (arch/llama.cc)
  kDeepseek,  // deepseek_v2, deepseek_v3, kimi_k2, kimi_k25 (arch/deepseek.cc)
};

enum class RopeType : uint8_t { kDefault, kLinear, kLlama3, kYarn, kDynamic };

struct RopeSpec {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3, yarn, dynamic: the context the model was trained at before scaling.
  int64_t original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;                     // 0 = absent
  double mscale_all_dim = 0.0;             // 0 = absent
  std::optional<double> attention_factor;  // explicit override when the config gives one
  bool truncate = true;                    // yarn: floor/ceil the correction range (HF default)
  // How many dims of each head are rotated (head_dim, or qk_rope_head_dim for MLA).
  int rotary_dim = 0;
  // true: pairs are (2i, 2i+1) (GPT-J / DeepSeek `rope_interleave`); false: (i, i + dim/2).
  bool interleaved = false;
};

enum class ScoringFunc : uint8_t { kSoftmax, kSigmoid };
enum class TopkMethod : uint8_t { kGreedy, kGroupLimitedGreedy, kNoauxTc };

struct MlaSpec {
  int q_lora_rank = 0;  // 0 = no q compression (DeepSeek-V2-Lite): q_proj directly
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
};

struct MoeSpec {
  int n_routed_experts = 0;  // 0 = dense model
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int first_k_dense_replace = 0;  // layers [0, k) use the dense MLP
  int moe_layer_freq = 1;
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;
  TopkMethod topk_method = TopkMethod::kGreedy;
};

enum class QuantMethod : uint8_t {
  kNone,
  kInt4PackQuantized,  // compressed-tensors pack-quantized W4A16 (Kimi-K2.5 routed experts)
  kFp8Block,           // DeepSeek-V3 fp8 with weight_scale_inv per 128x128 block
};
inline constexpr EnumName<QuantMethod> kQuantMethodNames[] = {
    {QuantMethod::kNone, "none"},
    {QuantMethod::kInt4PackQuantized, "int4-pack-quantized"},
    {QuantMethod::kFp8Block, "fp8-block"}};
constexpr const auto& enum_names(QuantMethod) { return kQuantMethodNames; }

struct QuantSpec {
  QuantMethod method = QuantMethod::kNone;
  int group_size = 0;  // int4: input elements per scale
  bool symmetric = true;
  std::vector<int> weight_block_size;  // fp8: {128, 128}
  // Modules left unquantized: plain names or "re:<regex>" entries from the config's `ignore`.
  std::vector<std::string> ignore;
};

struct ModelSpec {
  ArchKind arch = ArchKind::kLlama;
  std::string model_type;       // as in config.json (for kimi_k25: the wrapper's type)
  std::string text_model_type;  // the text model's type (same as model_type unless wrapped)

  int64_t vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // attention head dim (GQA); for MLA: qk_nope + qk_rope
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;

  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry a bias (qwen2)
  bool attention_out_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;               // per-head RMSNorm on q and k before rope (qwen3)
  std::optional<int> sliding_window;  // recorded; not used by attention yet

  RopeSpec rope;
  MlaSpec mla;  // meaningful when arch == kDeepseek
  MoeSpec moe;  // meaningful when moe.n_routed_experts > 0
  QuantSpec quant;

  std::vector<int> eos_token_ids;
  std::optional<int> bos_token_id;
  DType weight_dtype = DType::kBF16;  // the checkpoint's `torch_dtype`/`dtype`

  // Prefix of the text model's weights: "model." or "language_model.model." (kimi_k25).
  std::string weight_prefix = "model.";
  // lm_head name: "lm_head.weight" or "language_model.lm_head.weight".
  std::string lm_head_name = "lm_head.weight";

  bool is_mla() const { return arch == ArchKind::kDeepseek; }
  bool is_moe_layer(int layer) const {
    return moe.n_routed_experts > 0 && layer >= moe.first_k_dense_replace &&
           (layer % (moe.moe_layer_freq > 0 ? moe.moe_layer_freq : 1)) == 0;
  }
};

}  // namespace strata
