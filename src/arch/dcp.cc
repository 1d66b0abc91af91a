#include "arch/dcp.h"

#include "core/check.h"

namespace strata {

void DcpLocalBatch::build(const AttentionMetadata& meta, DcpShard shard, int pool_page_size) {
  const int n = shard.size, r = shard.rank;
  CHECK_MSG(meta.page_size == pool_page_size * n,
            "decode context parallelism over {} ranks: the step's page of {} tokens is not {} pool "
            "pages of {}",
            n, meta.page_size, n, pool_page_size);
  kv_lens.resize(size_t(meta.num_seqs));
  for (int s = 0; s < meta.num_seqs; ++s) {
    const int32_t len = meta.kv_lens[s];  // positions 0 .. len - 1; this rank's: r, r + n, …
    kv_lens[size_t(s)] = len > r ? (len - r + n - 1) / n : 0;
  }
  owned_rows.clear();
  owned_slots.clear();
  for (int t = 0; t < meta.num_tokens; ++t) {
    const int32_t pos = meta.positions[t];
    if (pos % n != r) continue;
    // The engine's slot is page · page_size · n + pos mod (page_size · n); the pool's is
    // page · page_size + local offset.
    const int32_t page = meta.slot_mapping[t] / meta.page_size;
    owned_rows.push_back(t);
    owned_slots.push_back(page * pool_page_size + (pos % meta.page_size) / n);
  }
  attn = meta;
  attn.page_size = pool_page_size;
  attn.kv_lens = kv_lens.data();
  write = attn;
  write.num_tokens = int(owned_rows.size());
  write.slot_mapping = owned_slots.data();
}

void mla_dcp_attention(Backend& be, DcpAttention& ops, Communicator& group, const MlaDims& d,
                       int group_heads, const MlaAbsorbedWeights& w, float scale, const Tensor& q,
                       const Tensor& kv_rows, KvStorage& kv, int layer, const DcpLocalBatch& local,
                       const Tensor& out) {
  const int64_t t = q.dim(0), heads = d.num_heads, rank = d.kv_lora_rank, width = d.cache_dim();
  const int64_t n = group.size(), hg = group_heads;
  CHECK_LE(heads, hg);
  const DType act = be.activation_dtype();
  // The owned tokens' rows only.
  if (!local.owned_rows.empty()) {
    const int owned = int(local.owned_rows.size());
    auto mine = be.alloc(act, {owned, width});
    be.gather_rows(kv_rows, local.owned_rows.data(), owned, *mine);
    be.kv_write(kv, layer, *mine, Tensor{}, local.write);
  }
  // This rank's absorbed queries in the first `heads` of hg padded heads.
  auto q_latent = be.alloc(act, {t, heads, width});
  be.per_head_linear(q, 0, *w.w_uk, *q_latent, 0);
  be.copy_columns(q, d.qk_nope_head_dim, d.q_head_dim(), *q_latent, rank);
  auto q_padded = be.alloc(act, {t, hg, width});
  if (heads > 0)
    be.copy_columns(q_latent->view().reshape({t, heads * width}), 0, heads * width,
                    q_padded->view().reshape({t, hg * width}), 0);
  auto q_group = be.alloc(act, {n, t, hg, width});
  group.all_gather(*q_padded, *q_group);
  // Every group head over this rank's shard: parts[g] holds rank g's heads.
  auto parts = be.alloc(DType::kF32, {n, t, hg, rank + 1});
  const MlaArgs args{.scale = scale,
                     .num_heads = int(hg),
                     .kv_lora_rank = int(rank),
                     .rope_dim = d.qk_rope_head_dim};
  const DcpShard shard{.rank = group.rank(), .size = int(n)};
  for (int64_t g = 0; g < n; ++g)
    ops.mla_attention_partial(q_group->view().slice_rows(g, g + 1).reshape({t, hg, width}), kv,
                              layer, local.attn, args, shard,
                              parts->view().slice_rows(g, g + 1).reshape({t, hg, rank + 1}));
  // Each rank gets every rank's partials of its own heads, and merges them.
  auto mine = be.alloc(DType::kF32, {n, t, hg, rank + 1});
  group.all_to_all(*parts, *mine);
  auto latent_out = be.alloc(act, {t, heads, rank});
  ops.merge_attention_partials(*mine, *latent_out);
  be.per_head_linear(*latent_out, 0, *w.w_uv, out, 0);
}

}  // namespace strata
