// A batch generation job: datasets in, one prompt target (engine or server), JSONL out, resumable
// and exactly-once (output_log.h says how).
//
// Files, with --output FILE (every dataset in one file; meta.dataset tells them apart):
//   FILE                 results, one line per prompt, in completion order
//   FILE.failures.jsonl  prompts given up on:
//   {"id","dataset","model","error","http_status","attempts"} FILE.done            a JSON summary,
//   written when every prompt is done or failed and the
//                        files on disk hold every id (checked by reading them again)
//   FILE.lock            the job's exclusive ownership of FILE (output_lock.h): a second job on
//                        the same output is refused at once, naming the holder
//   FILE.partial.jsonl   checkpoints of unfinished prompts (checkpoint.h; in-process engine
//                        only): a resumed job continues each from its last checkpoint
//   FILE.partial.kv      their KV rows (kv_checkpoint.h; --checkpoint-kv): a resumed prompt
//                        decodes on instead of prefilling prompt + partial output again
//   hidden/NAME/         with JobOptions::capture: the records' hidden states (hidden_store.h)
// With --output-dir DIR, the same per dataset: DIR/<name>.jsonl, DIR/<name>.jsonl.failures.jsonl,
// ... Without either, results stay in memory (JobSummary::records, input order): not resumable.
//
// A result line is the input line with the generated assistant turn appended to its
// "conversations" (or "messages"), or a "completion" field for a raw {"prompt"}, plus
// "meta": {"dataset","model","sampling":{...},"seed","prompt_tokens","completion_tokens",
// "finish_reason"}.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "pipeline/dataset.h"
#include "pipeline/hidden_store.h"
#include "pipeline/output_lock.h"
#include "pipeline/progress.h"
#include "pipeline/prompt_target.h"

namespace strata {

struct JobOptions {
  JobSampling sampling;
  std::string output_file;
  std::string output_dir;
  bool retry_failures = false;        // prompts in the failures file run again
  bool allow_mixed_settings = false;  // resume even if the file was made with other settings
  bool progress = true;               // progress lines on stderr
  double progress_interval_s = 1.0;
  double rate_window_s = 30;  // token rates on the progress line: over this many seconds
  // Checkpoints of unfinished prompts (targets that can resume, with an output file): written
  // when a prompt has this many unsaved tokens, or every checkpoint_interval_s while any has
  // some. 0 tokens: no checkpoints.
  int checkpoint_tokens = 256;
  double checkpoint_interval_s = 10;
  // KV rows with the checkpoints (kv_checkpoint.h), for targets that have them (the in-process
  // engine at --tp-size 1). kAuto: on unless the rows of the prompts in flight could exceed
  // checkpoint_kv_max_bytes (KV bytes per token x max_new_tokens x prompts in flight, at most
  // the job's prompts; the prompts' own rows not counted); kOn where the target cannot is an error.
  enum class CheckpointKv { kAuto, kOn, kOff };
  CheckpointKv checkpoint_kv = CheckpointKv::kAuto;
  int64_t checkpoint_kv_max_bytes = int64_t(16) << 30;
  // Locks taken earlier by lock_job_outputs (so a second job is refused before a model loads);
  // the job takes any it does not find here itself.
  std::vector<std::shared_ptr<OutputLock>> held_locks{};
  // "K/N" when the datasets are one shard of a larger job (shard.h): said on the progress line
  // and in .done ("shard"), so a task's files tell which part of the job they hold.
  std::string shard{};
  // Hidden-state capture (hidden_store.h): each record's tensors go to DIR/hidden/NAME/ and the
  // record commits only once they are durable. Needs an output file and a target that captures.
  CaptureOptions capture{};
};

struct JobSummary {
  std::vector<DatasetSummary> datasets;
  double seconds = 0;
  int64_t interrupted = 0;  // prompts left for a later run (server gone too long)
  std::string interrupt_reason;
  bool complete = false;                // every prompt is done or failed
  std::vector<nlohmann::json> records;  // in-memory mode: one per prompt, input order

  int64_t failed() const;
  nlohmann::json to_json() const;
};

// Takes the output lock of every results file the job will write (none in memory mode). Call it
// before anything slow (loading a model) and pass the locks in JobOptions::held_locks.
StatusOr<std::vector<std::shared_ptr<OutputLock>>> lock_job_outputs(
    const std::vector<Dataset>& datasets, const JobOptions& options);

// Runs the job on the calling thread (the target runs the prompts). Errors: unreadable or
// corrupt output files, a resume with other settings, write failures. A prompt that fails is
// not an error: it is counted in the summary and written to the failures file.
StatusOr<JobSummary> run_job(const std::vector<Dataset>& datasets, PromptTarget& target,
                             const JobOptions& options);

}  // namespace strata
