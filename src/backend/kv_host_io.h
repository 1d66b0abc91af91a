// KvHostIo: copies whole KV pages between a backend's KV pool (KvStorage) and a host-memory
// mirror of it — the data path of the host KV tier (kv/hicache.h holds the policy). Copies move
// raw bytes of every layer's K and V page, so every KV dtype and row format (plain, split MLA
// rows, FlashMLA fp8) travels unchanged.
//
// Host layout mirrors the device's, layer-major: for each layer, K as
// [num_host_pages, page_size, k_row_bytes] then V as [num_host_pages, page_size, v_row_bytes]
// (absent when v_dim == 0). A run of consecutive device pages onto consecutive host pages is then
// one contiguous block per layer and K/V.
//
// CPU backend: host memory is an ordinary buffer and copies are memcpy, complete on return.
// CUDA backend (backend/cuda/host_copy.cu): pinned host memory (cudaHostAlloc), a stream of its
// own; kDirect issues one cudaMemcpyAsync per contiguous page run per layer and K/V, kKernel one
// gather/scatter kernel that reads or writes the mapped host memory. Copies complete in
// submission order; each call returns a ticket to poll (done) or wait on.
//
// Who calls: the engine thread (through the host tier); not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "core/parse_enum.h"
#include "core/status.h"

namespace strata {

enum class KvIoBackend : uint8_t {
  kAuto,    // memcpy on cpu, kernel on cuda
  kMemcpy,  // cpu: plain memcpy
  kDirect,  // cuda: cudaMemcpyAsync per contiguous page run
  kKernel,  // cuda: one gather/scatter copy kernel per batch
};
inline constexpr EnumName<KvIoBackend> kKvIoBackendNames[] = {
    {KvIoBackend::kAuto, "auto"},
    {KvIoBackend::kMemcpy, "memcpy"},
    {KvIoBackend::kDirect, "direct"},
    {KvIoBackend::kKernel, "kernel"},
    {KvIoBackend::kAuto, ""}};  // an unset flag
constexpr const auto& enum_names(KvIoBackend) { return kKvIoBackendNames; }
// "" | "auto" | "memcpy" | "direct" | "kernel"; errors name --hicache-io-backend.
inline StatusOr<KvIoBackend> parse_kv_io_backend(std::string_view text) {
  return parse_enum<KvIoBackend>(text, "--hicache-io-backend");
}
inline std::string_view kv_io_backend_name(KvIoBackend io) { return enum_name(io); }

struct KvPageCopy {
  int32_t device_page = 0;
  int32_t host_page = 0;
};

class KvHostIo {
 public:
  virtual ~KvHostIo() = default;
  KvHostIo(const KvHostIo&) = delete;
  KvHostIo& operator=(const KvHostIo&) = delete;

  virtual KvIoBackend backend() const = 0;
  int64_t num_host_pages() const { return num_host_pages_; }
  // Bytes of one page over every layer, K and V.
  int64_t page_bytes() const { return page_bytes_; }
  int64_t host_bytes() const { return page_bytes_ * num_host_pages_; }

  // Enqueue copies of whole pages; return a ticket (increasing from 1). Copies complete in
  // submission order. The source pages must not change until the ticket is done.
  virtual uint64_t device_to_host(std::span<const KvPageCopy> copies) = 0;
  virtual uint64_t host_to_device(std::span<const KvPageCopy> copies) = 0;
  // Whether every copy up to `ticket` completed; wait() blocks until they have.
  virtual bool done(uint64_t ticket) = 0;
  virtual void wait(uint64_t ticket) = 0;
  // Seconds the completed copies took (device time between a batch's start and end on CUDA,
  // wall time of the memcpy on CPU).
  double copy_seconds() const { return copy_seconds_; }

  // Host bytes of layer `layer`'s K (or V) part of host page `page` (page_size rows): tests, and
  // KV rows read out of a staging mirror (engine/kv_rows_io.h).
  const std::byte* host_page_part(int32_t page, int layer, bool value) const;
  // The same part, to fill before a host_to_device copy (KV rows loaded from a checkpoint).
  std::byte* mutable_host_page_part(int32_t page, int layer, bool value) {
    return const_cast<std::byte*>(host_page_part(page, layer, value));
  }
  int64_t page_part_bytes(int layer, bool value) const;

 protected:
  // One contiguous block per layer and K/V, on both sides.
  struct Segment {
    std::byte* device = nullptr;  // page 0 of the KvStorage tensor
    int64_t host_offset = 0;      // byte offset of host page 0 in host memory
    int64_t page_bytes = 0;       // page_size rows of this layer's K or V
    int layer = 0;
    bool value = false;
  };
  KvHostIo(const KvStorage& kv, int64_t num_host_pages);
  // Called by subclasses once their host memory exists.
  void set_host_base(std::byte* host) { host_ = host; }
  // Splits copies into runs where device and host pages both ascend by one.
  struct Run {
    int32_t device_page, host_page, pages;
  };
  static std::vector<Run> runs(std::span<const KvPageCopy> copies);

  std::vector<Segment> segments_;
  int64_t num_host_pages_ = 0;
  int64_t page_bytes_ = 0;
  int64_t num_device_pages_ = 0;
  std::byte* host_ = nullptr;
  double copy_seconds_ = 0;
};

// Makes the copier for `kv` with a host mirror of num_host_pages pages. Errors: an io backend
// that does not exist on this backend (memcpy on cuda, direct/kernel on cpu: the caller maps
// what it accepts), host memory that cannot be allocated.
StatusOr<std::unique_ptr<KvHostIo>> make_kv_host_io(const Backend& backend, const KvStorage& kv,
                                                    int64_t num_host_pages, KvIoBackend io);

#ifdef STRATA_CUDA
namespace cuda {
// backend/cuda/host_copy.cu; io is kDirect or kKernel.
StatusOr<std::unique_ptr<KvHostIo>> make_cuda_kv_host_io(const KvStorage& kv,
                                                         int64_t num_host_pages, KvIoBackend io);
}  // namespace cuda
#endif

}  // namespace strata
