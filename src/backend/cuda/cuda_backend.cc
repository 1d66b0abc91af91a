// CudaBackend: host-input staging, steps, uploads and downloads, the tunables. Memory is in
// device_memory.cc, the launch recorder in graph_recorder.cc, each op in its family's .cu file.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/elementwise.h"
#include "core/log.h"
#include "core/thread_pool.h"

namespace strata {

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<cuda::CudaBackend>(); }
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<cuda::CudaBackend>(options);
}

namespace cuda {
namespace {

constexpr size_t kStagingBytes = size_t(64) << 20;

}  // namespace

Status CudaBackend::check_kv_layout(const KvLayout& layout) const {
  return check_cuda_kv_layout(layout);
}

int64_t CudaBackend::device_memory_bytes() const {
  size_t free_bytes = 0, total_bytes = 0;
  return cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess ? int64_t(total_bytes) : 0;
}

// ---- CudaBackend ----
CudaBackend::CudaBackend(const BackendOptions& options)
    : pool_(std::make_shared<DevicePool>()),
      staging_(kStagingBytes),
      tunables_(CudaTunables::from_environment()),
      cpu_twin_calls_(size_t(kNumCpuTwinOps), 0) {
  tunables_.deterministic = options.deterministic;
  tunables_.check();
  recorder_.set_explain_captures(tunables_.explain_graph_captures);
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking));
  stream_ = own_stream_;
  CHECK(cublasCreate(&cublas_) == CUBLAS_STATUS_SUCCESS);
  CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
  // A fixed workspace keeps cuBLAS from allocating during graph capture.
  CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSetStream(cublas_, stream_) == CUBLAS_STATUS_SUCCESS);
  CUDA_CHECK(cudaMalloc(&mla_merge_counters_, kMlaMergeCounterCapacity * sizeof(int32_t)));
  CUDA_CHECK(
      cudaMemsetAsync(mla_merge_counters_, 0, kMlaMergeCounterCapacity * sizeof(int32_t), stream_));
  CUDA_CHECK(cudaMalloc(&head_gemv_linear_barrier_, sizeof(unsigned)));
  CUDA_CHECK(cudaMemsetAsync(head_gemv_linear_barrier_, 0, sizeof(unsigned), stream_));
  init_attention_kernels();
  // Captured graphs hold addresses of cached blocks: a trim drops them (re-captured on demand).
  pool_->set_on_trim([this] {
    // Launches recorded for a graph but not yet run may use cached blocks: never free under them.
    CHECK_MSG(!recorder_.has_pending(),
              "device memory exhausted while recording a CUDA graph step");
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // launched segments of this step still run
    recorder_.drop_graphs();
  });
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  const GraphStats& stats = recorder_.stats();
  if (stats.recorded_steps > 0) {
    const double steps = double(stats.recorded_steps);
    LOG_INFO(
        "CUDA graphs: {} steps recorded ({} segments launched before their step's end): {} "
        "replayed, {} captured ({:.2f} ms per capture); host time per recorded step {:.1f} us (of "
        "which flush {:.1f} us); {} steps eager; device pool: {} cudaMalloc, {} trims (a trim "
        "drops every graph)",
        stats.recorded_steps, stats.segments, stats.replays, stats.captures,
        stats.captures ? 1e-6 * double(stats.capture_ns) / double(stats.captures) : 0.0,
        1e-3 * double(stats.record_ns) / steps, 1e-3 * double(stats.flush_ns) / steps,
        stats.eager_steps, pool_->mallocs(), pool_->trims());
  }
  if (download_buffer_) cudaFreeHost(download_buffer_);
  recorder_.drop_graphs();
  cublasDestroy(cublas_);
  cudaFree(cublas_workspace_);
  cudaFree(mla_merge_counters_);
  cudaFree(head_gemv_linear_barrier_);
  fp8_planner_.reset();
  if (fp8_workspace_) cudaFree(fp8_workspace_);
  cudaStreamDestroy(own_stream_);
  if (side_cublas_ != nullptr) {
    cublasDestroy(side_cublas_);
    cudaFree(side_cublas_workspace_);
  }
  if (side_stream_ != nullptr) {
    cudaEventDestroy(side_fork_);
    cudaEventDestroy(side_join_);
    cudaStreamDestroy(side_stream_);
  }
}

