// The state of one batch generation job (run_job, runner.h) and the class that runs it, shared by
// its files: runner.cc (tasks, outcomes, results files, progress), job_checkpoints.cc (checkpoints
// of unfinished prompts and their KV side files) and job_capture.cc (hidden-state capture).
// Internal to pipeline/: the interface is runner.h.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "pipeline/checkpoint.h"
#include "pipeline/hidden_store.h"
#include "pipeline/kv_checkpoint.h"
#include "pipeline/output_lock.h"
#include "pipeline/output_log.h"
#include "pipeline/progress.h"
#include "pipeline/runner.h"

namespace strata::generate_job {

using Clock = std::chrono::steady_clock;

// Outcomes handed from the target's threads to the job's thread. Shared with the callbacks, so
// an early return (write error) leaves them a valid place to post to.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<size_t, GenerationOutcome>> items;  // (task index, outcome)
  std::deque<std::pair<size_t, TokenReport>> tokens;       // (task index, new tokens)
};

// One results file, its failures file and its .done marker, fed by one or more datasets.
struct Sink {
  std::string results_path, failures_path, done_path;
  std::string default_dataset;  // per-dataset files: records need not name it
  std::vector<size_t> datasets;
  ScanResult results, failures;
  std::shared_ptr<OutputLock> lock;  // taken before the scan, held until the job returns
  std::unique_ptr<AppendLog> results_log, failures_log;
  std::string partial_path;                      // checkpoints (checkpoint.h)
  std::map<PartialKey, PartialOutput> partials;  // of unfinished prompts, when the job started
  std::unique_ptr<AppendLog> partial_log;        // null when the job does not checkpoint
  std::unique_ptr<KvCheckpointFile> kv_file;     // their KV rows; null without KV checkpoints
  int64_t kv_dead_rows = 0;             // rows of records finished since the last compaction
  std::unique_ptr<HiddenStore> hidden;  // capture jobs (hidden_store.h)
};

struct Task {
  size_t dataset = 0;
  size_t sink = 0;
  GenerationTask task;
  // While it runs: its output tokens (a resumed partial's included), how many of them a
  // checkpoint holds, and the sampler state after them.
  bool running = false;
  std::vector<int32_t> produced{};
  size_t checkpointed = 0;
  uint64_t rng_draws = 0;
  int32_t prompt_tokens = 0;
  int64_t reported_this_run = 0;  // tokens the target reported (not the resumed ones)
  // KV checkpoints: the sampler's draws after each produced token (kUnknownDraws where a report
  // of several tokens hid them), rows received and not yet in the side file, rows it holds, rows
  // to load when the task starts, and the mark the last line stated.
  std::vector<uint64_t> draws_after{};
  std::vector<std::shared_ptr<const KvRows>> kv_pending{};
  int64_t kv_received = 0, kv_saved = 0, kv_resume_rows = 0;
  KvMark kv_written{};
};

constexpr uint64_t kUnknownDraws = ~uint64_t(0);

class Job {
 public:
  Job(const std::vector<Dataset>& datasets, PromptTarget& target, const JobOptions& options)
      : datasets_(datasets),
        target_(target),
        options_(options),
        inbox_(std::make_shared<Inbox>()) {}

  StatusOr<JobSummary> run();

 private:
  Status open_sinks();
  // Hidden-state capture (job_capture.cc).
  Status open_hidden(Sink& s);
  Status check_capture_space();
  Status commit_hidden(Sink& s, const Task& t, const GenerationOutcome& o);
  // Capture jobs: the tensors of a batch's finished records, durable as one group before handle()
  // writes their results lines (HiddenStore::commit); handle()'s commit_hidden then finds them.
  Status commit_hidden_group(const std::vector<std::pair<size_t, GenerationOutcome>>& batch);
  void plan_tasks();
  Status handle(size_t index, GenerationOutcome& outcome);
  void on_tokens(size_t index, TokenReport& report);
  // Checkpoints of unfinished prompts and their KV side files (job_checkpoints.cc).
  Status setup_kv_checkpoints();
  Status open_checkpoints(Sink& s);
  Status checkpoint(bool force);
  Status keep_for_resume(Task& t);
  Status save_partial(Task& t);
  Status save_kv_rows(Task& t);
  KvMark kv_mark(const Task& t) const;
  Status compact_kv_if_wasteful(Sink& s);
  int64_t tokens_left() const;
  void report_progress(bool force);
  Status verify_sink(const Sink& s) const;
  Status finish_sinks();

  const std::vector<Dataset>& datasets_;
  PromptTarget& target_;
  const JobOptions& options_;
  std::shared_ptr<Inbox> inbox_;
  nlohmann::json meta_base_;
  std::vector<Sink> sinks_;
  std::vector<Task> tasks_;
  JobSummary summary_;
  std::vector<std::pair<size_t, size_t>> record_slots_;  // memory mode: task -> (dataset, record)
  Clock::time_point start_ = Clock::now(), last_progress_ = Clock::now(),
                    last_checkpoint_ = Clock::now();
  Clock::time_point last_token_ = Clock::now();  // when the job last received generated tokens
  int64_t finished_this_run_ = 0;
  bool checkpointing_ = false;
  std::optional<KvRowsLayout> kv_layout_;  // set when checkpoints hold KV rows too
  std::string settings_;                   // settings_fingerprint of meta_base_
  std::set<size_t> running_;
  size_t started_ = 0;                                   // tasks handed to the target
  int64_t generated_ = 0, finished_prompt_tokens_ = 0;   // this run
  int64_t done_completion_tokens_ = 0, done_count_ = 0;  // for the expected output length
  RateWindow gen_rate_{30}, prompt_rate_{30};
};

}  // namespace strata::generate_job
