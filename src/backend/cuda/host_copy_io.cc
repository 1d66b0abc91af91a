// The CUDA side of KvHostIo (backend/kv_host_io.h): pinned, mapped host memory mirroring the
// device KV pool's layout, copies on a stream of the copier's own. `direct` issues one
// cudaMemcpyAsync per contiguous page run per layer K|V part; `kernel` one launch of the
// gather/scatter kernel (host_copy.cu) per batch. Each batch is bracketed by two events: their
// elapsed time is the copy time, and the end event is the batch's ticket.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <vector>

#include "backend/cuda/host_copy.h"
#include "backend/cuda/launch.h"
#include "backend/kv_host_io.h"

namespace strata::cuda {
namespace {

class CudaKvHostIo : public KvHostIo {
 public:
  CudaKvHostIo(const KvStorage& kv, int64_t num_host_pages, KvIoBackend io)
      : KvHostIo(kv, num_host_pages), io_(io) {}

  Status init() {
    const size_t bytes = size_t(std::max<int64_t>(1, host_bytes()));
    if (cudaHostAlloc(&host_mem_, bytes, cudaHostAllocMapped | cudaHostAllocPortable) !=
        cudaSuccess) {
      cudaGetLastError();
      host_mem_ = nullptr;
      return resource_exhausted(
          "host KV tier: cannot pin {:.2f} GiB of host memory (cudaHostAlloc)",
          double(bytes) / double(int64_t(1) << 30));
    }
    set_host_base(static_cast<std::byte*>(host_mem_));
    CUDA_CHECK(cudaHostGetDevicePointer(&host_dev_, host_mem_, 0));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    std::vector<KvCopySegment> segs;
    vec16_ = true;
    for (const Segment& s : segments_) {
      segs.push_back(KvCopySegment{.device = reinterpret_cast<char*>(s.device),
                                   .host = static_cast<char*>(host_dev_) + s.host_offset,
                                   .page_bytes = s.page_bytes});
      vec16_ = vec16_ && s.page_bytes % 16 == 0 &&
               reinterpret_cast<uintptr_t>(s.device) % 16 == 0 && s.host_offset % 16 == 0;
    }
    CUDA_CHECK(
        cudaMalloc(&segments_dev_, std::max<size_t>(1, segs.size()) * sizeof(KvCopySegment)));
    CUDA_CHECK(cudaMemcpy(segments_dev_, segs.data(), segs.size() * sizeof(KvCopySegment),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaHostAlloc(&ring_, kRingPairs * 2 * sizeof(int32_t), cudaHostAllocMapped));
    CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&ring_dev_), ring_, 0));
    return Status::ok_status();
  }

