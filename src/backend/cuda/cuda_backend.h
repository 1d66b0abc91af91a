// The CUDA backend: bf16 weights and activations, float32 accumulation, paged KV in bf16 or fp8
// (e4m3 / e5m2, per-layer scales and dtypes; fp8.cuh).
//
// Files: one .cu per op (kernels.h lists the launchers); dispatch.cc turns Backend calls into
// launches; this class owns memory, host-input staging and CUDA graphs; fallback.cc runs the
// ops not yet ported (MLA attention, MoE) on the CPU twin through host copies.
//
// Execution model. Every op becomes one or more launches, each a trivially copyable parameter
// block plus a launcher. In eager mode (the default) a launch runs at once on the backend's
// stream. In graph mode (set_graph_mode) the launches of a step are recorded, and a step ends at
// the next download_f32 (the forward pass's logits): the step's parameter bytes are its
// signature; an identical signature replays the graph captured for it, a new one is captured
// once. This needs no help from the architecture code: host inputs (token ids, positions, page
// tables) are copied into pinned staging at offsets that depend only on the step's shapes, so a
// replay's copy nodes pick up the new values; device memory comes from a LIFO caching pool, so
// the same sequence of allocations returns the same addresses.
//
// Thread-safety: none (the engine thread only), like every Backend.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"

namespace strata::cuda {

// Device memory, cached by size class (size_class) and reused last-freed-first. Returns cached
// memory to the driver only when an allocation would otherwise fail (trim).
class DevicePool {
 public:
  DevicePool() = default;
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  ~DevicePool();
  void* alloc(size_t bytes);
  void release(void* ptr, size_t bytes);
  size_t bytes_reserved() const { return reserved_; }
  // Frees every cached block (alloc does this once before failing for lack of memory).
  void trim();
  void set_on_trim(std::function<void()> fn) { on_trim_ = std::move(fn); }
  static size_t size_class(size_t bytes);
  int64_t mallocs() const { return mallocs_; }  // cudaMalloc calls (a cache miss each)
  int64_t trims() const { return trims_; }      // cache flushes (each synchronizes the device)
  // Every allocation and its size (benchmarks fill them with random values).
  const std::vector<std::pair<void*, size_t>>& allocations() const { return owned_; }

 private:
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::vector<std::pair<void*, size_t>> owned_;
  size_t reserved_ = 0;
  int64_t mallocs_ = 0, trims_ = 0;
  std::function<void()> on_trim_;
};

class CudaTensor : public DeviceTensor {
 public:
  CudaTensor(std::shared_ptr<DevicePool> pool, DType dtype, const Shape& shape);
  ~CudaTensor() override;

 private:
  std::shared_ptr<DevicePool> pool_;
  size_t bytes_ = 0;
};

class CudaKvStorage : public KvStorage {
 public:
  explicit CudaKvStorage(const KvLayout& layout);
  ~CudaKvStorage() override;
  Tensor k(int layer) const override { return k_[size_t(layer)]; }
  Tensor v(int layer) const override { return v_[size_t(layer)]; }

 private:
  void* memory_ = nullptr;
  std::vector<Tensor> k_, v_;  // per layer [num_pages, page_size, k_dim | v_dim], layer dtype
};

// Pinned host memory mirrored by device memory: the per-step host inputs. Offsets restart at
// every step, so a step's layout depends only on the order and sizes of what it stages.
class Staging {
 public:
  explicit Staging(size_t capacity_bytes);
  ~Staging();
  void reset() {
    used_ = 0;
    entries_.clear();
  }
  // Reserves `bytes` (256-byte aligned); returns the offset.
  size_t reserve(size_t bytes);
  char* host(size_t offset) const { return host_ + offset; }
  char* device(size_t offset) const { return device_ + offset; }
  // A staged int32 array whose contents equal host[0..n), or -1.
  int64_t find(const int32_t* host, int64_t n) const;
  void remember(size_t offset, int64_t n) { entries_.push_back({offset, n}); }
  size_t capacity() const { return capacity_; }

 private:
  struct Entry {
    size_t offset;
    int64_t n;
  };
  char* host_ = nullptr;
  char* device_ = nullptr;
  size_t capacity_ = 0, used_ = 0;
  std::vector<Entry> entries_;
};

struct GraphStats {
  int64_t captures = 0;
  int64_t replays = 0;
  int64_t eager_steps = 0;
  // Graph mode: host time from a step's first op to its graph launch (recording, signature,
  // lookup), summed over `recorded_steps`. The device idles through it.
  int64_t record_ns = 0;
  int64_t recorded_steps = 0;
  // The part of record_ns spent in flush (signature hash and lookup, graph launch or capture).
  int64_t flush_ns = 0;
  // The part of flush_ns spent capturing and instantiating graphs for new signatures.
  int64_t capture_ns = 0;
  // Eager steps: host time from the first op to the step's end (launching every op), and the
  // wait for the device after it. A wait near zero means the host, not the GPU, set the pace.
  int64_t eager_launch_ns = 0;
  int64_t eager_wait_ns = 0;
};

class CudaBackend : public Backend {
 public:
  CudaBackend();
  ~CudaBackend() override;

