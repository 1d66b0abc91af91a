// Moves KV rows (engine/kv_rows.h) between the device pool and host bytes, through the host
// tier's page copier (backend/kv_host_io.h: memcpy on cpu, the pinned-memory copy kernel on
// cuda) with a small staging mirror of its own, so checkpoints use the path the host tier's
// page restores use. A checkpoint's download from the GPU is one batched device -> host copy per
// staging-full of pages; seconds and bytes are counted for the log (bytes/s).
//
// Engine thread only; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/kv_host_io.h"
#include "core/status.h"
#include "engine/kv_rows.h"
#include "kv/page_pool.h"

namespace strata {

class KvRowsCopier {
 public:
  // A copier over `kv` with a staging mirror of at most 64 MiB (at least one page).
  static StatusOr<std::unique_ptr<KvRowsCopier>> create(const Backend& backend,
                                                        const KvStorage& kv);

  int64_t page_bytes() const { return io_->page_bytes(); }
  // Appends the bytes of device `pages` to `out`, page-major (kv_rows.h). Waits for the copies.
  void read_pages(std::span<const PageId> pages, std::vector<std::byte>* out);
  // Writes pages.size() pages of page-major bytes into device `pages`. Waits for the copies.
  void write_pages(std::span<const PageId> pages, const std::byte* bytes);

  int64_t bytes_read() const { return bytes_read_; }
  int64_t bytes_written() const { return bytes_written_; }
  double read_seconds() const {
    return read_seconds_;
  }  // wall time of read_pages, host side included
  double write_seconds() const { return write_seconds_; }

 private:
  KvRowsCopier(std::unique_ptr<KvHostIo> io, int num_layers, int32_t staging_pages)
      : io_(std::move(io)), num_layers_(num_layers), staging_pages_(staging_pages) {}
  std::unique_ptr<KvHostIo> io_;
  int num_layers_;
  int32_t staging_pages_;
  std::vector<KvPageCopy> copies_;
  int64_t bytes_read_ = 0, bytes_written_ = 0;
  double read_seconds_ = 0, write_seconds_ = 0;
};

// A short fingerprint of the model a KV row belongs to: its directory's config.json bytes and the
// names and sizes of its weight files (not their contents: reading every weight would cost a load).
std::string model_fingerprint(const std::string& model_path);

}  // namespace strata
