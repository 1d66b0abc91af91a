#include "pipeline/output_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/check.h"

namespace strata {
namespace {

Status errno_status(const char* what, const std::string& path) {
  return internal_error("{} '{}': {}", what, path, std::strerror(errno));
}

// fsync of the directory that holds `path`, so a created or renamed entry is durable.
void sync_parent_dir(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

Status write_all(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("writing", path);
    }
    data += n;
    size -= size_t(n);
  }
  return Status();
}

}  // namespace

bool record_key(const nlohmann::json& j, const std::string& default_dataset, std::string& dataset,
                std::string& id) {
  if (!j.is_object() || !j.contains("id")) return false;
  const auto& jid = j["id"];
  if (jid.is_string())
    id = jid.get<std::string>();
  else if (jid.is_number_integer())
    id = std::to_string(jid.get<int64_t>());
  else
    return false;
  dataset = default_dataset;
  if (auto m = j.find("meta"); m != j.end() && m->is_object()) {
    if (auto d = m->find("dataset"); d != m->end() && d->is_string())
      dataset = d->get<std::string>();
  } else if (auto d = j.find("dataset"); d != j.end() && d->is_string()) {
    dataset = d->get<std::string>();
  }
  return true;
}

bool ScanResult::contains(const std::string& dataset, const std::string& id) const {
  auto it = keys.find(dataset);
  return it != keys.end() && it->second.count(id) > 0;
}

int64_t ScanResult::count(const std::string& dataset) const {
  auto it = keys.find(dataset);
  return it == keys.end() ? 0 : int64_t(it->second.size());
}

StatusOr<ScanResult> scan_output(const std::string& path, const ScanOptions& options) {
  ScanResult r;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return r;
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot read output file '{}'", path);
  r.exists = true;
  r.file_bytes = int64_t(std::filesystem::file_size(path, ec));
  std::string line, dataset, id;
  int64_t offset = 0;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (in.eof()) break;  // no '\n': the torn tail of an interrupted write
    const int64_t length = int64_t(line.size()) + 1;
    const int64_t line_offset = offset;
    offset += length;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !record_key(j, options.default_dataset, dataset, id)) {
      return data_loss(
          "{} line {}: a complete line that is not a JSON record with an \"id\" (the file was "
          "edited or "
          "corrupted; fix or remove that line and run again)",
          path, n);
    }
    ++r.records;
    if (r.first_record.is_null()) r.first_record = j;
    if (!r.keys[dataset].insert(id).second) r.duplicates.push_back({line_offset, length});
    if (options.keep_records) r.last_records[dataset][id] = std::move(j);
  }
  r.valid_bytes = offset;
  r.torn_bytes = r.file_bytes - r.valid_bytes;
  return r;
}

Status compact_output(const std::string& path, const ScanResult& scan) {
  if (scan.duplicates.empty() && scan.torn_bytes == 0) return Status();
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot read output file '{}'", path);
  const std::string tmp = path + ".compact";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status("creating", tmp);
  std::string chunk;
  int64_t pos = 0;
  size_t dup = 0;
  Status s;
  auto copy = [&](int64_t bytes) {
    chunk.resize(size_t(bytes));
    in.read(chunk.data(), bytes);
    if (in.gcount() != bytes) return data_loss("{} changed while it was compacted", path);
    return write_all(fd, chunk.data(), chunk.size(), tmp);
  };
  while (s.ok() && pos < scan.valid_bytes) {
    const int64_t next_dup =
        dup < scan.duplicates.size() ? scan.duplicates[dup].offset : scan.valid_bytes;
    if (pos < next_dup) {
      s = copy(next_dup - pos);
      pos = next_dup;
    } else {
      in.seekg(scan.duplicates[dup].length, std::ios::cur);
      pos += scan.duplicates[dup].length;
      ++dup;
    }
  }
  if (s.ok() && ::fsync(fd) != 0) s = errno_status("syncing", tmp);
  ::close(fd);
  if (!s.ok()) return s;
  if (::rename(tmp.c_str(), path.c_str()) != 0) return errno_status("renaming to", path);
  sync_parent_dir(path);
  return Status();
}

StatusOr<std::unique_ptr<AppendLog>> AppendLog::open(const std::string& path, int64_t valid_bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status("opening output file", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || (st.st_size > valid_bytes && ::ftruncate(fd, valid_bytes) != 0) ||
      ::fsync(fd) != 0) {
    Status s = errno_status("truncating the torn tail of", path);
    ::close(fd);
    return s;
  }
  if (st.st_size < valid_bytes) {
    ::close(fd);
    return data_loss("{} shrank while it was opened ({} bytes, expected {})", path, st.st_size,
                     valid_bytes);
  }
  sync_parent_dir(path);
  return std::unique_ptr<AppendLog>(new AppendLog(path, fd));
}

AppendLog::~AppendLog() {
  if (fd_ >= 0) {
    if (dirty_) ::fdatasync(fd_);
    ::close(fd_);
  }
}

Status AppendLog::append(std::string_view line) {
  CHECK_MSG(line.find('\n') == std::string_view::npos, "a JSONL record must be one line");
  buffer_.assign(line);
  buffer_.push_back('\n');
  dirty_ = true;
  return write_all(fd_, buffer_.data(), buffer_.size(), path_);
}

Status AppendLog::sync() {
  if (!dirty_) return Status();
  if (::fdatasync(fd_) != 0) return errno_status("syncing", path_);
  dirty_ = false;
  return Status();
}

bool AppendLog::same_file_as_path() const {
  struct stat mine {
  }, named{};
  if (::fstat(fd_, &mine) != 0 || ::stat(path_.c_str(), &named) != 0) return false;
  return mine.st_dev == named.st_dev && mine.st_ino == named.st_ino;
}

Status write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status("creating", tmp);
  Status s = write_all(fd, text.data(), text.size(), tmp);
  if (s.ok() && ::fsync(fd) != 0) s = errno_status("syncing", tmp);
  ::close(fd);
  if (!s.ok()) return s;
  if (::rename(tmp.c_str(), path.c_str()) != 0) return errno_status("renaming to", path);
  sync_parent_dir(path);
  return Status();
}

}  // namespace strata
