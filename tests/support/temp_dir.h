// Test support: a fresh directory under the system temp directory, removed with everything in
// it when the object goes out of scope. Names carry the process id and a counter, so parallel
// test processes and several objects in one test never share a directory.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace strata::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "strata_test") {
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Writes `text` to the file `name` in this directory.
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

}  // namespace strata::testing