  ~CudaKvHostIo() override {
    if (stream_) cudaStreamSynchronize(stream_);
    for (Batch& b : pending_) {
      cudaEventDestroy(b.start);
      cudaEventDestroy(b.stop);
    }
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (segments_dev_) cudaFree(segments_dev_);
    if (ring_) cudaFreeHost(ring_);
    if (host_mem_) cudaFreeHost(host_mem_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  KvIoBackend backend() const override { return io_; }
  uint64_t device_to_host(std::span<const KvPageCopy> copies) override {
    return submit(copies, true);
  }
  uint64_t host_to_device(std::span<const KvPageCopy> copies) override {
    return submit(copies, false);
  }

  bool done(uint64_t ticket) override {
    retire(false);
    return ticket <= completed_;
  }
  void wait(uint64_t ticket) override {
    CHECK_LE(ticket, ticket_);
    while (completed_ < ticket) retire(true);
  }

 private:
  static constexpr int64_t kRingPairs = int64_t(1) << 20;
  struct Batch {
    uint64_t ticket;
    cudaEvent_t start, stop;
  };

  cudaEvent_t event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }

  // Retires completed batches in order (blocking on the oldest when `block`).
  void retire(bool block) {
    while (!pending_.empty()) {
      Batch& b = pending_.front();
      if (block) {
        CUDA_CHECK(cudaEventSynchronize(b.stop));
        block = false;
      } else {
        const cudaError_t e = cudaEventQuery(b.stop);
        if (e == cudaErrorNotReady) return;
        CUDA_CHECK(e);
      }
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, b.start, b.stop));
      copy_seconds_ += double(ms) / 1000.0;
      completed_ = b.ticket;
      free_events_.push_back(b.start);
      free_events_.push_back(b.stop);
      pending_.pop_front();
    }
  }

  uint64_t submit(std::span<const KvPageCopy> copies, bool to_host) {
    for (const KvPageCopy& c : copies) {
      CHECK(c.device_page >= 0 && c.device_page < num_device_pages_);
      CHECK(c.host_page >= 0 && c.host_page < num_host_pages_);
    }
    Batch b{++ticket_, event(), event()};
    CUDA_CHECK(cudaEventRecord(b.start, stream_));
    if (io_ == KvIoBackend::kDirect) {
      for (const Run& r : runs(copies)) {
        for (const Segment& s : segments_) {
          std::byte* dev = s.device + int64_t(r.device_page) * s.page_bytes;
          std::byte* host = host_ + s.host_offset + int64_t(r.host_page) * s.page_bytes;
          const size_t n = size_t(r.pages) * size_t(s.page_bytes);
          CUDA_CHECK(cudaMemcpyAsync(
              to_host ? static_cast<void*>(host) : dev, to_host ? static_cast<void*>(dev) : host, n,
              to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream_));
        }
      }
    } else {
      for (size_t first = 0; first < copies.size(); first += size_t(kRingPairs)) {
        const int64_t n = std::min<int64_t>(kRingPairs, int64_t(copies.size() - first));
        if (ring_used_ + n > kRingPairs) {
          // Wrapping over pairs a queued launch may still read: let the stream drain first.
          CUDA_CHECK(cudaStreamSynchronize(stream_));
          ring_used_ = 0;
        }
        int32_t* dst = ring_ + 2 * ring_used_;
        for (int64_t i = 0; i < n; ++i) {
          dst[2 * i] = copies[first + size_t(i)].device_page;
          dst[2 * i + 1] = copies[first + size_t(i)].host_page;
        }
        launch_kv_page_copy(segments_dev_, int(segments_.size()), ring_dev_ + 2 * ring_used_,
                            int(n), to_host, vec16_, stream_);
        ring_used_ += n;
      }
    }
    CUDA_CHECK(cudaEventRecord(b.stop, stream_));
    pending_.push_back(b);
    return b.ticket;
  }

  KvIoBackend io_;
  void* host_mem_ = nullptr;  // [layers][K|V][num_host_pages, page_size, row bytes], pinned
  void* host_dev_ = nullptr;  // the same memory as the device sees it
  cudaStream_t stream_ = nullptr;
  KvCopySegment* segments_dev_ = nullptr;  // [segments]
  int32_t* ring_ = nullptr;                // pinned [kRingPairs][2] copy lists of the kernel
  int32_t* ring_dev_ = nullptr;
  int64_t ring_used_ = 0;
  bool vec16_ = true;
  uint64_t ticket_ = 0, completed_ = 0;
  std::deque<Batch> pending_;
  std::vector<cudaEvent_t> free_events_;
};

}  // namespace

StatusOr<std::unique_ptr<KvHostIo>> make_cuda_kv_host_io(const KvStorage& kv,
                                                         int64_t num_host_pages, KvIoBackend io) {
  CHECK(io == KvIoBackend::kDirect || io == KvIoBackend::kKernel);
  auto p = std::make_unique<CudaKvHostIo>(kv, num_host_pages, io);
  STRATA_RETURN_IF_ERROR(p->init());
  return std::unique_ptr<KvHostIo>(std::move(p));
}

}  // namespace strata::cuda
