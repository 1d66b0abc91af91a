// The attention ops of decode context parallelism (arch/dcp.h): each rank of a DCP group holds
// 1/N of every sequence's tokens, attends over its own shard, and returns partial outputs with
// their log-sum-exp; the partials are merged exactly afterwards. A backend with these ops
// implements DcpAttention beside Backend (the CPU reference and the CUDA backend do, the latter
// through its MLA kernels' split-KV partials: backend/cuda/mla_dcp.cu); dcp_attention() finds
// them.
#pragma once

#include "backend/backend.h"

namespace strata {

// Which tokens of each sequence this rank holds: positions rank, rank + size, rank + 2·size, …
struct DcpShard {
  int rank = 0;
  int size = 1;
};

class DcpAttention {
 public:
  virtual ~DcpAttention() = default;
  // Absorbed MLA (as Backend::mla_attention) of the new tokens over this rank's shard. Local token
  // j of sequence s is the sequence's token at position shard.rank + shard.size · j, stored at
  // index j of s's page table (meta.page_size tokens a page, meta.kv_lens[s] local tokens). A new
  // token at position p (meta.positions) attends to the local tokens at positions <= p.
  // out float32 [T, heads, kv_lora_rank + 1]: per (token, head) the softmax-normalized output over
  // those tokens, then the natural-log log-sum-exp of their scaled scores (-inf and a zero output
  // when none qualifies).
  virtual void mla_attention_partial(const Tensor& q_latent, const KvStorage& kv, int layer,
                                     const AttentionMetadata& meta, const MlaArgs& args,
                                     DcpShard shard, const Tensor& out) = 0;
  // The exact merge of N partials: parts float32 [N, T, heads, D + 1] (each as above, over
  // disjoint token sets), out [T, out_heads, D] in the activation dtype for the first out_heads
  // (<= heads) heads: Σ_n exp(lse_n - M) o_n / Σ_n exp(lse_n - M), M = max_n lse_n, summed in
  // part order.
  virtual void merge_attention_partials(const Tensor& parts, const Tensor& out) = 0;
};

// `backend`'s DCP ops, or null when it has none.
inline DcpAttention* dcp_attention(Backend& backend) {
  return dynamic_cast<DcpAttention*>(&backend);
}

}  // namespace strata
