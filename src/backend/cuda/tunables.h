// Every launch tunable of the CUDA backend and every environment variable it reads, in one place.
//
// A CudaBackend owns one CudaTunables, read from the environment once when the backend is made
// (CudaTunables::from_environment) and changed only through CudaBackend::set_tunables
// (benchmarks' A/B runs, parity tests), which ends the step and drops the captured graphs. The
// kernels see the values through their launch parameters (launch.h): nothing here is a global.
// Each field says its environment variable (if any), its default and what measured the default
// (numbers: bench/RESULTS.md, H200).
//
// Environment variables of backend/cuda/, all read here:
//   STRATA_CUDA_PDL=0            CudaTunables::pdl off.
//   STRATA_CUDA_PREFILL_SPLIT=N  CudaTunables::prefill_split_mode (0, 1, 2).
//   STRATA_STEP_TIMING=1         CudaTunables::log_eager_steps (the engine reads it too).
//   STRATA_GRAPH_DEBUG=1         CudaTunables::explain_graph_captures.
//   STRATA_FP8_W8A8=1            CudaTunables::fp8_w8a8 (FP8-block linears as W8A8).
//   STRATA_NCCL_TIMEOUT_S=S      NcclEnv::timeout_s.
//   STRATA_NCCL_ID=HEX           NcclEnv::id_hex.
//   CUDA_VISIBLE_DEVICES         NcclEnv::visible_devices (only quoted in error messages).
//   NCCL_NVLS_ENABLE             set to 0 unless set (apply_nccl_env_defaults); NCCL reads it.
// Gone from the product with the development kernels they selected (bench/cuda/dev/):
// STRATA_CUDA_PREFILL (prefill attention variants) and STRATA_GEMV_MMA, STRATA_GEMV_MMA_MAX_ROWS
// (the tensor-core GEMV).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace strata::cuda {

struct CudaTunables {
  // ---- launches ----
  // Programmatic dependent launch of the decode-path kernels (common.cuh launch_pdl). Env
  // STRATA_CUDA_PDL=0 turns it off. Default on since the first graphs (batch-1 decode of the 8B
  // shape, RESULTS' table: graphs without PDL 5.122 ms/token on the old launch sequence,
  // 2026-11-30; the default path 4.142).
  bool pdl = true;
  // Decode kernels (GEMV, RMSNorm, fused rope/KV write, decode attention) trigger their successor
  // before waiting on their predecessor (common.cuh pdl_enter). No env. Default off: batch-1
  // decode 0.50 ms/token slower with it (4.81 -> 5.31 ms, 2026-11-29 night).
  bool pdl_early = false;
  // The fused ops (linear_silu_mul as one GEMV with a SwiGLU epilogue, qkv_rope_kv_write as one
  // launch) instead of the Backend defaults. No env. Default on: batch-1 decode 4.95-5.00 -> 4.81
  // ms/token (RESULTS "Decode history", 2026-11-29 night).
  bool fusion = true;
  // With fusion: MLA's attention inputs (Backend::mla_attention_inputs: the cache row's norm,
  // both ropes, q's rope columns into q_latent and the latent KV write) as one launch
  // (mla_inputs.h) instead of four. No env. Default on; off is the A/B of that fusion alone
  // (rank_step_bench --variants unfused_mla_inputs) and the parity tests' bitwise reference.
  bool mla_inputs_fusion = true;
  // With fusion: a q_lora layer's MLA query (Backend::mla_query: the q_a norm, q_b, q's rope,
  // W_UK and the cache rows) as one launch of clusters (mla_query.h) at up to 2 tokens, instead
  // of the q_b GEMV, W_UK on a side branch beside the attention inputs, and the join. No env.
  // Default on: a Kimi-K2.5 rank of tp 8 at batch 1, 61 layers projected from 4/8/12 cuts,
  // 4.328 -> 4.236 ms (-2.1%), 4.400 -> 4.361 (-0.9%), 4.425 -> 4.277 (-3.3%) in three calls,
  // batch 2 5.403 -> 5.290 (-2.1%) (rank_step_bench --variants, H200, 2026-12-04, session 25,
  // bench/results/2026-12-04-session25.md); off: variant no_mla_query.
  bool mla_query_fusion = true;

