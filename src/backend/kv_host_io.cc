#include "backend/kv_host_io.h"

#include <chrono>
#include <cstring>

#include "core/check.h"

namespace strata {

KvHostIo::KvHostIo(const KvStorage& kv, int64_t num_host_pages) : num_host_pages_(num_host_pages) {
  const KvLayout& l = kv.layout();
  num_device_pages_ = l.num_pages;
  int64_t offset = 0;
  for (int layer = 0; layer < l.num_layers; ++layer) {
    for (bool value : {false, true}) {
      const Tensor t = value ? kv.v(layer) : kv.k(layer);
      if (t.empty() || t.numel() == 0) continue;
      // Raw bytes of one page: the tensor is [num_pages, page_size, row], contiguous.
      CHECK(t.is_contiguous());
      const int64_t page = t.nbytes() / l.num_pages;
      CHECK_EQ(page * l.num_pages, t.nbytes());
      segments_.push_back(Segment{.device = static_cast<std::byte*>(t.data),
                                  .host_offset = offset * num_host_pages,
                                  .page_bytes = page,
                                  .layer = layer,
                                  .value = value});
      offset += page;
    }
  }
  page_bytes_ = offset;
}

const std::byte* KvHostIo::host_page_part(int32_t page, int layer, bool value) const {
  CHECK(page >= 0 && page < num_host_pages_);
  for (const Segment& s : segments_)
    if (s.layer == layer && s.value == value)
      return host_ + s.host_offset + int64_t(page) * s.page_bytes;
  return nullptr;
}

int64_t KvHostIo::page_part_bytes(int layer, bool value) const {
  for (const Segment& s : segments_)
    if (s.layer == layer && s.value == value) return s.page_bytes;
  return 0;
}

std::vector<KvHostIo::Run> KvHostIo::runs(std::span<const KvPageCopy> copies) {
  std::vector<Run> out;
  for (const KvPageCopy& c : copies) {
    if (!out.empty()) {
      Run& r = out.back();
      if (c.device_page == r.device_page + r.pages && c.host_page == r.host_page + r.pages) {
        ++r.pages;
        continue;
      }
    }
    out.push_back(Run{c.device_page, c.host_page, 1});
  }
  return out;
}

namespace {

// CPU: the device pool is host memory too, so a copy is a memcpy and completes on return.
class CpuKvHostIo : public KvHostIo {
 public:
  CpuKvHostIo(const KvStorage& kv, int64_t num_host_pages)
      : KvHostIo(kv, num_host_pages), buffer_(std::max<int64_t>(1, page_bytes_ * num_host_pages)) {
    set_host_base(static_cast<std::byte*>(buffer_.data()));
  }
  KvIoBackend backend() const override { return KvIoBackend::kMemcpy; }
  uint64_t device_to_host(std::span<const KvPageCopy> copies) override {
    return copy(copies, true);
  }
  uint64_t host_to_device(std::span<const KvPageCopy> copies) override {
    return copy(copies, false);
  }
  bool done(uint64_t ticket) override { return ticket <= ticket_; }
  void wait(uint64_t ticket) override { CHECK_LE(ticket, ticket_); }

 private:
  uint64_t copy(std::span<const KvPageCopy> copies, bool to_host) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const Run& r : runs(copies)) {
      CHECK(r.device_page >= 0 && r.device_page + r.pages <= num_device_pages_);
      CHECK(r.host_page >= 0 && r.host_page + r.pages <= num_host_pages_);
      for (const Segment& s : segments_) {
        std::byte* dev = s.device + int64_t(r.device_page) * s.page_bytes;
        std::byte* host = host_ + s.host_offset + int64_t(r.host_page) * s.page_bytes;
        const size_t n = size_t(r.pages) * size_t(s.page_bytes);
        if (to_host)
          std::memcpy(host, dev, n);
        else
          std::memcpy(dev, host, n);
      }
    }
    copy_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return ++ticket_;
  }

  Buffer buffer_;  // [layers][K|V][num_host_pages, page_size, row bytes]
  uint64_t ticket_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<KvHostIo>> make_kv_host_io(const Backend& backend, const KvStorage& kv,
                                                    int64_t num_host_pages, KvIoBackend io) {
  if (num_host_pages < 1)
    return invalid_argument("host KV tier: {} pages (need at least one)", num_host_pages);
  if (backend.device() == Device::kCpu) {
    if (io != KvIoBackend::kAuto && io != KvIoBackend::kMemcpy)
      return invalid_argument(
          "--hicache-io-backend {}: not available on the cpu backend (copies are memcpy)",
          kv_io_backend_name(io));
    return std::unique_ptr<KvHostIo>(new CpuKvHostIo(kv, num_host_pages));
  }
#ifdef STRATA_CUDA
  if (io == KvIoBackend::kMemcpy)
    return invalid_argument(
        "--hicache-io-backend memcpy is the cpu backend's; use direct or kernel on cuda");
  return cuda::make_cuda_kv_host_io(kv, num_host_pages,
                                    io == KvIoBackend::kAuto ? KvIoBackend::kKernel : io);
#else
  return failed_precondition("host KV tier: backend {} has no host copy path", backend.name());
#endif
}

}  // namespace strata
