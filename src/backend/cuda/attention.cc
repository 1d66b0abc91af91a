// Paged attention's host entry (attention.h): picks the kernel of each batch. Decode batches
// (one new token per sequence) take the split-KV decode kernel, its split count sized from a
// power-of-two bucket of the longest context; prefill and mixed batches take the split-KV
// prefill kernel for short chunks over long contexts (attention_prefill_split.h) and the regular
// prefill kernels for the rest.
#include "backend/cuda/attention.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/attention_prefill_split.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/kv_write.h"
#include "backend/cuda/rope.h"

namespace strata::cuda {

void init_attention_kernels() {
  init_decode_attention_kernels();
  init_prefill_attention_kernels();
  init_split_prefill_kernels();
}

// Batches whose one split fits one round of SMs (num_seqs x kv_heads <= decode_blocks_per_sm x
// SMs): the fewest splits that give every SM a block; where those overflow the round (after the
// split length's rounding), as many as fill two rounds. Larger batches: the fewest splits that
// give 90% of decode_large_batch_blocks_per_sm blocks an SM (before 2026-12-07: all of four,
// every batch). Why (H100, Llama-3.1-8B W4A16 steps, 2026-12-07 session 49, against that rule):
// batch 1 at 2,048 / 4,096 / 16,384 keys -3 / -8 / -8% with 128 blocks (16 splits), bf16 and
// Qwen2.5-7B at 4,096 -5 / -4%; batch 16 at 2,048 / 4,096 keys -6 / -3% with 2 splits (256 blocks),
// where 1 split (128 blocks) lost +5%; batch 4 at 4,096 keys 5 splits (160 blocks) +1.8%, 8 (256)
// -0.5%; batch 8 -1.1%; batch 64 at 2,048 one split (512 blocks) -1.7% against two. From 17 to 48
// sequences one split a sequence (136-384 blocks of whole contexts) lost +0.6 to +6.7%. The same
// counts hold over fp8_e4m3 KV, whose block allows four resident an SM where bf16's allows two
// (session 50: batch 1 / 16 -7 / -5% against that rule; two blocks an SM no better): the count
// follows the SMs, not the blocks resident on each.
DecodeSplitPlan plan_decode_splits(int64_t num_seqs, int kv_heads, int64_t max_kv, int num_sms,
                                   int tokens_per_iteration, const CudaTunables& rule) {
  int64_t bucket = 256;
  while (bucket < max_kv) bucket *= 2;
  const int64_t per_split = std::max<int64_t>(1, num_seqs * kv_heads);  // blocks a split
  const int64_t round = int64_t(rule.decode_blocks_per_sm) * num_sms;
  const int64_t tpi = tokens_per_iteration;
  const int64_t max_splits =
      std::max<int64_t>(1, bucket / std::max<int64_t>(rule.decode_min_split_tokens, tpi));
  // Splits of whole iterations: the count after rounding the length up may be smaller.
  auto plan_for = [&](int64_t splits) {
    splits = std::clamp<int64_t>(splits, 1, max_splits);
    const int64_t len = ((bucket + splits - 1) / splits + tpi - 1) / tpi * tpi;
    return DecodeSplitPlan{int((bucket + len - 1) / len), int(len)};
  };
  if (per_split > round) {  // 90% of the target: 512 blocks on 132 SMs at four, not 1,024
    const int64_t large = int64_t(rule.decode_large_batch_blocks_per_sm) * num_sms * 9 / 10;
    return plan_for((large + per_split - 1) / per_split);
  }
  DecodeSplitPlan plan = plan_for((round + per_split - 1) / per_split);
  if (rule.decode_split_fill_second_round && plan.splits * per_split > round) {
    const DecodeSplitPlan two = plan_for(2 * round / per_split);
    if (two.splits > plan.splits) plan = two;
  }
  return plan;
}

bool CudaBackend::merge_decode_rope(AttentionParams* p) {
  QkvRopeParams r;
  if (!tunables_.fusion || p->meta.num_seqs > tunables_.decode_rope_fusion_max_seqs ||
      !recorder_.last(kOpQkvRope, &r))
    return false;
  const int hd = p->head_dim;
  const int64_t width = int64_t(p->heads + 2 * p->kv_heads) * hd;
  const bool shape = (hd == 32 || hd == 64 || hd == 128) && r.head_dim == hd &&
                     r.heads == p->heads && r.kv_heads == p->kv_heads &&
                     r.tokens == p->meta.num_tokens && r.tokens == p->meta.num_seqs;
  const bool same = r.q == p->q && r.cache_k == p->k_cache && r.cache_v == p->v_cache &&
                    r.positions == p->meta.positions && r.slots == p->meta.slot_mapping &&
                    r.kv_elem == p->kv_elem;
  // Neox over the whole head (a lane holds both dims of its pairs), or interleaved.
  const bool pairs = r.interleaved ? 2 * r.half <= hd : 2 * r.half == hd;
  // Every block reads the projection's output while some write q and out.
  const int64_t in_bytes = r.tokens * width * 2, out_bytes = r.tokens * p->heads * hd * 2;
  if (!shape || !same || !pairs || byte_ranges_overlap(r.qkv, in_bytes, r.q, out_bytes) ||
      byte_ranges_overlap(r.qkv, in_bytes, p->out, out_bytes))
    return false;
  recorder_.drop_last();
  DecodeRopeFusion& f = p->rope;
  f.qkv = r.qkv;
  f.q_out = r.q;
  f.cache_k = r.cache_k;
  f.cache_v = r.cache_v;
  f.attention_factor = r.attention_factor;
  f.inv_scale_k = r.inv_scale_k;
  f.inv_scale_v = r.inv_scale_v;
  f.half = r.half;
  f.interleaved = r.interleaved;
  for (int i = 0; i < r.half; ++i) f.inv_freq[i] = r.inv_freq[i];
  return true;
}

void CudaBackend::paged_attention(const Tensor& q, const KvStorage& kv, int layer,
                                  const AttentionMetadata& meta, const AttentionArgs& args,
                                  const Tensor& out) {
  const KvLayout& lay = kv.layout();
  const int heads = args.num_heads, kv_heads = args.num_kv_heads, hd = args.head_dim;
  CHECK_EQ(lay.k_dim, kv_heads * hd);
  CHECK_EQ(lay.v_dim, kv_heads * args.v_head_dim);
  CHECK_MSG(args.v_head_dim == hd, "CUDA paged attention: v_head_dim {} != head_dim {}",
            args.v_head_dim, hd);
  CHECK_EQ(heads % kv_heads, 0);
  check_bf16(q, "attention q");
  check_bf16(out, "attention out");
  if (meta.num_tokens == 0) return;
  const DeviceMeta& dm = device_meta(meta);
  check_new_within_kv();
  auto p = zeroed<AttentionParams>();
  p.q = q.ptr<bf16_bits>();
  p.k_cache = kv.k(layer).data;
  p.v_cache = kv.v(layer).data;
  p.kv_elem = kv_elem_of(kv.k(layer));
  p.out = out.ptr<bf16_bits>();
  p.meta = dm;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = hd;
  p.scale_log2 = args.scale * 1.4426950408889634f;
  p.k_scale = kv.k_scale(layer);
  p.v_scale = kv.v_scale(layer);
  p.kv_scale = p.k_scale * p.v_scale;
  p.pdl_early = tunables_.pdl_early;
  const int group = heads / kv_heads;

  // Deterministic mode: every batch takes the regular prefill kernels below, whose result for a
  // query row depends on its own keys only (64-key tiles from key 0; keys past the row's position
  // are masked and add exact zeros), not on the batch, the chunk or the split count.
  if (meta_min_q_ == 1 && meta_max_q_ == 1 && decode_attention_supported(hd, group) &&
      !tunables_.deterministic) {
    const DecodeSplitPlan split =
        plan_decode_splits(meta.num_seqs, kv_heads, meta_max_kv_, num_sms_,
                           decode_tokens_per_iteration(hd), tunables_);
    p.num_splits = split.splits;
    p.split_len = split.split_len;
    p.early_kv = tunables_.decode_early_kv && !tunables_.pdl_early ? 1 : 0;
    DeviceTensorPtr work;
    if (split.splits > 1) {
      const int64_t parts = int64_t(meta.num_seqs) * heads * split.splits;
      work = scratch(parts * (hd + 2) * 4);
      p.partial_o = static_cast<float*>(work->view().data);
      p.partial_ml = p.partial_o + parts * hd;
    }
    merge_decode_rope(&p);
    record(kOpDecode, p, launch_decode_attention);
    return;
  }
  // Short query chunks over long contexts: split-KV (attention_prefill_split.h); the regular
  // kernels below take the batch's other sequences.
  SplitPrefillPlan plan;
  if (plan_split_prefill(meta, hd, group, kv_heads, p.kv_elem != kKvBf16, num_sms_,
                         tunables_.deterministic ? 0 : tunables_.prefill_split_mode,
                         tunables_.prefill_split_blocks_per_sm, &plan)) {
    auto sp = zeroed<SplitPrefillParams>();
    std::memcpy(static_cast<void*>(&sp.a), &p, sizeof p);
    sp.a.split_len = plan.split_len;
    sp.a.num_tiles = int(plan.work.size() / 4);
    sp.a.tiles = stage_i32(plan.work.data(), int64_t(plan.work.size()));
    sp.num_combine = int(plan.combine.size() / 4);
    DeviceTensorPtr work;
    if (sp.num_combine > 0) {
      sp.combine = stage_i32(plan.combine.data(), int64_t(plan.combine.size()));
      const int64_t rows = plan.partial_groups * kv_heads * kSplitPrefillRows;
      work = scratch(rows * (hd + 2) * 4);
      sp.a.partial_o = static_cast<float*>(work->view().data);
      sp.a.partial_ml = sp.a.partial_o + rows * hd;
    }
    record(kOpPrefill, sp, launch_split_prefill);
  }
  CHECK_MSG(prefill_attention_supported(hd), "CUDA paged attention: head_dim {} not supported", hd);
  std::vector<int32_t> tiles;
  const int tile_tokens = prefill_tile_tokens(hd, group);
  // Deterministic mode: a draft tree's rows one to a tile, each with its keys in path order (path
  // tiles, attention.h kTreePathTile), so a row's sums run as plain decoding of its path runs
  // them. (A shared tile would hold the row's ancestors at their tree slots, with masked
  // siblings between them: other 64-key tiles, another order, other bits.)
  const bool path_tiles =
      tunables_.deterministic && tunables_.deterministic_tree_paths && meta.tree_mask != nullptr;
  for (int s = 0; s < meta.num_seqs; ++s) {
    if (plan.takes(s)) continue;  // split-KV above
    const int q0 = meta.q_indptr[s], n_new = meta.q_indptr[s + 1] - q0;
    if (path_tiles && std::any_of(meta.tree_mask + q0, meta.tree_mask + q0 + n_new,
                                  [](uint64_t w) { return w != 0; })) {
      for (int r = 0; r < n_new; ++r) {
        tiles.push_back(s);
        tiles.push_back(r | kTreePathTile);
      }
      p.tree_paths = 1;
      continue;
    }
    for (int r = 0; r < n_new; r += tile_tokens) {
      tiles.push_back(s);
      tiles.push_back(r);
    }
  }
  p.num_tiles = int(tiles.size() / 2);
  if (p.num_tiles == 0) return;
  p.tiles = stage_i32(tiles.data(), int64_t(tiles.size()));
  record(kOpPrefill, p,
         dev_.prefill_attention != nullptr && !tunables_.deterministic ? dev_.prefill_attention
                                                                       : launch_prefill_attention);
}

}  // namespace strata::cuda