  // ---- decode GEMV (linear.cu) ----
  // Rows up to which a linear takes the GEMV (1..kGemvMaxRows); above, cuBLAS. No env. Default 2:
  // one decode step's linears of the 8B shape took 3.83 / 4.21 / 5.08 / 8.80 ms at m = 1 / 2 / 4
  // / 8 against cuBLAS's 4.83 / 4.69 / 4.53 / 4.72 ms (2026-11-30).
  int gemv_max_rows = 2;
  // Most warps that share one output row (1, 2 or 4); the launch takes the fewest that give every
  // SM ~48 warps of loads (2 for the 8B shape's qkv, o_proj and down). No env. Default 1 (a warp
  // streams whole rows): in the decode steps as the engine runs them (graphs, PDL;
  // rank_step_bench --variants gemv_ks1, H200, 2026-12-03) the 8B shape's batch 1 took 4.121 ms
  // against 4.195 with up to 4, Moonlight's batch 1 2.348 against 2.414, a Kimi-K2.5 rank's batch
  // 2 5.571 against 5.901 (61 layers projected). (2026-11-29, the 8B shape's GEMVs back to back
  // outside a step: 3.928 ms with 1, 3.847 with up to 4.)
  int gemv_max_ksplit = 1;
  // Leading weights of each row prefetched into L2 before the PDL wait (elements; 0 off; -1: only
  // the first batch into registers, variant gemv_preload_regs: H100s 2026-12-05, Moonlight /
  // Kimi rank batch 1 -0.8 / -1.6%, Llama-3.1-8B bf16 +0.9% in one run; Kimi -1.1 to +0.4% in
  // four more, within their spread). No env. Default
  // off: every GEMV got slower (one token's GEMVs 3.93 -> 4.37 ms, lm_head 237 -> 255 us; decode
  // step +0.2 ms/token; 2026-11-29 night).
  int64_t gemv_prefetch_elems = 0;
  // With fusion, graph mode: two consecutive plain GEMVs on the same x (MLA's q_a or q_proj, then
  // kv_a: arch/deepseek.cc records them back to back) as one launch (linear.h GemvParams::w2),
  // bitwise the two launches. No env. Default on: Moonlight bf16 batch 1 (rank_step_bench
  // --variants, H200, 2026-12-03) 2.831 against 2.897 ms a step (-2.3%; an earlier run -0.4%);
  // a Kimi-K2.5 rank of tp 8 at batch 1, 61 layers projected, 6.42 against 6.48 ms.
  bool gemv_pair_fusion = true;
  // With fusion, graph mode: a plain GEMV of up to 2 rows right after the rms_norm that made its
  // x (not in place: MLA's q_a norm before q_b, arch/deepseek.cc) normalizes x itself, and the
  // norm's launch goes (norm_prologue.cc; bitwise the two launches). No env. Default on: one kernel
  // boundary fewer a layer on the batch-1 critical path of DeepSeek-V3 / Kimi-K2.5 (q_lora); a
  // Kimi-K2.5 rank at batch 1, 4-layer cut, 0.506 against 0.520 ms a step (-2.7%; 61 layers
  // projected 5.98 against 6.73 ms; rank_step_bench --variants gemv_norm, H200, 2026-12-03).
  // add_rms_norms inside the GEMV, and the post-attention norm inside the MoE router GEMV, ran
  // slower and left the product (norm_prologue.cuh).
  bool gemv_norm_fusion = true;
  // With fusion, graph mode: an add_rms_norm right after the W4A16 register GEMV that made its x
  // (a dense layer's o_proj or down) becomes that GEMV's residual update (its epilogue: residual
  // += out) and a plain rms_norm of the residual, which the next W4A16 GEMV of up to 2 rows on its
  // output (qkv, gate_up) runs as its prologue; bitwise the three launches (norm_prologue.cc).
  // One launch fewer a norm on the batch-1 critical path: the Llama-3.1-8B W4A16 step ran 65
  // single-block add_rms_norms of ~3.6 us (H100 timeline, 2026-12-06 session 43). No env.
  // Default on: Llama-3.1-8B W4A16 batch 1, H100, 2026-12-07 session 45, seven processes, each
  // form one to three times beside a no-change control: -0.2 to -1.4% in six, +0.4% in one
  // (timeline: the norms' 177.6 us of increments go, the GEMVs' prologues add 107; wall -46 us).
  // Int4AddNorm.* checks the bits. A/B: variant no_int4_add_norm.
  bool int4_add_norm_fusion = true;
  // With fusion, graph mode: a linear of up to 2 rows right after the per-head GEMV that made its x
  // (MLA's W_UV, then o_proj: arch/mla.cc, arch/deepseek.cc) as one launch whose CTAs copy their
  // o_proj rows into shared memory before the PDL wait and meet at a grid barrier
  // (head_gemv_linear.h; bitwise the two launches). No env. Default off: against the two launches
  // the one was slower in 8 A/Bs, faster in 2, level in 2 (rank_step_bench, 61 layers projected,
  // batch 1; on: variant uv_oproj). H200s, 2026-12-05 session 27: a Kimi-K2.5 rank of tp 8 4.223 ->
  // 4.189 ms (-0.8%) and 4.174 -> 4.045 (-3.1%) with it on one machine, 4.457 -> 4.482 and 4.296 ->
  // 4.346 on another, Moonlight unchanged (bench/results/2026-12-05-session27.md). H100s, session
  // 35 (two machines): Kimi +0.3 / +1.1 / 0.0 / +3.1%, Moonlight bf16 +1.8 / +3.0 / +1.6% with it
  // (bench/results/2026-12-05-session35.md; a barrier with its phase bit loaded early and the
  // copies issued by warp 1 only brought it to the level of the two launches: the patch beside that
  // log). Measured and removed: the rows copied after the barrier (no gain); weights brought into
  // L2 by the MLA query's CTAs during the batch-1 attention (Kimi +4.2%, Moonlight +2.6%: they
  // share DRAM with the attention's own reads); 4-warp blocks for a SwiGLU GEMV of few rows (Kimi
  // +2.0%).
  bool head_gemv_linear_fusion = false;
  // How long (µs) a CTA of that launch waits at its grid barrier before making the per-head
  // outputs itself (head_gemv_linear.h: when the grid is not resident at once). No env. Default
  // 200, ~100 times the barrier's own time; 0 sends the tests through that path.
  int head_gemv_linear_barrier_timeout_us = 200;
  // With fusion, graph mode: the add_rms_norm recorded right after a MoE layer's experts (tp 1: the
  // next layer's input norm) runs inside their combine, one CTA a token (moe_combine.cu; bitwise
  // the two launches). No env. Default on: one launch a layer fewer at batch 1 (rms_norm ~2.8 us
  // a launch, ncu 2026-12-03); Moonlight bf16 batch 1 2.498 against 2.515 ms a step (-0.7%,
  // rank_step_bench --variants combine_norm, H200, 2026-12-03).
  bool moe_combine_norm_fusion = true;
  // The combine + norm of up to this many tokens splits each token's row over a cluster of CTAs
  // (up to 8, a divisor of the row's warps; their squares summed in the one-CTA order through
  // distributed shared memory: the same bits). 0: one CTA a token. Why: at batch 1 one SM read
  // the token's 8 expert rows, the shared experts' row and the residual (~140 KB at hidden
  // 7,168) alone. Rows of 16 warps or more only (hidden >= 4,096; moe_combine.cu has the
  // Moonlight numbers). No env. A/B: variant no_combine_cluster. Default 8: rank_step_bench, H200,
  // 2026-12-04, 61 layers, a Kimi-K2.5 rank at batch 1 4.599 / 4.655 / 4.521 against 4.706 /
  // 4.778 / 4.598 ms a step in three calls, batch 8 -0.8 / -0.5%; a DeepSeek-V3 rank batch 1 /
  // 8 -1.5 / -1.0%. Those one-rank runs merged the norm into the combine across the skipped
  // all-reduce, which a real rank cannot (fixed the same day: Backend::skipped_collective); so
  // this applies at tp 1 (MoE models of hidden >= 4,096), where the norm follows the combine.
  int moe_combine_cluster_max_tokens = 8;
  // INT4 experts at one token (top-k <= 8, no norm merged into the combine): the down projection
  // and the combine as one launch (moe_experts_int4_down_combine.cu; the same bits), the shared
  // experts' branch joined before it. Why: at batch 1 each dependent launch of a MoE layer's
  // routed path costs ~2 us of hand-off beyond its work (a Kimi-K2.5 rank's timeline, H200,
  // 2026-12-04: flat down ~4.5 us, combine ~3-4). No env. Default on: rank_step_bench, H200,
  // 2026-12-04, 61 layers, a Kimi-K2.5 rank at batch 1 4.548 against 4.733 ms a step (-3.9%;
  // batch 8, which does not take it, within the spread). A/B: variant no_int4_down_combine.
  // (An RMSNorm of a few rows over a cluster, for the rank's norms after its all-reduces, was
  // measured with it the same day: +0.9% alone, -0.1% beside this; not kept.)
  bool moe_int4_down_combine = true;
  // Side branches (backend/side_branch.h; arch/deepseek.cc: a MoE layer's shared experts beside
  // its router, route and routed experts, MLA's W_UK products beside the attention inputs) run
  // on a second stream, forked and joined through events (graphs capture the fork and the
  // join), up to this many rows (above gemv_max_rows the branch's GEMMs run on a cuBLAS handle and
  // workspace of their own). 0 runs them in order on the one stream. No env. Default 256: at batch
  // 1 the branches' GEMVs and kernel boundaries overlap the main stream's latency-bound launches
  // (Moonlight bf16 batch 1, H200, 2026-12-03, two calls: 2.615 / 2.649 against 2.897 / 2.868 ms
  // a step without branches; a Kimi-K2.5 rank at batch 1, 61 layers projected, 6.14 against
  // 6.48); at batch 32 / 128 the shared experts' GEMMs overlap the routed experts (a Kimi-K2.5
  // rank with the flat down projection: 16.59 / 36.77 against 17.97 / 37.07 ms with branches of
  // up to 2 rows; a later call 14.36 / 32.40 against 15.08 / 35.26). Moonlight offline 1,000 x
  // 1,024 / 1,024 with branches at every batch: 22,536 against 22,535 tok/s (prefill chunks stay on
  // the one stream above 256 rows).
  int side_branch_max_rows = 256;
  // Graph mode: a step's launches go to the device in segments of this many (the last one
  // shorter), each a graph of its own replayed or captured as soon as it is full, so that the
  // device runs the step's first segments while the host records the rest; 0 keeps one graph a
  // step, launched once the whole step is recorded (the device idles meanwhile: Moonlight bf16
  // batch 1 172 us of host recording a 2.6 ms step, a Kimi-K2.5 rank ~10 us a layer; H200,
  // 2026-12-03). Segments cut only between ops and outside side branches; launches that would
  // merge across a cut stay two. No env. Default 64: Moonlight bf16 batch 1 (27 layers, 489
  // launches a step; rank_step_bench --variants, H200, 2026-12-03) 2.534 / 2.555 / 2.573 ms a
  // step in segments of 64 / 128 / 256 against 2.672 in one graph (-5.2 / -4.4 / -3.7%); a
  // Kimi-K2.5 rank of tp 8, 61 layers projected: batch 1 5.62 against 6.03 ms, batch 128 40.94
  // against 41.57; the Llama-3.1-8B shape's offline 1,000 x 1,024 / 1,024 unchanged (8,976 tok/s).
  int graph_segment_launches = 64;
  // Graph mode, with segments: the step's first segment is cut at this many launches and each
  // next one at twice the last, up to graph_segment_launches (0: every segment that size). The
  // device idles from the step's start until its first segment is recorded and launched, so a
  // short first segment starts it sooner, and longer later ones cut fewer PDL chains (each cut
  // ends one: the next graph's first kernel cannot launch early). No env. Default 8 (then 16, 32,
  // 64): in one process against 0 (every segment 64), H200, 2026-12-03 (rank_step_bench
  // --variants, four calls): a Kimi-K2.5 rank of tp 8, 4-layer cut, batch 1, 0.468 -> 0.441,
  // 0.483 -> 0.443, 0.456 -> 0.443, 0.460 -> 0.436 ms a step, 8-layer cut 0.761 -> 0.733, 0.776 ->
  // 0.737, 0.800 -> 0.758, 0.764 -> 0.734 (the ~25-40 us the device waited for a whole first
  // segment); Moonlight bf16 batch 1 -1.1 / -1.4 / -1.5 / -3.0%; Llama-3.1-8B bf16 batch 1 -0.5%.
  // Doubling past 64 (to 256) gained nothing more.
  int graph_first_segment_launches = 8;
  // Warps per GEMV block: 4 or 8. No env. Default 8: 4-warp blocks measured +0.13 / -0.07
  // ms/token (on top of early triggers and prefetch, so not conclusive; 2026-11-29 night).
  int gemv_block_warps = 8;

