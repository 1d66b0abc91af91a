// CudaBackend: memory (caching pool, KV storage), host-input staging, steps and CUDA graphs,
// uploads and downloads. The ops' dispatch is in dispatch.cc.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/log.h"
#include "core/thread_pool.h"

namespace strata {

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<cuda::CudaBackend>(); }

namespace cuda {
namespace {

constexpr size_t kAlign = 256;
constexpr size_t kStagingBytes = size_t(64) << 20;
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

// ---- DevicePool ----
DevicePool::~DevicePool() {
  for (auto& [p, bytes] : owned_) cudaFree(p);
}

// Size classes: 256-byte multiples up to 1 MiB, then four classes per power of two, so that the
// activations of decode batches of every size (a new size each step under continuous batching)
// share a bounded set of blocks instead of each size keeping its own.
size_t DevicePool::size_class(size_t bytes) {
  bytes = std::max(kAlign, round_up(bytes, kAlign));
  if (bytes <= (size_t(1) << 20)) return bytes;
  size_t pow2 = size_t(1) << 20;
  while (pow2 * 2 < bytes) pow2 *= 2;
  return round_up(bytes, pow2 / 4);
}

void* DevicePool::alloc(size_t bytes) {
  bytes = size_class(bytes);
  auto& list = free_[bytes];
  if (!list.empty()) {
    void* p = list.back();
    list.pop_back();
    return p;
  }
  void* p = nullptr;
  ++mallocs_;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    // Give the cached free blocks back to the driver and retry once.
    (void)cudaGetLastError();
    trim();
    err = cudaMalloc(&p, bytes);
  }
  CHECK_MSG(err == cudaSuccess, "cudaMalloc of {} bytes failed ({} reserved): {}", bytes,
            reserved_, cudaGetErrorString(err));
  owned_.push_back({p, bytes});
  reserved_ += bytes;
  return p;
}

void DevicePool::trim() {
  ++trims_;
  CUDA_CHECK(cudaDeviceSynchronize());  // cached blocks may still be in use by queued work
  if (on_trim_) on_trim_();
  for (auto& [bytes, list] : free_) {
    for (void* p : list) {
      CUDA_CHECK(cudaFree(p));
      reserved_ -= bytes;
      owned_.erase(std::find(owned_.begin(), owned_.end(), std::pair<void*, size_t>{p, bytes}));
    }
    list.clear();
  }
}

void DevicePool::release(void* ptr, size_t bytes) {
  free_[size_class(bytes)].push_back(ptr);
}

CudaTensor::CudaTensor(std::shared_ptr<DevicePool> pool, DType dtype, const Shape& shape)
    : pool_(std::move(pool)), bytes_(size_t(dtype_bytes_for(dtype, shape_numel(shape)))) {
  void* p = bytes_ > 0 ? pool_->alloc(bytes_) : nullptr;
  view_ = Tensor::make(p, dtype, shape, Device::kCuda);
}

CudaTensor::~CudaTensor() {
  if (view_.data) pool_->release(view_.data, bytes_);
}

// ---- KV storage ----
namespace {
Status check_cuda_kv_layout(const KvLayout& layout) {
  for (int l = 0; l < layout.num_layers; ++l) {
    const DType dt = layout.layer_dtype(l);
    const bool fp8 = dt == DType::kFP8E4M3 || dt == DType::kFP8E5M2;
    if (dt != DType::kBF16 && !fp8)
      return unimplemented("CUDA backend: KV dtype {} (layer {}) is not implemented; use bf16, "
                           "fp8_e4m3 or fp8_e5m2", dtype_name(dt), l);
    if (!fp8) continue;
    if (layout.format == KvFormat::kFlashMlaFp8)
      return unimplemented("CUDA backend: the FlashMLA FP8 KV layout (fp8_flashmla) is not "
                           "implemented; use --device cpu or a bf16 KV cache");
    if (layout.k_row_is_split(l))
      return unimplemented("CUDA backend: MLA KV rows with a separate rope dtype "
                           "(--kv-mla-rope-dtype) are not implemented; use --device cpu");
    if (layout.rope_dim > 0)
      return unimplemented("CUDA backend: fp8 MLA KV caches are not implemented (the MLA "
                           "attention kernels are not ported); use --device cpu or bf16 KV");
  }
  return Status();
}
}  // namespace

Status CudaBackend::check_kv_layout(const KvLayout& layout) const {
  return check_cuda_kv_layout(layout);
}

CudaKvStorage::CudaKvStorage(const KvLayout& layout) : KvStorage(layout) {
  const Status st = check_cuda_kv_layout(layout);
  CHECK_MSG(st.ok(), "{}", st.message());
  std::vector<size_t> k_off, v_off;
  size_t total = 0;
  const int64_t slots = layout.num_pages * layout.page_size;
  for (int l = 0; l < layout.num_layers; ++l) {
    const DType dt = layout.layer_dtype(l);
    k_off.push_back(total);
    total += round_up(size_t(dtype_bytes_for(dt, slots * layout.k_dim)), kAlign);
    v_off.push_back(total);
    total += round_up(size_t(dtype_bytes_for(dt, slots * layout.v_dim)), kAlign);
  }
  CUDA_CHECK(cudaMalloc(&memory_, std::max<size_t>(total, kAlign)));
  CUDA_CHECK(cudaMemset(memory_, 0, std::max<size_t>(total, kAlign)));
  char* base = static_cast<char*>(memory_);
  for (int l = 0; l < layout.num_layers; ++l) {
    const DType dt = layout.layer_dtype(l);
    k_.push_back(Tensor::make(base + k_off[size_t(l)], dt,
                              {layout.num_pages, layout.page_size, layout.k_dim}, Device::kCuda));
    v_.push_back(Tensor::make(layout.v_dim > 0 ? base + v_off[size_t(l)] : nullptr, dt,
                              {layout.num_pages, layout.page_size, layout.v_dim}, Device::kCuda));
  }
}

CudaKvStorage::~CudaKvStorage() { cudaFree(memory_); }

// ---- Staging ----
Staging::Staging(size_t capacity_bytes) : capacity_(capacity_bytes) {
  CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_), capacity_));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_), capacity_));
}

