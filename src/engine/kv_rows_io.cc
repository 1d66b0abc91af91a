#include "engine/kv_rows_io.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/check.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kStagingBytes = int64_t(64) << 20;

uint64_t fnv1a(uint64_t h, std::string_view bytes) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

StatusOr<std::unique_ptr<KvRowsCopier>> KvRowsCopier::create(const Backend& backend,
                                                             const KvStorage& kv) {
  const KvLayout& l = kv.layout();
  const int64_t page_bytes = l.bytes_per_token() * l.page_size;
  const int64_t pages =
      std::clamp<int64_t>(kStagingBytes / std::max<int64_t>(1, page_bytes), 1, 256);
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<KvHostIo> io,
                          make_kv_host_io(backend, kv, pages, KvIoBackend::kAuto));
  return std::unique_ptr<KvRowsCopier>(
      new KvRowsCopier(std::move(io), l.num_layers, int32_t(pages)));
}

void KvRowsCopier::read_pages(std::span<const PageId> pages, std::vector<std::byte>* out) {
  const auto t0 = Clock::now();
  for (size_t begin = 0; begin < pages.size(); begin += size_t(staging_pages_)) {
    const size_t n = std::min(pages.size() - begin, size_t(staging_pages_));
    copies_.clear();
    for (size_t i = 0; i < n; ++i) copies_.push_back(KvPageCopy{pages[begin + i], int32_t(i)});
    io_->wait(io_->device_to_host(copies_));
    for (size_t i = 0; i < n; ++i) {
      for (int layer = 0; layer < num_layers_; ++layer) {
        for (bool value : {false, true}) {
          const int64_t part = io_->page_part_bytes(layer, value);
          if (part == 0) continue;
          const std::byte* src = io_->host_page_part(int32_t(i), layer, value);
          out->insert(out->end(), src, src + part);
        }
      }
    }
  }
  bytes_read_ += int64_t(pages.size()) * page_bytes();
  read_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

void KvRowsCopier::write_pages(std::span<const PageId> pages, const std::byte* bytes) {
  const auto t0 = Clock::now();
  for (size_t begin = 0; begin < pages.size(); begin += size_t(staging_pages_)) {
    const size_t n = std::min(pages.size() - begin, size_t(staging_pages_));
    copies_.clear();
    for (size_t i = 0; i < n; ++i) {
      copies_.push_back(KvPageCopy{pages[begin + i], int32_t(i)});
      for (int layer = 0; layer < num_layers_; ++layer) {
        for (bool value : {false, true}) {
          const int64_t part = io_->page_part_bytes(layer, value);
          if (part == 0) continue;
          std::memcpy(io_->mutable_host_page_part(int32_t(i), layer, value), bytes, size_t(part));
          bytes += part;
        }
      }
    }
    io_->wait(io_->host_to_device(copies_));
  }
  bytes_written_ += int64_t(pages.size()) * page_bytes();
  write_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string model_fingerprint(const std::string& model_path) {
  namespace fs = std::filesystem;
  uint64_t h = 1469598103934665603ull;
  std::ifstream config(fs::path(model_path) / "config.json", std::ios::binary);
  h = fnv1a(h, std::string(std::istreambuf_iterator<char>(config), {}));
  std::map<std::string, uintmax_t> weights;  // sorted: the directory order is not stable
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(model_path, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".safetensors") || name.ends_with(".gguf") || name.ends_with(".bin"))
      weights[name] = e.file_size(ec);
  }
  for (const auto& [name, size] : weights) h = fnv1a(h, fmt::format("{}:{};", name, size));
  return fmt::format("{:016x}", h);
}

}  // namespace strata
