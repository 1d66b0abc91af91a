#include "pipeline/kv_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/log.h"

namespace strata {
namespace {

constexpr char kFileMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'K', 'V'};
constexpr char kBlockMagic[4] = {'S', 'K', 'V', 'B'};
constexpr int64_t kFileHeadBytes = 8 + 4 + 8;
constexpr int64_t kBlockHeadBytes = 4 + 4 + 8 + 8;
constexpr int64_t kMaxMetaBytes = 1 << 20;

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

Status write_all(int fd, const char* data, size_t size, int64_t offset, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return internal_error("cannot write {}: {}", path, std::strerror(errno));
    }
    data += n;
    size -= size_t(n);
    offset += n;
  }
  return Status();
}

// Reads exactly `size` bytes at `offset`; false at the end of the file (a torn tail).
bool read_all(int fd, char* data, size_t size, int64_t offset) {
  while (size > 0) {
    const ssize_t n = ::pread(fd, data, size, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= size_t(n);
    offset += n;
  }
  return true;
}

void sync_dir(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

uint64_t kv_checksum(const void* data, size_t size, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed ^ 0x9e3779b97f4a7c15ull ^ (uint64_t(size) * 0xff51afd7ed558ccdull);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

KvCheckpointFile::~KvCheckpointFile() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::unique_ptr<KvCheckpointFile>> KvCheckpointFile::open(const std::string& path,
                                                                   const KvRowsLayout& layout) {
  if (layout.page_size <= 0 || layout.page_bytes <= 0 || layout.header.empty())
    return invalid_argument("KV checkpoint file {}: no KV row layout", path);
  std::unique_ptr<KvCheckpointFile> f(new KvCheckpointFile(path, layout));
  f->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (f->fd_ < 0) return internal_error("cannot open {}: {}", path, std::strerror(errno));
  bool header_ok = false;
  STRATA_RETURN_IF_ERROR(f->scan(f->fd_, &header_ok));
  if (!header_ok) {
    if (f->file_bytes_ > 0)
      LOG_WARN(
          "{}: its KV rows were made with another model, KV dtype, layout, page size or rank (or "
          "its header "
          "is unreadable); dropping them: unfinished records are prefilled again",
          path);
    f->index_.clear();
    if (::ftruncate(f->fd_, 0) != 0)
      return internal_error("cannot truncate {}: {}", path, std::strerror(errno));
    f->file_bytes_ = 0;
    STRATA_RETURN_IF_ERROR(f->write_header(f->fd_));
    STRATA_RETURN_IF_ERROR(f->sync());
    sync_dir(path);
  } else if (f->torn_bytes_ > 0) {
    LOG_WARN(
        "{}: dropping a torn or corrupt tail of {} bytes (the records whose KV rows it held "
        "recompute them)",
        path, f->torn_bytes_);
    if (::ftruncate(f->fd_, f->file_bytes_) != 0)
      return internal_error("cannot truncate {}: {}", path, std::strerror(errno));
  }
  return f;
}

Status KvCheckpointFile::write_header(int fd) {
  std::string head(kFileMagic, sizeof(kFileMagic));
  put<uint32_t>(head, uint32_t(layout_.header.size()));
  put<uint64_t>(head, kv_checksum(layout_.header.data(), layout_.header.size()));
  head += layout_.header;
  STRATA_RETURN_IF_ERROR(write_all(fd, head.data(), head.size(), 0, path_));
  file_bytes_ = int64_t(head.size());
  dirty_ = true;
  return Status();
}

// Reads the header and indexes every whole block with a good checksum; file_bytes_ ends after the
// last one (torn_bytes_ is what follows).
Status KvCheckpointFile::scan(int fd, bool* header_ok) {
  *header_ok = false;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (size < 0) return internal_error("cannot read {}: {}", path_, std::strerror(errno));
  file_bytes_ = int64_t(size);
  if (size < kFileHeadBytes) return Status();
  char head[kFileHeadBytes];
  if (!read_all(fd, head, sizeof(head), 0) ||
      std::memcmp(head, kFileMagic, sizeof(kFileMagic)) != 0)
    return Status();
  const uint32_t header_len = get<uint32_t>(head + 8);
  if (header_len != layout_.header.size()) return Status();
  std::string header(header_len, '\0');
  if (!read_all(fd, header.data(), header_len, kFileHeadBytes) || header != layout_.header ||
      get<uint64_t>(head + 12) != kv_checksum(header.data(), header.size()))
    return Status();
  *header_ok = true;
  int64_t pos = kFileHeadBytes + header_len;
  std::string payload;
  for (;;) {
    char bh[kBlockHeadBytes];
    if (pos + kBlockHeadBytes > int64_t(size) || !read_all(fd, bh, sizeof(bh), pos)) break;
    if (std::memcmp(bh, kBlockMagic, sizeof(kBlockMagic)) != 0) break;
    const int64_t meta_len = get<uint32_t>(bh + 4);
    const int64_t payload_len = int64_t(get<uint64_t>(bh + 8));
    if (meta_len > kMaxMetaBytes || payload_len < 0 ||
        pos + kBlockHeadBytes + meta_len + payload_len > int64_t(size))
      break;
    std::string meta_text(size_t(meta_len), '\0');
    payload.resize(size_t(payload_len));
    if (!read_all(fd, meta_text.data(), meta_text.size(), pos + kBlockHeadBytes) ||
        !read_all(fd, payload.data(), payload.size(), pos + kBlockHeadBytes + meta_len))
      break;
    const uint64_t sum = kv_checksum(payload.data(), payload.size(),
                                     kv_checksum(meta_text.data(), meta_text.size()));
    if (sum != get<uint64_t>(bh + 16)) break;
    const nlohmann::json meta =
        nlohmann::json::parse(meta_text, nullptr, /*allow_exceptions=*/false);
    if (!meta.is_object() || !meta["dataset"].is_string() || !meta["id"].is_string() ||
        !meta["first_row"].is_number_integer() || !meta["rows"].is_number_integer())
      break;
    const int64_t rows = meta["rows"].get<int64_t>();
    if (rows <= 0 || rows % layout_.page_size != 0 ||
        payload_len != rows / layout_.page_size * layout_.page_bytes)
      break;
    index_block({meta["dataset"].get<std::string>(), meta["id"].get<std::string>()},
                meta["first_row"].get<int64_t>(), rows, pos + kBlockHeadBytes + meta_len);
    pos += kBlockHeadBytes + meta_len + payload_len;
  }
  torn_bytes_ = int64_t(size) - pos;
  file_bytes_ = pos;
  return Status();
}

void KvCheckpointFile::index_block(const PartialKey& key, int64_t first_row, int64_t rows,
                                   int64_t offset) {
  std::vector<Segment>& segs = index_[key];
  int64_t have = segs.empty() ? 0 : segs.back().first_row + segs.back().rows;
  if (first_row > have || first_row < 0) return;  // a gap: the rows after it cannot be used
  while (!segs.empty() && segs.back().first_row >= first_row) segs.pop_back();  // replaced
  if (!segs.empty() && segs.back().first_row + segs.back().rows > first_row)
    segs.back().rows = first_row - segs.back().first_row;  // cut where the new rows start
  segs.push_back(Segment{.first_row = first_row, .rows = rows, .offset = offset});
}

int64_t KvCheckpointFile::rows(const PartialKey& key) const {
  auto it = index_.find(key);
  if (it == index_.end() || it->second.empty()) return 0;
  return it->second.back().first_row + it->second.back().rows;
}

int64_t KvCheckpointFile::live_bytes() const {
  int64_t rows = 0;
  for (const auto& [key, segs] : index_)
    for (const Segment& s : segs) rows += s.rows;
  return rows / layout_.page_size * layout_.page_bytes;
}

StatusOr<std::shared_ptr<KvRows>> KvCheckpointFile::read(const PartialKey& key,
                                                         int64_t rows) const {
  if (rows > this->rows(key) || rows < 0 || rows % layout_.page_size != 0)
    return invalid_argument("{}: {} rows of {} id {} asked, {} held", path_, rows, key.first,
                            key.second, this->rows(key));
  auto out = std::make_shared<KvRows>();
  out->rows = rows;
  out->bytes.resize(size_t(rows / layout_.page_size * layout_.page_bytes));
  const int64_t row_bytes = layout_.page_bytes / layout_.page_size;
  if (rows == 0) return out;
  for (const Segment& s : index_.at(key)) {
    if (s.first_row >= rows) break;
    const int64_t n = std::min(s.rows, rows - s.first_row);
    if (!read_all(fd_, reinterpret_cast<char*>(out->bytes.data() + s.first_row * row_bytes),
                  size_t(n * row_bytes), s.offset))
      return data_loss("{}: rows of {} id {} cut short", path_, key.first, key.second);
  }
  return out;
}

Status KvCheckpointFile::append(const PartialKey& key, const KvRows& rows) {
  if (rows.rows <= 0) return Status();
  if (rows.first_row > this->rows(key) || rows.first_row % layout_.page_size != 0 ||
      rows.rows % layout_.page_size != 0 ||
      int64_t(rows.bytes.size()) != rows.rows / layout_.page_size * layout_.page_bytes)
    return invalid_argument("{}: rows {}..{} ({} bytes) of {} id {} do not continue its {} rows",
                            path_, rows.first_row, rows.first_row + rows.rows, rows.bytes.size(),
                            key.first, key.second, this->rows(key));
  const std::string meta = nlohmann::json{
      {"dataset", key.first},
      {"id", key.second},
      {"first_row", rows.first_row},
      {"rows", rows.rows}}.dump();
  std::string head(kBlockMagic, sizeof(kBlockMagic));
  put<uint32_t>(head, uint32_t(meta.size()));
  put<uint64_t>(head, uint64_t(rows.bytes.size()));
  put<uint64_t>(head, kv_checksum(rows.bytes.data(), rows.bytes.size(),
                                  kv_checksum(meta.data(), meta.size())));
  head += meta;
  // Head and payload in one write when small; a kill between two writes leaves a torn block,
  // which the checksum rejects either way.
  STRATA_RETURN_IF_ERROR(write_all(fd_, head.data(), head.size(), file_bytes_, path_));
  STRATA_RETURN_IF_ERROR(write_all(fd_, reinterpret_cast<const char*>(rows.bytes.data()),
                                   rows.bytes.size(), file_bytes_ + int64_t(head.size()), path_));
  index_block(key, rows.first_row, rows.rows, file_bytes_ + int64_t(head.size()));
  file_bytes_ += int64_t(head.size() + rows.bytes.size());
  dirty_ = true;
  return Status();
}

Status KvCheckpointFile::sync() {
  if (!dirty_) return Status();
  if (::fdatasync(fd_) != 0)
    return internal_error("cannot sync {}: {}", path_, std::strerror(errno));
  dirty_ = false;
  return Status();
}

Status KvCheckpointFile::compact(const std::map<PartialKey, int64_t>& keep) {
  const std::string tmp = path_ + ".compact";
  std::unique_ptr<KvCheckpointFile> out(new KvCheckpointFile(tmp, layout_));
  out->fd_ = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out->fd_ < 0) return internal_error("cannot create {}: {}", tmp, std::strerror(errno));
  STRATA_RETURN_IF_ERROR(out->write_header(out->fd_));
  for (const auto& [key, n] : keep) {
    const int64_t rows = std::min(n, this->rows(key)) / layout_.page_size * layout_.page_size;
    if (rows <= 0) continue;
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<KvRows> r, read(key, rows));
    STRATA_RETURN_IF_ERROR(out->append(key, *r));
  }
  STRATA_RETURN_IF_ERROR(out->sync());
  if (std::rename(tmp.c_str(), path_.c_str()) != 0)
    return internal_error("cannot rename {} to {}: {}", tmp, path_, std::strerror(errno));
  sync_dir(path_);
  std::swap(fd_, out->fd_);
  index_ = std::move(out->index_);
  file_bytes_ = out->file_bytes_;
  dirty_ = false;
  return Status();
}

void KvCheckpointFile::remove() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  std::error_code ec;
  std::filesystem::remove(path_, ec);
  index_.clear();
}

}  // namespace strata