Staging::~Staging() {
  cudaFreeHost(host_);
  cudaFree(device_);
}

size_t Staging::reserve(size_t bytes) {
  const size_t off = used_;
  used_ = round_up(used_ + bytes, kAlign);
  CHECK_MSG(used_ <= capacity_, "host-input staging overflow: {} of {} bytes", used_, capacity_);
  return off;
}

int64_t Staging::find(const int32_t* host, int64_t n) const {
  for (const Entry& e : entries_)
    if (e.n == n && std::memcmp(host_ + e.offset, host, size_t(n) * 4) == 0) return int64_t(e.offset);
  return -1;
}

// ---- CudaBackend ----
CudaBackend::CudaBackend() : pool_(std::make_shared<DevicePool>()), staging_(kStagingBytes) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking));
  stream_ = own_stream_;
  CHECK(cublasCreate(&cublas_) == CUBLAS_STATUS_SUCCESS);
  CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
  // A fixed workspace keeps cuBLAS from allocating during graph capture.
  CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSetStream(cublas_, stream_) == CUBLAS_STATUS_SUCCESS);
  init_attention_kernels();
  if (const char* e = std::getenv("STRATA_STEP_TIMING")) log_eager_ = std::string_view(e) == "1";
  // Captured graphs hold addresses of cached blocks: a trim drops them (re-captured on demand).
  pool_->set_on_trim([this] {
    // Launches recorded for a graph but not yet run may use cached blocks: never free under them.
    CHECK_MSG(pending_.empty(), "device memory exhausted while recording a CUDA graph step");
    for (auto& [h, g] : graphs_) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
  });
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  if (stats_.recorded_steps > 0) {
    const double steps = double(stats_.recorded_steps);
    LOG_INFO("CUDA graphs: {} steps recorded: {} replayed, {} captured ({:.2f} ms per capture); "
             "host time per recorded step {:.1f} us (of which flush {:.1f} us); {} steps eager",
             stats_.recorded_steps, stats_.replays, stats_.captures,
             stats_.captures ? 1e-6 * double(stats_.capture_ns) / double(stats_.captures) : 0.0,
             1e-3 * double(stats_.record_ns) / steps, 1e-3 * double(stats_.flush_ns) / steps,
             stats_.eager_steps);
  }
  if (download_buffer_) cudaFreeHost(download_buffer_);
  for (auto& [h, g] : graphs_) cudaGraphExecDestroy(g.exec);
  cublasDestroy(cublas_);
  cudaFree(cublas_workspace_);
  cudaStreamDestroy(own_stream_);
}

