// Tensor inventory: every weight of an architecture derived from its ModelSpec alone (no
// checkpoint needed), with HF names, logical shapes, storage format and how SGLang-style tensor
// parallelism partitions it. The capacity planner (src/planner) sums it; loaders can use it to
// check a checkpoint against what the config promises.
//
// Conventions:
// - One entry per logical weight ("<module>.weight", "<norm>.weight", "...e_score_correction_bias")
//   with its unpacked HF shape ([out, in] for linears). Quantized weights are stored as several
//   checkpoint tensors (stored_tensor_names() lists them); bytes include their scales.
// - Parameter counts count logical elements (unpacked INT4 values, no scales), embedding and
//   lm_head included (once when tied), as DeepSeek's 671B/37B figures do. MTP (nextn) layers are
//   not part of ModelSpec and are excluded.
// - Active parameters per token = every non-routed-expert weight + top-k routed experts per MoE
//   layer (shared experts are non-routed, so always active).
// - MoE under TP: SGLang's default (no --ep-size): every rank holds every expert, each expert's
//   intermediate dim split across ranks (gate/up column-parallel, down row-parallel).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/weight_format.h"
#include "model/spec.h"

namespace strata {

// How a weight is split across tensor-parallel ranks.
enum class Sharding : uint8_t {
  kReplicated,  // full copy on every rank (norms, MLA latent projections, router)
  kColumn,      // dim 0 (output features) split: q/k/v/gate/up, q_b_proj, kv_b_proj
  kRow,         // dim 1 (input features) split: o_proj, down_proj
  kVocab,    // dim 0 (vocab) split in balanced ranges (the first ranks one row more): embed_tokens,
             // lm_head
  kKvHeads,  // dim 0 split by KV heads; a head is replicated when tp > num_kv_heads
};
inline constexpr EnumName<Sharding> kShardingNames[] = {{Sharding::kReplicated, "replicated"},
                                                        {Sharding::kColumn, "column"},
                                                        {Sharding::kRow, "row"},
                                                        {Sharding::kVocab, "vocab"},
                                                        {Sharding::kKvHeads, "kv_heads"}};
constexpr const auto& enum_names(Sharding) { return kShardingNames; }

enum class WeightRole : uint8_t {
  kEmbedding,
  kLmHead,
  kNorm,
  kAttention,
  kDenseMlp,  // dense MLP layers (llama, DeepSeek's first_k_dense_replace layers)
  kSharedExpert,
  kRouter,  // mlp.gate.weight and e_score_correction_bias
  kRoutedExpert,
};
inline constexpr EnumName<WeightRole> kWeightRoleNames[] = {
    {WeightRole::kEmbedding, "embedding"}, {WeightRole::kLmHead, "lm_head"},
    {WeightRole::kNorm, "norm"},           {WeightRole::kAttention, "attention"},
    {WeightRole::kDenseMlp, "dense_mlp"},  {WeightRole::kSharedExpert, "shared_expert"},
    {WeightRole::kRouter, "router"},       {WeightRole::kRoutedExpert, "routed_expert"}};
constexpr const auto& enum_names(WeightRole) { return kWeightRoleNames; }

struct WeightEntry {
  std::string name;            // HF logical name, e.g. "model.layers.3.self_attn.q_a_proj.weight"
  std::vector<int64_t> shape;  // logical shape: [out, in] for linears, [n] for norms/biases
  DType dtype = DType::kBF16;  // element type of the stored values (kInt4Packed, kFP8E4M3, ...)
  QuantMethod quant = QuantMethod::kNone;
  Sharding sharding = Sharding::kReplicated;
  WeightRole role = WeightRole::kAttention;
  int layer = -1;        // decoder layer, -1 for embedding / final norm / lm_head
  int expert = -1;       // routed expert index, -1 otherwise
  int64_t head_dim = 0;  // kKvHeads only: rows per KV head

