// Helpers shared by the libFuzzer targets (fuzz/*_fuzz.cc): splitting one input into fields and
// handing bytes to APIs that read files. Not part of any library; see FUZZING.md.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace strata::fuzz {

// Splits the input at NUL bytes into at most `max_parts` fields (the last keeps any later NULs).
// JSON and templates never contain a raw NUL, so seeds write fields as "a\0b\0c".
inline std::vector<std::string_view> split_fields(const uint8_t* data, size_t size,
                                                  size_t max_parts) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    size_t nul = in.find('\0');
    if (nul == std::string_view::npos) break;
    parts.push_back(in.substr(0, nul));
    in.remove_prefix(nul + 1);
  }
  parts.push_back(in);
  parts.resize(max_parts);  // missing fields are empty
  return parts;
}

// An anonymous in-memory file whose contents are replaced on every call: lets the fuzzers drive
// APIs that take a path (mmap, ifstream) without touching the disk. Path: /proc/self/fd/N.
class MemFile {
 public:
  MemFile() : fd_(::memfd_create("strata-fuzz", 0)) {
    if (fd_ < 0) std::abort();
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  const std::string& write(std::string_view bytes) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, off_t(done));
      if (n <= 0) std::abort();
      done += size_t(n);
    }
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

// ../shared (models and fixtures): $STRATA_SHARED_DIR, else the path CMake compiled in.
inline std::string shared_dir() {
  const char* env = std::getenv("STRATA_SHARED_DIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(STRATA_SHARED_DIR);
}

}  // namespace strata::fuzz
