// The CUDA backend's memory (device_memory.h): caching pool, tensors, KV storage, staging.
#include "backend/cuda/device_memory.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/launch.h"
#include "backend/cuda/mla_attention.h"

namespace strata::cuda {
namespace {

constexpr size_t kAlign = 256;

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

void* DevicePool::alloc(size_t bytes, Lifetime lifetime) {
  if (lifetime == Lifetime::kResident) {
    bytes = std::max(kAlign, round_up(bytes, kAlign));
  } else {
    bytes = size_class(bytes);
    auto& list = free_[bytes];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      cached_ -= bytes;
      return p;
    }
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
  CHECK_MSG(err == cudaSuccess, "cudaMalloc of {} bytes failed ({} reserved): {}", bytes, reserved_,
            cudaGetErrorString(err));
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
  cached_ = 0;
}

void DevicePool::resume_releases() {
  deferring_ = false;
  for (const auto& [ptr, bytes] : deferred_) release(ptr, bytes);
  deferred_.clear();
}

void DevicePool::release(void* ptr, size_t bytes, Lifetime lifetime) {
  if (lifetime == Lifetime::kTransient && deferring_) {
    deferred_.emplace_back(ptr, bytes);
    return;
  }
  if (lifetime == Lifetime::kTransient) {
    bytes = size_class(bytes);
    free_[bytes].push_back(ptr);
    cached_ += bytes;
    return;
  }
  bytes = std::max(kAlign, round_up(bytes, kAlign));
  // cudaFree waits for the device: resident blocks go when a model goes, not per step.
  const auto it = std::find(owned_.begin(), owned_.end(), std::pair<void*, size_t>{ptr, bytes});
  CHECK_MSG(it != owned_.end(), "device pool: freeing {} bytes it did not allocate", bytes);
  CUDA_CHECK(cudaFree(ptr));
  reserved_ -= bytes;
  owned_.erase(it);
}

CudaTensor::CudaTensor(std::shared_ptr<DevicePool> pool, DType dtype, const Shape& shape,
                       Lifetime lifetime)
    : pool_(std::move(pool)),
      bytes_(size_t(dtype_bytes_for(dtype, shape_numel(shape)))),
      lifetime_(lifetime) {
  void* p = bytes_ > 0 ? pool_->alloc(bytes_, lifetime_) : nullptr;
  view_ = Tensor::make(p, dtype, shape, Device::kCuda);
}

CudaTensor::~CudaTensor() {
  if (view_.data) pool_->release(view_.data, bytes_, lifetime_);
}

// ---- KV storage ----
namespace {

bool mla_part_dtype(DType dt) {
  return dt == DType::kBF16 || dt == DType::kFP8E4M3 || dt == DType::kFP8E5M2 || dt == DType::kF32;
}

// An MLA layer (rope_dim > 0) of an fp8 dtype: rows the MLA writer (mla.cu) can store, every
// value at an address of its own size (the rope part and FlashMLA's float32 tile scales).
Status check_mla_fp8_layer(const KvLayout& layout, int l) {
  if (layout.rope_dtype && !mla_part_dtype(*layout.rope_dtype))
    return unimplemented(
        "CUDA backend: MLA rope parts of dtype {} are not implemented; use bf16, "
        "fp8_e4m3, fp8_e5m2 or f32",
        dtype_name(*layout.rope_dtype));
  const MlaRowFormat f = mla_row_format(layout, l, 1.0f);
  if (f.rope_offset % mla_elem_bytes(f.rope_elem) != 0 || (f.flashmla && f.latent % 4 != 0))
    return unimplemented(
        "CUDA backend: MLA KV rows of {} latent values with a {}-byte rope part "
        "leave the rope part (or the FlashMLA tile scales) unaligned; use bf16 KV "
        "or --device cpu",
        f.latent, mla_elem_bytes(f.rope_elem));
  return Status();
}

}  // namespace

Status check_cuda_kv_layout(const KvLayout& layout) {
  if (layout.rope_dim > 0 && layout.rope_dim >= layout.k_dim)
    return invalid_argument("MLA KV layout: rope dim {} is not below the row's {} values",
                            layout.rope_dim, layout.k_dim);
  for (int l = 0; l < layout.num_layers; ++l) {
    const DType dt = layout.layer_dtype(l);
    const bool fp8 = dt == DType::kFP8E4M3 || dt == DType::kFP8E5M2;
    if (dt != DType::kBF16 && !fp8)
      return unimplemented(
          "CUDA backend: KV dtype {} (layer {}) is not implemented; use bf16, "
          "fp8_e4m3 or fp8_e5m2",
          dtype_name(dt), l);
    if (fp8 && layout.rope_dim > 0) STRATA_RETURN_IF_ERROR(check_mla_fp8_layer(layout, l));
  }
  return Status();
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
    total += round_up(size_t(slots * layout.k_row_bytes(l)), kAlign);
    v_off.push_back(total);
    total += round_up(size_t(dtype_bytes_for(dt, slots * layout.v_dim)), kAlign);
  }
  CUDA_CHECK(cudaMalloc(&memory_, std::max<size_t>(total, kAlign)));
  CUDA_CHECK(cudaMemset(memory_, 0, std::max<size_t>(total, kAlign)));
  char* base = static_cast<char*>(memory_);
  for (int l = 0; l < layout.num_layers; ++l) {
    const DType dt = layout.layer_dtype(l);
    // Split MLA rows (rope part in its own dtype, FlashMLA tiles) are raw bytes, as KvStorage::k
    // says; every other layer is k_dim values of its dtype.
    if (layout.k_row_is_split(l))
      k_.push_back(Tensor::make(base + k_off[size_t(l)], DType::kU8,
                                {layout.num_pages, layout.page_size, layout.k_row_bytes(l)},
                                Device::kCuda));
    else
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
    if (e.n == n && std::memcmp(host_ + e.offset, host, size_t(n) * 4) == 0)
      return int64_t(e.offset);
  return -1;
}

}  // namespace strata::cuda