  // Per-head linears (MLA's absorbed W_UK / W_UV) of up to this many tokens take the per-head
  // GEMV (per_head_gemv.h, in the step's PDL chain), above it cuBLAS's batched GEMM. No env.
  // Default 8 (kPerHeadGemvMaxTokens); 0: cuBLAS always (A/B, parity tests).
  int per_head_gemv_max_tokens = 8;

  // ---- packed weights (linear_packed.cc) ----
  // INT4 register GEMV's residency depth (Int4LinearParams::gemv_depth: the most blocks per SM
  // its shared memory leaves room for, its successor's included; 0 = no padding). No env.
  // 1 took Llama-3.1-8B W4A16 batch-1 decode (graphs + PDL, fused, GPU greedy) from 3.255 to
  // 2.703 ms/token against 0 with one block per SM (bench/cuda/decode_profile.sh, H200,
  // 2026-12-02 morning). Default 0 since two blocks per SM (below) keep two resident anyway.
  int int4_gemv_depth = 0;
  // INT4 register GEMV's grid, in blocks per SM (Int4LinearParams::gemv_grid = this x SMs; 0:
  // the kernel's default, one), and its register ring (gemv_unroll: 8 or 16 k tiles in flight
  // per warp; 0: the kernel's default, 16). No env. Defaults 2 and 8: one 8B token's 128 W4A16
  // GEMVs as a model runs them at m = 1, 2.483 ms (one block, ring 16) / 1.895 ms (depth 1) ->
  // 1.754 ms = 47.8% of copy (`strata_bench_int4_linear_bench --what ceilings,gemv`, H200,
  // 2026-12-02 session 5; the per-shape sweep: gate_up 65%, down 44%, qkv 37%, o_proj 31%).
  int int4_gemv_blocks_per_sm = 2;
  int int4_gemv_ring = 8;
  // INT4 register GEMV: row tiles a warp multiplies at each k tile (Int4LinearParams::gemv_rows;
  // 1, or 4: the x fragments, addresses and loop bookkeeping of a k tile shared by four 16-row
  // tiles). Why: ncu (H200, 2026-12-05) counted 105-118 warp instructions a 512-byte tile in the
  // register GEMV and the flat down, of which the dequantization and the mma are ~64 in round
  // mode and ~32 unrounded, at 61-65% issue: the rest is a position's overhead. Dense linears
  // here, the MoE experts' in moe_int4_reg_rows. No env. Default 1: one 8B token's 128 W4A16
  // GEMVs (int4_linear_bench, H200, 2026-12-05) took 2.674 ms with 4 against 1.859 ms: blocks
  // own whole groups of four row tiles, so the 8B shapes (256-384 row tiles) fill 64-96 blocks
  // where 264 run with 1.
  int int4_gemv_rows = 1;
  // INT4 register GEMV: x of up to this many bytes (m · k · 2, dense linears) by one bulk copy
  // after the PDL wait (Int4LinearParams::gemv_x_tma), 0 off. Why: x's loads, issued after the
  // weights' ring, cost ~1.7 of a launch's ~4.9 us fixed cost (H100, 2026-12-05 session 32). No
  // env. Default 32 KB (every 8B shape at m = 1, down's 28 KB included): one 8B token's 128 W4A16
  // GEMVs (int4_linear_bench --what token, H100, 2026-12-06, four processes, steady rounds)
  // 1.847-1.895 ms against 1.887-1.932 loaded by the threads (-0.6 to -3.0%; up to 8 KB only
  // -0.5 to -1.1%), and Llama-3.1-8B W4A16 batch 1 (two processes) 2.697 / 2.742 ms against
  // 2.776 / 2.814 (-2.8 / -2.6%; 8 KB only 2.725 / 2.773). Variants no_int4_x_tma, int4_x_tma8.
  int int4_gemv_x_tma = 32768;
  // MoE decode with INT4 experts: up to this many assignments (tokens x top-k) the experts run
  // as the register GEMV's experts mode, one expert matrix per assignment (linear_int4.h), above
  // it the grouped MoE GEMV. No env. 0 turns it off (A/B). Default 16: one Kimi-K2.5 rank's
  // grouped GEMVs took 33 us a layer at T = 1 for 24.7 MB of weights (decode_profile.sh,
  // 2026-12-02); with this mode the rank's step at batch 1 / 2 took 6.39 / 8.22 ms against 6.60 /
  // 9.10 (moe_reg_check.sh). A repeated expert is read once per assignment: for T·k << E.
  // Raised to 64 once gate_up by ids ran split (moe_int4_split_gate_up): the rank's experts
  // (moe_bench --what backend --variants moe_ids*, H200, 2026-12-03) at T = 4 / 8 took 39.9 / 73.3
  // us against the planned mode's 58.8 / 95.1; at T = 16 the two tie (136 us) and at T = 32 by
  // ids is slower (262.8 against 222.7 us: repeated experts read once per assignment).
  int moe_int4_reg_max_assignments = 64;
  // Above that, still in the MoE decode regime: true runs the INT4 experts as the register GEMV's
  // planned experts mode (a plan of 4- or 8-row tiles, each touched expert read once per tile),
  // false the grouped MoE GEMV. No env. Default true: one Kimi-K2.5 rank's decode step (61 layers
  // projected, bench/cuda/moe_reg_check.sh, H200, 2026-12-02) at batch 8 / 32 / 128 took 13.06 /
  // 24.60 / 48.63 ms against the grouped GEMV's 14.09 / 25.50 / 57.22.
  bool moe_int4_reg_planned = true;
  // The INT4 experts modes' knobs (A/B: rank_step_bench and moe_bench --variants). No env.
  // round: weights rounded to bf16 before the mma, as the CPU twin dequantizes (default), or
  // (nibble - 8) · scale unrounded (fewer instructions a tile; the 8B dense GEMV's default).
  // split: at least this many blocks share one work item's matrix (0: the kernel's choice, two
  // blocks per SM over the items). tile_rows: the planned mode's rows per tile (0: 8 while a
  // tile's x fits 64 KB of shared memory, else 4).
  // Defaults split 2, down_units 128: one Kimi-K2.5 rank's INT4 experts (moe_bench --what
  // backend, H200, 2026-12-02) at T = 8 / 32 / 128 took 103.4 / 249.1 / 548.8 us against 111.0 /
  // 294.9 / 625.2 with 0 / 32 (gate_up items spread over more blocks; down blocks of more row
  // tiles, each paying its x and epilogue once); the rank's step (61 layers projected) at batch
  // 32 / 128: 18.64 / 39.90 ms against 22.98 / 45.02. Batch 1 (by ids) is unchanged by both.
  // Unrounded weights and 8-row tiles measured no better (within 1%, or slower).
  bool moe_int4_reg_round = true;
  // gate_up_round (with round on): whether the register GEMV's gate_up (planned, and by ids where
  // the split gate_up does not take it) rounds its weights too; false runs that projection
  // unrounded ((nibble - 8) · scale exactly, the dense W4A16 GEMV's numerics) while the split
  // gate_up and the flat down keep rounding (round off turns those round-only kernels off: session
  // 28's moe_unrounded row, +10-13% at T = 8 / 128, measured that). Per 512-byte tile and row the
  // round mode spends ~68 instructions on the dequantization and mma, unrounded ~52. One Kimi-K2.5
  // rank's experts unrounded (moe_bench --what backend, H100, 2026-12-06, three processes,
  // alternating) at T = 32 / 128: -1.9 to -2.5% / -1.7 to -1.8% (T = 1 / 8: +-0.5%); its step (61
  // layers projected) at batch 32 / 128 15.531 / 36.871 ms against 15.967 / 37.508 (-2.7 /
  // -1.7%). NMSE against the twin 1.5e-5 to 2.0e-5 (MoeBackend.UnroundedGateUpMatchesCpu), as
  // rounded. The flat down unrounded measured +0.4 to +0.7% (latency-bound: bench/results/
  // 2026-12-06-session41-flat-down-unrounded.patch). Default false since session 42: the MoE,
  // INT4 and DeepSeek fixture suites passed with it (48 / 48, H100), and the rank's step at batch
  // 1 / 32 / 128 took 4.675 / 15.557 / 36.566 ms against 4.657 / 15.960 / 37.354 rounding
  // (variant moe_gu_rounded, same process: +0.4 / -2.5 / -2.1%).
  bool moe_int4_gate_up_round = false;
  int moe_int4_reg_split = 2;
  // rows: Int4LinearParams::gemv_rows of the experts' register GEMV (1 or 4). Default 4: one
  // Kimi-K2.5 rank's experts (moe_bench --what backend, H200, 2026-12-05, alternating A/B) at
  // T = 32 / 128 −3.5 / −2.1% (T = 1 / 8 unchanged: the split gate_up and flat down take them),
  // and its step (61 layers projected) at batch 32 / 128 15.002 / 34.365 ms against 15.126 /
  // 34.858 (variant moe_rows1). Dense linears lose with 4 (int4_gemv_rows).
  int moe_int4_reg_rows = 4;
  int moe_int4_reg_tile_rows = 0;
  // down_units: the most row tiles one block of the down projection takes (0: the kernel's 32).
  int moe_int4_reg_down_units = 128;
  // gate_up_warps: warps a block of the gate_up projection (0: the kernel's 8; 16 doubles the
  // loads in flight where the grid has fewer blocks than two per SM).
  int moe_int4_reg_gate_up_warps = 0;
  // down_warps: warps a block of the planned down projection (0: the kernel's 8; 4 lets four
  // smaller blocks share an SM, so that one block's start and epilogue overlap three others'
  // streams).
  int moe_int4_reg_down_warps = 0;
  // flat_down: the down projection (planned and by ids) as one flat stream over every item's row
  // tiles (moe_experts_int4_flat.cu: equal shares per warp across experts, no per-tile blocks),
  // where it fits (expert slices of k <= 256, round on). Default on: the per-tile blocks' down
  // projection ran at 54% of copy against gate_up's 84% on a Kimi-K2.5 rank at batch 128 (ncu,
  // H200, 2026-12-03); the rank's experts (moe_bench --what backend --variants moe_flat_down,
  // same day) at T = 1 / 8 / 32 / 128 took 22.5 / 95.3 / 223.8 / 476.4 us against 24.7 / 103.2 /
  // 249.8 / 548.7, and its step (61 layers projected) at batch 32 / 128 17.97 / 37.07 ms against
  // 19.01 / 42.48; with side branches up to 256 rows, 14.36 / 32.40 against 16.58 / 39.42 with
  // this off (a later call). MoeBackend.FlatDownMatchesCpu and the DeepSeek fixtures' greedy pass.
  bool moe_int4_reg_flat_down = true;
  // split_gate_up: the gate_up projection by ids (T · k <= moe_int4_reg_max_assignments) with
  // each 16-row tile pair's k split over the warps of a cluster of CTAs
  // (moe_experts_int4_gate_up.cu), where it fits (k % 64 == 0, round on), in place of the
  // register GEMV's experts mode (one Kimi-K2.5 rank: gate_up 18.4 us a MoE layer for 16.5 MB at
  // batch 1, ~21% of copy, ncu, H200, 2026-12-03). cluster / warps /
  // ring: its shape (0: the launcher's: 8 warps, 4 k tiles in flight, the most CTAs a pair
  // within one CTA an SM). Default on: the rank's experts (moe_bench --what backend, H200,
  // 2026-12-03) at T = 1 / 2 took 16.0 / 23.1 us against the register GEMV's 22.7 / 29.4
  // (variants no_split_gu, moe_split_gu_*; the shapes measured: moe_experts_int4_gate_up.cu).
  bool moe_int4_split_gate_up = true;
  int moe_int4_split_cluster = 0;
  int moe_int4_split_warps = 0;
  int moe_int4_split_ring = 0;
  // split_tma: the split gate_up's weights by bulk copies (TMA) into shared memory instead of the
  // register ring of `ring` k tiles a warp (moe_experts_int4_gate_up.cu says why). -1: where the
  // grid is one wave (a Kimi-K2.5 rank at one token: 128 CTAs; the warp's whole stream in two
  // batches), 0: never, 1: wherever it fits (larger grids through a ring of 4-tile batches at two
  // CTAs an SM). No env. Default -1, measured on the H200 (2026-12-03, session 14; variants
  // no_split_tma, split_tma_all): a Kimi rank's batch-1 step -3.0% / -4.8% / -3.2% in three calls;
  // TMA at 2-8 tokens lost to the register ring (the step at batch 2 +2.7%).
  int moe_int4_split_tma = -1;
  // split_round: whether the split gate_up rounds its weights: 1 always; 0 never (group 32 only:
  // Kimi-K2.5's), unrounded as moe_int4_gate_up_round does, x's half-tile sums made once a CTA;
  // -1 unrounded where its weights come by TMA (split_tma), rounded on the register ring.
  // Measured on an H100 (2026-12-06, session 42, one Kimi-K2.5 rank's experts, four processes,
  // alternating; variant moe_split_unrounded, 0): T = 1 (TMA, one wave) -1.4 to -2.6%, T = 2 (the
  // register ring) +2.4 to +3.0%, T = 4 / 8 within +-0.6%; the step at batch 1 -0.6%. -1 takes
  // the first without the second (variants moe_split_unrounded_tma, moe_split_rounded). Default
  // -1 since session 43 (H100, 2026-12-06, three processes, alternating in each: T = 1 the
  // rounded form +2.2 to +2.5% against it, T = 2 -0.1 to +0.3%, T = 4-128 within +-0.3%; the
  // always-unrounded form +2.9 to +3.3% at T = 2; a Kimi-K2.5 rank's step batch 1 / 2 4.631 /
  // 5.499 ms against 4.646 / 5.549 rounded; the MoE, INT4 and DeepSeek suites 39 / 39).
  int moe_int4_split_round = -1;
  // flat_ctas_per_sm: the flat down projection's grid, CTAs of 8 warps an SM (1 or 2; 0: 2).
  int moe_int4_flat_ctas_per_sm = 0;
  // FP8 experts' decode GEMVs against x staged in f16 (moe_stage_f16.cu: one small launch before
  // each projection; e4m3 -> f16 exactly, the block scale on float32 sums; no bf16 rounding of
  // w · s, so not bit for bit the CPU twin's bf16(w · s)). On: one DeepSeek-V3 rank's experts
  // (moe_bench --what backend, H200, 2026-12-03, fp8_f16_check.sh) at T = 1 / 8 / 32 / 128 took
  // 28.7 / 120.3 / 309.2 / 567.3 us against 30.5 / 167.0 / 432.0 / 745.8 with bf16 x (variant
  // fp8_bf16x).
  bool moe_fp8_f16 = true;
  // With moe_fp8_f16, up to this many tokens: each FP8 GEMV's CTAs stage the x rows they read in
  // shared memory where they fit (moe_gemv_stage_smem: a DeepSeek-V3 rank's down projection at
  // every decode size, its gate_up at one token) instead of a staging launch before the GEMV.
  // The same values (moe_stage_f16.cuh). No env; 0 never. Default 8: one DeepSeek-V3 rank's
  // experts (moe_bench --what backend, H200, 2026-12-04, fp8_f16_check.sh, two runs) at
  // T = 1 / 2 / 4 / 8 took 27.2-27.4 / 36.2 / 55.8-56.1 / 99.3-99.4 us against 27.3-27.6
  // / 37.3-37.4 / 57.8 / 101.0-101.2 with the launches, but at T = 32 / 128 287.4 / 474.4-474.9
  // against 281.8 / 471.7-472.2: there every CTA of a pass stages the pass's rows again, and the
  // down projection has thousands of CTAs (A/B: variant fp8_launch_stage).
  int moe_fp8_f16_smem_max_tokens = 8;
  // Prefill: the experts' down projection of k = 128 / 256 (a tp-8 slice) on the
  // weight-stationary GEMM (moe_experts_gemm_ws.cu: each weight dequantized once per expert,
  // not once per 64-row x tile; outputs through shared memory). No env. A/B: variant
  // no_ws_down. moe_bench --what kernels, H200, 2026-12-04, down projection at 512 / 2,048 /
  // 8,192 tokens, us: DeepSeek-V3 rank (FP8) 326 / 543 / 1,702 -> 226 / 287 / 710; Kimi-K2.5
  // rank (INT4) 431 / 481 / 1,594 -> 311 / 334 / 751.
  bool moe_gemm_weight_stationary = true;
  // Prefill: the experts' GEMMs on the producer-warp kernel (moe_experts_gemm_pipe.cu: one CTA
  // an SM, an mbarrier pipeline fed by a producer warpgroup, no CTA barrier a k step) where it
  // applies (plan tiles of 128 rows, k % 64 == 0); the weight-stationary down projection keeps
  // its kernel (the pipe kernel there measured 1.9-2.1x slower). No env. A/B: variant
  // no_gemm_pipe. moe_bench --what backend, H200, 2026-12-04, experts us at 2,048 / 8,192
  // tokens, off -> on: DeepSeek-V3 rank (FP8) 892.7 / 2,371.9 -> 834.2 / 2,196.0; Moonlight
  // (bf16) 744.4 / 2,326.7 -> 658.4 / 2,087.4; Kimi-K2.5 rank (INT4) 884.5 / 2,429.3 -> 910.2
  // (64-row tiles at 2,048: the pipe kernel does not apply; spread) / 2,218.2.
  bool moe_gemm_pipe = true;
  // Prefill: the weight-stationary down projection runs an expert's last x tile of at most 32
  // rows at wgmma n = 32, not 64 (fp8 and int4 at k = 256: moe_experts_gemm_ws.cu's kNarrowTail;
  // at 8,192 tokens short tails are a share of its executed products: DeepSeek-V3's rank ~256
  // rows an expert, Kimi-K2.5's ~170). No env. A/B: variant no_narrow_tails; moe_bench
  // --narrow-tails 0|1. H100, 2026-12-05, down at 8,192 tokens (kernels mode): 695-699 us
  // (DeepSeek-V3) / 744-749 (Kimi) against 696-706 / 752-759 without, and 704-716 / 773-776 for
  // the form before (n = 16 / 32 / 48 by the tail's rows, which made ptxas serialize the wgmma).
  bool moe_gemm_narrow_tails = true;
  // The router GEMV's first weight loads before its PDL wait (the same arithmetic, the same bits:
  // MoeParity.RouterLogits). No env. Default on: H100, 2026-12-06 session 44, two processes, each
  // variant twice beside a no-change control timed twice (rank_step_bench --variants
  // router_preload,...,defaults): a Kimi-K2.5 rank at batch 1 -0.8 to -1.5% (12-layer cut),
  // -0.8 to -1.0% (4-layer cut), Moonlight bf16 -0.2 to -0.5% (session 13's A/B without a
  // control: Kimi -0.9 / -0.2 / -1.7%, left off as within its spread). A/B: no_router_preload.
  bool moe_router_preload = true;
  // FP8-block linears above the GEMV's rows: false (default) dequantize the weight to bf16 and
  // run the bf16 GEMM (W8A16: the weights exactly as DeepSeek's reference inference dequantizes
  // them, activations untouched); true quantize the activations to e4m3 per 128 values and run
  // the FP8 tensor cores (W8A8, DeepSeek's act_quant: 1.5-1.8x faster on large prefills,
  // bench/RESULTS; lossy: the tiny FP8 fixture's logits moved from NMSE 2e-4 to 5e-2 against
  // Hugging Face's, 2026-12-01). Env STRATA_FP8_W8A8=1 (opt-in, as every lossy lever).
  bool fp8_w8a8 = false;