void CudaBackend::begin_op() {
  if (in_step_) {
    // Graph mode: a long step goes to the device in segments, each replayed (or captured) as
    // soon as it holds graph_segment_launches launches, so that the device runs them while the
    // host records the rest. Never inside a side branch (a graph must end joined).
    // The first segment may be shorter (graph_first_segment_launches), the next ones double.
    if (tunables_.graph_segment_launches > 0 && side_ == SideBranch::kNone &&
        recorder_.pending_launches() >= segment_cut_) {
      recorder_.flush_segment(launch());
      segment_cut_ = std::min(2 * segment_cut_, size_t(tunables_.graph_segment_launches));
    }
    return;
  }
  in_step_ = true;
  step_start_ns_ = host_now_ns();
  const int first = tunables_.graph_first_segment_launches;
  segment_cut_ = size_t(first > 0 && first < tunables_.graph_segment_launches
                            ? first
                            : tunables_.graph_segment_launches);
  staging_.reset();
  meta_valid_ = false;
}

void CudaBackend::end_step() {
  CHECK_MSG(side_ != SideBranch::kOpen, "a step ended inside a side branch");
  join_side_branch();  // the step's launches end on the one stream
  const bool eager = !recorder_.graph_mode() && in_step_;
  recorder_.flush(launch(), step_start_ns_);
  const int64_t launched = host_now_ns();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (eager) {
    GraphStats& stats = recorder_.stats();
    ++stats.eager_steps;
    stats.eager_launch_ns += launched - step_start_ns_;
    stats.eager_wait_ns += host_now_ns() - launched;
    if (tunables_.log_eager_steps && stats.eager_steps % 256 == 0) log_eager_steps();
  }
  in_step_ = false;
  recorder_.collect_profile();
}

void CudaBackend::log_eager_steps() {
  const GraphStats& stats = recorder_.stats();
  const double n = double(stats.eager_steps - logged_.eager_steps);
  LOG_INFO(
      "CUDA eager steps: {} steps: host launching {:.2f} ms, then waiting for the device {:.2f} ms "
      "per step; device pool: {} cudaMalloc, {} trims so far",
      stats.eager_steps - logged_.eager_steps,
      1e-6 * double(stats.eager_launch_ns - logged_.eager_launch_ns) / n,
      1e-6 * double(stats.eager_wait_ns - logged_.eager_wait_ns) / n, pool_->mallocs(),
      pool_->trims());
  logged_ = stats;
}

void CudaBackend::set_profile(bool on) {
  end_step();
  recorder_.set_profile(on);
}

std::string CudaBackend::profile_report(int steps) {
  end_step();
  return recorder_.profile_report(steps);
}

void CudaBackend::synchronize() { end_step(); }

