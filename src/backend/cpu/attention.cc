// Paged attention on the CPU reference: for each sequence, gather its context from the page
// table into contiguous float32 rows (dequantizing fp8/bf16 KV), then plain causal softmax
// attention per (new token, head) in float32.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd.h"
#include "backend/kv_format.h"
#include "core/thread_pool.h"

namespace strata::cpu {
namespace {

// Copies the first `len` token rows of sequence `s` from layer `layer`'s paged K (is_k) or V cache
// [num_pages, page_size, row] into dst [len, dim] as float32.
void gather_context(const KvStorage& kv, int layer, bool is_k, const AttentionMetadata& meta, int s,
                    int64_t len, std::vector<float>& dst) {
  const KvLayout& lay = kv.layout();
  const Tensor cache = is_k ? kv.k(layer) : kv.v(layer);
  const int64_t dim = is_k ? lay.k_dim : lay.v_dim;
  const float scale = is_k ? kv.k_scale(layer) : kv.v_scale(layer);
  const DType dt = lay.layer_dtype(layer);
  dst.resize(size_t(len * dim));
  const int64_t row_bytes = is_k ? lay.k_row_bytes(layer) : lay.v_row_bytes(layer);
  const int32_t* pages = meta.page_indices + meta.page_indptr[s];
  const int64_t num_pages = meta.page_indptr[s + 1] - meta.page_indptr[s];
  CHECK_MSG((len + meta.page_size - 1) / meta.page_size <= num_pages,
            "sequence {} has {} tokens but {} pages", s, len, num_pages);
  parallel_for(len, 256, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      const int64_t slot = int64_t(pages[j / meta.page_size]) * meta.page_size + j % meta.page_size;
      const char* row = static_cast<const char*>(cache.data) + slot * row_bytes;
      if (is_k)
        decode_k_row(lay, layer, row, scale, dst.data() + j * dim);
      else
        load_kv_row(dt, row, dim, scale, dst.data() + j * dim);
    }
  });
}

