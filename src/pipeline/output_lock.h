// Exclusive ownership of a batch job's output: one job at a time writes FILE (and its
// .failures.jsonl, .done and .partial.jsonl companions). Two jobs appending to one file lose
// records (a compaction of one renames a new file over the path while the other appends to the
// old inode) and both would report success, so the second job is refused at once.
//
// The lock is flock(LOCK_EX | LOCK_NB) on FILE.lock, taken before the output is scanned and held
// (the descriptor stays open) for the whole job, compaction included. The kernel drops it when the
// process exits, kill -9 included, so a stale lock never blocks a resume. The lock file is never
// deleted: deleting it would let a job lock a new inode while another still holds the old one.
// Its content names the holder (pid, host, start time, heartbeat) for the error message.
//
// Shared filesystems:
//   - local filesystems: flock is exact.
//   - NFS (Linux client >= 2.6.12): flock is emulated with a whole-file POSIX lock through the NFS
//     lock protocol (NLM for v3, built in for v4), so it holds across hosts, unless the mount has
//     `nolock` or `local_lock=flock|all`, which keep locks local to one host.
//   - Lustre: flock is cluster-coherent with the `-o flock` mount option; `-o localflock` keeps it
//     local to one node; with neither, flock fails (ENOSYS) and the job stops with that error.
// For the local-only cases a second guard catches most mistakes: the holder touches the lock
// file's heartbeat every few seconds, and a job that takes the flock but finds another host's
// heartbeat younger than kForeignHeartbeatSeconds refuses too (its lock is evidently not shared).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/status.h"

namespace strata {

// The holder's heartbeat is rewritten this often (seconds) by OutputLock::heartbeat().
inline constexpr double kLockHeartbeatSeconds = 5;
// Another host's heartbeat younger than this refuses the lock even when flock granted it.
inline constexpr double kForeignHeartbeatSeconds = 30;

class OutputLock {
 public:
  // Locks `results_path` + ".lock" without waiting. Errors: failed_precondition naming the holder
  // (pid, host, since when) when another job holds it; the filesystem's error when it has no
  // locks. Creates the lock file (and nothing else) when missing.
  static StatusOr<std::unique_ptr<OutputLock>> acquire(const std::string& results_path);
  ~OutputLock();  // marks the file released and closes it (which drops the flock)
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  // Rewrites the holder record with a fresh heartbeat when kLockHeartbeatSeconds have passed.
  // Call from the job's thread now and then; cheap otherwise.
  void heartbeat();
  const std::string& path() const { return path_; }

 private:
  OutputLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  void write_record(bool released);
  std::string path_;
  int fd_ = -1;
  int64_t started_unix_ = 0;
  std::chrono::steady_clock::time_point last_beat_{};
};

// This machine's host name ("?" when unknown).
std::string local_host_name();

}  // namespace strata