void CudaBackend::fill_random(const Tensor& t, uint64_t seed, float scale) {
  end_step();
  launch_fill_random_bf16(static_cast<bf16_bits*>(t.data), t.nbytes() / 2, seed, scale, stream_);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::fill_all_random(uint64_t seed, float scale) {
  end_step();
  for (auto& [p, bytes] : pool_->allocations())
    launch_fill_random_bf16(static_cast<bf16_bits*>(p), int64_t(bytes / 2), seed++, scale, stream_);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::set_graph_mode(bool on) {
  end_step();
  recorder_.set_graph_mode(on);
}

namespace {
// The skipped collective's place in a step (its payload bytes: the signature tells steps apart as
// a real collective's parameters would).
struct SkippedCollective {
  int64_t bytes;
};
void run_skipped_collective(const SkippedCollective&, const Launch&) {}
}  // namespace

// The recorder merges a launch with the one right before it (recorder_.last): a launch that
// runs nothing keeps both sides of the collective apart. Eager mode merges nothing.
void CudaBackend::skipped_collective(int64_t bytes) {
  if (!recorder_.graph_mode()) return;
  begin_op();
  record(kOpCollective, SkippedCollective{bytes}, run_skipped_collective);
}

void CudaBackend::set_stream(cudaStream_t s, int gemm_sm_target) {
  end_step();
  stream_ = s != nullptr ? s : own_stream_;
  CHECK(cublasSetStream(cublas_, stream_) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSetSmCountTarget(cublas_, gemm_sm_target) == CUBLAS_STATUS_SUCCESS);
  gemm_sm_target_ = gemm_sm_target;
  if (side_cublas_ != nullptr)
    CHECK(cublasSetSmCountTarget(side_cublas_, gemm_sm_target) == CUBLAS_STATUS_SUCCESS);
  reset_graphs();  // captured on the old stream
}

void CudaBackend::set_tunables(const CudaTunables& t) {
  t.check();
  end_step();
  tunables_ = t;
  reset_graphs();
}

void CudaBackend::set_dev_kernels(const DevKernels& k) {
  end_step();
  dev_ = k;
  reset_graphs();
}

void CudaBackend::reset_graphs() {
  end_step();
  recorder_.drop_graphs();
}

const int32_t* CudaBackend::stage_i32(const int32_t* host, int64_t n, int64_t copy_n) {
  begin_op();
  const int64_t found = staging_.find(host, n);
  if (found >= 0) return reinterpret_cast<const int32_t*>(staging_.device(size_t(found)));
  if (copy_n < n) copy_n = n;
  const size_t off = staging_.reserve(size_t(copy_n) * 4);
  std::memcpy(staging_.host(off), host, size_t(n) * 4);
  staging_.remember(off, n);
  struct CopyParams {
    void* dst;
    const void* src;
    size_t bytes;
  } p;
  std::memset(&p, 0, sizeof p);
  p.dst = staging_.device(off);
  p.src = staging_.host(off);
  p.bytes = size_t(copy_n) * 4;
  record<CopyParams>(kOpCopy, p, [](const CopyParams& c, const Launch& l) {
    CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyHostToDevice, l.stream));
  });
  return reinterpret_cast<const int32_t*>(staging_.device(off));
}

const DeviceMeta& CudaBackend::device_meta(const AttentionMetadata& m) {
  begin_op();
  const int n = m.num_seqs, t = m.num_tokens;
  // Everything the kernels read, in one array (backend/metadata_pack.h); every op of a step asks
  // again, and the same metadata (compared in place) keeps the copy already staged.
  if (meta_valid_ && packs_to(m, meta_packed_)) return meta_dev_;
  PackedMetadata packed = pack_attention_metadata(m);

  // The copy size is rounded up to a power of two so that a decode step's graph survives
  // sequences gaining pages.
  int64_t copy_n = 1024;
  while (copy_n < int64_t(packed.values.size())) copy_n *= 2;
  const int32_t* dev = stage_i32(packed.values.data(), int64_t(packed.values.size()), copy_n);
  // Let rope find the positions inside the packed copy.
  const size_t base = size_t(reinterpret_cast<const char*>(dev) - staging_.device(0));
  staging_.remember(base + packed.positions_at() * 4, t);

  meta_dev_ = DeviceMeta{};
  meta_dev_.q_indptr = dev + packed.q_indptr_at();
  meta_dev_.kv_lens = dev + packed.kv_lens_at();
  meta_dev_.page_indptr = dev + packed.page_indptr_at();
  meta_dev_.positions = dev + packed.positions_at();
  meta_dev_.slot_mapping = dev + packed.slot_mapping_at();
  meta_dev_.page_indices = dev + packed.pages_at;
  CHECK_MSG(reinterpret_cast<uintptr_t>(dev) % 8 == 0, "metadata staging is not 8-byte aligned");
  meta_dev_.tree_mask =
      packed.tree ? reinterpret_cast<const uint64_t*>(dev + packed.tree_at) : nullptr;
  meta_dev_.num_seqs = n;
  meta_dev_.num_tokens = t;
  meta_dev_.page_size = m.page_size;
  meta_host_ = m;
  meta_packed_ = std::move(packed);
  meta_valid_ = true;
  meta_max_q_ = 0;
  meta_min_q_ = n > 0 ? INT32_MAX : 0;
  meta_max_kv_ = 0;
  meta_short_seq_ = -1;
  for (int s = 0; s < n; ++s) {
    const int q = m.q_indptr[s + 1] - m.q_indptr[s];
    meta_max_q_ = std::max(meta_max_q_, q);
    meta_min_q_ = std::min(meta_min_q_, q);
    meta_max_kv_ = std::max(meta_max_kv_, int(m.kv_lens[s]));
    // A DCP shard's metadata (DcpAttention) holds fewer local tokens than new ones; every other
    // attention op checks this through check_new_within_kv().
    if (q > m.kv_lens[s] && meta_short_seq_ < 0) {
      meta_short_seq_ = s;
      meta_short_q_ = q;
      meta_short_kv_ = int(m.kv_lens[s]);
    }
    const int pages = m.page_indptr[s + 1] - m.page_indptr[s];
    CHECK_MSG((m.kv_lens[s] + m.page_size - 1) / m.page_size <= pages,
              "sequence {} has {} tokens but {} pages", s, m.kv_lens[s], pages);
  }
  return meta_dev_;
}

