// MLA (multi-head latent attention, DeepSeek-V2/V3, Kimi-K2, Moonlight) on the GPU: the latent KV
// write and absorbed attention over the paged latent cache (issue 22). See arch/mla.h for the
// absorbed form: per token the cache holds one row [latent c (R = kv_lora_rank) | k_rope (P)]; a
// query row is [W_UKᵀ q_nope (R) | q_rope (P)], its key is the whole cached row and its value
// the first R values, so all heads of a token share one KV "head" of R + P dims.
//
// Row encodings (backend/kv_format.h, byte for byte): every layout is described here as
// [latent: R values of latent_elem][rope: P values of rope_elem at rope_offset], plus, for
// FlashMLA rows, R / 128 float32 tile scales right after the latent (the latent is e4m3):
//   bf16 / fp8 plain rows:  latent_elem = rope_elem = the layer's type, rope_offset = R · bytes;
//   rope split rows:        fp8 latent, then the rope part in its own type (bf16, fp8 or f32);
//   FlashMLA (kFlashMlaFp8): e4m3 latent in 128-wide tiles, 4-byte scales, bf16 rope.
// Stored = value / scale (the layer's K scale; bf16/f32 rope parts of split rows stay unscaled,
// FlashMLA rows carry their own scales): see MlaRowFormat::latent_scale and rope_scale.
//
// Files: mla_kv_write.cu (the write), mla_attention.cu (the mma.sync kernel: any head count,
// every layout, the split-KV merge), mla_decode.cuh / .cu / _fp8.cu (the decode kernel: R = 512,
// P = 64, bf16, fp8 and FlashMLA rows, 8 or 16 query rows a block, a TMA producer warp and fp8
// converted in registers: the memory-bound decode), mla_attention_wgmma.cu (the wgmma kernel:
// bf16 rows, R = 512, P = 64, 64 query rows a block: DeepSeek-V3's 128 heads, long chunks) and
// mla_attention_wgmma_pipe.cu (the same products with warpgroup 1 loading behind mbarriers, no
// block-wide barrier in the loop), mla_wgmma.cuh (their shared pieces).
//
// Conventions as kernels.h's: trivially copyable parameter blocks without padding bytes (a
// launch is recorded as its bytes), launchers asynchronous on `stream` that never allocate or
// synchronize (scratch is passed in), and every kernel waits on its predecessor first
// (griddepcontrol.wait) so it may be launched with programmatic dependent launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata {
struct KvLayout;
}