  int64_t numel() const;
};

struct QuantLayout {
  int int4_group_size = 32;  // input elements per bf16 scale (compressed-tensors group)
  int fp8_block_out = 128;   // fp8 block: one float32 scale per block_out x block_in
  int fp8_block_in = 128;
};

// The INT4 group and fp8 block sizes `spec`'s quantization_config gives (defaults where it is
// silent: group 32, blocks 128 x 128).
QuantLayout quant_layout(const ModelSpec& spec);

// Every weight of `spec` in checkpoint order (embedding, layers, final norm, lm_head).
// Cost: O(layers x experts) entries (~70K for Kimi-K2.5); a few milliseconds.
std::vector<WeightEntry> build_inventory(const ModelSpec& spec);

// The entry's shape on one rank under tensor parallelism `tp` (>= 1).
std::vector<int64_t> shard_shape(const WeightEntry& w, int tp);

// Bytes of a tensor of `shape` in w's storage format: values plus quantization scales
// (INT4: 4 bits per value + one bf16 scale per group along the input dim; fp8 block: 1 byte per
// value + one float32 per block). Pass w.shape for the full tensor, shard_shape() for a rank.
int64_t storage_bytes(const WeightEntry& w, const std::vector<int64_t>& shape,
                      const QuantLayout& layout);

// The format a quantized entry is stored in (kDense with the entry's dtype otherwise).
LinearFormat stored_format(const WeightEntry& w, const QuantLayout& layout);

// Bytes a backend with `policy` holds for the tensor of `shape` (w.shape or a shard_shape): the
// one formula the planner and the loaders share (arch/ loads exactly this; a test checks every
// fixture). Linear weights take linear_device_bytes of policy.device_format(stored)
// (core/weight_format.h: the packed layouts' padding included); every other tensor the policy's
// dense dtype, except biases and e_score_correction_bias (float32 on every
// backend: the GEMM epilogues read float32) and MLA's kv_b_proj (always dense: it becomes the
// absorbed per-head W_UK / W_UV).
int64_t device_bytes(const WeightEntry& w, const std::vector<int64_t>& shape,
                     const QuantLayout& layout, const WeightPolicy& policy);

// The CUDA backend's policy: bf16, fp8 block and INT4 kept packed. What `strata plan` assumes.
constexpr WeightPolicy kGpuWeightPolicy{
    .dense_dtype = DType::kBF16, .keep_fp8_block = true, .keep_int4 = true};

// Names of the checkpoint tensors holding one logical weight: "<m>.weight" plainly;
// "<m>.weight_packed", "<m>.weight_scale", "<m>.weight_shape" for INT4;
// "<m>.weight", "<m>.weight_scale_inv" for fp8 block.
std::vector<std::string> stored_tensor_names(const WeightEntry& w);

struct InventorySummary {
  int64_t total_params = 0;
  int64_t active_params = 0;         // per token, see the header comment
  int64_t routed_expert_params = 0;  // all routed experts of all layers
  int64_t total_bytes = 0;           // whole checkpoint (values + scales)
  // Device bytes of rank 0's weights (the largest shard when splits are uneven) under the
  // policy summarize_inventory was given: device_bytes over shard_shape, plus the zero row the
  // vocab-parallel embedding appends under tensor parallelism (arch/tp.h).
  int64_t bytes_per_rank = 0;
  // Bytes per storage dtype over the whole model; scales are counted with their weight's dtype.
  int64_t bf16_bytes = 0;
  int64_t int4_bytes = 0;
  int64_t fp8_bytes = 0;
  int64_t f32_bytes = 0;
  int64_t other_bytes = 0;
};

InventorySummary summarize_inventory(const ModelSpec& spec, const std::vector<WeightEntry>& inv,
                                     int tp, const QuantLayout& layout = {},
                                     const WeightPolicy& policy = kGpuWeightPolicy);

inline const char* sharding_name(Sharding s) { return enum_name(s).data(); }
inline const char* weight_role_name(WeightRole r) { return enum_name(r).data(); }

}  // namespace strata