void CudaBackend::check_new_within_kv() const {
  if (meta_short_seq_ < 0) return;
  CHECK_MSG(false, "sequence {} has {} new tokens but length {}", meta_short_seq_, meta_short_q_,
            meta_short_kv_);
}

DeviceTensorPtr CudaBackend::alloc(DType dtype, const Shape& shape) {
  return std::make_unique<CudaTensor>(pool_, dtype, shape);
}

DeviceTensorPtr CudaBackend::alloc_resident(DType dtype, const Shape& shape) {
  return std::make_unique<CudaTensor>(pool_, dtype, shape, Lifetime::kResident);
}

void CudaBackend::upload_to(const Tensor& host, const Tensor& dst) {
  CHECK(host.is_contiguous() && dst.is_contiguous());
  CHECK_EQ(host.numel(), dst.numel());
  end_step();  // an eager copy, in stream order before the next step's launches
  if (host.numel() == 0) return;
  if (host.dtype == dst.dtype) {
    upload_bytes(dst.data, host.data, size_t(host.nbytes()));
    return;
  }
  // Converted on the host (small inputs: a drafter's features), then copied as stored.
  const int64_t n = host.numel();
  std::vector<float> wide(static_cast<size_t>(n));
  to_f32(host.dtype, host.data, wide.data(), n);
  std::vector<char> bytes(static_cast<size_t>(dst.nbytes()));
  from_f32(dst.dtype, wide.data(), bytes.data(), n);
  upload_bytes(dst.data, bytes.data(), bytes.size());
}