  Device device() const override { return Device::kCuda; }
  std::string name() const override { return "cuda"; }
  DType activation_dtype() const override { return DType::kBF16; }
  DType weight_dtype() const override { return DType::kBF16; }

  DeviceTensorPtr alloc(DType dtype, const Shape& shape) override;
  DeviceTensorPtr upload(const Tensor& host_f32, DType dtype) override;
  void download_f32(const Tensor& src, float* dst) override;
  std::unique_ptr<KvStorage> alloc_kv(const KvLayout& layout) override;
  // bf16, fp8_e4m3 and fp8_e5m2 plain rows per layer (mixed allowed); refuses MLA fp8 rows
  // (rope split, FlashMLA tiles), fp8 MLA caches in general, and every other dtype.
  Status check_kv_layout(const KvLayout& layout) const override;

  void embedding(const int32_t* ids, int num_tokens, const Tensor& table, const Tensor& out) override;
  void linear(const Tensor& x, const LinearWeight& w, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) override;
  void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                    const Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void silu_mul(const Tensor& x, const Tensor& out) override;
  void rope(const Tensor& x, const int32_t* positions, const RopeArgs& args) override;
  void kv_write(KvStorage& kv, int layer, const Tensor& k, const Tensor& v,
                const AttentionMetadata& meta) override;
  void paged_attention(const Tensor& q, const KvStorage& kv, int layer,
                       const AttentionMetadata& meta, const AttentionArgs& args,
                       const Tensor& out) override;
  void mla_attention(const Tensor& q_latent, const KvStorage& kv, int layer,
                     const AttentionMetadata& meta, const MlaArgs& args, const Tensor& out) override;
  void gather_rows(const Tensor& x, const int32_t* rows, int n, const Tensor& out) override;
  void slice_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out) override;
  // Fused ops: one GEMV launch with the SwiGLU epilogue at decode sizes (m <= gemv_max_rows());
  // one launch for split + rope + KV write (qkv_rope.cu). Otherwise the Backend defaults.
  void linear_silu_mul(const Tensor& x, const LinearWeight& w, const Tensor& out) override;
  void qkv_rope_kv_write(const Tensor& qkv, int heads, int kv_heads, int head_dim,
                         const RopeArgs& rope, KvStorage& kv, int layer,
                         const AttentionMetadata& meta, const Tensor& q) override;
  void copy_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out,
                    int64_t out_begin) override;
  void per_head_linear(const Tensor& x, int64_t x_begin, const Tensor& w, const Tensor& out,
                       int64_t out_begin) override;
  void moe_route(const Tensor& router_logits, const Tensor& correction_bias,
                 const MoeRouteArgs& args, const Tensor& topk_ids,
                 const Tensor& topk_weights) override;
  void moe_experts(const Tensor& x, const MoeExpertWeights& experts, const Tensor& topk_ids,
                   const Tensor& topk_weights, const Tensor& out) override;
  // sampling.cu, one block per row; only the ids are copied back.
  void sample(const Tensor& logits, const SampleRowParams* params, int32_t* out_ids) override;

  // ---- CUDA-specific ----
  // Graph mode: see the file comment. Switching flushes the current step.
  void set_graph_mode(bool on) override;
  // Programmatic dependent launch on/off (A/B): drops the captured graphs.
  void set_pdl(bool on);
  // Decode kernels (GEMV, RMSNorm, fused rope/KV write, decode attention) trigger their
  // successor before waiting on their predecessor (common.cuh pdl_enter). Off by default: on the
  // H200 batch-1 decode ran 0.5 ms/token slower with it (bench/RESULTS.md, 2026-11-29 night).
  void set_pdl_early(bool on);
  // The fused ops (linear_silu_mul, qkv_rope_kv_write) as one launch (default) or through the
  // Backend defaults (A/B measurements, parity tests).
  void set_fusion(bool on);
  // Drops every captured graph (after changing a launch tunable that is not in the signature).
  void reset_graphs();
  const GraphStats& graph_stats() const { return stats_; }
  cudaStream_t stream() const { return stream_; }
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

 private:
  friend struct Dispatch;
  // Marks the start of a step at the first op after a download.
  void begin_op();
  // Graph mode: replays or captures the recorded launches. Eager: nothing.
  void flush();
  // Flushes and waits; the next op starts a new step.
  void end_step();
  // A linear with a float32 output (MoE routers: the reference scores experts in float32), on
  // the CPU twin like the other DeepSeek ops (fallback.cc).
  void linear_f32_out(const Tensor& x, const LinearWeight& w, const Tensor& out);

  // Runs (eager) or records (graph mode) one launch. `op` and the bytes of `p` join the step's
  // signature; `p` must be fully initialized, padding included (memset before filling).
  template <typename P>
  void record(int op, const P& p, void (*fn)(const P&, cudaStream_t)) {
    if (!graph_mode_) {
      if (profile_) {
        Profiled e{op, nullptr, nullptr};
        CUDA_CHECK(cudaEventCreate(&e.start));
        CUDA_CHECK(cudaEventCreate(&e.stop));
        CUDA_CHECK(cudaEventRecord(e.start, stream_));
        fn(p, stream_);
        CUDA_CHECK(cudaEventRecord(e.stop, stream_));
        profiled_.push_back(e);
      } else {
        fn(p, stream_);
      }
      return;
    }
    last_op_ = op;
    last_sig_start_ = signature_.size();
    signature_.append(reinterpret_cast<const char*>(&op), sizeof op);
    signature_.append(reinterpret_cast<const char*>(&p), sizeof p);
    // The parameter bytes already sit in the signature: a pending launch only names them (no
    // allocation per launch; the host's recording time is time the device waits).
    pending_.push_back(Pending{&run_recorded<P>, reinterpret_cast<AnyFn>(fn),
                               last_sig_start_ + sizeof op});
  }

  using AnyFn = void (*)();
  // Runs a recorded launch from its parameter bytes (copied out: the signature's bytes carry no
  // alignment guarantee).
  template <typename P>
  static void run_recorded(const char* bytes, AnyFn fn, cudaStream_t s) {
    P p;
    std::memcpy(static_cast<void*>(&p), bytes, sizeof p);
    reinterpret_cast<void (*)(const P&, cudaStream_t)>(fn)(p, s);
  }
  struct Pending {
    void (*run)(const char*, AnyFn, cudaStream_t);
    AnyFn fn;
    size_t offset;  // of the parameter bytes in signature_
  };

  // Graph mode: removes the last recorded launch (to record a merged one instead).
  void drop_last() {
    pending_.pop_back();
    signature_.resize(last_sig_start_);
    last_op_ = 0;
  }

  // Copies host int32 [n] into staging (or finds an identical staged copy this step) and
  // returns its device address. `copy_n` >= n elements are copied (a stable size for graphs).
  const int32_t* stage_i32(const int32_t* host, int64_t n, int64_t copy_n = -1);
  // The device copy of `meta` for this step (uploaded once per step and content).
  const DeviceMeta& device_meta(const AttentionMetadata& meta);
  // Scratch device memory for the duration of one op (returns to the pool at once; stream order
  // keeps later reuse safe).
  DeviceTensorPtr scratch(int64_t bytes) { return alloc(DType::kU8, {bytes}); }

  std::shared_ptr<DevicePool> pool_;
  cudaStream_t stream_ = nullptr;      // where launches go (own_stream_ unless set_stream)
  cudaStream_t own_stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  int num_sms_ = 0;
  Staging staging_;
  bool in_step_ = false;

  // The metadata of this step, as uploaded.
  bool meta_valid_ = false;
  AttentionMetadata meta_host_;
  std::vector<int32_t> meta_copy_;  // the host values it was uploaded from
  DeviceMeta meta_dev_{};
  int meta_max_q_ = 0, meta_min_q_ = 0, meta_max_kv_ = 0;

  bool graph_mode_ = false;
  bool pdl_early_ = false;
  bool fusion_ = true;
  int64_t step_start_ns_ = 0;  // host clock at the step's first op (graph mode's record time)
  bool log_eager_ = false;     // STRATA_STEP_TIMING=1: log eager_* every 256 eager steps
  GraphStats logged_{};        // the counters at the last such log
  // The last recorded launch (graph mode): consecutive column slices of one tensor and the q/k
  // rope pair merge into one launch.
  int last_op_ = 0;
  size_t last_sig_start_ = 0;
  MultiSliceParams last_slice_{};
  RopeParams last_rope_{};
  std::string signature_;
  std::vector<Pending> pending_;
  struct Graph {
    std::string signature;
    cudaGraphExec_t exec = nullptr;
  };
  std::unordered_map<size_t, Graph> graphs_;
  static constexpr size_t kMaxGraphs = 256;  // captured steps kept at once (flush starts over)
  GraphStats stats_;

  void* download_buffer_ = nullptr;  // pinned host memory for download_f32
  size_t download_capacity_ = 0;

  bool profile_ = false;
  struct Profiled {
    int op;
    cudaEvent_t start, stop;
  };
  std::vector<Profiled> profiled_;
  std::unordered_map<int, std::pair<double, int64_t>> profile_ms_;  // op -> (ms, launches)
  void collect_profile();
  void log_eager_steps();
};

// The name of a dispatch op id (profiles).
const char* op_name(int op);

}  // namespace strata::cuda
