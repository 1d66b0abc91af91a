// eval-kv's checkpoint: the statistics of every finished group of windows, appended (and flushed
// to disk) as each group finishes, so an interrupted evaluation continues where it stopped
// instead of starting from zero (a million positions on 8 GPUs are hours). A group's record
// holds, per result (the noise floor first, then the candidates), each scored position's
// LogitStatsRow — exactly what the metrics accumulate, so a resumed run's record equals an
// uninterrupted one's. Positions that are not in a finished group are computed again.
//
// File: one JSON line {"format", "key"} (the run's identity: model, data, windows, options,
// candidates, device; a file of another run is refused, not silently mixed), then binary group
// records [u32 'KVG1'][i64 first window][i32 windows][i32 results] per result [i64 n]
// n × [i32 position][5 × f32] and [u32 'KVGE']. A record without its end mark (a run killed
// while writing) is cut off when the file is opened again.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "arch/model.h"  // LogitStatsRow (backend.h; eval reaches the backend through the model)
#include "core/status.h"

namespace strata {

struct ScoredPosition {
  int32_t position = 0;  // in its window
  LogitStatsRow stats;
};

struct CheckpointGroup {
  int64_t first_window = 0;
  int32_t windows = 0;
  std::vector<std::vector<ScoredPosition>> results;  // [result][position in scoring order]
};

class EvalCheckpoint {
 public:
  // Opens (or creates) `path` for the run `key`; `done` receives the groups already finished,
  // in order. Errors: a file of another run, an unreadable or unwritable file.
  static StatusOr<std::unique_ptr<EvalCheckpoint>> open(const std::string& path,
                                                        const std::string& key,
                                                        std::vector<CheckpointGroup>* done);
  ~EvalCheckpoint();
  EvalCheckpoint(const EvalCheckpoint&) = delete;
  EvalCheckpoint& operator=(const EvalCheckpoint&) = delete;

  // Appends a finished group and flushes it to disk (fsync) before returning.
  Status append(const CheckpointGroup& group);
  const std::string& path() const { return path_; }

 private:
  EvalCheckpoint() = default;
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace strata
