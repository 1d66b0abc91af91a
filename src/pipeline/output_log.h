// The append-only JSONL files of a batch job (results and failures) and the scan that resumes
// them. Exactly-once rests on three rules:
//   1. every record is one complete line written by one write() call (looping only on a short
//      write), so after a kill -9 the file is whole lines plus at most one torn tail;
//   2. on start the scan keeps the complete lines, truncates the torn tail and collects the
//      (dataset, id) keys already written; the job skips those;
//   3. a key found twice (only possible if files were concatenated by hand or an older tool
//      wrote them) is reported and removed by compact(), keeping the first record.
// Lines end with '\n' and never contain one (nlohmann::json::dump escapes it).
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/status.h"

namespace strata {

struct LineSpan {
  int64_t offset = 0;  // bytes from the file start
  int64_t length = 0;  // including the '\n'
};

struct ScanResult {
  bool exists = false;
  int64_t file_bytes = 0;
  int64_t valid_bytes = 0;  // the complete lines; the rest is a torn tail
  int64_t torn_bytes = 0;   // file_bytes - valid_bytes
  int64_t records = 0;      // complete lines
  // dataset -> ids, each once. The dataset is the record's meta.dataset, else its top-level
  // "dataset", else the scan's default.
  std::map<std::string, std::unordered_set<std::string>> keys;
  std::vector<LineSpan> duplicates;  // lines whose key appeared on an earlier line
  // dataset -> id -> the last record seen (only when the scan keeps records: failures files).
  std::map<std::string, std::unordered_map<std::string, nlohmann::json>> last_records;
  nlohmann::json first_record;  // null when the file has no complete line

  bool contains(const std::string& dataset, const std::string& id) const;
  int64_t count(const std::string& dataset) const;
};

struct ScanOptions {
  std::string default_dataset{};  // for records that name none
  bool keep_records = false;      // fill last_records
};

// The key of an output record, as the scan and the job key it: its "id" (a string, or an integer
// as its decimal text) and dataset (meta.dataset, else a top-level "dataset" as failures carry,
// else `default_dataset`). False when the line is not an object with a usable id.
bool record_key(const nlohmann::json& j, const std::string& default_dataset, std::string& dataset,
                std::string& id);

// Reads a results or failures file. A missing file is an empty result (exists = false).
// A complete line that is not a JSON object with an "id" is corruption nobody can resolve
// automatically: a data_loss error naming the file and line. Costs one pass over the file.
StatusOr<ScanResult> scan_output(const std::string& path, const ScanOptions& options = {});

// Rewrites `path` without the scan's duplicate lines and torn tail (to PATH.compact, fsync,
// rename), so the file holds every key once. No-op when there is nothing to remove.
Status compact_output(const std::string& path, const ScanResult& scan);

// An append-only JSONL file. Not thread-safe: one writer thread (the job's) owns it.
class AppendLog {
 public:
  // Creates `path` if missing, truncates it to `valid_bytes` (dropping a torn tail) and
  // positions at the end. The directory entry is fsync'ed so a new file survives a crash.
  static StatusOr<std::unique_ptr<AppendLog>> open(const std::string& path, int64_t valid_bytes);
  ~AppendLog();
  AppendLog(const AppendLog&) = delete;
  AppendLog& operator=(const AppendLog&) = delete;

  // Writes `line` plus '\n' with one write() (looping only if the kernel writes less).
  // `line` must not contain '\n'.
  Status append(std::string_view line);
  // fdatasync: records appended so far survive a power loss, not only a process kill.
  Status sync();
  const std::string& path() const { return path_; }
  // True while path() still names the file this log appends to (same device and inode).
  bool same_file_as_path() const;

 private:
  AppendLog(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
  bool dirty_ = false;
  std::string buffer_;  // line + '\n', reused
};

// Writes `text` to `path` atomically (PATH.tmp, fsync, rename): used for the .done summary.
Status write_file_atomic(const std::string& path, const std::string& text);

}  // namespace strata
