// The CUDA backend's launch kinds: one list gives each its id (part of a graph step's signature,
// graph_recorder.h) and its name (profiles).
#pragma once

namespace strata::cuda {

// X(enumerator, name). Not clang-formatted: one op added would realign every line of the table
// (the macro is one logical line to clang-format), so every branch adding an op would conflict.
// clang-format off
#define STRATA_CUDA_OPS(X)            \
  X(kOpCopy, "h2d_copy")              \
  X(kOpCopyRows, "copy_rows")         \
  X(kOpRmsNorm, "rms_norm")           \
  X(kOpAdd, "add")                    \
  X(kOpSiluMul, "silu_mul")           \
  X(kOpRope, "rope")                  \
  X(kOpGemv, "gemv")                  \
  X(kOpGemm, "gemm")                  \
  X(kOpBias, "bias")                  \
  X(kOpKvWrite, "kv_write")           \
  X(kOpDecode, "attn_decode")         \
  X(kOpPrefill, "attn_prefill")       \
  X(kOpMlaKvWrite, "mla_kv_write")    \
  X(kOpMlaAttention, "mla_attention") \
  X(kOpGemmBatched, "gemm_batched")   \
  X(kOpSlice, "slice")                \
  X(kOpSample, "sample")              \
  X(kOpEditLogits, "edit_logits")     \
  X(kOpGemvGlu, "gemv_silu")          \
  X(kOpQkvRope, "qkv_rope_kv")        \
  X(kOpGemvDev, "gemv_dev")           \
  X(kOpGemvDevGlu, "gemv_dev_silu")   \
  X(kOpInt4Gemv, "int4_gemv")         \
  X(kOpInt4GemvGlu, "int4_gemv_silu") \
  X(kOpInt4Gemm, "int4_gemm")         \
  X(kOpFp8Gemv, "fp8_gemv")           \
  X(kOpFp8GemvGlu, "fp8_gemv_silu")   \
  X(kOpFp8Linear, "fp8_linear")       \
  X(kOpFp8Dequant, "fp8_dequant")     \
  X(kOpMoeRouter, "moe_router")       \
  X(kOpGemmF32, "gemm_f32")           \
  X(kOpBiasF32, "bias_f32")           \
  X(kOpMoeRoute, "moe_route")         \
  X(kOpMoeExperts, "moe_experts")     \
  X(kOpLogitStats, "logit_stats")     \
  X(kOpTopK, "top_k")                 \
  X(kOpMlaDcpMerge, "mla_dcp_merge") \
  X(kOpGemmDet, "gemm_det")          \
  X(kOpInt4Dequant, "int4_dequant")  \
  X(kOpPerHeadGemv, "per_head_gemv") \
  X(kOpKvMove, "kv_move")            \
  X(kOpMlaInputs, "mla_inputs") \
  X(kOpGemvPair, "gemv_pair") \
  X(kOpSideFork, "side_fork") \
  X(kOpSideEnd, "side_end") \
  X(kOpSideJoin, "side_join") \
  X(kOpGemvNorm, "gemv_norm") \
  X(kOpCollective, "collective") \
  X(kOpMlaQuery, "mla_query") \
  X(kOpHeadGemvLinear, "head_gemv_linear") \
  X(kOpInt4GemvNorm, "int4_gemv_norm") \
  X(kOpInt4GemvAdd, "int4_gemv_add")
// clang-format on

enum Op : int {
  kOpNone = 0,
#define STRATA_CUDA_OP_ENUM(id, name) id,
  STRATA_CUDA_OPS(STRATA_CUDA_OP_ENUM)
#undef STRATA_CUDA_OP_ENUM
      kOpCount
};

// The name of an op id ("?" for none or an unknown id).
inline const char* op_name(int op) {
  static constexpr const char* kNames[] = {"?",
#define STRATA_CUDA_OP_NAME(id, name) name,
                                           STRATA_CUDA_OPS(STRATA_CUDA_OP_NAME)
#undef STRATA_CUDA_OP_NAME
  };
  static_assert(sizeof kNames / sizeof kNames[0] == kOpCount);
  return op >= 0 && op < kOpCount ? kNames[op] : "?";
}

}  // namespace strata::cuda
