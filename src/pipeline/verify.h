// `strata generate --verify PATH...`: after the shards of a job ran as separate tasks (shard.h),
// checks that their outputs together hold every input id exactly once. PATHs are results files
// (--output FILE) or directories searched recursively for them (--output-dir layouts, one
// directory per shard or their parent); each results file's FILE.failures.jsonl is read with it.
//
// Per input dataset, every (dataset, id) is exactly one of:
//   done        one result record across all files;
//   failed      no result, but a record in a failures file (the task gave up on it: run that
//               shard again with --retry-failures);
//   missing     in no file (a shard never ran, or was killed and not resumed);
//   duplicated  more than one result record (shards that overlapped: tasks run with different
//               N, or the same shard's output copied twice).
// Records whose dataset or id is not in the input are counted as foreign (an output of another
// input file, or an input edited since). The job is verified when nothing is failed, missing,
// duplicated or foreign.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "pipeline/dataset.h"

namespace strata {

struct VerifiedFile {
  std::string path{};
  int64_t results = 0;   // complete result lines
  int64_t failures = 0;  // lines of its failures file
  bool torn = false;     // ends in a torn line: its job was killed and not run again
  bool done = false;     // FILE.done exists: its job finished
  std::string shard{};   // "K/N" from FILE.done, when the job was a shard
};

struct VerifiedDataset {
  std::string name{};
  int64_t total = 0, done = 0, failed = 0, missing = 0, duplicated = 0;
};

struct VerifyReport {
  std::vector<VerifiedFile> files;
  std::vector<std::string> skipped;  // .jsonl files under a directory that are no job output
  std::vector<VerifiedDataset> datasets;
  int64_t foreign = 0;
  // A few "dataset/id (where)" of each problem, for the summary.
  std::vector<std::string> missing_examples, duplicate_examples, foreign_examples, failed_examples;

  bool ok() const;
};

// Reads every output under `paths`. Errors: a path that does not exist, a given file that is not a
// job's output, a complete line that is not a JSON record with an id.
StatusOr<VerifyReport> verify_outputs(const std::vector<Dataset>& inputs,
                                      const std::vector<std::string>& paths);

// The summary, one line each; the last says OK or what is wrong.
std::vector<std::string> format_verify_report(const VerifyReport& report);

}  // namespace strata
