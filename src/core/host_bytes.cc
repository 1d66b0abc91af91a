#include "core/host_bytes.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/check.h"

namespace strata {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

void* HostBytePool::map_block(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK_MSG(p != MAP_FAILED, "host allocation of {} bytes failed", bytes);
  // Transparent huge pages where the system grants them on request: a fault per 2 MiB.
  if (bytes >= kHugePage) ::madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

void HostBytePool::unmap_block(void* block, size_t capacity) { ::munmap(block, capacity); }

HostBytePool::~HostBytePool() {
  for (const auto& [cap, block] : free_) unmap_block(block, cap);
}

void* HostBytePool::take(size_t bytes, size_t* capacity) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->first >= bytes && it->first <= 2 * bytes &&
          (best == free_.end() || it->first < best->first))
        best = it;
    if (best != free_.end()) {
      *capacity = best->first;
      void* block = best->second;
      cached_ -= best->first;
      free_.erase(best);
      return block;
    }
    ++fresh_;
  }
  *capacity = round_up(bytes, bytes >= kHugePage ? kHugePage : 4096);
  return map_block(*capacity);
}

void HostBytePool::give(void* block, size_t capacity) {
  std::vector<std::pair<size_t, void*>> evicted;
  {
    std::lock_guard<std::mutex> lk(mu_);
    free_.emplace_back(capacity, block);
    cached_ += capacity;
    while (cached_ > max_cached_) {
      auto largest = std::max_element(free_.begin(), free_.end());
      cached_ -= largest->first;
      evicted.push_back(*largest);
      free_.erase(largest);
    }
  }
  for (const auto& [cap, b] : evicted) unmap_block(b, cap);
}

size_t HostBytePool::cached_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return cached_;
}

int64_t HostBytePool::fresh_blocks() const {
  std::lock_guard<std::mutex> lk(mu_);
  return fresh_;
}

HostBytes::HostBytes(const uint8_t* first, const uint8_t* last) {
  *this = uninitialized(size_t(last - first));
  if (size_ > 0) std::memcpy(data_, first, size_);
}

HostBytes& HostBytes::operator=(const HostBytes& o) {
  if (this != &o) HostBytes(o).swap(*this);
  return *this;
}

HostBytes HostBytes::uninitialized(size_t n, const std::shared_ptr<HostBytePool>& pool) {
  HostBytes b;
  if (n == 0) return b;
  if (n >= HostBytePool::kMinPooledBytes) {
    if (pool) {
      b.data_ = static_cast<uint8_t*>(pool->take(n, &b.capacity_));
      b.pool_ = pool;
    } else {
      b.capacity_ = round_up(n, 4096);
      b.data_ = static_cast<uint8_t*>(HostBytePool::map_block(b.capacity_));
    }
    b.mapped_ = true;
  } else {
    b.data_ = static_cast<uint8_t*>(std::malloc(n));
    CHECK_MSG(b.data_ != nullptr, "host allocation of {} bytes failed", n);
    b.capacity_ = n;
  }
  b.size_ = n;
  return b;
}

void HostBytes::resize(size_t n) {
  if (n <= capacity_) {
    if (n > size_) std::memset(data_ + size_, 0, n - size_);
    size_ = n;
    return;
  }
  HostBytes grown = uninitialized(n);
  if (size_ > 0) std::memcpy(grown.data_, data_, size_);
  std::memset(grown.data_ + size_, 0, n - size_);
  grown.swap(*this);
}

bool HostBytes::operator==(const HostBytes& o) const {
  return size_ == o.size_ && (size_ == 0 || std::memcmp(data_, o.data_, size_) == 0);
}

void HostBytes::swap(HostBytes& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  std::swap(capacity_, o.capacity_);
  std::swap(mapped_, o.mapped_);
  std::swap(pool_, o.pool_);
}

void HostBytes::release() {
  if (data_ == nullptr) return;
  if (pool_) {
    pool_->give(data_, capacity_);
  } else if (mapped_) {
    HostBytePool::unmap_block(data_, capacity_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  size_ = capacity_ = 0;
  mapped_ = false;
  pool_.reset();
}

}  // namespace strata
