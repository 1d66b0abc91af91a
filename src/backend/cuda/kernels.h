// Launch parameters and launchers of the CUDA backend's kernels (one .cu file per op). Every
// parameter block is a trivially copyable struct: the backend records it by value, so that in
// graph mode the bytes of all blocks of a step are that step's signature (cuda_backend.h), and a
// captured graph is replayed only when every launch would be identical.
//
// Conventions: activations and weights are bf16 (uint16_t bits here, __nv_bfloat16 in kernels);
// float32 accumulation everywhere; row-major [rows, cols]. Launchers are asynchronous on
// `stream` and check the launch (CUDA_CHECK on cudaGetLastError).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/check.h"

#define CUDA_CHECK(expr)                                                                   \
  do {                                                                                     \
    const cudaError_t err_ = (expr);                                                       \
    CHECK_MSG(err_ == cudaSuccess, "CUDA: {} ({})", cudaGetErrorString(err_), #expr);      \
  } while (0)

namespace strata::cuda {

using bf16_bits = uint16_t;

// ---- elementwise / row ops (elementwise.cu, norm.cu, rope.cu) ----
struct ConvertParams {  // dst = src, f32 -> bf16
  const float* src;
  bf16_bits* dst;
  int64_t n;
};
void launch_f32_to_bf16(const ConvertParams& p, cudaStream_t stream);
// Programmatic dependent launch of the decode-path kernels (common.cuh); on by default.
void set_pdl_enabled(bool on);

// Fills n bf16 values with uniform random values in [-scale, scale] (benchmarks' weights).
void launch_fill_random_bf16(bf16_bits* dst, int64_t n, uint64_t seed, float scale,
                             cudaStream_t stream);

struct RmsNormParams {
  const bf16_bits* x;     // [rows, dim]
  bf16_bits* residual;    // [rows, dim] or null: residual += x first, then norm(residual)
  const void* weight;     // [dim], bf16 or f32 (weight_f32)
  bf16_bits* out;         // [rows, dim]; may alias x
  int64_t rows;
  int dim;
  float eps;
  int weight_f32;
  int pdl_early;          // trigger the next kernel before waiting on the previous (common.cuh)
};
void launch_rms_norm(const RmsNormParams& p, cudaStream_t stream);

struct AddParams {  // out = a + b
  const bf16_bits* a;
  const bf16_bits* b;
  bf16_bits* out;
  int64_t n;
};
void launch_add(const AddParams& p, cudaStream_t stream);

struct SiluMulParams {  // out[r, i] = silu(x[r, i]) · x[r, inter + i]
  const bf16_bits* x;   // [rows, 2 · inter]
  bf16_bits* out;       // [rows, inter]
  int64_t rows;
  int64_t inter;
};
void launch_silu_mul(const SiluMulParams& p, cudaStream_t stream);

// out[i, out_begin + c] = x[rows ? rows[i] : i, x_begin + c] for c < width: embedding, gather,
// slice_columns and copy_columns are all this copy (elements of `elem_bytes`).
struct CopyRowsParams {
  const void* x;
  void* out;
  const int32_t* rows;  // device [n] or null (identity)
  int64_t n;            // output rows
  int64_t x_stride;     // elements per x row
  int64_t out_stride;   // elements per out row
  int64_t x_begin;
  int64_t out_begin;
  int64_t width;
  int elem_bytes;
};
void launch_copy_rows(const CopyRowsParams& p, cudaStream_t stream);

// Up to four column slices of the same rows in one launch (graph mode merges the Q/K/V slices of
// a fused projection): segment s copies x[:, x_begin_s : x_begin_s + width_s] to out_s.
constexpr int kMaxSlices = 4;
struct MultiSliceParams {
  const void* x;
  int64_t n;         // rows
  int64_t x_stride;  // elements per x row
  int elem_bytes;
  int count;
  void* out[kMaxSlices];
  int64_t x_begin[kMaxSlices];
  int64_t width[kMaxSlices];  // = out row stride
};
void launch_multi_slice(const MultiSliceParams& p, cudaStream_t stream);

struct BiasAddParams {  // out[r, j] += bias[j]
  bf16_bits* out;
  const float* bias;
  int64_t rows;
  int64_t cols;
};
void launch_bias_add(const BiasAddParams& p, cudaStream_t stream);

constexpr int kMaxRopeHalf = 256;
struct RopeParams {
  bf16_bits* x;              // [tokens, heads, stride]
  bf16_bits* x2;             // a second tensor rotated in the same launch (q and k), or null
  int heads2;
  int stride2;
  const int32_t* positions;  // device [tokens]
  int64_t tokens;
  int heads;
  int stride;
  int offset;
  int half;  // rotary_dim / 2
  int interleaved;
  float attention_factor;
  float inv_freq[kMaxRopeHalf];
};
void launch_rope(const RopeParams& p, cudaStream_t stream);

// ---- linear.cu ----
// out [m, n] = x [m, k] · w [n, k]ᵀ for small m: one warp per output row, bf16 weights streamed
// once with 16-byte loads (decode GEMV). Needs k % 8 == 0 and 16-byte aligned rows.
constexpr int kGemvMaxRows = 8;
// With glu_inter > 0 the weight is a fused gate-up projection [2 · glu_inter, k] and the output
// is SwiGLU's [m, glu_inter]: out[r, j] = silu(g) · u with g, u the bf16-rounded rows j and
// glu_inter + j (bias included), computed exactly as launch_silu_mul would on the GEMV's output.
struct GemvParams {
  const bf16_bits* x;
  const bf16_bits* w;
  const float* bias;  // [n] or null
  bf16_bits* out;
  int m;
  int64_t n;
  int64_t k;
  int64_t glu_inter;       // 0: plain GEMV
  int64_t prefetch_elems;  // leading weights of each row prefetched into L2 before pdl_wait
  int block_warps;         // 4 or 8 (one weight row per warp, or per KS warps)
  int pdl_early;           // trigger the next kernel before waiting on the previous
  int mma_warps_per_sm;    // launch_gemv_mma's k-split target (0: set_gemv_mma_warps_per_sm's)
};
void launch_gemv(const GemvParams& p, cudaStream_t stream);
// Most warps that share one output row (1, 2 or 4; default 4: the launch uses 2 for the 8B
// shape's qkv, o_proj and down, measured faster on the H200; linear.cu).
void set_gemv_max_ksplit(int ks);
// Decode-path launch tunables (benchmarks compare; dispatch copies them into each GemvParams so
// a graph's signature includes them): weights of each row prefetched into L2 before the kernel
// waits on its predecessor (elements; 0 off), warps per GEMV block.
void set_gemv_prefetch_elems(int64_t elems);
int64_t gemv_prefetch_elems();
void set_gemv_block_warps(int warps);
int gemv_block_warps();
// Rows up to which dispatch sends a linear to this GEMV (1..kGemvMaxRows); above, cuBLAS. Default
// 2: its per-weight CUDA-core work grows with m, and on the H200 (8B shape, one decode step's
// linears, 2026-11-30) it took 3.83 / 4.21 / 5.08 / 8.80 ms at m = 1 / 2 / 4 / 8 against cuBLAS's
// 4.83 / 4.69 / 4.53 / 4.72 ms.
void set_gemv_max_rows(int rows);
int gemv_max_rows();

// ---- linear_mma.cu ----
// The same GEMV (plain or GLU, same GemvParams, same roundings) on the tensor cores for up to
// kGemvMmaMaxRows rows: mma.sync with 16 weight rows per tile, the rows of x as up to 8 n-tiles
// of 8 tokens; weights streamed once with 16-byte loads; any m >= 1, k % 8 == 0, 16-byte aligned.
// Its cost barely grows with m, where the FMA GEMV's grows linearly (CUDA-core bound past m ~2);
// but it streams big layers at 65-75% of copy bandwidth (see use_gemv_mma).
constexpr int kGemvMmaMaxRows = 64;
void launch_gemv_mma(const GemvParams& p, cudaStream_t stream);
// Whether dispatch sends an m-row linear / linear_silu_mul to launch_gemv_mma: m within the row
// range set here (default 2..64; STRATA_GEMV_MMA_MAX_ROWS=N lowers the top), when enabled: off
// by default (slower than the FMA GEMV / cuBLAS on the H200, linear_mma.cu), STRATA_GEMV_MMA=1
// or set_gemv_mma_enabled(true) turns it on.
bool use_gemv_mma(int64_t m);
void set_gemv_mma_rows(int min_rows, int max_rows);
int gemv_mma_min_rows();
int gemv_mma_max_rows();
void set_gemv_mma_enabled(bool on);
bool gemv_mma_enabled();
// k split: the fewest warps per tile (1, 2, 4, 8) that give every SM this many warps (default 24).
void set_gemv_mma_warps_per_sm(int warps);
int gemv_mma_warps_per_sm();
// 32-element k chunks per weight batch (loads in flight) of the 8-n-tile kernels (m > 32): 4
// (default) or 2. Process-wide, not part of a graph's signature (benchmarks compare).
void set_gemv_mma_unroll8(int u);
int gemv_mma_unroll8();

// ---- qkv_rope.cu ----
// The attention inputs of a fused QKV projection in one launch: rope on Q (to q) and on K, K and
// V stored into the layer's KV cache (quantized as kv_write does). Neox or interleaved pairs over
// dims [0, 2 · half) of each head; dims past them are copied. Values round to bf16 after rope,
// exactly as rope then kv_write would.
struct QkvRopeParams {
  const bf16_bits* qkv;      // [tokens, (heads + 2 · kv_heads) · head_dim]
  bf16_bits* q;              // [tokens, heads, head_dim]
  void* cache_k;             // [slots, kv_heads · head_dim] of kv_elem
  void* cache_v;             // [slots, kv_heads · head_dim] of kv_elem
  const int32_t* positions;  // device [tokens]
  const int32_t* slots;      // device [tokens]
  int64_t tokens;
  int heads;
  int kv_heads;
  int head_dim;
  int half;  // rotary_dim / 2
  int interleaved;
  int kv_elem;
  int pdl_early;
  float attention_factor;
  float inv_scale_k;
  float inv_scale_v;
  float inv_freq[kMaxRopeHalf];
};
void launch_qkv_rope_kv_write(const QkvRopeParams& p, cudaStream_t stream);

// ---- kv_write.cu ----
struct KvWriteParams {  // K and V rows of the new tokens in one launch
  const bf16_bits* src_k;   // [tokens, k_dim]
  const bf16_bits* src_v;   // [tokens, v_dim] (v_dim may be 0)
  void* cache_k;            // [num_slots, k_dim] of kv_elem
  void* cache_v;            // [num_slots, v_dim] of kv_elem
  const int32_t* slots;     // device [tokens]
  int64_t tokens;
  int k_dim;
  int v_dim;
  float inv_scale_k;        // stored = value · inv_scale (1 / the layer's scale, as on the CPU)
  float inv_scale_v;
  int kv_elem;              // KvElem (fp8.cuh): bf16, fp8 e4m3 or fp8 e5m2
  int pad_;
};
void launch_kv_write(const KvWriteParams& p, cudaStream_t stream);

// ---- attention (attention_decode.cu, attention_prefill.cu) ----
// The device copy of AttentionMetadata (all int32 device pointers).
struct DeviceMeta {
  const int32_t* q_indptr;      // [num_seqs + 1]
  const int32_t* kv_lens;       // [num_seqs]
  const int32_t* page_indptr;   // [num_seqs + 1]
  const int32_t* page_indices;  // [page_indptr[num_seqs]]
  const int32_t* positions;     // [num_tokens]
  const int32_t* slot_mapping;  // [num_tokens]
  int num_seqs;
  int num_tokens;
  int page_size;
  int pad_;
};

struct AttentionParams {
  const bf16_bits* q;        // [tokens, heads, head_dim]
  const void* k_cache;       // [slots, kv_heads · head_dim] of kv_elem
  const void* v_cache;       // [slots, kv_heads · head_dim] of kv_elem
  bf16_bits* out;            // [tokens, heads, head_dim]
  DeviceMeta meta;
  int heads;
  int kv_heads;
  int head_dim;
  float scale_log2;  // softmax scale · log2(e)
  float kv_scale;    // k_scale · v_scale folded where possible (1 for bf16)
  float k_scale;
  float v_scale;
  int kv_elem;       // KvElem (fp8.cuh): bf16, fp8 e4m3 or fp8 e5m2 (dequantized on load)
  // decode: split-KV
  int num_splits;
  int split_len;       // tokens per split (multiple of the block's tokens per iteration)
  float* partial_o;    // [num_seqs, heads, num_splits, head_dim]
  float* partial_ml;   // [num_seqs, heads, num_splits, 2]
  // prefill: the (sequence, first q row) of each 64-row query tile
  const int32_t* tiles;  // device [num_tiles, 2]
  int num_tiles;
  int pdl_early;  // decode kernels: trigger the next kernel before waiting on the previous
};
// Decode: every sequence has exactly one new token. Grid (splits, kv_heads, seqs); K/V chunks of
// 64 tokens through a cp.async pipeline in shared memory (attention_decode.cu).
bool decode_attention_supported(int head_dim, int group);
void launch_decode_attention(const AttentionParams& p, cudaStream_t stream);
// Split-KV sizing: aim at this many decode blocks per SM (default 4; benchmarks compare).
void set_decode_blocks_per_sm(int n);
// Tokens one decode block handles per loop iteration (split_len is a multiple of it).
int decode_tokens_per_iteration(int head_dim);
// Prefill (any ragged batch, causal, chunked): tensor-core tiles of queries × 64 keys.
constexpr int kPrefillTileRows = 64;
bool prefill_attention_supported(int head_dim);
// Tokens per entry of `tiles` (head_dim 64/128: 128 query rows = 128 / group tokens of a KV head).
int prefill_tile_tokens(int head_dim, int group);
void launch_prefill_attention(const AttentionParams& p, cudaStream_t stream);
// Sets the kernels' shared-memory limits once (before any graph capture).
void init_attention_kernels();
void init_decode_attention_kernels();  // called by init_attention_kernels

// ---- sampling.cu ----
// backend.h's SampleRowParams, byte for byte (the host array is staged as is).
struct SampleRowDev {
  float temperature;
  float top_p;
  int32_t top_k;
  float min_p;
  double uniform;
};
struct SampleParams {
  const void* logits;          // [rows, vocab] bf16 (or f32: greedy rows only)
  const SampleRowDev* params;  // device [rows]
  int32_t* out;                // device [rows]
  uint32_t* hist;              // device [rows, 65536] scratch when any row samples, else null
  int64_t vocab;
  int rows;
  int f32;
  int vec;           // rows are 16-byte aligned and a whole number of 16-byte vectors
  int any_sampling;
};
void launch_sample(const SampleParams& p, cudaStream_t stream);

}  // namespace strata::cuda