  // ---- attention ----
  // MLA attention's key splits where the plan picks them (a batch whose rows leave SMs idle:
  // one block an SM over whole 64-key chunks): at most this many; 0 no cap. No env. Default 0:
  // a fixed cap would also cut the parallelism of long contexts at batch 1 (see
  // mla_min_split_chunks). A Kimi-K2.5 rank at batch 1 (4-layer cut, rank_step_bench --variants,
  // H200, 2026-12-03): 16 -3.6%, 32 -8.0% a step.
  int mla_max_splits = 0;
  // Where the plan picks the splits: at least this many 64-key chunks a split, where that leaves
  // 32 splits or more (kMlaSplitsKept). No env. Default 2. Why: at batch 1 a Kimi-K2.5 rank's
  // 4,096-token context split 64 ways, one chunk a block, and the merge then read 64 partial
  // rows per head (mla_combine 5 us a layer against the decode kernel's 7.6 us, ncu
  // 2026-12-03). Splits of two chunks (32 at 4,096 keys, the measured mla_splits32 above) halve
  // the partials; long contexts stay split wide, short ones (Moonlight's 768 keys) unchanged.
  int mla_min_split_chunks = 2;
  // The MLA decode kernel merges its key splits itself where a batch has at most this many (and
  // more than one): the last split block of a (sequence, row tile) weighs the others' partials
  // (mla_decode_merge.cuh) instead of a merge kernel launched after it. 0: never. No env.
  // Default 2, measured on the H200 (2026-12-03, mla_bench --what merge; rank_step_bench): batch
  // 64 x 4,096 (2 splits) 73.7 -> 75.8% of copy at 16 heads, 76.9 -> 79.3% at 8, fp8_flashmla
  // +1.2 / +1.7 points; 4 splits (32 x 8,192) 76.1 -> 74.8%; at batch 1 (12-64 splits) slower,
  // 17 -> 21-24 us a Kimi-K2.5 rank's layer (one SM reads every split's partial rows where the
  // merge kernel spreads them over 32 blocks): the rank's batch-1 step 4.97 against 4.83 ms.
  int mla_fused_merge_max_splits = 2;
  // The MLA decode kernel copies its first stages of old keys (those before the step's new
  // tokens: written by earlier steps) before its PDL wait, so the copies overlap the previous
  // kernel's tail (mla_inputs, which writes only the new tokens' rows). Only with pdl_early off
  // (every kernel then triggers after its own wait, so everything two kernels back is done) and
  // without decode context parallelism. No env. A/B: variant no_mla_early_kv.
  bool mla_early_kv = true;
  // The MLA decode kernel only where a step has at least this many query rows (tokens x heads);
  // below, the mma kernel (mla_attention.cu). 0: wherever the decode kernel takes the rows. No
  // env. Why: at batch 1 the decode kernel is its blocks' fixed latency (a block's first chunk
  // ~5 us whether or not its keys load: mla_bench --what batch1, H200, 2026-12-04; ~7.5 us a
  // layer of a Kimi-K2.5 rank's step after its inputs), and the mma kernel has no warp roles to
  // hand chunks between. Measured slower (variant mla_mma_small, 17: a Kimi-K2.5 rank's batch-1
  // step +1.8 to +2.5%, DeepSeek-V3's +2.1%, Moonlight's +1.7%; H200, 2026-12-04, session 25),
  // so 0; the tests' way onto the mma kernel at decode. (A lean decode kernel for small batches,
  // four warps without roles, lost the same way: +1.6 to +2.7%, and with one-chunk splits no
  // better than the decode kernel with them; removed, session 25.)
  int mla_decode_min_rows = 0;
  // The MLA decode kernel's query rows a block: 8 or 16; 0: 8 where a sequence's rows (heads x
  // new tokens) are at most 8, else 16; -1 (default): as 0, and 8 also where 16-row blocks of one
  // chunk each would leave SMs idle (batch x row tiles x chunks < SMs). No env. Why: Moonlight's
  // batch 1 at a 768-token context ran 12 blocks (one row tile x 12 one-chunk splits) for 11 us a
  // layer (ncu 2026-12-03); 8-row tiles make twice the blocks of half the math: Moonlight bf16
  // batch 1 2.414 against 2.515 ms a step (-4.0%, rank_step_bench --variants mla_rows8, H200,
  // 2026-12-03). Large batches keep 16-row blocks (each page read once for 16 heads).
  int mla_decode_rows = -1;
  // The MLA decode kernel's 16-row blocks: 2 runs their S warps as two groups of 8 rows (12 warps
  // a block, the same bits; mla_decode_s_warps.cuh says why), 3 as two groups of half the dims
  // (fp8 rows through the V tile; elsewhere as 2), 1 as one group of 16. No env. Default 2,
  // measured on H100s (2026-12-06, mla_bench --what sgroups, rank_step_bench variant
  // mla_sgroups2): fp8_flashmla 16 heads 64.4 -> 68.7% of copy (by dims 69.1%), bf16 level
  // (86.6-90.0% either way, bandwidth-bound there), Moonlight bf16 steps -0.9 / -0.8% at batch
  // 64 / 256 (two runs each); batch 1 runs 8-row blocks.
  int mla_s_groups = 2;
  // The MLA decode kernel's L2 prefetch distance in chunks (MlaPlanOptions::l2_prefetch); -1: the
  // plan's default (mla_decode_l2_prefetch: 1 for bf16 rows, 0 for fp8). No env; A/B: variants
  // mla_pf0 / mla_pf1.
  int mla_l2_prefetch = -1;
  // Decode attention's split-KV targets (plan_decode_splits, attention.cc, with the numbers):
  // batches of at most decode_blocks_per_sm x SMs blocks a split take the fewest splits that
  // give every SM that many blocks (two rounds where the split length's rounding overflows one,
  // decode_split_fill_second_round); larger batches the fewest that give 90% of
  // decode_large_batch_blocks_per_sm blocks an SM. No env. Defaults 1 and 4 (until 2026-12-07: 4
  // for every batch, no second round). A/B: variants decode_bps2 / decode_bps4, decode_no_fill,
  // decode_old_splits.
  int decode_blocks_per_sm = 1;
  int decode_large_batch_blocks_per_sm = 4;
  bool decode_split_fill_second_round = true;
  // Decode attention's split-KV floor: at least this many keys (of the context's power-of-two
  // bucket) a split; one split writes the output itself, with no merge launch after it. Why ask:
  // at batch 1 the merge (combine_kernel) moves a Llama layer's step end by ~1.9 us and each of
  // 8 splits reads only 64 keys (H100 timeline, 2026-12-07 session 48). No env. Default 64 (the
  // split rule since 2026-11-29); A/B: variants decode_split_tokens256 / 512 / 1024.
  int decode_min_split_tokens = 64;
  // Decode attention copies its first chunks of old keys (before the step's new token: written
  // by earlier steps) before its PDL wait, so the copies overlap the previous kernel's tail
  // (qkv_rope or kv_write, which write only the new token's rows), as mla_early_kv does for MLA.
  // Only with pdl_early off (every kernel then triggers after its own wait). No env. Default on:
  // batch-1 step 2.643 against 2.679 ms Llama-3.1-8B W4A16, 5.341 against 5.355 bf16, three
  // rounds alike (H100, 2026-12-07 session 48); A/B: variant no_decode_early_kv.
  bool decode_early_kv = true;
  // Graph mode: a decode attention launch of at most this many sequences takes the
  // qkv_rope_kv_write just recorded before it (the same q, caches, positions and slots): the
  // kernel rotates Q and the new token's K from the QKV projection's output, stores the new K/V
  // rows and writes q itself, with the same bits (attention_decode_rope.cuh;
  // CudaParity.DecodeRopeFusion), and copies its old keys before its PDL wait where
  // decode_early_kv is on. One launch a layer fewer; 0: never. No env. Default 1 (H100,
  // 2026-12-07 session 48, alternating A/B, two processes, the loads before the stores):
  // Llama-3.1-8B batch 1 W4A16 2.628-2.630 against 2.646-2.648 ms, bf16 5.430-5.431 against
  // 5.442-5.444; merged at batch 16 W4A16 5.75-5.78 against 5.53-5.59 ms, at 64 bf16 7.91-7.93
  // against 7.83-7.84 (W4A16 8.69 against 8.73). A/B: variants no_decode_rope_fusion,
  // decode_rope_fusion_all.
  int decode_rope_fusion_max_seqs = 1;
  // RMSNorm's row kernel loads its bf16 weights before its PDL wait (model parameters: no
  // kernel writes them), off the critical path after the row's reduction; the same bits
  // (CudaParity.RmsNormAndResidual). No env. Default on: batch-1 steps, H100, 2026-12-06
  // session 44, two processes, each against a no-change control timed twice beside it
  // (rank_step_bench --variants norm_preload,defaults,...): Llama-3.1-8B W4A16 -0.2 / -0.2%,
  // bf16 -0.5 / -0.5%, Moonlight bf16 -0.5 / -0.5%, a Kimi-K2.5 rank (61 layers projected)
  // -1.0 / -1.9% (session 43's H200: -0.1% W4A16, -0.8% bf16, -0.6% Moonlight). A/B: variant
  // no_norm_preload.
  bool norm_weight_preload = true;
  // MLA's attention inputs kernel (mla_inputs.cu: the latent's norm, ropes and cache row; the
  // batch-1 path of models without q_lora, e.g. Moonlight, and of larger batches) prefetches its
  // norm weights into L2 before its PDL wait, as the MLA query kernel's cache-row CTAs do. No
  // env. Off until measured (A/B: variant mla_inputs_prefetch; bench/cuda/session44c_check.sh).
  bool mla_inputs_norm_prefetch = false;
  // When prefill batches take the split-KV kernel (attention_prefill_split.h): 0 never, 1 auto
  // (short chunks over long contexts, see plan_split_prefill), 2 whenever supported (tests). Env
  // STRATA_CUDA_PREFILL_SPLIT=0/1/2. Default 1: 12x / 4.9x / 1.4x over the regular kernels at
  // 16 / 64 / 256 new tokens over 32K cached, bf16 KV; 0.97x at 256 over fp8 KV (2026-11-29).
  int prefill_split_mode = 1;
  // Split-KV prefill sizing: this many blocks per SM over the whole batch. No env. Default 2:
  // best or tied against 1 and 4 in every case measured (2026-11-29).
  int prefill_split_blocks_per_sm = 2;

