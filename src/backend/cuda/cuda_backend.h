// The CUDA backend: bf16 weights and activations, float32 accumulation, paged KV in bf16 or fp8
// (e4m3 / e5m2, per-layer scales and dtypes; fp8.cuh).
//
// Files, by op family as in backend/cpu/: each family is one .cu holding its kernels and its
// host entry (the CudaBackend member that checks the tensors, fills the launch parameters and
// records the launch) plus a small header with its parameter structs: attention (attention.h;
// the kernels in attention_*.cu), linear, norm, rope (and the fused qkv_rope), elementwise,
// copies (embedding, gathers, slices), kv_write, sampling, mla (MLA attention and its KV write),
// moe (routing, expert GEMMs); cpu_twin.cc runs on the CPU reference the shapes their kernels
// refuse (a declared table, counted). This class owns memory (device_memory.h), host-input
// staging, steps, the launch recorder (graph_recorder.h) and the tunables (tunables.h, the one
// place that reads the environment).
//
// Execution model. Every op becomes one or more launches, each a trivially copyable parameter
// block plus a launcher (launch.h). In eager mode (the default) a launch runs at once on the
// backend's stream. In graph mode (set_graph_mode) the launches of a step are recorded, and a
// step ends at the next download_f32 (the forward pass's logits): the step's parameter bytes are
// its signature; an identical signature replays the graph captured for it, a new one is captured
// once. This needs no help from the architecture code: host inputs (token ids, positions, page
// tables) are copied into pinned staging at offsets that depend only on the step's shapes, so a
// replay's copy nodes pick up the new values; device memory comes from a LIFO caching pool, so
// the same sequence of allocations returns the same addresses.
//
// Thread-safety: none (the engine thread only), like every Backend.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/backend_options.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/graph_recorder.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/linear_fp8.h"
#include "backend/cuda/linear_int4.h"
#include "backend/cuda/mla_inputs.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/tunables.h"
#include "backend/cuda/weight_upload.h"
#include "backend/dcp_attention.h"
#include "backend/host_pinning.h"
#include "backend/metadata_pack.h"
#include "backend/side_branch.h"
#include "backend/top_k.h"