DeviceTensorPtr CudaBackend::upload(const Tensor& host, DType dtype) {
  CHECK(host.is_contiguous());
  CHECK_MSG(host.dtype == DType::kF32 || host.dtype == DType::kBF16 || host.dtype == DType::kF16,
            "upload: host tensors are float32, bf16 or f16, not {}", dtype_name(host.dtype));
  end_step();
  auto t = alloc_resident(dtype, host.shape);
  const int64_t n = host.numel();
  if (n == 0) return t;
  if (host.dtype == dtype) {  // as stored (a bf16 table): the bytes are the device's
    upload_bytes(t->view().data, host.data, size_t(host.nbytes()));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // on return the device holds it, as callers expect
    return t;
  }
  std::vector<float> wide;
  const float* f32 = host.ptr<float>();
  if (host.dtype != DType::kF32) {
    wide.resize(size_t(n));
    to_f32(host.dtype, host.data, wide.data(), n);
    f32 = wide.data();
  }
  if (dtype == DType::kBF16) {
    // Convert on the device: a float32 copy in, one kernel (weights of 8B-class models load fast).
    // Not from the pool: the float32 copy (an embedding table's is GBs) would stay cached there.
    float* tmp = nullptr;
    CUDA_CHECK(cudaMalloc(&tmp, size_t(n) * 4));
    upload_bytes(tmp, f32, size_t(n) * 4);
    launch_f32_to_bf16({tmp, static_cast<bf16_bits*>(t->view().data), n}, stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaFree(tmp));
  } else {
    std::vector<char> bytes(size_t(dtype_bytes_for(dtype, n)));
    from_f32(dtype, f32, bytes.data(), n);
    upload_bytes(t->view().data, bytes.data(), bytes.size());
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  return t;
}

// Raw bytes through the pinned buffer (a pageable copy runs at a fraction of the bus rate), then
// spread over the host thread pool into `dst`.
void CudaBackend::download(const Tensor& src, void* dst) {
  CHECK(src.is_contiguous());
  end_step();
  const size_t bytes = size_t(src.nbytes());
  if (bytes == 0) return;
  // Page-locked memory (pin_host: the capture writer's blocks) takes the device's copy directly.
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, dst) == cudaSuccess && attr.type == cudaMemoryTypeHost) {
    CUDA_CHECK(cudaMemcpy(dst, src.data, bytes, cudaMemcpyDeviceToHost));
    return;
  }
  (void)cudaGetLastError();  // an unregistered pointer's query may leave an error behind
  if (bytes > download_capacity_) {
    if (download_buffer_) CUDA_CHECK(cudaFreeHost(download_buffer_));
    download_capacity_ = std::max(bytes, size_t(1) << 20);
    CUDA_CHECK(cudaMallocHost(&download_buffer_, download_capacity_));
  }
  CUDA_CHECK(cudaMemcpy(download_buffer_, src.data, bytes, cudaMemcpyDeviceToHost));
  const char* host = static_cast<const char*>(download_buffer_);
  parallel_for(int64_t(bytes), int64_t(1) << 20, [&](int64_t b, int64_t e) {
    std::memcpy(static_cast<char*>(dst) + b, host + b, size_t(e - b));
  });
}

std::shared_ptr<void> CudaBackend::pin_host(void* p, size_t bytes) {
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    LOG_WARN("page-locking {} MB of host memory failed ({}); downloads into it are staged",
             bytes >> 20, cudaGetErrorString(e));
    return nullptr;
  }
  // At exit the context may be gone before the last block: unregistering then fails harmlessly.
  return std::shared_ptr<void>(p, [](void* q) {
    if (cudaHostUnregister(q) != cudaSuccess) (void)cudaGetLastError();
  });
}

void CudaBackend::download_f32(const Tensor& src, float* dst) {
  CHECK(src.is_contiguous());
  end_step();
  const int64_t n = src.numel();
  if (n == 0) return;
  if (src.dtype == DType::kF32) {
    CUDA_CHECK(cudaMemcpy(dst, src.data, size_t(n) * 4, cudaMemcpyDeviceToHost));
    return;
  }
  // Through a pinned buffer (a pageable copy runs at a fraction of the bus rate), converted by
  // the host thread pool: a decode batch's logits are hundreds of MB per step.
  const size_t bytes = size_t(src.nbytes());
  if (bytes > download_capacity_) {
    if (download_buffer_) CUDA_CHECK(cudaFreeHost(download_buffer_));
    download_capacity_ = std::max(bytes, size_t(1) << 20);
    CUDA_CHECK(cudaMallocHost(&download_buffer_, download_capacity_));
  }
  CUDA_CHECK(cudaMemcpy(download_buffer_, src.data, bytes, cudaMemcpyDeviceToHost));
  const char* host = static_cast<const char*>(download_buffer_);
  if (src.dtype == DType::kI32) {
    for (int64_t i = 0; i < n; ++i) dst[i] = float(reinterpret_cast<const int32_t*>(host)[i]);
    return;
  }
  const DType dt = src.dtype;
  parallel_for(n, int64_t(1) << 16, [&](int64_t b, int64_t e) {
    to_f32(dt, host + dtype_bytes_for(dt, b), dst + b, e - b);
  });
}

std::unique_ptr<KvStorage> CudaBackend::alloc_kv(const KvLayout& layout) {
  end_step();
  // The KV pool comes after the weights: the load's cached scratch (an INT4 expert stack's upload
  // buffer is ~0.8 GB on a Kimi-K2.5 rank) goes back to the driver first.
  if (pool_->bytes_cached() > 0) pool_->trim();
  return std::make_unique<CudaKvStorage>(layout);
}

}  // namespace cuda
}  // namespace strata