// softmax(q·kⱼ · scale) over the context rows, then out = Σ pⱼ vⱼ: rows j < ctx, or rows[0..ctx)
// when `rows` is given (a draft tree's row: its cached prefix, then its ancestors). k rows have
// stride k_stride, v rows v_stride; `scores` is scratch of at least ctx floats. Each q·kⱼ is
// simd.h's dot8, so a score depends only on the two rows, never on ctx or the batch, and a tree
// row equals the causal row of its root-to-node path. Returns the log-sum-exp of the scaled
// scores (decode context parallelism merges partials with it). Cloned for AVX2.
STRATA_CPU_CLONES double attend_one(const float* q, const float* k, int64_t k_stride, int head_dim,
                                    const float* v, int64_t v_stride, int v_dim, int64_t ctx,
                                    float scale, float* scores, float* out,
                                    const int32_t* rows = nullptr) {
  float max_score = -INFINITY;
  for (int64_t j = 0; j < ctx; ++j) {
    const int64_t r = rows != nullptr ? rows[j] : j;
    scores[j] = dot8(q, k + r * k_stride, head_dim) * scale;
    max_score = std::max(max_score, scores[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < ctx; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  const float inv = float(1.0 / sum);
  std::fill(out, out + v_dim, 0.0f);
  for (int64_t j = 0; j < ctx; ++j) {
    const float p = scores[j] * inv;
    const float* vj = v + (rows != nullptr ? rows[j] : j) * v_stride;
    for (int d = 0; d < v_dim; ++d) out[d] += p * vj[d];
  }
  return double(max_score) + std::log(sum);
}

// The context rows of each new token of sequence s that has a tree mask (empty for causal rows):
// [0, first_new) then first_new + j for every bit j of its mask word.
std::vector<std::vector<int32_t>> tree_rows(const AttentionMetadata& meta, int s,
                                            int64_t first_new) {
  const int64_t q0 = meta.q_indptr[s], n_new = meta.q_indptr[s + 1] - q0;
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(n_new));
  if (meta.tree_mask == nullptr) return rows;
  for (int64_t i = 0; i < n_new; ++i) {
    const uint64_t mask = meta.tree_mask[q0 + i];
    if (mask == 0) continue;
    CHECK_MSG(n_new <= 64 && (mask >> i) == 1,
              "sequence {} token {}: tree mask {:#x} over {} new tokens (a token sees itself and "
              "earlier tokens only)",
              s, i, mask, n_new);
    std::vector<int32_t>& r = rows[size_t(i)];
    r.resize(size_t(first_new));
    std::iota(r.begin(), r.end(), 0);
    for (int64_t j = 0; j <= i; ++j)
      if (mask >> j & 1) r.push_back(int32_t(first_new + j));
  }
  return rows;
}

}  // namespace

void CpuBackend::paged_attention(const Tensor& q, const KvStorage& kv, int layer,
                                 const AttentionMetadata& meta, const AttentionArgs& args,
                                 const Tensor& out) {
  const KvLayout& lay = kv.layout();
  const int heads = args.num_heads, kv_heads = args.num_kv_heads;
  const int hd = args.head_dim, vd = args.v_head_dim;
  CHECK_EQ(lay.k_dim, kv_heads * hd);
  CHECK_EQ(lay.v_dim, kv_heads * vd);
  CHECK_EQ(heads % kv_heads, 0);
  const int group = heads / kv_heads;
  std::vector<float> keys, values;
  for (int s = 0; s < meta.num_seqs; ++s) {
    const int64_t q0 = meta.q_indptr[s], n_new = meta.q_indptr[s + 1] - q0, len = meta.kv_lens[s];
    if (n_new == 0) continue;
    gather_context(kv, layer, true, meta, s, len, keys);
    gather_context(kv, layer, false, meta, s, len, values);
    const int64_t first_pos = len - n_new;
    const std::vector<std::vector<int32_t>> rows = tree_rows(meta, s, first_pos);
    parallel_for(n_new * heads, 4, [&](int64_t b, int64_t e) {
      std::vector<float> scores(static_cast<size_t>(len));
      for (int64_t w = b; w < e; ++w) {
        const int64_t i = w / heads, h = w % heads, kvh = h / group;
        const float* qi = q.ptr<float>() + ((q0 + i) * heads + h) * hd;
        float* oi = out.ptr<float>() + ((q0 + i) * heads + h) * vd;
        const std::vector<int32_t>& r = rows[size_t(i)];
        attend_one(qi, keys.data() + kvh * hd, lay.k_dim, hd, values.data() + kvh * vd, lay.v_dim,
                   vd, r.empty() ? first_pos + i + 1 : int64_t(r.size()), args.scale, scores.data(),
                   oi, r.empty() ? nullptr : r.data());
      }
    });
  }
}

void CpuBackend::mla_attention(const Tensor& q_latent, const KvStorage& kv, int layer,
                               const AttentionMetadata& meta, const MlaArgs& args,
                               const Tensor& out) {
  const KvLayout& lay = kv.layout();
  const int heads = args.num_heads, rank = args.kv_lora_rank;
  const int width = rank + args.rope_dim;
  CHECK_EQ(lay.k_dim, width);
  std::vector<float> latent;
  for (int s = 0; s < meta.num_seqs; ++s) {
    const int64_t q0 = meta.q_indptr[s], n_new = meta.q_indptr[s + 1] - q0, len = meta.kv_lens[s];
    if (n_new == 0) continue;
    gather_context(kv, layer, true, meta, s, len, latent);
    const int64_t first_pos = len - n_new;
    const std::vector<std::vector<int32_t>> rows = tree_rows(meta, s, first_pos);
    parallel_for(n_new * heads, 4, [&](int64_t b, int64_t e) {
      std::vector<float> scores(static_cast<size_t>(len));
      for (int64_t w = b; w < e; ++w) {
        const int64_t i = w / heads, h = w % heads;
        const float* qi = q_latent.ptr<float>() + ((q0 + i) * heads + h) * width;
        float* oi = out.ptr<float>() + ((q0 + i) * heads + h) * rank;
        const std::vector<int32_t>& r = rows[size_t(i)];
        // Keys are the whole latent row (latent + rope part); values its first `rank` dims.
        attend_one(qi, latent.data(), width, width, latent.data(), width, rank,
                   r.empty() ? first_pos + i + 1 : int64_t(r.size()), args.scale, scores.data(), oi,
                   r.empty() ? nullptr : r.data());
      }
    });
  }
}

void CpuBackend::mla_attention_partial(const Tensor& q_latent, const KvStorage& kv, int layer,
                                       const AttentionMetadata& meta, const MlaArgs& args,
                                       DcpShard shard, const Tensor& out) {
  const KvLayout& lay = kv.layout();
  const int heads = args.num_heads, rank = args.kv_lora_rank;
  const int width = rank + args.rope_dim;
  CHECK_EQ(lay.k_dim, width);
  CHECK_EQ(int(out.dtype), int(DType::kF32));
  CHECK_EQ(out.dim(-1), rank + 1);
  CHECK(shard.size >= 1 && shard.rank >= 0 && shard.rank < shard.size);
  CHECK_MSG(meta.tree_mask == nullptr,
            "draft trees with decode context parallelism: not built (the mask is by row, the "
            "shards hold every size-th token)");
  std::vector<float> latent;
  for (int s = 0; s < meta.num_seqs; ++s) {
    const int64_t q0 = meta.q_indptr[s], n_new = meta.q_indptr[s + 1] - q0, len = meta.kv_lens[s];
    if (n_new == 0) continue;
    gather_context(kv, layer, true, meta, s, len, latent);
    parallel_for(n_new * heads, 4, [&](int64_t b, int64_t e) {
      std::vector<float> scores(static_cast<size_t>(std::max<int64_t>(len, 1)));
      for (int64_t w = b; w < e; ++w) {
        const int64_t i = w / heads, h = w % heads;
        // Local tokens at positions rank + size·j <= p: the causal mask by absolute position.
        const int64_t p = meta.positions[q0 + i];
        const int64_t ctx =
            p < shard.rank ? 0 : std::min<int64_t>(len, (p - shard.rank) / shard.size + 1);
        const float* qi = q_latent.ptr<float>() + ((q0 + i) * heads + h) * width;
        float* oi = out.ptr<float>() + ((q0 + i) * heads + h) * (rank + 1);
        if (ctx == 0) {
          std::fill(oi, oi + rank, 0.0f);
          oi[rank] = -INFINITY;
          continue;
        }
        oi[rank] = float(attend_one(qi, latent.data(), width, width, latent.data(), width, rank,
                                    ctx, args.scale, scores.data(), oi));
      }
    });
  }
}

}  // namespace strata::cpu