namespace {
int64_t host_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void CudaBackend::begin_op() {
  if (in_step_) return;
  in_step_ = true;
  step_start_ns_ = host_now_ns();
  staging_.reset();
  meta_valid_ = false;
}

namespace {
// The graph cache's key: 8 bytes per multiply (a step's signature is tens of KB at batch 1, and
// the host hashes it on the device's critical path); equality is still checked on the whole
// signature.
size_t signature_hash(const std::string& s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  for (; i < s.size(); ++i) h = (h ^ uint8_t(s[i])) * 0x94D049BB133111EBull;
  return size_t(h ^ (h >> 29));
}
}  // namespace

void CudaBackend::flush() {
  if (!graph_mode_ || pending_.empty()) return;
  const int64_t flush_start = host_now_ns();
  const size_t h = signature_hash(signature_);
  auto it = graphs_.find(h);
  if (it != graphs_.end() && it->second.signature == signature_) {
    CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream_));
    ++stats_.replays;
  } else {
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    for (const Pending& l : pending_) l.run(signature_.data() + l.offset, l.fn, stream_);
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    if (it != graphs_.end()) {
      cudaGraphExecDestroy(it->second.exec);
    } else if (graphs_.size() >= kMaxGraphs) {
      // Serving meets many step shapes (batch sizes x context buckets): keep memory bounded by
      // starting over; the shapes in use are captured again on their next step.
      for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
      graphs_.clear();
    }
    graphs_[h] = Graph{signature_, exec};
    CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    ++stats_.captures;
    stats_.capture_ns += host_now_ns() - flush_start;
  }
  pending_.clear();
  signature_.clear();
  last_op_ = 0;
  const int64_t now = host_now_ns();
  stats_.flush_ns += now - flush_start;
  stats_.record_ns += now - step_start_ns_;
  ++stats_.recorded_steps;
}

void CudaBackend::end_step() {
  const bool eager = !graph_mode_ && in_step_;
  if (graph_mode_) flush();
  const int64_t launched = host_now_ns();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (eager) {
    ++stats_.eager_steps;
    stats_.eager_launch_ns += launched - step_start_ns_;
    stats_.eager_wait_ns += host_now_ns() - launched;
    if (log_eager_ && stats_.eager_steps % 256 == 0) log_eager_steps();
  }
  in_step_ = false;
  collect_profile();
}

void CudaBackend::log_eager_steps() {
  const double n = double(stats_.eager_steps - logged_.eager_steps);
  LOG_INFO("CUDA eager steps: {} steps: host launching {:.2f} ms, then waiting for the device {:.2f} ms "
           "per step; device pool: {} cudaMalloc, {} trims so far",
           stats_.eager_steps - logged_.eager_steps,
           1e-6 * double(stats_.eager_launch_ns - logged_.eager_launch_ns) / n,
           1e-6 * double(stats_.eager_wait_ns - logged_.eager_wait_ns) / n, pool_->mallocs(), pool_->trims());
  logged_ = stats_;
}

void CudaBackend::collect_profile() {
  for (const Profiled& e : profiled_) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e.start, e.stop));
    auto& acc = profile_ms_[e.op];
    acc.first += ms;
    ++acc.second;
    cudaEventDestroy(e.start);
    cudaEventDestroy(e.stop);
  }
  profiled_.clear();
}

void CudaBackend::set_profile(bool on) {
  end_step();
  profile_ = on;
  profile_ms_.clear();
}

std::string CudaBackend::profile_report(int steps) {
  end_step();
  std::vector<std::pair<int, std::pair<double, int64_t>>> rows(profile_ms_.begin(), profile_ms_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  double total = 0;
  for (auto& r : rows) total += r.second.first;
  std::string out;
  for (auto& [op, v] : rows)
    out += fmt::format("profile  {:<14} {:8.1f} us/step  {:5.1f} launches/step  {:6.2f} us/launch  {:5.1f}%\n",
                       op_name(op), 1e3 * v.first / steps, double(v.second) / steps,
                       1e3 * v.first / double(v.second), 100.0 * v.first / total);
  out += fmt::format("profile  total          {:8.1f} us/step\n", 1e3 * total / steps);
  return out;
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
  graph_mode_ = on;
}

void CudaBackend::set_stream(cudaStream_t s, int gemm_sm_target) {
  end_step();
  stream_ = s != nullptr ? s : own_stream_;
  CHECK(cublasSetStream(cublas_, stream_) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSetSmCountTarget(cublas_, gemm_sm_target) == CUBLAS_STATUS_SUCCESS);
  reset_graphs();  // captured on the old stream
}

void CudaBackend::set_pdl(bool on) {
  set_pdl_enabled(on);
  reset_graphs();
}

void CudaBackend::set_pdl_early(bool on) {
  pdl_early_ = on;
  reset_graphs();
}

void CudaBackend::set_fusion(bool on) {
  fusion_ = on;
  reset_graphs();
}

void CudaBackend::reset_graphs() {
  end_step();
  for (auto& [h, g] : graphs_) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
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
  record<CopyParams>(1, p, [](const CopyParams& c, cudaStream_t s) {
    CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyHostToDevice, s));
  });
  return reinterpret_cast<const int32_t*>(staging_.device(off));
}

