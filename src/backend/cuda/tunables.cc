// The CUDA backend's environment, read here and nowhere else in backend/cuda/ (tunables.h).
#include "backend/cuda/tunables.h"

#include <cstdlib>
#include <mutex>
#include <string_view>

#include "backend/cuda/linear.h"
#include "backend/cuda/mla_attention.h"
#include "backend/cuda/per_head_gemv.h"
#include "core/check.h"

namespace strata::cuda {

CudaTunables CudaTunables::from_environment() {
  CudaTunables t;
  if (const char* v = std::getenv("STRATA_CUDA_PDL")) t.pdl = !(v[0] == '0');
  if (const char* v = std::getenv("STRATA_CUDA_PREFILL_SPLIT");
      v != nullptr && *v >= '0' && *v <= '2')
    t.prefill_split_mode = *v - '0';
  if (const char* v = std::getenv("STRATA_STEP_TIMING"))
    t.log_eager_steps = std::string_view(v) == "1";
  if (const char* v = std::getenv("STRATA_GRAPH_DEBUG"))
    t.explain_graph_captures = std::string_view(v) == "1";
  if (const char* v = std::getenv("STRATA_FP8_W8A8")) t.fp8_w8a8 = std::string_view(v) == "1";
  return t;
}

void CudaTunables::check() const {
  CHECK_MSG(gemv_max_rows >= 1 && gemv_max_rows <= kGemvMaxRows, "gemv_max_rows {}", gemv_max_rows);
  CHECK_MSG(gemv_max_ksplit == 1 || gemv_max_ksplit == 2 || gemv_max_ksplit == 4,
            "gemv_max_ksplit {}", gemv_max_ksplit);
  CHECK_MSG(gemv_prefetch_elems >= -1, "gemv_prefetch_elems {}", gemv_prefetch_elems);
  CHECK_MSG(gemv_block_warps == 4 || gemv_block_warps == 8, "gemv_block_warps {}",
            gemv_block_warps);
  CHECK_MSG(head_gemv_linear_barrier_timeout_us >= 0, "head_gemv_linear_barrier_timeout_us {}",
            head_gemv_linear_barrier_timeout_us);
  CHECK_MSG(per_head_gemv_max_tokens >= 0 && per_head_gemv_max_tokens <= kPerHeadGemvMaxTokens,
            "per_head_gemv_max_tokens {}", per_head_gemv_max_tokens);
  CHECK_MSG(int4_gemv_depth >= 0, "int4_gemv_depth {}", int4_gemv_depth);
  CHECK_MSG(int4_gemv_blocks_per_sm >= 0 && int4_gemv_blocks_per_sm <= 2,
            "int4_gemv_blocks_per_sm {} (the registers allow two blocks of 8 warps)",
            int4_gemv_blocks_per_sm);
  CHECK_MSG(int4_gemv_ring == 0 || int4_gemv_ring == 8 || int4_gemv_ring == 16, "int4_gemv_ring {}",
            int4_gemv_ring);
  CHECK_MSG(int4_gemv_rows == 1 || int4_gemv_rows == 4, "int4_gemv_rows {}", int4_gemv_rows);
  CHECK_MSG(int4_gemv_x_tma >= 0, "int4_gemv_x_tma {}", int4_gemv_x_tma);
  CHECK_MSG(moe_int4_reg_rows == 1 || moe_int4_reg_rows == 4, "moe_int4_reg_rows {}",
            moe_int4_reg_rows);
  CHECK_MSG(moe_int4_reg_max_assignments >= 0, "moe_int4_reg_max_assignments {}",
            moe_int4_reg_max_assignments);
  CHECK_MSG(moe_int4_split_cluster == 0 || moe_int4_split_cluster == 1 ||
                moe_int4_split_cluster == 2 || moe_int4_split_cluster == 4 ||
                moe_int4_split_cluster == 8,
            "moe_int4_split_cluster {}", moe_int4_split_cluster);
  CHECK_MSG(moe_int4_split_tma >= -1 && moe_int4_split_tma <= 1, "moe_int4_split_tma {}",
            moe_int4_split_tma);
  CHECK_MSG(moe_int4_split_round >= -1 && moe_int4_split_round <= 1, "moe_int4_split_round {}",
            moe_int4_split_round);
  CHECK_MSG(moe_int4_split_warps >= 0 && moe_int4_split_warps <= 8, "moe_int4_split_warps {}",
            moe_int4_split_warps);
  CHECK_MSG(moe_int4_flat_ctas_per_sm >= 0 && moe_int4_flat_ctas_per_sm <= 2,
            "moe_int4_flat_ctas_per_sm {}", moe_int4_flat_ctas_per_sm);
  CHECK_MSG(moe_int4_split_ring == 0 || moe_int4_split_ring == 2 || moe_int4_split_ring == 4,
            "moe_int4_split_ring {}", moe_int4_split_ring);
  CHECK_MSG(moe_fp8_f16_smem_max_tokens >= 0, "moe_fp8_f16_smem_max_tokens {}",
            moe_fp8_f16_smem_max_tokens);
  CHECK_MSG(side_branch_max_rows >= 0, "side_branch_max_rows {}", side_branch_max_rows);
  CHECK_MSG(graph_segment_launches >= 0, "graph_segment_launches {}", graph_segment_launches);
  CHECK_MSG(graph_first_segment_launches >= 0, "graph_first_segment_launches {}",
            graph_first_segment_launches);
  CHECK_MSG(mla_max_splits >= 0, "mla_max_splits {}", mla_max_splits);
  CHECK_MSG(mla_decode_min_rows >= 0, "mla_decode_min_rows {}", mla_decode_min_rows);
  CHECK_MSG(mla_min_split_chunks >= 1, "mla_min_split_chunks {}", mla_min_split_chunks);
  CHECK_MSG(mla_fused_merge_max_splits >= 0, "mla_fused_merge_max_splits {}",
            mla_fused_merge_max_splits);
  CHECK_MSG(mla_decode_rows == -1 || mla_decode_rows == 0 || mla_decode_rows == 8 ||
                mla_decode_rows == 16,
            "mla_decode_rows {}", mla_decode_rows);
  CHECK_MSG(mla_s_groups >= 1 && mla_s_groups <= 3, "mla_s_groups {}", mla_s_groups);
  CHECK_MSG(mla_l2_prefetch >= -1 && mla_l2_prefetch <= kMlaDecodeMaxL2Prefetch,
            "mla_l2_prefetch {}", mla_l2_prefetch);
  CHECK_MSG(decode_blocks_per_sm >= 1, "decode_blocks_per_sm {}", decode_blocks_per_sm);
  CHECK_MSG(decode_large_batch_blocks_per_sm >= 1, "decode_large_batch_blocks_per_sm {}",
            decode_large_batch_blocks_per_sm);
  CHECK_MSG(decode_min_split_tokens >= 1, "decode_min_split_tokens {}", decode_min_split_tokens);
  CHECK_MSG(decode_rope_fusion_max_seqs >= 0, "decode_rope_fusion_max_seqs {}",
            decode_rope_fusion_max_seqs);
  CHECK_MSG(prefill_split_mode >= 0 && prefill_split_mode <= 2, "prefill_split_mode {}",
            prefill_split_mode);
  CHECK_MSG(prefill_split_blocks_per_sm >= 1, "prefill_split_blocks_per_sm {}",
            prefill_split_blocks_per_sm);
}

NcclEnv NcclEnv::from_environment() {
  NcclEnv e;
  if (const char* s = std::getenv("STRATA_NCCL_TIMEOUT_S")) {
    const double v = std::atof(s);
    if (v > 0) e.timeout_s = v;
  }
  if (const char* hex = std::getenv("STRATA_NCCL_ID")) e.id_hex = hex;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) e.visible_devices = v;
  return e;
}

void apply_nccl_env_defaults() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("NCCL_NVLS_ENABLE") == nullptr) setenv("NCCL_NVLS_ENABLE", "0", 0);
  });
}

}  // namespace strata::cuda
