// Paged attention of the CUDA backend: the decode kernel (attention_decode.cu), the prefill
// kernels (attention_prefill.cu: head_dim 16/32 and the dispatch; attention_prefill_wgmma.cu:
// head_dim 64/128; attention_prefill_split.h: short chunks over long contexts), and the host
// entry that picks among them (attention.cc).
#pragma once

#include "backend/cuda/launch.h"

namespace strata::cuda {

// The device copy of AttentionMetadata (all int32 device pointers).
struct DeviceMeta {
  const int32_t* q_indptr;      // [num_seqs + 1]
  const int32_t* kv_lens;       // [num_seqs]
  const int32_t* page_indptr;   // [num_seqs + 1]
  const int32_t* page_indices;  // [page_indptr[num_seqs]]
  const int32_t* positions;     // [num_tokens]
  const int32_t* slot_mapping;  // [num_tokens]
  const uint64_t* tree_mask;    // [num_tokens] or null (AttentionMetadata::tree_mask)
  int num_seqs;
  int num_tokens;
  int page_size;
  int pad_;
};

// Decode: the step's attention inputs made by the decode kernel itself (graph mode merges
// qkv_rope_kv_write into the decode launch: CudaTunables::decode_rope_fusion_max_seqs). From the
// QKV projection's output the kernel rotates Q and the new token's K, stores the new K and V rows
// into the cache and writes q, every value with qkv_rope.cu's bits. Neox pairs over the whole
// head or interleaved pairs over dims [0, 2 · half); head_dim 32, 64 or 128.
constexpr int kMaxDecodeRopeHalf = 64;
struct DecodeRopeFusion {
  const bf16_bits* qkv;  // [tokens, (heads + 2 · kv_heads) · head_dim]; null: no fusion
  bf16_bits* q_out;      // [tokens, heads, head_dim]: the rotated Q, as qkv_rope writes it
  void* cache_k;         // the layer's caches (AttentionParams::k_cache, v_cache), written
  void* cache_v;
  float attention_factor;
  float inv_scale_k;  // 1 / k_scale, as qkv_rope_kv_write computes it
  float inv_scale_v;
  int half;  // rotary_dim / 2
  int interleaved;
  int reserved_zero;  // no padding bytes: the parameters are a captured graph's signature
  float inv_freq[kMaxDecodeRopeHalf];
};
static_assert(sizeof(DecodeRopeFusion) == 4 * 8 + 6 * 4 + kMaxDecodeRopeHalf * 4,
              "DecodeRopeFusion has no padding");

struct AttentionParams {
  const bf16_bits* q;   // [tokens, heads, head_dim]
  const void* k_cache;  // [slots, kv_heads · head_dim] of kv_elem
  const void* v_cache;  // [slots, kv_heads · head_dim] of kv_elem
  bf16_bits* out;       // [tokens, heads, head_dim]
  DeviceMeta meta;
  int heads;
  int kv_heads;
  int head_dim;
  float scale_log2;  // softmax scale · log2(e)
  float kv_scale;    // k_scale · v_scale folded where possible (1 for bf16)
  float k_scale;
  float v_scale;
  int kv_elem;  // KvElem (fp8.cuh): bf16, fp8 e4m3 or fp8 e5m2 (dequantized on load)
  // decode: split-KV
  int num_splits;
  int split_len;      // tokens per split (multiple of the block's tokens per iteration)
  float* partial_o;   // [num_seqs, heads, num_splits, head_dim]
  float* partial_ml;  // [num_seqs, heads, num_splits, 2]
  // prefill: the (sequence, first q row) of each query tile; a first row with kTreePathTile set
  // is a path tile (below)
  const int32_t* tiles;  // device [num_tiles, 2]
  int num_tiles;
  int pdl_early;   // decode kernels: trigger the next kernel before waiting on the previous
  int tree_paths;  // prefill: 1 when `tiles` holds path tiles (kTreePathTile)
  // decode: 1 copies its first chunks of keys older than the step's new token before waiting on
  // the previous kernel. The caller's promise: that kernel triggers only after its own wait and
  // writes none of those keys (CudaTunables::decode_early_kv).
  int early_kv;
  DecodeRopeFusion rope;  // decode: null rope.qkv unless merged
};
static_assert(sizeof(AttentionParams) ==
                  4 * 8 + sizeof(DeviceMeta) + 10 * 4 + 3 * 8 + 4 * 4 + sizeof(DecodeRopeFusion),
              "AttentionParams has no padding");

// Decode: every sequence has exactly one new token. Grid (splits, kv_heads, seqs); K/V chunks of
// 64 tokens through a cp.async pipeline in shared memory (attention_decode.cu).
bool decode_attention_supported(int head_dim, int group);
void launch_decode_attention(const AttentionParams& p, const Launch& launch);
// Tokens one decode block handles per loop iteration (split_len is a multiple of it).
int decode_tokens_per_iteration(int head_dim);
// Decode's split-KV: how many splits of how many keys each sequence's context is cut into, for a
// batch of num_seqs x kv_heads blocks a split. Sized from the power-of-two bucket of max_kv (at
// least 256), so a captured graph's grid holds while contexts grow inside the bucket.
struct DecodeSplitPlan {
  int splits = 1;
  int split_len = 0;  // keys a split, a multiple of tokens_per_iteration
};
struct CudaTunables;
// The rule: decode_blocks_per_sm, decode_large_batch_blocks_per_sm,
// decode_split_fill_second_round and decode_min_split_tokens (tunables.h).
DecodeSplitPlan plan_decode_splits(int64_t num_seqs, int kv_heads, int64_t max_kv, int num_sms,
                                   int tokens_per_iteration, const CudaTunables& rule);
void init_decode_attention_kernels();

// Prefill (any ragged batch, causal, chunked). head_dim 64/128 with a group of at most
// kGroupedPrefillRows query heads per KV head: the grouped tensor-core kernel
// (attention_prefill_wgmma.cu), a block = kGroupedPrefillRows (token, query head of the group)
// rows of one KV head; other head sizes (16, 32): the simple kernel, 64-row tiles of one head.
constexpr int kPrefillTileRows = 64;
// Deterministic mode's draft-tree rows (attention.cc): a tile whose first row carries this bit
// holds that one new token, and its block gathers the token's keys in logical order: the
// sequence's cached keys, then its tree ancestors and itself (the set bits of its tree word, in
// slot order) at positions first, first + 1, ..., first + depth. The keys then fall into the
// same 64-key tiles, in the same order, as plain decoding of the token's path gives them, so
// the row's result is bitwise that of plain decoding (tree_mask.cuh path_key).
constexpr int32_t kTreePathTile = int32_t(1) << 30;
constexpr int kGroupedPrefillRows = 128;
bool prefill_attention_supported(int head_dim);
bool grouped_prefill_supported(int head_dim, int group);
// Tokens per entry of `tiles` (grouped: kGroupedPrefillRows / group tokens of a KV head).
int prefill_tile_tokens(int head_dim, int group);
void launch_prefill_attention(const AttentionParams& p, const Launch& launch);
// The grouped kernel on Hopper's wgmma (attention_prefill_wgmma.cuh) as the product runs it:
// K/V tiles of 64 keys, 3 K/V stages for bf16 KV at head_dim 64, else 2 (bench/cuda/dev
// measures the other tile sizes and stage counts).
void launch_wgmma_prefill(const AttentionParams& p, const Launch& launch);

// Set the kernels' shared-memory limits once (before any graph capture).
void init_attention_kernels();  // all of them
void init_prefill_attention_kernels();
void init_wgmma_prefill_kernels();

}  // namespace strata::cuda
