// Named changes to the CUDA backend's tunables that the benches' --variants time against the
// defaults in one process (rank_step_bench: the decode step; moe_bench: the MoE layer's experts).
#pragma once

#include <string>

#include "backend/cuda/tunables.h"

namespace strata::bench {

struct Variant {
  const char* name;
  const char* what;
  void (*apply)(cuda::CudaTunables&);
};
inline constexpr Variant kVariants[] = {
    {"defaults",
     "no change: a control timed among the variants (the first graph timing of a "
     "process reads slower at times)",
     [](cuda::CudaTunables&) {}},
    {"unfused", "CudaTunables::fusion off", [](cuda::CudaTunables& t) { t.fusion = false; }},
    {"cublas_heads", "per-head linears on cuBLAS's batched GEMM (per_head_gemv_max_tokens 0)",
     [](cuda::CudaTunables& t) { t.per_head_gemv_max_tokens = 0; }},
    {"moe_grouped",
     "INT4 experts on the grouped MoE GEMV at every batch (moe_int4_reg_max_assignments 0)",
     [](cuda::CudaTunables& t) {
       t.moe_int4_reg_max_assignments = 0;
       t.moe_int4_reg_planned = false;
     }},
    {"moe_ids_only", "INT4 experts on the register GEMV by ids only (moe_int4_reg_planned off)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_planned = false; }},
    {"fp8_bf16x", "FP8 experts' decode GEMVs against bf16 x (moe_fp8_f16 off)",
     [](cuda::CudaTunables& t) { t.moe_fp8_f16 = false; }},
    {"fp8_launch_stage",
     "FP8 experts' f16 GEMVs after a staging launch at every size (moe_fp8_f16_smem_max_tokens 0)",
     [](cuda::CudaTunables& t) { t.moe_fp8_f16_smem_max_tokens = 0; }},
    {"no_ws_down",
     "MoE prefill down projection on the x-resident GEMM (moe_gemm_weight_stationary off)",
     [](cuda::CudaTunables& t) { t.moe_gemm_weight_stationary = false; }},
    {"no_gemm_pipe",
     "MoE prefill GEMMs on the two-CTA kernel, not the producer-warp one "
     "(moe_gemm_pipe off)",
     [](cuda::CudaTunables& t) { t.moe_gemm_pipe = false; }},
    {"no_int4_down_combine",
     "INT4 experts' down and combine as two launches at batch 1 (moe_int4_down_combine off)",
     [](cuda::CudaTunables& t) { t.moe_int4_down_combine = false; }},
    {"no_combine_cluster",
     "MoE combine + norm one CTA a token at every batch (moe_combine_cluster_max_tokens 0)",
     [](cuda::CudaTunables& t) { t.moe_combine_cluster_max_tokens = 0; }},
    {"no_narrow_tails",
     "MoE prefill down projection's last tiles at wgmma n 64 (moe_gemm_narrow_tails off)",
     [](cuda::CudaTunables& t) { t.moe_gemm_narrow_tails = false; }},
    {"no_mla_early_kv", "MLA decode copies its first stages after its PDL wait (mla_early_kv off)",
     [](cuda::CudaTunables& t) { t.mla_early_kv = false; }},
    {"moe_unrounded", "INT4 experts' weights unrounded before the mma (moe_int4_reg_round off)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_round = false; }},
    {"moe_gu_rounded",
     "INT4 experts' register-GEMV gate_up rounding its weights to bf16 as the flat down and "
     "split gate_up do (moe_int4_gate_up_round on)",
     [](cuda::CudaTunables& t) { t.moe_int4_gate_up_round = true; }},
    {"moe_split_unrounded",
     "INT4 experts' split gate_up (by ids, few tokens) unrounded at group 32 "
     "(moe_int4_split_round 0)",
     [](cuda::CudaTunables& t) { t.moe_int4_split_round = 0; }},
    {"moe_split_unrounded_tma",
     "INT4 experts' split gate_up unrounded where its weights come by TMA (one wave: T = 1), "
     "rounded on the register ring (moe_int4_split_round -1)",
     [](cuda::CudaTunables& t) { t.moe_int4_split_round = -1; }},
    {"moe_split_rounded",
     "INT4 experts' split gate_up rounding its weights (moe_int4_split_round 1)",
     [](cuda::CudaTunables& t) { t.moe_int4_split_round = 1; }},
    {"no_int4_x_tma", "W4A16 GEMV: x loaded by every thread, no bulk copy (int4_gemv_x_tma 0)",
     [](cuda::CudaTunables& t) { t.int4_gemv_x_tma = 0; }},
    {"int4_x_tma8", "W4A16 GEMV: x of up to 8 KB by one bulk copy (int4_gemv_x_tma 8192)",
     [](cuda::CudaTunables& t) { t.int4_gemv_x_tma = 8192; }},
    {"moe_rows1", "INT4 experts' register GEMV: one row tile a k tile (moe_int4_reg_rows 1)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_rows = 1; }},
    {"moe_split_auto", "INT4 experts: the kernel's blocks per work item (moe_int4_reg_split 0)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_split = 0; }},
    {"moe_split2", "INT4 experts: two blocks at least per work item (moe_int4_reg_split 2)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_split = 2; }},
    {"moe_split3", "INT4 experts: three blocks at least per work item (moe_int4_reg_split 3)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_split = 3; }},
    {"moe_split4", "INT4 experts: four blocks at least per work item (moe_int4_reg_split 4)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_split = 4; }},
    {"moe_rows8", "INT4 experts: 8-row plan tiles (moe_int4_reg_tile_rows 8)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_tile_rows = 8; }},
    {"moe_rows4", "INT4 experts: 4-row plan tiles (moe_int4_reg_tile_rows 4)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_tile_rows = 4; }},
    {"moe_s7_before", "INT4 experts as before 2026-12-02 evening (split 0, down_units 0: 32)",
     [](cuda::CudaTunables& t) {
       t.moe_int4_reg_split = 0;
       t.moe_int4_reg_down_units = 0;
     }},
    {"moe_down64", "INT4 experts: down blocks of up to 64 row tiles (moe_int4_reg_down_units)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_down_units = 64; }},
    {"moe_down128", "INT4 experts: down blocks of up to 128 row tiles (moe_int4_reg_down_units)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_down_units = 128; }},
    {"moe_down448", "INT4 experts: down blocks of up to 448 row tiles (moe_int4_reg_down_units)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_down_units = 448; }},
    {"moe_split2_down128", "INT4 experts: moe_split2 and moe_down128 together",
     [](cuda::CudaTunables& t) {
       t.moe_int4_reg_split = 2;
       t.moe_int4_reg_down_units = 128;
     }},
    {"moe_gu_warps16", "INT4 experts: gate_up blocks of 16 warps (moe_int4_reg_gate_up_warps)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_gate_up_warps = 16; }},
    {"pdl_early", "decode kernels trigger their successor before waiting (pdl_early)",
     [](cuda::CudaTunables& t) { t.pdl_early = true; }},
    {"unfused_mla_inputs",
     "MLA's attention inputs as four launches (norm, rope, copy_columns, KV write; "
     "mla_inputs_fusion off)",
     [](cuda::CudaTunables& t) { t.mla_inputs_fusion = false; }},
    // The GEMV pair and side branches are on by default (tunables.h, 2026-12-03): these take them
    // off, alone and together.
    {"no_gemv_pair", "q_a / q_proj and kv_a as two GEMV launches (gemv_pair_fusion off)",
     [](cuda::CudaTunables& t) { t.gemv_pair_fusion = false; }},
    {"no_side_branch",
     "shared experts and W_UK in order on the one stream (side_branch_max_rows 0)",
     [](cuda::CudaTunables& t) { t.side_branch_max_rows = 0; }},
    {"no_segments",
     "each graph-mode step one graph, launched once recorded (graph_segment_launches 0)",
     [](cuda::CudaTunables& t) { t.graph_segment_launches = 0; }},
    {"segments16", "graph-mode steps launched in segments of 16 launches (2- and 4-layer cuts)",
     [](cuda::CudaTunables& t) { t.graph_segment_launches = 16; }},
    {"segments32", "graph-mode steps launched in segments of 32 launches",
     [](cuda::CudaTunables& t) { t.graph_segment_launches = 32; }},
    {"segments64", "graph-mode steps launched in segments of 64 launches (graph_segment_launches)",
     [](cuda::CudaTunables& t) { t.graph_segment_launches = 64; }},
    {"segments128", "graph-mode steps launched in segments of 128 launches",
     [](cuda::CudaTunables& t) { t.graph_segment_launches = 128; }},
    {"segments256", "graph-mode steps launched in segments of 256 launches",
     [](cuda::CudaTunables& t) { t.graph_segment_launches = 256; }},
    {"seg_first_off",
     "every graph segment of graph_segment_launches (graph_first_segment_launches 0)",
     [](cuda::CudaTunables& t) { t.graph_first_segment_launches = 0; }},
    {"seg_first8_256", "graph segments of 8, 16, ... doubling up to 256 launches",
     [](cuda::CudaTunables& t) {
       t.graph_first_segment_launches = 8;
       t.graph_segment_launches = 256;
     }},
    {"gemv_norm", "q_a's RMSNorm inside the q_b GEMV (gemv_norm_fusion)",
     [](cuda::CudaTunables& t) { t.gemv_norm_fusion = true; }},
    {"combine_norm",
     "the next layer's add_rms_norm inside the MoE combine (moe_combine_norm_fusion)",
     [](cuda::CudaTunables& t) { t.moe_combine_norm_fusion = true; }},
    {"mla_rows8", "MLA decode kernel blocks of 8 query rows at any head count (mla_decode_rows 8)",
     [](cuda::CudaTunables& t) { t.mla_decode_rows = 8; }},
    {"mla_sgroups2",
     "MLA decode kernel's 16-row blocks with two groups of S warps (mla_s_groups 2)",
     [](cuda::CudaTunables& t) { t.mla_s_groups = 2; }},
    {"mla_sgroups1", "MLA decode kernel's 16-row blocks with one group of S warps (mla_s_groups 1)",
     [](cuda::CudaTunables& t) { t.mla_s_groups = 1; }},
    {"mla_pf0", "MLA decode kernel without L2 prefetch (mla_l2_prefetch 0)",
     [](cuda::CudaTunables& t) { t.mla_l2_prefetch = 0; }},
    {"mla_pf1", "MLA decode kernel's L2 prefetch one chunk ahead (mla_l2_prefetch 1)",
     [](cuda::CudaTunables& t) { t.mla_l2_prefetch = 1; }},
    {"mla_sgroups3",
     "MLA decode kernel's 16-row blocks with two groups of S warps by dims (mla_s_groups 3)",
     [](cuda::CudaTunables& t) { t.mla_s_groups = 3; }},
    {"mla_splits16", "MLA attention's key splits capped at 16 (mla_max_splits)",
     [](cuda::CudaTunables& t) { t.mla_max_splits = 16; }},
    {"mla_splits32", "MLA attention's key splits capped at 32 (mla_max_splits)",
     [](cuda::CudaTunables& t) { t.mla_max_splits = 32; }},
    {"no_flat_down",
     "INT4 experts: the down projection in per-tile blocks (moe_int4_reg_flat_down off)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_flat_down = false; }},
    {"side_rows2", "side branches up to 2 rows, GEMV sizes only (session 9's side_branch_max_rows)",
     [](cuda::CudaTunables& t) { t.side_branch_max_rows = 2; }},
    {"side_rows64", "side branches up to 64 rows (side_branch_max_rows; GEMMs on their own cuBLAS)",
     [](cuda::CudaTunables& t) { t.side_branch_max_rows = 64; }},
    {"side_rows256", "side branches up to 256 rows (side_branch_max_rows)",
     [](cuda::CudaTunables& t) { t.side_branch_max_rows = 256; }},
    {"side_rows_all", "side branches at every batch, prefill included (side_branch_max_rows)",
     [](cuda::CudaTunables& t) { t.side_branch_max_rows = 1 << 30; }},
    {"flat_side256", "moe_flat_down and side_rows256 together",
     [](cuda::CudaTunables& t) {
       t.moe_int4_reg_flat_down = true;
       t.side_branch_max_rows = 256;
     }},
    {"no_split_gu",
     "INT4 experts: gate_up by ids on the register GEMV (moe_int4_split_gate_up off)",
     [](cuda::CudaTunables& t) { t.moe_int4_split_gate_up = false; }},
    {"flat_down_1cta", "INT4 experts: the flat down projection's grid one CTA an SM",
     [](cuda::CudaTunables& t) { t.moe_int4_flat_ctas_per_sm = 1; }},
    {"gemv_ks1", "bf16 decode GEMVs: one warp a row (gemv_max_ksplit 1)",
     [](cuda::CudaTunables& t) { t.gemv_max_ksplit = 1; }},
    {"gemv_ks2", "bf16 decode GEMVs: at most two warps a row (gemv_max_ksplit 2)",
     [](cuda::CudaTunables& t) { t.gemv_max_ksplit = 2; }},
    {"gemv_w4", "bf16 decode GEMVs: blocks of 4 warps (gemv_block_warps 4)",
     [](cuda::CudaTunables& t) { t.gemv_block_warps = 4; }},
    {"moe_ids32", "INT4 experts by ids (split gate_up, flat down) up to 32 assignments",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_max_assignments = 32; }},
    {"moe_ids64", "INT4 experts by ids up to 64 assignments (moe_int4_reg_max_assignments)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_max_assignments = 64; }},
    {"moe_ids128", "INT4 experts by ids up to 128 assignments (moe_int4_reg_max_assignments)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_max_assignments = 128; }},
    {"moe_ids256", "INT4 experts by ids up to 256 assignments (moe_int4_reg_max_assignments)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_max_assignments = 256; }},
    {"session10",
     "session 10's defaults: gate_up by ids on the register GEMV, by ids up to 16 "
     "assignments, up to 4 warps a bf16 GEMV row",
     [](cuda::CudaTunables& t) {
       t.moe_int4_split_gate_up = false;
       t.moe_int4_reg_max_assignments = 16;
       t.gemv_max_ksplit = 4;
     }},
    {"gemv_ks4", "bf16 decode GEMVs: up to four warps a row (session 10's gemv_max_ksplit)",
     [](cuda::CudaTunables& t) { t.gemv_max_ksplit = 4; }},
    {"moe_ids16", "INT4 experts by ids up to 16 assignments (session 10's threshold)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_max_assignments = 16; }},
    {"mla_inputs_prefetch", "MLA inputs kernel: the latent norm's weights into L2 before its wait",
     [](cuda::CudaTunables& t) { t.mla_inputs_norm_prefetch = true; }},
    {"no_router_preload", "the MoE router GEMV's weights loaded after its PDL wait",
     [](cuda::CudaTunables& t) { t.moe_router_preload = false; }},
    {"gemv_prefetch2k",
     "bf16 decode GEMVs: each row's first 2,048 weights prefetched before the "
     "PDL wait (gemv_prefetch_elems, with the first batch into registers)",
     [](cuda::CudaTunables& t) { t.gemv_prefetch_elems = 2048; }},
    {"mla_mma_small",
     "MLA attention on the mma kernel below 17 query rows (mla_decode_min_rows 17: batch 1)",
     [](cuda::CudaTunables& t) { t.mla_decode_min_rows = 17; }},
    {"no_mla_query",
     "a q_lora layer's MLA query as the q_b GEMV, W_UK on a side branch and the attention inputs "
     "(mla_query_fusion off)",
     [](cuda::CudaTunables& t) { t.mla_query_fusion = false; }},
    {"uv_oproj",
     "MLA's W_UV and o_proj as one launch with o_proj's rows in shared memory before the PDL "
     "wait and a grid barrier (head_gemv_linear_fusion on; off, the default: two launches)",
     [](cuda::CudaTunables& t) { t.head_gemv_linear_fusion = true; }},
    {"mla_chunks1",
     "MLA splits of one 64-key chunk on the default decode kernel "
     "(mla_min_split_chunks 1)",
     [](cuda::CudaTunables& t) { t.mla_min_split_chunks = 1; }},
    {"gemv_preload_regs",
     "bf16 decode GEMVs: each lane's first batch of weights into registers before the PDL wait, "
     "no L2 prefetch (gemv_prefetch_elems -1)",
     [](cuda::CudaTunables& t) { t.gemv_prefetch_elems = -1; }},
    {"gemv_prefetch8k",
     "bf16 decode GEMVs: each row's first 8,192 weights prefetched before the "
     "PDL wait (gemv_prefetch_elems)",
     [](cuda::CudaTunables& t) { t.gemv_prefetch_elems = 8192; }},
    {"moe_split_gu",
     "INT4 experts: gate_up by ids with k split over a cluster (the launcher's shape)",
     [](cuda::CudaTunables& t) { t.moe_int4_split_gate_up = true; }},
    {"moe_split_gu_c1w8", "moe_split_gu, one CTA of 8 warps a tile pair",
     [](cuda::CudaTunables& t) {
       t.moe_int4_split_gate_up = true;
       t.moe_int4_split_cluster = 1;
       t.moe_int4_split_warps = 8;
     }},
    {"moe_split_gu_c2w8", "moe_split_gu, clusters of 2 CTAs of 8 warps",
     [](cuda::CudaTunables& t) {
       t.moe_int4_split_gate_up = true;
       t.moe_int4_split_cluster = 2;
       t.moe_int4_split_warps = 8;
     }},
    {"moe_split_gu_c8w2", "moe_split_gu, clusters of 8 CTAs of 2 warps",
     [](cuda::CudaTunables& t) {
       t.moe_int4_split_gate_up = true;
       t.moe_int4_split_cluster = 8;
       t.moe_int4_split_warps = 2;
     }},
    {"moe_split_gu_c8w4", "moe_split_gu, clusters of 8 CTAs of 4 warps (~32 warps an SM at T 1)",
     [](cuda::CudaTunables& t) {
       t.moe_int4_split_gate_up = true;
       t.moe_int4_split_cluster = 8;
       t.moe_int4_split_warps = 4;
     }},
    {"moe_split_gu_r2", "moe_split_gu with 2 k tiles in flight a warp",
     [](cuda::CudaTunables& t) {
       t.moe_int4_split_gate_up = true;
       t.moe_int4_split_ring = 2;
     }},
    {"moe_flat_down", "INT4 experts: the planned down projection as one flat stream",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_flat_down = true; }},
    {"moe_down150", "INT4 experts: down blocks of up to 150 row tiles (3 a Kimi rank's expert)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_down_units = 150; }},
    {"moe_down224", "INT4 experts: down blocks of up to 224 row tiles (2 a Kimi rank's expert)",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_down_units = 224; }},
    {"moe_down_w4", "INT4 experts: down blocks of 4 warps and up to 64 row tiles",
     [](cuda::CudaTunables& t) {
       t.moe_int4_reg_down_warps = 4;
       t.moe_int4_reg_down_units = 64;
     }},
    {"moe_down_w4_128", "INT4 experts: down blocks of 4 warps and up to 128 row tiles",
     [](cuda::CudaTunables& t) { t.moe_int4_reg_down_warps = 4; }},
    {"no_gemv_norm", "q_a's RMSNorm its own launch (gemv_norm_fusion off)",
     [](cuda::CudaTunables& t) { t.gemv_norm_fusion = false; }},
    {"no_combine_norm",
     "the next layer's add_rms_norm its own launch (moe_combine_norm_fusion off)",
     [](cuda::CudaTunables& t) { t.moe_combine_norm_fusion = false; }},
    {"mla_rows16", "MLA decode kernel blocks of 16 query rows (mla_decode_rows 16)",
     [](cuda::CudaTunables& t) { t.mla_decode_rows = 16; }},
    {"no_split_tma", "INT4 split gate_up through the register ring, not TMA (moe_int4_split_tma 0)",
     [](cuda::CudaTunables& t) { t.moe_int4_split_tma = 0; }},
    {"split_tma_all", "INT4 split gate_up by TMA wherever it fits (moe_int4_split_tma 1)",
     [](cuda::CudaTunables& t) { t.moe_int4_split_tma = 1; }},
    {"no_mla_fused_merge", "MLA splits merged by their own kernel (mla_fused_merge_max_splits 0)",
     [](cuda::CudaTunables& t) { t.mla_fused_merge_max_splits = 0; }},
    {"no_int4_add_norm",
     "W4A16: add_rms_norm as its own launch, not split between the GEMVs around it "
     "(int4_add_norm_fusion)",
     [](cuda::CudaTunables& t) { t.int4_add_norm_fusion = false; }},
    {"no_norm_preload", "RMSNorm's bf16 weights loaded after its PDL wait (norm_weight_preload)",
     [](cuda::CudaTunables& t) { t.norm_weight_preload = false; }},
    {"session9",
     "session 9's defaults (none of session 10's: gemv_norm, combine_norm, auto 8-row MLA, "
     "2-chunk splits, the flat down projection, side branches above 2 rows)",
     [](cuda::CudaTunables& t) {
       t.moe_int4_reg_flat_down = false;
       t.side_branch_max_rows = 2;
       t.gemv_norm_fusion = false;
       t.moe_combine_norm_fusion = false;
       t.mla_decode_rows = 0;
       t.mla_min_split_chunks = 1;
     }},
    {"session7", "neither the GEMV pair nor side branches (session 7's defaults)",
     [](cuda::CudaTunables& t) {
       t.gemv_pair_fusion = false;
       t.side_branch_max_rows = 0;
     }},
};
// Decode attention (the GQA kernel): its defaults' A/B.
inline constexpr Variant kDecodeAttentionVariants[] = {
    {"no_decode_early_kv",
     "decode attention copies its first chunks of old keys after its PDL wait, merged with "
     "qkv_rope or not (decode_early_kv off)",
     [](cuda::CudaTunables& t) { t.decode_early_kv = false; }},
    {"no_decode_rope_fusion",
     "qkv_rope as its own launch before decode attention (decode_rope_fusion_max_seqs 0)",
     [](cuda::CudaTunables& t) { t.decode_rope_fusion_max_seqs = 0; }},
    {"decode_rope_fusion_all",
     "qkv_rope merged into decode attention at every batch (decode_rope_fusion_max_seqs 2^20)",
     [](cuda::CudaTunables& t) { t.decode_rope_fusion_max_seqs = 1 << 20; }},
    {"decode_split_tokens256", "decode attention splits of at least 256 keys",
     [](cuda::CudaTunables& t) { t.decode_min_split_tokens = 256; }},
    {"decode_split_tokens512", "decode attention splits of at least 512 keys",
     [](cuda::CudaTunables& t) { t.decode_min_split_tokens = 512; }},
    {"decode_split_tokens1024", "decode attention splits of at least 1,024 keys",
     [](cuda::CudaTunables& t) { t.decode_min_split_tokens = 1024; }},
    {"decode_bps2", "decode attention's split-KV target two blocks per SM (decode_blocks_per_sm 2)",
     [](cuda::CudaTunables& t) { t.decode_blocks_per_sm = 2; }},
    {"decode_bps4",
     "decode attention's split-KV target four blocks per SM (decode_blocks_per_sm 4)",
     [](cuda::CudaTunables& t) { t.decode_blocks_per_sm = 4; }},
    {"decode_no_fill", "decode attention's splits: no second round filled (as before 2026-12-07)",
     [](cuda::CudaTunables& t) { t.decode_split_fill_second_round = false; }},
    {"decode_old_splits", "decode attention's split rule before 2026-12-07 (four blocks an SM)",
     [](cuda::CudaTunables& t) {
       t.decode_blocks_per_sm = 4;
       t.decode_large_batch_blocks_per_sm = 4;
       t.decode_split_fill_second_round = false;
     }},
};

inline const Variant* find_variant(const std::string& name) {
  for (const Variant& v : kVariants)
    if (name == v.name) return &v;
  for (const Variant& v : kDecodeAttentionVariants)
    if (name == v.name) return &v;
  return nullptr;
}
// Every variant's name, space-separated (the benches' error for an unknown one).
inline std::string variant_names() {
  std::string all;
  for (const Variant& v : kVariants) all += std::string(" ") + v.name;
  for (const Variant& v : kDecodeAttentionVariants) all += std::string(" ") + v.name;
  return all;
}

}  // namespace strata::bench