namespace strata::cuda {

// Element types of MLA row parts (the first three match fp8.cuh's KvElem).
enum MlaElem : int { kMlaBf16 = 0, kMlaE4M3 = 1, kMlaE5M2 = 2, kMlaF32 = 3 };
constexpr int mla_elem_bytes(int e) { return e == kMlaBf16 ? 2 : e == kMlaF32 ? 4 : 1; }
constexpr int kMlaFlashTile = 128;  // FlashMLA: latent values per float32 scale

// How one layer's cached rows are laid out (mla_row_format fills it from the KvLayout).
struct MlaRowFormat {
  int64_t row_bytes;   // KvLayout::k_row_bytes(layer)
  int latent;          // R = kv_lora_rank
  int rope;            // P = rope dim
  int latent_elem;     // MlaElem
  int rope_elem;       // MlaElem
  int rope_offset;     // bytes from the row start to the rope part
  int flashmla;        // 1: FlashMLA rows (e4m3 latent, float32 tile scales at byte `latent`)
  float latent_scale;  // the layer's K scale for the latent (1 for FlashMLA rows)
  float rope_scale;    // the scale of the rope part (the layer's for fp8 / plain rows, else 1)
};
static_assert(sizeof(MlaRowFormat) == 8 + 6 * 4 + 2 * 4, "MlaRowFormat has no padding");
// The row format of `layer` (KvLayout::k_dim = R + rope_dim) with the layer's K scale.
MlaRowFormat mla_row_format(const KvLayout& layout, int layer, float k_scale);
// The row format of `layer` when the model's rope part is `rope` dims. A layout without its MLA
// split (rope_dim 0: a model's own kv_layout(), which tests allocate directly; the engine sets
// rope_dim through engine/kv_config.h) holds plain rows of the layer's dtype: the format of the
// same layer with rope_dim set and no split (the bytes are the same).
MlaRowFormat mla_layer_row_format(const KvLayout& layout, int layer, int rope, float k_scale);

// ---- the write (mla_kv_write.cu) ----
// Each new token's row [latent | rope] (bf16) is encoded into its slot exactly as
// backend/kv_format.cc's encode_k_row does (the same bytes; FlashMLA tile scales computed here
// as amax / 448 of the tile, 1 for an all-zero tile). One warp per token.
struct MlaKvWriteParams {
  const uint16_t* src;   // bf16 [tokens, src_stride]: each row R latent then P rope values
  void* cache;           // the layer's rows [slots, fmt.row_bytes]; 4-byte aligned
  const int32_t* slots;  // device [tokens]: page · page_size + offset
  int64_t tokens;
  int64_t src_stride;  // elements between two tokens' rows (>= R + P)
  MlaRowFormat fmt;
};
static_assert(sizeof(MlaKvWriteParams) == 3 * 8 + 2 * 8 + sizeof(MlaRowFormat), "no padding");
void launch_mla_kv_write(const MlaKvWriteParams& p, cudaStream_t stream);

// ---- attention (mla_attention.cu, mla_decode*.cu, mla_attention_wgmma*.cu) ----
// Query rows of a sequence are its new tokens × heads, token-major: row r of sequence s is
// (token q_indptr[s] + r / heads, head r % heads), which is q's row q_indptr[s] · heads + r
// when q is [tokens, heads, q_stride]. Token i of the n new tokens of a sequence with kv_len
// keys sees keys [0, kv_len - n + i] (causal within the new tokens, everything before them).
// A block takes `tile_rows` rows of one sequence (16: the mma kernel, 8 or 16: the decode kernel,
// 64: the wgmma kernels) and one split of its keys; grid (row_tiles, num_splits, num_seqs), the
// row tiles in reverse (the longest causal tiles first), tiles past a sequence's rows exit. With
// num_splits > 1 each block leaves unnormalized partials and launch_mla_attention appends the merge
// kernel (also with one split when partials are asked for: MlaPlanOptions::partials).
//
// Decode context parallelism (backend/dcp_attention.h, p.positions set): the keys are one rank's
// shard of each sequence, local key j being the token at position dcp_rank + dcp_size · j, and
// the new token at position pos sees the local keys at positions <= pos (pos >= dcp_rank:
// min(kv_len, (pos - dcp_rank) / dcp_size + 1) keys; else none). The merge then writes float32
// rows [normalized output (R) | natural log-sum-exp of the row's scaled scores] into lse_out
// (a zero output and -inf for a row that sees no key) instead of bf16 rows into out.
enum MlaKernel : int { kMlaMma = 0, kMlaWgmma = 1, kMlaDecode = 2, kMlaWgmmaPipe = 3 };
// The decode kernel's e4m3 -> f16 conversion (mla_decode.cuh): integer ops in both warp roles,
// the conversion unit in the S warps and integer ops in the PV warps, or the unit in both; or
// (kMlaCvtTile, the default) each value once, by the S warps' conversion unit, into a shared f16
// tile the PV warps read (fewer stages fit). FlashMLA and plain e4m3 rows; -1 in MlaPlanOptions:
// the default. Measured on the H200 (2026-12-02, batch 64 x 4,096, `bash
// bench/cuda/mla_decode_run.sh`), % of copy bandwidth, kMlaCvtHwS -> kMlaCvtTile: fp8_flashmla
// 36.2 -> 39.9 (16 heads), 44.0 -> 49.6 (8 heads); e4m3 rows 36.1 -> 36.9, 43.4 -> 45.8.
enum MlaCvt : int { kMlaCvtInt = 0, kMlaCvtHwS = 1, kMlaCvtHw = 2, kMlaCvtTile = 3 };

struct MlaAttentionParams {
  const uint16_t* q;            // bf16 [tokens, heads, q_stride]: [latent (R) | rope (P)]
  const void* cache;            // the layer's rows [slots, fmt.row_bytes]; 4-byte aligned (16
                                // for the decode and wgmma kernels)
  uint16_t* out;                // bf16 [tokens, heads, R]
  const int32_t* q_indptr;      // device [num_seqs + 1]
  const int32_t* kv_lens;       // device [num_seqs]: keys after this step (cached + new)
  const int32_t* page_indptr;   // device [num_seqs + 1]
  const int32_t* page_indices;  // device [page_indptr[num_seqs]]
  float* partial_o;             // num_splits > 1: [tokens · heads, num_splits, R] float32
  float* partial_ml;            // num_splits > 1: [tokens · heads, num_splits, 2] (max, sum)
  const int32_t* positions;     // DCP: device [tokens], the new tokens' positions; else null
  float* lse_out;               // DCP: float32 [tokens, heads, R + 1] (see above); else null
  uint64_t* prof;  // benchmarks only, the decode kernel: kMlaDecodeProfSlots clock64 sums over
                   // its warps (mla_decode_block.cuh WaitProfile); else null
  const uint64_t* tree_mask;  // draft trees: device [tokens] (AttentionMetadata); else null
  int32_t* merge_counters;    // the decode kernel with partials into bf16 out (no lse_out): one
                              // counter a (sequence, row tile), zero between launches; the last
                              // of a tile's split blocks merges the partials (mla_decode_merge.cuh)
                              // and no merge kernel follows. Null: the merge kernel
  MlaRowFormat fmt;
  int num_seqs;
  int heads;
  int q_stride;  // elements per q row (>= R + P, a multiple of 8)
  int page_size;
  float scale_log2;  // softmax scale · log2(e)
  int kernel;        // MlaKernel
  int row_tiles;     // grid.x: ceil(max new tokens · heads / tile rows)
  int num_splits;    // grid.y
  int split_len;     // keys per split, a multiple of `chunk`
  int copy_width;    // bytes per cp.async of raw rows (16, 8, 4; mla_copy_width)
  int chunk;         // keys per pipeline stage (48 or 64; the plan's)
  int stages;        // pipeline stages (2 or 3; the decode kernel 2..6; the plan's)
  int tile_rows;     // query rows a block (the plan's)
  int cvt;           // MlaCvt (the decode kernel over e4m3 rows; the plan's)
  int evict_first;   // 1: the decode kernel reads rows with an L2 evict-first policy (the plan's)
  int diag;          // benchmarks only, the decode and pipelined wgmma kernels: 1 loads without
                     // math, 2 math without loads; the decode kernel also 3 without the PV
                     // warps' math, 4 without the S warps' (wrong results; where the time goes)
  int dcp_rank;      // DCP: this rank's index in its group (positions set)
  int dcp_size;      // DCP: the group's ranks (positions set)
  int l2_prefetch;   // the decode kernel: chunks of rows prefetched into L2 ahead of its stage
                     // loads (the plan's; 0: none)
  int row_groups;    // the decode kernel: 1 copies rows in groups of 4 consecutive slots where
                     // the page size is a multiple of 4, 2 in groups of 8 where it is a multiple
                     // of 8 (else of 4), 0 one row a copy (mla_decode_layout.cuh StageLayout;
                     // the plan's)
  int tree_paths;    // 1: path tiles (deterministic mode's draft trees, mla_device.cuh BlockWork;
                     // the mma kernel, one split, no partials)
  int early_kv;      // the decode kernel: 1 copies its first stages of keys that existed before
                     // the step's new tokens before waiting on the previous kernel. The
                     // caller's promise: that kernel triggers only after its own wait and
                     // writes none of those keys (CudaTunables::mla_early_kv)
  int multicast;     // the pipelined wgmma kernel: 1 runs a sequence's two row tiles as a cluster
                     // pair with multicast copies where that applies (the plan's; 0 never)
  int s_groups;      // the decode kernel's S warps at 16 rows (mla_decode_s_warps.cuh; the
                     // plan's, where a sequence's rows are one tile): 1 one group; 2 two groups
                     // of 8 rows (12 warps a block; bf16 rows or e4m3 rows through the V tile; the
                     // same bits); 3 two groups of half the dims that trade partial scores (e4m3
                     // rows through the V tile)
};
static_assert(sizeof(MlaAttentionParams) == 14 * 8 + sizeof(MlaRowFormat) + 24 * 4, "no padding");
// Where the decode kernel's warps spend their cycles (p.prof, summed over every block's warps):
// the S warps waiting for a stage's bytes, for the other S warps' row maxima, for the PV warps to
// free a P buffer, and their whole run; the PV warps waiting for P, for a stage (its bytes, or
// the producer for its empty slot), producing stages, and their whole run.
enum MlaDecodeProf : int {
  kProfSFull = 0,
  kProfSMax,
  kProfSFree,
  kProfSTotal,
  kProfPvReady,
  kProfPvStage,
  kProfPvProduce,
  kProfPvTotal,
  kMlaDecodeProfSlots
};

// Which (R, P) the kernels are built for: (512, 64) the real models, (128, 32) house-mla,
// (32, 8) the tiny fixtures. The wgmma kernel: (512, 64) with bf16 plain rows only.
bool mla_attention_supported(int latent, int rope);
bool mla_wgmma_supported(const MlaRowFormat& fmt);
// The decode kernel: R = 512, P = 64, rows and rope offset multiples of 16 bytes, bf16 plain rows,
// fp8 latent with a bf16 or fp8 rope part, FlashMLA rows (not f32 rope parts). The cache base must
// be 16-byte aligned too (mla_copy_width == 16; launch checks).
bool mla_decode_supported(const MlaRowFormat& fmt);
// Its pipeline stages of 64 keys for the format and e4m3 conversion (3 for bf16 rows, 5 for fp8
// rows, 2 for e4m3 rows with kMlaCvtTile).
int mla_decode_stages(const MlaRowFormat& fmt, int cvt = kMlaCvtHwS);
// How many 64-key chunks ahead of its stage loads the decode kernel prefetches rows into L2 by
// default (mla_decode_l2_prefetch: bf16 rows kMlaDecodeL2Prefetch, fp8 rows none). The idea: its
// shared memory holds 3 stages of bf16 rows and two are under the S and PV warps, so about one
// stage (74 KB) is in flight an SM; rows prefetched into L2 ahead keep more bytes in flight.
// Measured: on the H200 (2026-12-02, batch 64 x 4,096, `bash bench/cuda/mla_decode_run.sh`, that
// day's kernel) distance 2 lowered every layout (bf16 16 / 8 heads 74.9 / 79.2 -> 66.6 / 69.4%
// of copy, fp8 39.6 -> 36.5%). On an H100 (2026-12-06, `mla_bench --what acceptance
// --l2-prefetch 0|1`, `--what sgroups`) distance 1 took bf16 16 heads from 84.5-88.9 to
// 89.9-90.4% and 8 heads from 93.3-93.5 to 95.8-96.3%, distance 2 / 4 lost (84.6 / 56.5%), and
// fp8_flashmla lost at every distance (16 heads 64.4 -> 63.3%, 8 heads 79.5-80.3 -> 78.1-78.3%);
// in the steps (rank_step_bench variant mla_pf1): a Kimi-K2.5 rank -1.7 / -0.9 / -1.1% at batch
// 1 / 32 / 128, Moonlight bf16 -0.8 / +0.4 / +0.1% at 1 / 64 / 256.
constexpr int kMlaDecodeL2Prefetch = 1;
constexpr int kMlaDecodeMaxL2Prefetch = 8;
// The decode kernel's default L2 prefetch distance for a row format (see kMlaDecodeL2Prefetch).
int mla_decode_l2_prefetch(const MlaRowFormat& fmt);
// Whether the mma kernel copies rows straight into its bf16 tiles (bf16 plain rows) rather than
// staging and decoding them.
bool mla_mma_direct(const MlaRowFormat& fmt);
// The cp.async width for raw rows at `cache` (16 if rows and base are 16-byte aligned, else 8,
// else 4; 0: rows not 4-byte aligned, unsupported).
int mla_copy_width(const void* cache, int64_t row_bytes);

// Grid and scratch of one call. The host decides it from the batch's shape only (num_seqs,
// tokens, the most new tokens of a sequence and a bucket of the longest context), so decode
// steps inside one bucket launch the same grid and a CUDA graph replays them.
struct MlaPlan {
  int kernel = kMlaMma;
  int row_tiles = 0;
  int tile_rows = 16;
  int num_splits = 1;
  int split_len = 0;
  int chunk = 64;
  int stages = 2;
  int cvt = kMlaCvtTile;
  int evict_first = 0;
  int diag = 0;
  int l2_prefetch = 0;
  int row_groups = 1;
  int multicast = 1;
  int s_groups = 1;
  int64_t scratch_bytes = 0;  // partial_o then partial_ml, float32; 0: no partials (one split)
  // The decode kernel's split merge in its last block (MlaAttentionParams::merge_counters): the
  // counters it needs (num_seqs · row_tiles); 0: the merge kernel (or no merge).
  int64_t merge_counters = 0;
};
// Knobs for tests and benchmarks; the defaults are the production choice.
struct MlaPlanOptions {
  int wgmma = 2;         // 0: never a wgmma kernel, 1: the wgmma kernel, 2: the pipelined one
  int decode = 1;        // 0: never the decode kernel (the mma kernel instead)
  int splits = 0;        // > 0: that many key splits (some may be empty); 0: the plan's
  int bf16_chunk = 48;   // the mma kernel over bf16 rows: 48-key chunks x 3 stages, or 64 x 2
  int cvt = -1;          // the decode kernel's MlaCvt over e4m3 rows (-1: kMlaCvtTile)
  int evict_first = 0;   // the decode kernel: rows read with an L2 evict-first policy
  int diag = 0;          // MlaAttentionParams::diag (benchmarks)
  int partials = 0;      // 1: partials and the merge even with one split (DCP's lse_out needs them)
  int l2_prefetch = -1;  // the decode kernel's L2 prefetch distance in chunks (-1: the default,
                         // mla_decode_l2_prefetch; 0: none)
  int row_groups = 1;    // the decode kernel: 1 rows copied in groups of 4 where the page size
                         // allows, 2 in groups of 8, 0 one row a copy (the kernel as before)
  int stages = 0;        // the decode kernel's stages (0: as many as fit, mla_decode_stages)
  int max_splits = 0;    // > 0: at most this many key splits where the plan picks them (splits 0)
  int decode_rows = 0;   // the decode kernel's rows a block: 8 or 16 (0: 8 up to 8 rows, else 16;
                         // -1: as 0, and 8 too where 16-row blocks, one chunk each, leave SMs idle)
  int min_split_chunks = 1;  // where the plan picks the splits: at least this many chunks a split
                             // where that leaves kMlaSplitsKept splits or more
  int multicast = 1;    // the pipelined wgmma kernel's row-tile pairs with multicast copies where
                        // they apply (launch_mla_attention_wgmma_pipe); 0 never
  int fused_merge = 0;  // > 1: the decode kernel merges its splits itself where there are at
                        // most this many (and kMlaFusedMergeMaxSplits), into bf16 output (not
                        // opt.partials); CudaTunables::mla_fused_merge_max_splits
  int s_groups = 2;     // 2 / 3: the decode kernel's 16-row blocks with two groups of S warps, by
                        // rows / by dims, where the format allows it (MlaAttentionParams::s_groups
                        // says where; 3 falls back to 2); 1 one group; CudaTunables::mla_s_groups
};
// The most splits the decode kernel merges itself: its last block weighs every split of its
// rows in one pass of its warps (mla_decode_merge.cuh: a lane two splits).
constexpr int kMlaFusedMergeMaxSplits = 64;
// min_split_chunks never takes the splits below this: Moonlight's batch 1 (16 heads, 768 keys:
// 12 one-chunk splits of 8-row blocks) ran 1.9% faster a step than with 6 two-chunk splits,
// a Kimi-K2.5 rank's (8 heads, 4,096 keys) faster with 32 two-chunk splits than 64 (H200,
// 2026-12-03).
constexpr int kMlaSplitsKept = 32;
// Kernel: the pipelined wgmma kernel (opt.wgmma 1: the wgmma kernel) where it applies
// (mla_wgmma_supported and >= 64 query rows a sequence), else the decode kernel where it applies
// (mla_decode_supported; 8 rows a block when a sequence has at most 8 query rows, else 16, see
// opt.decode_rows; 64-key stages, mla_decode_stages of them), else the mma kernel (16 rows; bf16
// rows 48-key chunks in 3 stages, other formats 64-key chunks in 3 raw stages where they fit).
// Splits: enough blocks for one wave over `num_sms` when the rows alone do not fill it, in whole
// chunks (at least opt.min_split_chunks a split where the keys allow). Scratch: tokens ·
// heads · num_splits · (R + 2) · 4 bytes when num_splits > 1 or opt.partials.
MlaPlan plan_mla_attention(const MlaRowFormat& fmt, int num_seqs, int64_t num_tokens, int heads,
                           int max_new_tokens, int max_kv_len, int num_sms,
                           const MlaPlanOptions& opt = {});
// Shared memory of the mma kernel for a format, chunk and stage count (bytes).
int mla_mma_smem_bytes(const MlaRowFormat& fmt, int chunk, int stages);
constexpr int kMlaMaxSmem = 227 * 1024;
// Fills p.kernel, row_tiles, tile_rows, num_splits, split_len, chunk, stages, cvt, evict_first,
// diag, l2_prefetch, row_groups, multicast, s_groups and the partial pointers from `plan` and
// `scratch` (plan.scratch_bytes bytes, 16-byte aligned; null when none is needed). The kernels
// leave partials exactly when partial_o is set. merge_counters: plan.merge_counters zeroed int32
// counters (left zero by every launch), or null: the merge kernel merges the splits.
void apply_mla_plan(const MlaPlan& plan, void* scratch, MlaAttentionParams* p,
                    int32_t* merge_counters = nullptr);

// Sets the kernels' shared-memory limits; call once per device before the first launch (and
// before any graph capture).
void init_mla_attention_kernels();
// The attention kernel p.kernel names, then the merge when it left partials (p.partial_o) and
// does not merge them itself (p.merge_counters).
// Programmatic dependent launch on both (their first instruction waits on the predecessor).
void launch_mla_attention(const MlaAttentionParams& p, cudaStream_t stream);
// The wgmma and decode kernels alone (launch_mla_attention calls them).
void launch_mla_attention_wgmma(const MlaAttentionParams& p, cudaStream_t stream);
void init_mla_attention_wgmma_kernels();
void launch_mla_attention_wgmma_pipe(const MlaAttentionParams& p, cudaStream_t stream);
void init_mla_attention_wgmma_pipe_kernels();
void launch_mla_decode(const MlaAttentionParams& p, cudaStream_t stream);
void init_mla_decode_kernels();

// ---- decode context parallelism's merge (mla_dcp.cu) ----
// out[t, h] = Σ_n exp(lse_n - M) o_n / Σ_n exp(lse_n - M), M = max_n lse_n, over the parts
// float32 [parts, tokens, heads, R + 1] (rows as lse_out above, over disjoint key sets), summed in
// part order in float32, for the first out_heads (<= heads) heads; parts with lse -inf weigh 0.
struct MlaDcpMergeParams {
  const float* parts;
  void* out;  // [tokens, out_heads, R]: bf16 (out_f32 0) or float32
  int64_t tokens;
  int parts_n;
  int heads;
  int out_heads;
  int latent;  // R
  int out_f32;
  int pad;  // 0 (no padding bytes)
};
static_assert(sizeof(MlaDcpMergeParams) == 3 * 8 + 6 * 4, "no padding");
void launch_mla_dcp_merge(const MlaDcpMergeParams& p, cudaStream_t stream);

}  // namespace strata::cuda