namespace strata::cuda {

// Each cuBLAS handle's fixed workspace (the main one, a side branch's): none is allocated during
// graph capture.
inline constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

// Development kernels (bench/cuda/dev/) in place of the product's, for A/B measurements and their
// parity tests; the product never sets them. Null: the product's kernel.
struct DevKernels {
  // Prefill attention (paged_attention's regular prefill launches, every head_dim).
  void (*prefill_attention)(const AttentionParams&, const Launch&) = nullptr;
  // linear and linear_silu_mul of gemv_min_rows..gemv_max_rows rows (k % 8 == 0, 16-byte aligned
  // rows), in place of the FMA GEMV and cuBLAS.
  void (*gemv)(const GemvParams&, const Launch&) = nullptr;
  int gemv_min_rows = 1, gemv_max_rows = 0;
};

// The ops not yet on the GPU, run on the CPU reference through host copies (cpu_twin.cc).
struct CpuTwinOp {
  const char* name;    // as cpu_fallback_counts and the metrics name it
  const char* reason;  // why, and where the GPU version is tracked
};
extern const CpuTwinOp kCpuTwinOps[];
extern const int kNumCpuTwinOps;

// Also decode context parallelism's ops (backend/dcp_attention.h, mla_dcp.cu).
class CudaBackend : public Backend,
                    public DcpAttention,
                    public HostPinning,
                    public TopKOp,
                    public SideBranches {
 public:
  explicit CudaBackend(const BackendOptions& options = {});
  ~CudaBackend() override;

  Device device() const override { return Device::kCuda; }
  std::string name() const override { return "cuda"; }
  DType activation_dtype() const override { return DType::kBF16; }
  DType weight_dtype() const override { return DType::kBF16; }

  DeviceTensorPtr alloc(DType dtype, const Shape& shape) override;
  DeviceTensorPtr upload(const Tensor& host, DType dtype) override;
  void upload_to(const Tensor& host, const Tensor& dst) override;
  void download_f32(const Tensor& src, float* dst) override;
  void download(const Tensor& src, void* dst) override;
  std::shared_ptr<void> pin_host(void* p, size_t bytes) override;  // HostPinning
  std::unique_ptr<KvStorage> alloc_kv(const KvLayout& layout) override;
  // check_cuda_kv_layout (device_memory.h).
  Status check_kv_layout(const KvLayout& layout) const override;
  // cudaMemGetInfo's total for the current device; 0 when the query fails.
  int64_t device_memory_bytes() const override;

  // ---- ops, by family file ----
  // copies.cu
  void embedding(const int32_t* ids, int num_tokens, const Tensor& table,
                 const Tensor& out) override;
  void kv_move_rows(KvStorage& kv, const int32_t* from_slots, const int32_t* to_slots,
                    int n) override;
  void gather_rows(const Tensor& x, const int32_t* rows, int n, const Tensor& out) override;
  void slice_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out) override;
  void copy_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out,
                    int64_t out_begin) override;
  // linear.cu: the GEMV at decode sizes (m <= tunables().gemv_max_rows), else cuBLAS; a linear
  // with a float32 output (MoE routers) is moe.cu's linear_f32_out. linear_silu_mul: one GEMV
  // launch with the SwiGLU epilogue at decode sizes, else the Backend default.
  void linear(const Tensor& x, const LinearWeight& w, const Tensor& out) override;
  void linear_silu_mul(const Tensor& x, const LinearWeight& w, const Tensor& out) override;
  // linear_packed.cc: INT4 group-quantized and FP8 128x128-block weights stay packed (their
  // kernels: linear_int4.h, linear_fp8.h); other formats are dequantized to bf16.
  LinearWeight upload_linear(const HostLinearWeight& w, const Tensor& bias_f32) override;
  WeightPolicy weight_policy() const override;
  void per_head_linear(const Tensor& x, int64_t x_begin, const Tensor& w, const Tensor& out,
                       int64_t out_begin) override;
  // norm.cu
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) override;
  void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                    const Tensor& out) override;
  void rms_norm_columns(const Tensor& x, const Tensor& weight, float eps) override;  // one launch
  // elementwise.cu
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void silu_mul(const Tensor& x, const Tensor& out) override;
  // rope.cu; qkv_rope.cu (split + rope + KV write in one launch, else the Backend default)
  void rope(const Tensor& x, const int32_t* positions, const RopeArgs& args) override;
  void qkv_rope_kv_write(const Tensor& qkv, int heads, int kv_heads, int head_dim,
                         const RopeArgs& rope, KvStorage& kv, int layer,
                         const AttentionMetadata& meta, const Tensor& q) override;
  // kv_write.cu (MLA layouts: mla.cu)
  void kv_write(KvStorage& kv, int layer, const Tensor& k, const Tensor& v,
                const AttentionMetadata& meta) override;
  // attention.cu
  void paged_attention(const Tensor& q, const KvStorage& kv, int layer,
                       const AttentionMetadata& meta, const AttentionArgs& args,
                       const Tensor& out) override;
  // sampling.cu: one block per row; only the ids are copied back.
  void sample(const Tensor& logits, const SampleRowParams* params, int32_t* out_ids) override;
  void edit_logits(const Tensor& logits, const LogitEdit* edits, int64_t num_edits) override;
  // logit_stats.cu: one block per row; five floats a row come back.
  void logit_stats(const Tensor& ref, const Tensor& cand, const int32_t* targets,
                   LogitStatsRow* out) override;
  // topk.cu: one block per row; 2k numbers a row come back.
  void top_k(const Tensor& logits, int k, int32_t* ids, float* logprobs) override;
  // mla.cu: on the GPU for the (kv_lora_rank, rope) pairs the kernels are built for, else on the
  // CPU twin (counted).
  void mla_attention(const Tensor& q_latent, const KvStorage& kv, int layer,
                     const AttentionMetadata& meta, const MlaArgs& args,
                     const Tensor& out) override;
  // mla_inputs.cu: one launch (CudaTunables::fusion and mla_inputs_fusion; layouts and dims
  // the launch does not take: the Backend default).
  void mla_attention_inputs(const Tensor& kv_row, const Tensor& norm, const Tensor& q,
                            const Tensor& q_latent, const MlaInputsArgs& args, KvStorage& kv,
                            int layer, const AttentionMetadata& meta) override;
  // mla_query.cu: one launch (CudaTunables::fusion and mla_query_fusion; a bf16 q_b, up to 2
  // tokens, sizes mla_query_fits takes, every cluster resident at once), else false.
  bool mla_query(const MlaQueryOperands& o, KvStorage& kv, int layer,
                 const AttentionMetadata& meta) override;
  // mla_dcp.cu: the shard's partials through the MLA kernels (the CPU twin where mla_attention
  // would use it), and their merge on the GPU.
  void mla_attention_partial(const Tensor& q_latent, const KvStorage& kv, int layer,
                             const AttentionMetadata& meta, const MlaArgs& args, DcpShard shard,
                             const Tensor& out) override;
  void merge_attention_partials(const Tensor& parts, const Tensor& out) override;
  // moe.cu (shapes the kernels refuse: the CPU twin, counted)
  void moe_route(const Tensor& router_logits, const Tensor& correction_bias,
                 const MoeRouteArgs& args, const Tensor& topk_ids,
                 const Tensor& topk_weights) override;
  void moe_experts(const Tensor& x, const MoeExpertWeights& experts, const Tensor& topk_ids,
                   const Tensor& topk_weights, const Tensor& out) override;
  void moe_experts_add(const Tensor& x, const MoeExpertWeights& experts, const Tensor& topk_ids,
                       const Tensor& topk_weights, const Tensor& add, const Tensor& out) override;
  // side_branch.cc (backend/side_branch.h): a second stream at up to
  // CudaTunables::side_branch_max_rows rows.
  void begin_side_branch(int64_t rows) override;
  void end_side_branch() override;
  void join_side_branch() override;
  // Every op of kCpuTwinOps with its calls so far.
  std::vector<std::pair<std::string, int64_t>> cpu_fallback_counts() const override;

  // ---- CUDA-specific ----
  // Graph mode: see the file comment. Switching flushes the current step.
  void set_graph_mode(bool on) override;
  const CudaTunables& tunables() const { return tunables_; }
  // Ends the step and drops the captured graphs (CHECK-fails on a value out of range).
  void set_tunables(const CudaTunables& t);
  // set_tunables of the current tunables as `edit` changes them, e.g.
  // be.tune([](CudaTunables& t) { t.fusion = false; }).
  template <typename F>
  void tune(F&& edit) {
    CudaTunables t = tunables_;
    edit(t);
    set_tunables(t);
  }
  // Development kernels (bench/cuda/dev): ends the step and drops the captured graphs.
  void set_dev_kernels(const DevKernels& k);
  // Drops every captured graph.
  void reset_graphs();
  const GraphStats& graph_stats() const { return recorder_.stats(); }
  // Graph mode: records a launch that runs nothing where the collective was (no merge spans it).
  void skipped_collective(int64_t bytes) override;
  cudaStream_t stream() const { return stream_; }
  // Where and how this backend launches (benchmarks that call a launcher directly).
  Launch launch() const { return Launch{stream_, tunables_.pdl}; }
  // Benchmarks: launch on `s` from now on (e.g. a green context's stream, which runs on a share of
  // the SMs; null: the backend's own stream again), cuBLAS too, its kernels chosen for
  // `gemm_sm_target` SMs (0: the whole GPU). The caller keeps `s` alive while it is in use.
  void set_stream(cudaStream_t s, int gemm_sm_target = 0);
  // Waits for all work of the backend and ends the step (tensor-parallel workers, benchmarks).
  void synchronize() override;
  int num_sms() const { return num_sms_; }
  // Eager-mode profile (benchmarks): device time of every launch, summed per op kind, between
  // set_profile(true) and profile_report(). Events around each launch serialize them.
  void set_profile(bool on);
  std::string profile_report(int steps);
  // Benchmarks: fills `t` (bf16 view of its bytes), or every live pool allocation (weights of a
  // model loaded from a zero-filled checkpoint), with uniform random bf16 in [-scale, scale].
  void fill_random(const Tensor& t, uint64_t seed, float scale);
  void fill_all_random(uint64_t seed, float scale);
  size_t pool_bytes() const { return pool_->bytes_reserved(); }
  // Pool memory held by live tensors (reserved less the cached free blocks).
  size_t pool_bytes_in_use() const { return pool_->bytes_reserved() - pool_->bytes_cached(); }

 private:
  // Marks the start of a step at the first op after a download.
  void begin_op();
  // Flushes and waits; the next op starts a new step.
  void end_step();

  // Runs or records one launch (GraphRecorder::record) on this backend's stream, or on the side
  // stream while a side branch is open (without programmatic launch there: a side launch waits
  // for its fork in full, and the main stream's next kernel keeps the one programmatic edge).
  template <typename P>
  void record(Op op, const P& p, void (*fn)(const P&, const Launch&)) {
    recorder_.record(
        op, p, fn,
        side_ == SideBranch::kOpen ? Launch{side_stream_, false} : Launch{stream_, tunables_.pdl});
  }
  // side_branch.cc: an ended side branch's join event, taken by the launch that joins it (the
  // branch counts as joined from then on: moe_experts_add's combine waits on it); null when no
  // branch waits for its join.
  cudaEvent_t take_side_join();
  // side_branch.cc: the cuBLAS handle of a launch recorded now: the side branch's own (its own
  // workspace: a workspace never serves two streams at once) while a branch is open, else the
  // main one.
  cublasHandle_t cublas_handle();
  // Copies host int32 [n] into staging (or finds an identical staged copy this step) and
  // returns its device address. `copy_n` >= n elements are copied (a stable size for graphs).
  const int32_t* stage_i32(const int32_t* host, int64_t n, int64_t copy_n = -1);
  // The device copy of `meta` for this step (uploaded once per step and content).
  const DeviceMeta& device_meta(const AttentionMetadata& meta);
  // Scratch device memory for the duration of one op (returns to the pool at once; stream order
  // keeps later reuse safe).
  DeviceTensorPtr scratch(int64_t bytes) { return alloc(DType::kU8, {bytes}); }
  // A weight's or table's memory: its exact size, not a size class (device_memory.h Lifetime),
  // so the device holds what the planner counted.
  DeviceTensorPtr alloc_resident(DType dtype, const Shape& shape);
  // Queues device dst = host src (`bytes`) through pinned staging (weight_upload.h); returns once
  // src has been read. Weights and tables at load time.
  void upload_bytes(void* dst, const void* src, size_t bytes) {
    uploader_.copy(dst, src, bytes, stream_);
  }
  // linear_packed.cc: a dense bf16 weight (or stack that stays row-major) as its bytes, no
  // conversion.
  LinearWeight upload_dense_bf16(const HostLinearWeight& w, const Tensor& bias_f32);

  // linear.cu
  GemvParams gemv_params(const Tensor& x, const Tensor& w, const float* bias, const Tensor& out,
                         int64_t m) const;
  bool merge_gemv_pair(const GemvParams& p, GemvParams* pair) const;
  // Graph mode, gemv_norm_fusion: when the launch just recorded is the rms_norm (or
  // add_rms_norm) that made x [m, k], *n becomes it as a prologue of the kernel that reads x and
  // writes `out` (norm_prologue.cc has the conditions); merge_gemv_norm: *p takes it
  // (GemvParams::norm). The caller drops the norm's launch.
  bool take_norm_prologue(const void* x, int64_t m, int64_t k, const void* out, int64_t out_bytes,
                          NormPrologue* n) const;
  bool merge_gemv_norm(GemvParams* p) const;
  // head_gemv_linear.cu: graph mode, head_gemv_linear_fusion: when the launch just recorded is
  // the per-head GEMV that made p's x (MLA's W_UV before o_proj), records both as one launch in
  // its place; false: nothing changed (the caller records p).
  bool merge_head_gemv_linear(const GemvParams& p);
  // Graph mode, moe_combine_norm_fusion: when the launch just recorded is the MoE experts step
  // that wrote np's x, records it again with the add_rms_norm in its combine (moe.cu); false:
  // nothing changed.
  bool merge_moe_combine_norm(const RmsNormParams& np);
  // int4_norm_fusion.cc, graph mode, int4_add_norm_fusion: an add_rms_norm after the W4A16 GEMV
  // that made its x becomes that GEMV's residual update and a plain rms_norm (false: nothing
  // changed); merge_int4_gemv_norm: a W4A16 GEMV takes the rms_norm just recorded that made its x
  // as its prologue (the caller drops the norm's launch).
  bool merge_int4_add_norm(const RmsNormParams& np);
  bool merge_int4_gemv_norm(Int4LinearParams* p) const;
  // attention.cc, graph mode, decode_rope_fusion_max_seqs: when the launch just recorded is the
  // qkv_rope_kv_write that made this decode's q and new K/V rows, drops it and *p does its work
  // (AttentionParams::rope); false: nothing changed.
  bool merge_decode_rope(AttentionParams* p);
  bool dev_gemv_takes(int64_t m) const {
    return dev_.gemv != nullptr && m >= dev_.gemv_min_rows && m <= dev_.gemv_max_rows;
  }
  // linear.cu: records out [m, n] = x [m, k] · w [n, k]ᵀ (+ bias) through cuBLAS (bf16).
  void record_gemm(const void* x, const void* w, const float* bias, void* out, int64_t m, int64_t n,
                   int64_t k);
  // linear.cu: the batch-invariant GEMM (linear_det.h) of deterministic mode; bf16 or f32 out.
  void record_det_gemm(const void* x, const void* w, const float* bias, void* out, bool out_f32,
                       int64_t m, int64_t n, int64_t k);
  // linear_packed.cc: linear / linear_silu_mul (glu) of a packed weight; whether the fused
  // SwiGLU GEMV takes x.
  void linear_packed(const Tensor& x, const LinearWeight& w, const Tensor& out, bool glu);
  bool packed_glu_fused(const Tensor& x, const LinearWeight& w) const;
  // A weight's dequantized values, bf16 [stack, out, in] (the CPU twin of packed MoE experts).
  DeviceTensorPtr dequantize_bf16(const LinearWeight& w);
  // mla_inputs.cu: whether the fused inputs launch takes these operands; the separate norm's
  // parameters on the cache rows (the fused launches follow its order of sums); the launch's
  // parameters (after begin_op: the step's device metadata).
  bool mla_inputs_fusable(const Tensor& kv_row, const Tensor& norm, const Tensor& q,
                          const Tensor& q_latent, const MlaInputsArgs& args, const KvStorage& kv,
                          const AttentionMetadata& meta) const;
  static RmsNormParams mla_inputs_norm(const Tensor& kv_row, const Tensor& norm);
  MlaInputsParams mla_inputs_params(const Tensor& kv_row, const Tensor& norm, const Tensor& q,
                                    const Tensor& q_latent, const MlaInputsArgs& args,
                                    KvStorage& kv, int layer, const AttentionMetadata& meta);
  // mla.cu: kv_write of a layout with MLA rows (rope_dim > 0).
  void mla_kv_write(KvStorage& kv, int layer, const Tensor& k, const AttentionMetadata& meta);
  // cpu_twin.cc: mla_attention for what the MLA kernels do not cover.
  void mla_attention_cpu_twin(const Tensor& q_latent, const KvStorage& kv, int layer,
                              const AttentionMetadata& meta, const MlaArgs& args,
                              const Tensor& out);
  // mla.cu: mla_attention (shard null: bf16 out) or mla_attention_partial (float32 out rows
  // [output | log-sum-exp] over the shard) on the MLA kernels; false, launching nothing, where
  // they do not cover the layer (the caller runs the CPU twin).
  bool mla_attention_gpu(const Tensor& q_latent, const KvStorage& kv, int layer,
                         const AttentionMetadata& meta, const MlaArgs& args, const Tensor& out,
                         const DcpShard* shard);
  // cpu_twin.cc: mla_attention_partial for what the MLA kernels do not cover.
  void mla_attention_partial_cpu_twin(const Tensor& q_latent, const KvStorage& kv, int layer,
                                      const AttentionMetadata& meta, const MlaArgs& args,
                                      DcpShard shard, const Tensor& out);
  // moe.cu: a linear with a float32 output (MoE routers: the reference scores experts in
  // float32); the upload of a stacked expert weight in the MoE kernels' layout (moe_weights.h);
  // the MoE GEMM kernels' one-time setup (before any graph capture).
  void linear_f32_out(const Tensor& x, const LinearWeight& w, const Tensor& out);
  LinearWeight upload_moe_stack(const HostLinearWeight& w, const LinearFormat& device_format);
  void init_moe_kernels();
  // cpu_twin.cc: the MoE ops on the CPU reference for the shapes the kernels refuse (`why`);
  // sampling rows of float32 logits (not produced by this backend's models).
  void linear_f32_out_twin(const Tensor& x, const LinearWeight& w, const Tensor& out,
                           const char* why);
  void moe_route_twin(const Tensor& router_logits, const Tensor& correction_bias,
                      const MoeRouteArgs& args, const Tensor& topk_ids, const Tensor& topk_weights,
                      const char* why);
  void moe_experts_twin(const Tensor& x, const MoeExpertWeights& experts, const Tensor& topk_ids,
                        const Tensor& topk_weights, const Tensor& out, const char* why);
  void sample_f32_logits(const Tensor& logits, const SampleRowParams* params, int32_t* out_ids);
  // Counts a call of kCpuTwinOps[i]; the first one is logged as a warning (with `why` if given).
  void count_cpu_twin(int i, const char* why = nullptr);

  std::shared_ptr<DevicePool> pool_;
  cudaStream_t stream_ = nullptr;  // where launches go (own_stream_ unless set_stream)
  // side_branch.cc: the side stream and its fork and join events (made at the first branch);
  // the branch's state (the pool defers releases from kOpen until the join).
  enum class SideBranch { kNone, kOpen, kEnded };
  SideBranch side_ = SideBranch::kNone;
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t side_fork_ = nullptr, side_join_ = nullptr;
  cublasHandle_t side_cublas_ = nullptr;  // the branch's cuBLAS (made at its first GEMM)
  void* side_cublas_workspace_ = nullptr;
  cudaStream_t own_stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  int gemm_sm_target_ = 0;  // set_stream's cuBLAS SM count target (0: all), both handles
  int num_sms_ = 0;
  Staging staging_;
  bool in_step_ = false;
  CudaTunables tunables_;
  DevKernels dev_;
  GraphRecorder recorder_;

  // The metadata of this step, as uploaded.
  bool meta_valid_ = false;
  AttentionMetadata meta_host_;
  PackedMetadata meta_packed_;  // the host values it was uploaded from
  DeviceMeta meta_dev_{};
  int meta_max_q_ = 0, meta_min_q_ = 0, meta_max_kv_ = 0;
  // The first sequence with more new tokens than its length (or -1), its new tokens and length.
  int meta_short_seq_ = -1, meta_short_q_ = 0, meta_short_kv_ = 0;
  // CHECKs that every sequence of the step's metadata holds its new tokens (all attention but
  // a DCP shard's, whose local length can be shorter).
  void check_new_within_kv() const;

  int64_t step_start_ns_ = 0;  // host clock at the step's first op (graph mode's record time)
  // mla_query.cu: whether the fused MLA query's clusters at a shape (tokens, q_lora_rank, heads,
  // q dims a head, nope, latent) are all resident at once.
  std::map<std::array<int64_t, 6>, bool> mla_query_one_wave_;
  // head_gemv_linear.cu: whether its grid is resident at once at (tokens, shared-memory bytes),
  // and its grid barrier's word (zeroed at construction; used by that kernel alone, on the main
  // stream).
  std::map<std::array<int64_t, 2>, bool> head_gemv_linear_one_wave_;
  unsigned* head_gemv_linear_barrier_ = nullptr;
  // Graph mode: pending launches at which the step's next segment is cut (begin_op).
  size_t segment_cut_ = 0;
  GraphStats logged_{};  // the counters at the last eager-steps log (log_eager_steps)

  PinnedUploader uploader_;          // upload_bytes' staging (pinned at the first upload)
  void* download_buffer_ = nullptr;  // pinned host memory for download_f32
  size_t download_capacity_ = 0;

  std::vector<int64_t> cpu_twin_calls_;  // per kCpuTwinOps entry

  // linear_packed.cc: made with the first packed weight.
  bool int4_ready_ = false;                      // init_int4_linear_kernels() done
  void* fp8_workspace_ = nullptr;                // cuBLASLt's, for every FP8 GEMM
  std::unique_ptr<Fp8GemmPlanner> fp8_planner_;  // plans per (m, n, k)
  bool mla_ready_ = false;                       // mla.cu: init_mla_attention_kernels() done
  // mla.cu: the MLA decode kernel's split-merge counters (MlaAttentionParams::merge_counters),
  // zeroed at construction; every launch leaves them zero. A fixed array (256 KB): captured
  // graphs keep its address.
  static constexpr int64_t kMlaMergeCounterCapacity = 1 << 16;
  int32_t* mla_merge_counters_ = nullptr;

  // moe.cu
  bool moe_ready_ = false;  // init_moe_gemm_kernels() done
  // The router GEMV's tile counters and the fused route's two (moe_route.h; always zero between
  // launches).
  DeviceTensorPtr moe_router_counters_;

  void log_eager_steps();
};

// ---- helpers of the op families' host entries ----
// A parameter block with every byte zero (padding included: its bytes join a graph's signature).
template <typename P>
P zeroed() {
  P p;
  std::memset(static_cast<void*>(&p), 0, sizeof p);
  return p;
}

inline void check_bf16(const Tensor& t, const char* what) {
  CHECK_MSG(t.dtype == DType::kBF16, "{}: expected a bf16 tensor, got {}", what,
            dtype_name(t.dtype));
  CHECK_MSG(t.device == Device::kCuda || t.data == nullptr, "{}: tensor is not on the GPU", what);
}

}  // namespace strata::cuda