const DeviceMeta& CudaBackend::device_meta(const AttentionMetadata& m) {
  begin_op();
  const int n = m.num_seqs, t = m.num_tokens;
  const int num_pages = m.page_indptr[n];
  // Everything the kernels read, in one array: q_indptr, kv_lens, page_indptr, positions,
  // slot_mapping, page_indices.
  std::vector<int32_t> packed;
  packed.reserve(size_t(3 * n + 2 + 2 * t + num_pages));
  packed.insert(packed.end(), m.q_indptr, m.q_indptr + n + 1);
  packed.insert(packed.end(), m.kv_lens, m.kv_lens + n);
  packed.insert(packed.end(), m.page_indptr, m.page_indptr + n + 1);
  packed.insert(packed.end(), m.positions, m.positions + t);
  packed.insert(packed.end(), m.slot_mapping, m.slot_mapping + t);
  packed.insert(packed.end(), m.page_indices, m.page_indices + num_pages);
  if (meta_valid_ && meta_host_.num_seqs == n && meta_host_.num_tokens == t &&
      meta_host_.page_size == m.page_size && packed == meta_copy_)
    return meta_dev_;

  // The copy size is rounded up to a power of two so that a decode step's graph survives
  // sequences gaining pages.
  int64_t copy_n = 1024;
  while (copy_n < int64_t(packed.size())) copy_n *= 2;
  const int32_t* dev = stage_i32(packed.data(), int64_t(packed.size()), copy_n);
  // Let rope find the positions inside the packed copy.
  const size_t base = size_t(reinterpret_cast<const char*>(dev) - staging_.device(0));
  staging_.remember(base + size_t(3 * n + 2) * 4, t);

  meta_dev_ = DeviceMeta{};
  meta_dev_.q_indptr = dev;
  meta_dev_.kv_lens = dev + n + 1;
  meta_dev_.page_indptr = dev + 2 * n + 1;
  meta_dev_.positions = dev + 3 * n + 2;
  meta_dev_.slot_mapping = dev + 3 * n + 2 + t;
  meta_dev_.page_indices = dev + 3 * n + 2 + 2 * t;
  meta_dev_.num_seqs = n;
  meta_dev_.num_tokens = t;
  meta_dev_.page_size = m.page_size;
  meta_host_ = m;
  meta_copy_ = std::move(packed);
  meta_valid_ = true;
  meta_max_q_ = 0;
  meta_min_q_ = n > 0 ? INT32_MAX : 0;
  meta_max_kv_ = 0;
  for (int s = 0; s < n; ++s) {
    const int q = m.q_indptr[s + 1] - m.q_indptr[s];
    meta_max_q_ = std::max(meta_max_q_, q);
    meta_min_q_ = std::min(meta_min_q_, q);
    meta_max_kv_ = std::max(meta_max_kv_, int(m.kv_lens[s]));
    CHECK_MSG(q <= m.kv_lens[s], "sequence {} has {} new tokens but length {}", s, q, m.kv_lens[s]);
    const int pages = m.page_indptr[s + 1] - m.page_indptr[s];
    CHECK_MSG((m.kv_lens[s] + m.page_size - 1) / m.page_size <= pages,
              "sequence {} has {} tokens but {} pages", s, m.kv_lens[s], pages);
  }
  return meta_dev_;
}

DeviceTensorPtr CudaBackend::alloc(DType dtype, const Shape& shape) {
  return std::make_unique<CudaTensor>(pool_, dtype, shape);
}

DeviceTensorPtr CudaBackend::upload(const Tensor& host_f32, DType dtype) {
  CHECK(host_f32.dtype == DType::kF32 && host_f32.is_contiguous());
  end_step();
  auto t = alloc(dtype, host_f32.shape);
  const int64_t n = host_f32.numel();
  if (n == 0) return t;
  if (dtype == DType::kBF16) {
    // Convert on the device: a float32 copy in, one kernel (weights of 8B-class models load fast).
    float* tmp = nullptr;
    CUDA_CHECK(cudaMalloc(&tmp, size_t(n) * 4));
    CUDA_CHECK(cudaMemcpyAsync(tmp, host_f32.data, size_t(n) * 4, cudaMemcpyHostToDevice, stream_));
    launch_f32_to_bf16({tmp, static_cast<bf16_bits*>(t->view().data), n}, stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaFree(tmp));
  } else {
    std::vector<char> bytes(size_t(dtype_bytes_for(dtype, n)));
    from_f32(dtype, host_f32.ptr<float>(), bytes.data(), n);
    CUDA_CHECK(cudaMemcpy(t->view().data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  }
  return t;
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
  return std::make_unique<CudaKvStorage>(layout);
}

}  // namespace cuda
}  // namespace strata