  // ---- deterministic inference ----
  // Batch-invariant kernels (BackendOptions::deterministic, --enable-deterministic-inference): a
  // token's row gives the same bits whatever the batch it runs in, its place there and the
  // prefill chunking. Every linear (bf16 dense, routers, per-head; FP8 and INT4 dequantized to
  // bf16 scratch per call) takes the fixed-k-order GEMM of linear_det.h at every m instead of the
  // GEMV / cuBLAS / W8A8; paged attention takes the regular prefill kernels for every
  // batch (no decode split-KV, no split prefill); MLA the mma kernel without key splits; MoE
  // experts the GEMM regime with 64-row tiles. No env (a typed backend option). Default off: it
  // costs throughput (bench/cuda/determinism_check.sh measures how much).
  bool deterministic = false;
  // Deterministic mode's draft trees: each tree row gets its own attention block that reads its
  // keys in path order (attention.h kTreePathTile), so a verified node's row is bitwise the row
  // plain decoding of its path gives. No env. Default on; off only as the parity tests'
  // negative control (tree_exact_parity_test.cc: rows then differ).
  bool deterministic_tree_paths = true;

  // ---- diagnostics ----
  // Eager steps: log host launch time and device wait every 256 steps. Env STRATA_STEP_TIMING=1.
  bool log_eager_steps = false;
  // Graph mode: log why a step captured a new graph (the first launch whose parameters differ
  // from a captured step of the same size; the first 64 captures). Env STRATA_GRAPH_DEBUG=1.
  bool explain_graph_captures = false;

  // The defaults above, overridden by the environment variables named.
  static CudaTunables from_environment();
  // CHECK-fails on a value outside its range.
  void check() const;
};

// The NCCL communicator's environment (nccl_comm.cc), read when a communicator or id is made.
struct NcclEnv {
  // How long a collective or init may wait for its peers before the group is aborted. Env
  // STRATA_NCCL_TIMEOUT_S (> 0). Default 600 s.
  double timeout_s = 600;
  // The group's NCCL id as hex, set by a job script for ranks of several processes. Env
  // STRATA_NCCL_ID; unset: rank 0 writes it to the id file.
  std::optional<std::string> id_hex;
  // CUDA_VISIBLE_DEVICES as set (for error messages).
  std::optional<std::string> visible_devices;

  static NcclEnv from_environment();
};

// NCCL_NVLS_ENABLE=0 unless the operator set it (NVLink multicast stays off, as the device
// machines require); once per process, before NCCL reads its environment.
void apply_nccl_env_defaults();

}  // namespace strata::cuda
