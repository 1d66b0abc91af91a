// The CPU reference backend: float32 activations, float32 weights (dequantized at load), KV in
// f32/bf16/fp8. Plain loops plus OpenBLAS sgemm; parallel_for over rows/heads. Used by CI, the
// golden tests and as the twin every CUDA op is compared with.
#pragma once

#include "backend/backend.h"
#include "backend/dcp_attention.h"
#include "backend/top_k.h"

namespace strata::cpu {

class CpuTensor : public DeviceTensor {
 public:
  CpuTensor(DType dtype, const Shape& shape) : buffer_(dtype_bytes_for(dtype, shape_numel(shape))) {
    view_ = buffer_.as_tensor(dtype, shape);
  }

 private:
  Buffer buffer_;
};

class CpuKvStorage : public KvStorage {
 public:
  explicit CpuKvStorage(const KvLayout& layout);
  Tensor k(int layer) const override { return k_[size_t(layer)].view(); }
  Tensor v(int layer) const override { return v_[size_t(layer)].view(); }

 private:
  std::vector<CpuTensor> k_, v_;  // per layer [num_pages, page_size, k_dim|v_dim]
};

// Also the reference of decode context parallelism's ops (backend/dcp_attention.h).
class CpuBackend : public Backend, public DcpAttention, public TopKOp {
 public:
  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "cpu"; }
  DType activation_dtype() const override { return DType::kF32; }
  DType weight_dtype() const override { return DType::kF32; }

  DeviceTensorPtr alloc(DType dtype, const Shape& shape) override;
  DeviceTensorPtr upload(const Tensor& host, DType dtype) override;
  void upload_to(const Tensor& host, const Tensor& dst) override;
  void download_f32(const Tensor& src, float* dst) override;
  std::unique_ptr<KvStorage> alloc_kv(const KvLayout& layout) override;

  void embedding(const int32_t* ids, int num_tokens, const Tensor& table,
                 const Tensor& out) override;
  void linear(const Tensor& x, const LinearWeight& w, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) override;
  void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                    const Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void silu_mul(const Tensor& x, const Tensor& out) override;
  void rope(const Tensor& x, const int32_t* positions, const RopeArgs& args) override;
  void kv_write(KvStorage& kv, int layer, const Tensor& k, const Tensor& v,
                const AttentionMetadata& meta) override;
  void kv_move_rows(KvStorage& kv, const int32_t* from_slots, const int32_t* to_slots,
                    int n) override;
  void paged_attention(const Tensor& q, const KvStorage& kv, int layer,
                       const AttentionMetadata& meta, const AttentionArgs& args,
                       const Tensor& out) override;
  void mla_attention(const Tensor& q_latent, const KvStorage& kv, int layer,
                     const AttentionMetadata& meta, const MlaArgs& args,
                     const Tensor& out) override;
  void mla_attention_partial(const Tensor& q_latent, const KvStorage& kv, int layer,
                             const AttentionMetadata& meta, const MlaArgs& args, DcpShard shard,
                             const Tensor& out) override;
  void merge_attention_partials(const Tensor& parts, const Tensor& out) override;
  void gather_rows(const Tensor& x, const int32_t* rows, int n, const Tensor& out) override;
  void slice_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out) override;
  void copy_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out,
                    int64_t out_begin) override;
  void per_head_linear(const Tensor& x, int64_t x_begin, const Tensor& w, const Tensor& out,
                       int64_t out_begin) override;
  void moe_route(const Tensor& router_logits, const Tensor& correction_bias,
                 const MoeRouteArgs& args, const Tensor& topk_ids,
                 const Tensor& topk_weights) override;
  void moe_experts(const Tensor& x, const MoeExpertWeights& experts, const Tensor& topk_ids,
                   const Tensor& topk_weights, const Tensor& out) override;
  // sampling.cc: sample_row_reference per row, rows in parallel.
  void sample(const Tensor& logits, const SampleRowParams* params, int32_t* out_ids) override;
  void edit_logits(const Tensor& logits, const LogitEdit* edits, int64_t num_edits) override;
  // logit_stats.cc: logit_stats_reference per row, rows in parallel.
  void logit_stats(const Tensor& ref, const Tensor& cand, const int32_t* targets,
                   LogitStatsRow* out) override;
  // topk.cc: top_k_row_reference per row, rows in parallel.
  void top_k(const Tensor& logits, int k, int32_t* ids, float* logprobs) override;
};

// out[r][j] = x[r] · w[j] (+ bias[j]) for r < m, j < n over k inputs, with row strides ldx, ldw,
// ldo. Batch-invariant: each element's summation order depends only on k (see linear.cc).
void gemm_nt(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w,
             int64_t ldw, float* out, int64_t ldo, const float* bias = nullptr);

// Reads `n` KV values of a stored row (any KV dtype) as float32, multiplied by `scale`.
void load_kv_row(DType dtype, const void* row, int64_t n, float scale, float* dst);
// Stores `n` float32 values divided by `scale` into a KV row of `dtype`.
void store_kv_row(DType dtype, const float* src, int64_t n, float scale, void* row);

}  // namespace strata::cpu
