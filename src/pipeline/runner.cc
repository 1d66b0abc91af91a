#include "pipeline/runner.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>

#include "core/log.h"
#include "pipeline/checkpoint.h"
#include "pipeline/kv_checkpoint.h"
#include "pipeline/output_lock.h"
#include "pipeline/output_log.h"

namespace strata {
namespace {

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

// Scans a file, compacting it first if it holds duplicates (rescanning after).
StatusOr<ScanResult> scan_and_repair(const std::string& path, const ScanOptions& opts) {
  STRATA_ASSIGN_OR_RETURN(ScanResult scan, scan_output(path, opts));
  if (scan.torn_bytes > 0)
    LOG_WARN("{}: dropping a torn last line ({} bytes) left by an interrupted write", path,
             scan.torn_bytes);
  if (!scan.duplicates.empty()) {
    LOG_WARN("{}: {} duplicate records; keeping the first of each", path, scan.duplicates.size());
    STRATA_RETURN_IF_ERROR(compact_output(path, scan));
    STRATA_ASSIGN_OR_RETURN(scan, scan_output(path, opts));
  }
  return scan;
}

// The resumed file must have been made with this job's model and sampling settings, or the
// dataset would silently mix two distributions.
Status check_settings(const Sink& sink, const nlohmann::json& meta_now, bool allow_mixed) {
  const nlohmann::json& first = sink.results.first_record;
  if (allow_mixed || first.is_null() || !first.contains("meta")) return Status();
  const nlohmann::json& meta = first["meta"];
  for (const char* key : {"model", "sampling"}) {
    if (meta.value(key, nlohmann::json()) != meta_now[key]) {
      return failed_precondition(
          "{} was generated with {} {} but this run uses {}; use another output, or pass "
          "--allow-mixed-settings to add to it anyway",
          sink.results_path, key, meta.value(key, nlohmann::json()).dump(), meta_now[key].dump());
    }
  }
  return Status();
}

// Where a dataset's results go: the one --output file, or DIR/<name>.jsonl.
std::string results_path_of(const Dataset& d, const JobOptions& o) {
  if (o.output_dir.empty()) return o.output_file;
  return (std::filesystem::path(o.output_dir) / (d.name + ".jsonl")).string();
}

nlohmann::json result_record(const PromptRecord& r, const std::string& dataset,
                             const nlohmann::json& meta_base, uint64_t seed,
                             const GenerationOutcome& o) {
  nlohmann::json out = r.original;
  if (!r.messages.is_null()) {
    const char* key = out.contains("messages") ? "messages" : "conversations";
    nlohmann::json conv = prompt_messages(r.messages);
    conv.push_back({{"role", "assistant"}, {"content", o.text}});
    out[key] = std::move(conv);
  } else {
    out["completion"] = o.text;
  }
  if (!out.contains("id")) out["id"] = r.id;
  nlohmann::json meta = meta_base;
  meta["dataset"] = dataset;
  meta["seed"] = seed;
  meta["prompt_tokens"] = o.prompt_tokens;
  meta["completion_tokens"] = o.completion_tokens;
  meta["finish_reason"] = o.finish_reason;
  if (o.kind != OutcomeKind::kDone) meta["error"] = o.error;
  out["meta"] = std::move(meta);
  if (o.teacher_forced) {  // the conversation already holds its response: kept as it was
    for (const char* key : {"messages", "conversations", "completion"}) {
      if (r.original.contains(key)) {
        out[key] = r.original[key];
      } else {
        out.erase(key);
      }
    }
  }
  return out;
}

nlohmann::json failure_record(const PromptRecord& r, const std::string& dataset,
                              const std::string& model, const GenerationOutcome& o) {
  return {{"id", r.id},       {"dataset", dataset},           {"model", model},
          {"error", o.error}, {"http_status", o.http_status}, {"attempts", o.attempts}};
}

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
  Status open_checkpoints(Sink& s);
  Status open_hidden(Sink& s);
  Status check_capture_space();
  // Capture jobs: the tensors of a batch's finished records, durable as one group before handle()
  // writes their results lines (HiddenStore::commit).
  Status commit_hidden(const std::vector<std::pair<size_t, GenerationOutcome>>& batch);
  void plan_tasks();
  Status handle(size_t index, GenerationOutcome& outcome);
  void on_tokens(size_t index, TokenReport& report);
  Status checkpoint(bool force);
  Status save_partial(Task& t);
  Status save_kv_rows(Task& t);
  KvMark kv_mark(const Task& t) const;
  Status setup_kv_checkpoints();
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

Status Job::open_sinks() {
  const bool per_dataset = !options_.output_dir.empty();
  if (per_dataset) {
    std::error_code ec;
    std::filesystem::create_directories(options_.output_dir, ec);
    if (ec)
      return internal_error("cannot create --output-dir '{}': {}", options_.output_dir,
                            ec.message());
  } else if (options_.output_file.empty()) {
    return Status();  // memory mode
  }
  for (size_t d = 0; d < datasets_.size(); ++d) {
    if (per_dataset || sinks_.empty()) {
      Sink s;
      s.results_path = results_path_of(datasets_[d], options_);
      s.failures_path = s.results_path + ".failures.jsonl";
      s.done_path = s.results_path + ".done";
      if (per_dataset) s.default_dataset = datasets_[d].name;
      sinks_.push_back(std::move(s));
    }
    sinks_.back().datasets.push_back(d);
  }
  // Every lock first: a job refused on its second file must not have compacted the first.
  for (Sink& s : sinks_) {
    for (const auto& held : options_.held_locks)
      if (held && held->path() == s.results_path + ".lock") s.lock = held;
    if (!s.lock) {
      STRATA_ASSIGN_OR_RETURN(s.lock, OutputLock::acquire(s.results_path));
    }
  }
  for (Sink& s : sinks_) {
    STRATA_ASSIGN_OR_RETURN(
        s.results, scan_and_repair(s.results_path, {.default_dataset = s.default_dataset}));
    STRATA_ASSIGN_OR_RETURN(
        s.failures, scan_and_repair(s.failures_path,
                                    {.default_dataset = s.default_dataset, .keep_records = true}));
    STRATA_RETURN_IF_ERROR(check_settings(s, meta_base_, options_.allow_mixed_settings));
    STRATA_ASSIGN_OR_RETURN(s.results_log, AppendLog::open(s.results_path, s.results.valid_bytes));
    STRATA_ASSIGN_OR_RETURN(s.failures_log,
                            AppendLog::open(s.failures_path, s.failures.valid_bytes));
    STRATA_RETURN_IF_ERROR(open_checkpoints(s));
    STRATA_RETURN_IF_ERROR(open_hidden(s));
    if (s.results.records > 0)
      LOG_INFO("resuming {}: {} records already written", s.results_path, s.results.records);
  }
  return Status();
}

// Keeps the checkpoints of prompts still to run (rewritten compactly, one line each) and opens
// the file for this run's. Without checkpointing, stale checkpoints are left alone.
Status Job::open_checkpoints(Sink& s) {
  s.partial_path = s.results_path + ".partial.jsonl";
  if (!checkpointing_) return Status();
  using Partials = std::map<PartialKey, PartialOutput>;
  STRATA_ASSIGN_OR_RETURN(Partials all, read_partials(s.partial_path, settings_));
  for (auto& [key, p] : all) {
    const auto& [dataset, id] = key;
    if (s.results.contains(dataset, id) ||
        (!options_.retry_failures && s.failures.contains(dataset, id)))
      continue;
    s.partials.emplace(key, std::move(p));
  }
  if (kv_layout_) {
    STRATA_ASSIGN_OR_RETURN(s.kv_file,
                            KvCheckpointFile::open(s.results_path + ".partial.kv", *kv_layout_));
    std::map<PartialKey, int64_t> keep;
    int64_t lost = 0;
    for (auto& [key, p] : s.partials) {
      if (p.kv.rows > 0 && s.kv_file->rows(key) < p.kv.rows) {
        ++lost;  // a torn side file, or one made with another layout: this record prefills again
        p.kv = KvMark{};
      }
      if (p.kv.rows > 0) keep[key] = p.kv.rows;
    }
    if (lost > 0)
      LOG_WARN("{}: the KV rows of {} unfinished prompts are missing; they are prefilled again",
               s.kv_file->path(), lost);
    int64_t kept = 0;
    for (const auto& [key, rows] : keep)
      kept += rows / kv_layout_->page_size * kv_layout_->page_bytes;
    if (s.kv_file->file_bytes() > 2 * kept + (int64_t(64) << 20))
      STRATA_RETURN_IF_ERROR(s.kv_file->compact(keep));
  } else {
    for (auto& [key, p] : s.partials)
      p.kv = KvMark{};  // no rows are loaded: continue from every token
  }
  STRATA_RETURN_IF_ERROR(rewrite_partials(s.partial_path, s.partials, settings_));
  std::error_code ec;
  const int64_t bytes = std::filesystem::exists(s.partial_path, ec)
                            ? int64_t(std::filesystem::file_size(s.partial_path, ec))
                            : 0;
  STRATA_ASSIGN_OR_RETURN(s.partial_log, AppendLog::open(s.partial_path, bytes));
  if (!s.partials.empty()) {
    int64_t tokens = 0;
    for (const auto& [key, p] : s.partials) tokens += int64_t(p.tokens.size());
    LOG_INFO("resuming {} unfinished prompts of {} from their checkpoints ({} tokens)",
             s.partials.size(), s.results_path, tokens);
  }
  return Status();
}

// Capture jobs: opens the sink's hidden-state store, reclaiming the tensors of records that never
// committed; every committed record must have its tensors (a file made without capture is refused).
Status Job::open_hidden(Sink& s) {
  if (!options_.capture.enabled) return Status();
  nlohmann::json meta = {{"model", meta_base_["model"]}, {"capture", options_.capture.to_json()}};
  const ScanResult& results = s.results;
  STRATA_ASSIGN_OR_RETURN(s.hidden,
                          HiddenStore::open(hidden_dir_for(s.results_path), meta,
                                            [&](const std::string& dataset, const std::string& id) {
                                              return results.contains(dataset, id);
                                            }));
  const int64_t without = s.results.records - s.hidden->records();
  if (without > 0)
    return failed_precondition(
        "{} holds {} records without hidden states in {} (made without capture?); use "
        "another output",
        s.results_path, without, s.hidden->dir());
  return Status();
}

Status Job::commit_hidden(const std::vector<std::pair<size_t, GenerationOutcome>>& batch) {
  std::map<size_t, std::vector<HiddenStore::Pending>> by_sink;
  for (const auto& [index, o] : batch) {
    const Task& t = tasks_[index];
    if (o.kind == OutcomeKind::kDone && o.hidden && !sinks_.empty() && sinks_[t.sink].hidden)
      by_sink[t.sink].push_back({t.task.dataset, t.task.record->id, o.hidden.get()});
  }
  for (const auto& [sink, records] : by_sink)
    STRATA_RETURN_IF_ERROR(sinks_[sink].hidden->commit(records, int(options_.capture.layers.size()),
                                                       options_.capture.hidden_size));
  return Status();
}

// Before a capture job starts: the bytes per token and the expected total, and a refusal when the
// output filesystem lacks the room (naming both numbers).
Status Job::check_capture_space() {
  const CaptureOptions& c = options_.capture;
  if (!c.enabled || sinks_.empty()) return Status();
  int64_t tokens = 0;
  for (const Task& t : tasks_) {
    int64_t prompt = target_.prompt_tokens(*t.task.record);
    if (prompt < 0) prompt = int64_t(t.task.record->original.dump().size() / 4);  // a rough guess
    tokens += prompt + (c.capture_only ? 0 : options_.sampling.params.max_new_tokens);
  }
  const int64_t per_token = c.bytes_per_token(), total = tokens * per_token;
  const std::string& dir = sinks_.front().hidden->dir();
  const int64_t free = c.free_bytes ? c.free_bytes(dir) : filesystem_free_bytes(dir);
  const double gb = 1e9;
  // Always printed (not a log line): users must see the total before the run, not on day 2.
  std::fprintf(stderr,
               "[generate] hidden-state capture: %lld bytes per token (%zu states x %lld x %lld B "
               "+ ids and mask); "
               "up to %lld tokens for %zu records: %.3f GB expected in %s, %.3f GB free there\n",
               (long long)per_token, c.layers.size() + 1, (long long)c.hidden_size,
               (long long)c.element_bytes(), (long long)tokens, tasks_.size(), double(total) / gb,
               dir.c_str(), double(free) / gb);
  if (free >= 0 && total > free)
    return resource_exhausted(
        "hidden-state capture needs up to {} bytes ({:.3f} GB: {} tokens x {} bytes per token) "
        "but the filesystem of {} has {} bytes ({:.3f} GB) free; free space or capture fewer "
        "layers",
        total, double(total) / gb, tokens, per_token, dir, free, double(free) / gb);
  return Status();
}

void Job::plan_tasks() {
  for (size_t d = 0; d < datasets_.size(); ++d) {
    const Dataset& ds = datasets_[d];
    DatasetSummary& sum = summary_.datasets[d];
    const size_t sink = sinks_.empty() ? 0 : (sinks_.size() == 1 ? 0 : d);
    for (size_t i = 0; i < ds.records.size(); ++i) {
      const PromptRecord& r = ds.records[i];
      if (!sinks_.empty()) {
        const Sink& s = sinks_[sink];
        if (s.results.contains(ds.name, r.id)) {
          ++sum.done_before;
          continue;
        }
        if (!options_.retry_failures && s.failures.contains(ds.name, r.id)) {
          ++sum.failed;
          continue;
        }
      }
      Task t{.dataset = d,
             .sink = sink,
             .task = {.dataset = ds.name,
                      .record = &r,
                      .seed = prompt_seed(options_.sampling.base_seed(), r.id)}};
      if (!sinks_.empty()) {
        const Sink& s = sinks_[sink];
        if (auto p = s.partials.find({ds.name, r.id});
            p != s.partials.end() &&
            int64_t(p->second.tokens.size()) < options_.sampling.params.max_new_tokens) {
          const PartialOutput& po = p->second;
          // With KV rows, from the tokens they cover (the rest is decoded again, as before);
          // without, from every token, prefilled.
          const size_t n = po.kv.rows > 0 ? size_t(po.kv.tokens) : po.tokens.size();
          t.task.resume_output_ids.assign(po.tokens.begin(), po.tokens.begin() + ptrdiff_t(n));
          t.task.resume_rng_draws = po.kv.rows > 0 ? po.kv.draws : po.rng_draws;
          t.task.resume_prompt_tokens = po.prompt_tokens;
          t.produced = t.task.resume_output_ids;
          t.checkpointed = t.produced.size();
          t.rng_draws = t.task.resume_rng_draws;
          t.prompt_tokens = po.prompt_tokens;
          t.draws_after.assign(t.produced.size(), kUnknownDraws);
          if (!t.draws_after.empty()) t.draws_after.back() = t.rng_draws;
          t.kv_resume_rows = t.kv_received = t.kv_saved = po.kv.rows;
          t.kv_written = po.kv;
        }
        if (kv_layout_) {
          t.task.export_kv = true;
          t.task.kv_export_from_row = int32_t(t.kv_saved);
        }
      }
      tasks_.push_back(std::move(t));
      record_slots_.emplace_back(d, i);
    }
  }
}

Status Job::handle(size_t index, GenerationOutcome& o) {
  const Task& t = tasks_[index];
  DatasetSummary& sum = summary_.datasets[t.dataset];
  const PromptRecord& r = *t.task.record;
  Task& tm = tasks_[index];
  tm.running = false;
  running_.erase(index);
  --sum.running;
  if (o.kind == OutcomeKind::kInterrupted) {
    ++summary_.interrupted;
    if (summary_.interrupt_reason.empty()) summary_.interrupt_reason = o.error;
    // What it made is kept for the next run: its KV rows synced before the line naming them.
    STRATA_RETURN_IF_ERROR(save_kv_rows(tm));
    if (!sinks_.empty() && sinks_[tm.sink].kv_file)
      STRATA_RETURN_IF_ERROR(sinks_[tm.sink].kv_file->sync());
    return save_partial(tm);
  }
  ++finished_this_run_;
  sum.prompt_tokens += o.prompt_tokens;
  sum.completion_tokens += o.completion_tokens;
  finished_prompt_tokens_ += o.prompt_tokens;
  if (o.kind == OutcomeKind::kDone) {
    ++sum.done;
    ++done_count_;
    done_completion_tokens_ += o.completion_tokens;
    // Targets that report no tokens as they go (a server) count them here.
    const int64_t resumed = int64_t(t.task.resume_output_ids.size());
    const int64_t unreported =
        std::max<int64_t>(0, o.completion_tokens - resumed - tm.reported_this_run);
    sum.generated_tokens += unreported;
    generated_ += unreported;
  } else {
    ++sum.failed;
  }
  tm.produced.clear();
  tm.produced.shrink_to_fit();
  tm.draws_after = {};
  tm.kv_pending = {};
  if (!sinks_.empty()) sinks_[t.sink].kv_dead_rows += tm.kv_saved;
  // Said in every mode (the failures file is not there to read in memory mode).
  if (o.kind != OutcomeKind::kDone) LOG_WARN("{} id {}: {}", t.task.dataset, r.id, o.error);
  if (sinks_.empty()) {
    summary_.records[index] = result_record(r, t.task.dataset, meta_base_, t.task.seed, o);
    return Status();
  }
  Sink& s = sinks_[t.sink];
  if (o.kind == OutcomeKind::kDone && s.hidden) {
    // Tensors durable first: the results line below is the record's commit (hidden_store.h).
    if (!o.hidden)
      return internal_error("{} id {}: the target returned no hidden states", t.task.dataset, r.id);
    STRATA_RETURN_IF_ERROR(s.hidden->append(t.task.dataset, r.id, *o.hidden,
                                            int(options_.capture.layers.size()),
                                            options_.capture.hidden_size));
  }
  if (o.kind == OutcomeKind::kDone)
    return s.results_log->append(
        result_record(r, t.task.dataset, meta_base_, t.task.seed, o).dump());
  return s.failures_log->append(failure_record(r, t.task.dataset, meta_base_["model"], o).dump());
}

// Engine-thread reports, applied on the job's thread: counted for progress at once, and kept for
// the next checkpoint.
void Job::on_tokens(size_t index, TokenReport& report) {
  Task& t = tasks_[index];
  if (!t.running) return;  // a late report of a task already handled
  if (report.restart) {
    t.produced.clear();
    t.draws_after.clear();
    t.checkpointed = 0;
    t.kv_pending.clear();
    t.kv_received = t.kv_saved = 0;  // its rows are exported again from row 0, replacing these
  }
  if (report.kv) {
    // In order from the engine; anything else (never expected) is dropped, not misfiled.
    if (report.kv->first_row == t.kv_received) {
      t.kv_received += report.kv->rows;
      t.kv_pending.push_back(std::move(report.kv));
    }
    return;
  }
  const int64_t n = int64_t(report.token_ids.size());
  t.produced.insert(t.produced.end(), report.token_ids.begin(), report.token_ids.end());
  for (int64_t i = 0; i < n; ++i)
    t.draws_after.push_back(i + 1 == n ? report.rng_draws : kUnknownDraws);
  if (n > 0) {
    t.rng_draws = report.rng_draws;
    t.prompt_tokens = report.prompt_tokens;
  }
  t.reported_this_run += n;
  summary_.datasets[t.dataset].generated_tokens += n;
  generated_ += n;
}

// Appends the unsaved tokens of every running prompt (one line each) and syncs, when a prompt
// has checkpoint_tokens unsaved or checkpoint_interval_s passed (or `force`).
Status Job::checkpoint(bool force) {
  if (!checkpointing_) return Status();
  const auto now = Clock::now();
  bool due = force || std::chrono::duration<double>(now - last_checkpoint_).count() >=
                          options_.checkpoint_interval_s;
  for (size_t index : running_) {
    if (due) break;
    due = int64_t(tasks_[index].produced.size() - tasks_[index].checkpointed) >=
          options_.checkpoint_tokens;
  }
  if (!due) return Status();
  last_checkpoint_ = now;
  // The KV rows first, synced, then the lines that name them: a line never refers to rows a
  // crash could have lost.
  for (size_t index : running_) STRATA_RETURN_IF_ERROR(save_kv_rows(tasks_[index]));
  for (Sink& s : sinks_)
    if (s.kv_file) STRATA_RETURN_IF_ERROR(s.kv_file->sync());
  for (size_t index : running_) STRATA_RETURN_IF_ERROR(save_partial(tasks_[index]));
  for (Sink& s : sinks_) STRATA_RETURN_IF_ERROR(s.partial_log->sync());
  return Status();
}

// Appends t's KV rows received since the last checkpoint to its sink's side file (unsynced).
Status Job::save_kv_rows(Task& t) {
  if (t.kv_pending.empty()) return Status();
  KvCheckpointFile& file = *sinks_[t.sink].kv_file;
  const PartialKey key{t.task.dataset, t.task.record->id};
  for (const auto& rows : t.kv_pending) {
    STRATA_RETURN_IF_ERROR(file.append(key, *rows));
    t.kv_saved = rows->first_row + rows->rows;
  }
  t.kv_pending.clear();
  return Status();
}

// The mark t's next line states: the rows saved, if they end right before an output token whose
// sampler state is known (KvMark); else none (a resume then prefills).
KvMark Job::kv_mark(const Task& t) const {
  const int64_t tokens = t.kv_saved - t.prompt_tokens + 1;
  if (t.kv_saved <= 0 || tokens < 1 || tokens > int64_t(t.produced.size()) ||
      t.draws_after[size_t(tokens - 1)] == kUnknownDraws)
    return KvMark{};
  return KvMark{.rows = t.kv_saved, .tokens = tokens, .draws = t.draws_after[size_t(tokens - 1)]};
}

// Appends t's tokens not yet in a checkpoint, or its new KV mark (one line; the caller syncs the
// side file before and the line after).
Status Job::save_partial(Task& t) {
  if (!checkpointing_) return Status();
  const KvMark mark = kv_layout_ ? kv_mark(t) : KvMark{};
  if (t.produced.size() <= t.checkpointed && mark == t.kv_written) return Status();
  const std::span<const int32_t> fresh =
      std::span<const int32_t>(t.produced).subspan(t.checkpointed);
  STRATA_RETURN_IF_ERROR(sinks_[t.sink].partial_log->append(
      partial_line({t.task.dataset, t.task.record->id}, int64_t(t.checkpointed), fresh, t.rng_draws,
                   t.prompt_tokens, settings_, mark)));
  t.checkpointed = t.produced.size();
  t.kv_written = mark;
  return Status();
}

// Rewrites a side file that holds mostly rows of finished records (keeping every unfinished
// record's saved rows, started or not).
Status Job::compact_kv_if_wasteful(Sink& s) {
  if (!s.kv_file || s.kv_dead_rows == 0) return Status();
  const int64_t dead = s.kv_dead_rows / kv_layout_->page_size * kv_layout_->page_bytes;
  if (dead < (int64_t(256) << 20) || dead < s.kv_file->live_bytes() - dead) return Status();
  std::map<PartialKey, int64_t> keep;
  for (size_t i = 0; i < tasks_.size(); ++i) {
    const Task& t = tasks_[i];
    if (&sinks_[t.sink] == &s && t.kv_saved > 0 && (t.running || i >= started_))
      keep[{t.task.dataset, t.task.record->id}] = t.kv_saved;
  }
  const int64_t before = s.kv_file->file_bytes();
  STRATA_RETURN_IF_ERROR(s.kv_file->compact(keep));
  LOG_INFO("{}: compacted the KV rows of finished prompts away ({:.1f} -> {:.1f} MB)",
           s.kv_file->path(), double(before) / 1e6, double(s.kv_file->file_bytes()) / 1e6);
  s.kv_dead_rows = 0;
  return Status();
}

// Decides whether checkpoints hold KV rows (JobOptions::checkpoint_kv) and says what they cost.
Status Job::setup_kv_checkpoints() {
  using Mode = JobOptions::CheckpointKv;
  if (!checkpointing_ || options_.checkpoint_kv == Mode::kOff) return Status();
  std::string why_not;
  std::optional<KvRowsLayout> layout = target_.kv_rows_layout(&why_not);
  if (!layout) {
    if (options_.checkpoint_kv == Mode::kOn)
      return failed_precondition(
          "--checkpoint-kv on: this job's KV rows cannot be checkpointed: {}", why_not);
    LOG_INFO("KV checkpoints: off ({}); a resumed prompt prefills its partial output again",
             why_not);
    return Status();
  }
  int64_t prompts = 0;
  for (const Dataset& d : datasets_) prompts += int64_t(d.records.size());
  const int64_t in_flight =
      std::max<int64_t>(1, std::min<int64_t>(prompts, target_.max_in_flight()));
  const int64_t bytes =
      layout->bytes_per_token() * int64_t(options_.sampling.params.max_new_tokens) * in_flight;
  if (options_.checkpoint_kv == Mode::kAuto && bytes > options_.checkpoint_kv_max_bytes) {
    LOG_INFO(
        "KV checkpoints: off: the KV rows of {} prompts in flight x {} tokens x {} B/token could "
        "reach {:.1f} GB "
        "(above --checkpoint-kv-max-gb {:.1f}); --checkpoint-kv on writes them anyway",
        in_flight, options_.sampling.params.max_new_tokens, layout->bytes_per_token(),
        double(bytes) / 1e9, double(options_.checkpoint_kv_max_bytes) / 1e9);
    return Status();
  }
  LOG_INFO(
      "KV checkpoints: on: {} B/token, up to {:.2f} GB of rows for {} prompts in flight x {} "
      "output tokens "
      "(plus their prompts) in FILE.partial.kv; a resumed prompt decodes on without prefilling",
      layout->bytes_per_token(), double(bytes) / 1e9, in_flight,
      options_.sampling.params.max_new_tokens);
  kv_layout_ = std::move(layout);
  return Status();
}

// Output tokens still expected: prompts not started x the mean output length of this run's
// finished prompts (max_new_tokens before any finished), plus what running prompts may still add.
int64_t Job::tokens_left() const {
  const int64_t expected = done_count_ > 0 ? done_completion_tokens_ / done_count_
                                           : options_.sampling.params.max_new_tokens;
  int64_t left = int64_t(tasks_.size() - started_) * expected;
  for (size_t index : running_)
    left += std::max<int64_t>(0, expected - int64_t(tasks_[index].produced.size()));
  return left;
}

void Job::report_progress(bool force) {
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  gen_rate_.add(elapsed, double(generated_));
  prompt_rate_.add(elapsed, double(finished_prompt_tokens_));
  if (!options_.progress) return;
  if (!force &&
      std::chrono::duration<double>(now - last_progress_).count() < options_.progress_interval_s)
    return;
  last_progress_ = now;
  ProgressSnapshot snap{.datasets = summary_.datasets,
                        .elapsed_s = elapsed,
                        .gen_tokens_per_s = gen_rate_.rate(),
                        .prompt_tokens_per_s = prompt_rate_.rate(),
                        .window_s = gen_rate_.span_s(),
                        .tokens_left = tokens_left(),
                        .shard = options_.shard,
                        .target_note = target_.progress_note()};
  std::fprintf(stderr, "%s\n", format_progress(snap).c_str());
}

// Before .done says "complete": the files on disk (read again, not this job's memory of them) hold
// every id of the sink's datasets, as a result or a failure, and the path still names the file this
// job appended to (nobody renamed another file over it).
Status Job::verify_sink(const Sink& s) const {
  STRATA_ASSIGN_OR_RETURN(ScanResult results,
                          scan_output(s.results_path, {.default_dataset = s.default_dataset}));
  STRATA_ASSIGN_OR_RETURN(ScanResult failures,
                          scan_output(s.failures_path, {.default_dataset = s.default_dataset}));
  if (!s.results_log->same_file_as_path())
    return data_loss("{} was replaced while this job wrote it; not writing {}", s.results_path,
                     s.done_path);
  int64_t expected = 0, missing = 0;
  std::string example;
  for (size_t d : s.datasets) {
    const Dataset& ds = datasets_[d];
    for (const PromptRecord& r : ds.records) {
      ++expected;
      if (results.contains(ds.name, r.id) || failures.contains(ds.name, r.id)) continue;
      if (missing++ == 0) example = ds.name + "/" + r.id;
    }
  }
  if (missing > 0)
    return data_loss(
        "{} holds {} of {} prompts (missing e.g. {}); not writing {}: run the same command again",
        s.results_path, expected - missing, expected, example, s.done_path);
  return Status();
}

Status Job::finish_sinks() {
  for (Sink& s : sinks_)
    if (s.hidden) STRATA_RETURN_IF_ERROR(s.hidden->close());
  if (summary_.interrupted > 0) return Status();
  for (Sink& s : sinks_) {
    STRATA_RETURN_IF_ERROR(s.results_log->sync());
    STRATA_RETURN_IF_ERROR(s.failures_log->sync());
    STRATA_RETURN_IF_ERROR(verify_sink(s));
    JobSummary part;
    part.seconds = summary_.seconds;
    part.complete = true;
    for (size_t d : s.datasets) part.datasets.push_back(summary_.datasets[d]);
    nlohmann::json j = part.to_json();
    j["model"] = meta_base_["model"];
    j["sampling"] = meta_base_["sampling"];
    if (!options_.shard.empty()) j["shard"] = options_.shard;
    STRATA_RETURN_IF_ERROR(write_file_atomic(s.done_path, j.dump(2) + "\n"));
    if (s.partial_log) {  // every prompt finished: no checkpoint is needed any more
      s.partial_log.reset();
      std::error_code ec;
      std::filesystem::remove(s.partial_path, ec);
      if (s.kv_file) s.kv_file->remove();
      std::filesystem::remove(s.results_path + ".partial.kv", ec);
    }
  }
  return Status();
}

StatusOr<JobSummary> Job::run() {
  std::set<std::string> names;
  for (const Dataset& d : datasets_) {
    if (!names.insert(d.name).second)
      return invalid_argument("dataset name '{}' is given twice", d.name);
    summary_.datasets.push_back({.name = d.name, .total = int64_t(d.records.size())});
  }
  meta_base_ = {{"model", target_.model_name()}, {"sampling", options_.sampling.to_json()}};
  settings_ = settings_fingerprint(meta_base_.dump());
  checkpointing_ = target_.can_resume() && options_.checkpoint_tokens > 0 &&
                   (!options_.output_file.empty() || !options_.output_dir.empty());
  gen_rate_ = RateWindow(options_.rate_window_s);
  prompt_rate_ = RateWindow(options_.rate_window_s);
  STRATA_RETURN_IF_ERROR(setup_kv_checkpoints());
  STRATA_RETURN_IF_ERROR(open_sinks());
  plan_tasks();
  STRATA_RETURN_IF_ERROR(check_capture_space());
  if (!tasks_.empty()) {
    for (Sink& s : sinks_) std::filesystem::remove(s.done_path);  // stale: there is work again
  }
  if (sinks_.empty()) summary_.records.resize(tasks_.size());

  const size_t max_in_flight = size_t(std::max(1, target_.max_in_flight()));
  size_t next = 0, in_flight = 0;
  std::vector<std::pair<size_t, GenerationOutcome>> batch;
  std::vector<std::pair<size_t, TokenReport>> reports;
  // The job's thread wakes for outcomes, and at least this often for progress and checkpoints.
  const auto tick = std::chrono::milliseconds(int64_t(
      1000 * std::clamp(std::min(options_.progress_interval_s, options_.checkpoint_interval_s),
                        0.02, 0.2)));
  while (next < tasks_.size() || in_flight > 0) {
    while (summary_.interrupted == 0 && next < tasks_.size() && in_flight < max_in_flight) {
      const size_t index = next++;
      ++in_flight;
      started_ = next;
      Task& t = tasks_[index];
      t.running = true;
      running_.insert(index);
      ++summary_.datasets[t.dataset].running;
      std::shared_ptr<Inbox> inbox = inbox_;
      t.task.on_tokens = [inbox, index](TokenReport r) {
        std::lock_guard<std::mutex> lk(inbox->mu);
        inbox->tokens.emplace_back(index, std::move(r));
      };
      if (t.kv_resume_rows >
          0) {  // read now, not at planning: only the prompts started hold rows in memory
        auto rows =
            sinks_[t.sink].kv_file->read({t.task.dataset, t.task.record->id}, t.kv_resume_rows);
        if (rows.ok())
          t.task.resume_kv = std::move(rows).value();
        else
          LOG_WARN("{} id {}: {}; it is prefilled", t.task.dataset, t.task.record->id,
                   rows.status().message());
      }
      if (!sinks_.empty()) t.task.hidden_store = sinks_[t.sink].hidden.get();
      target_.start(t.task, [inbox, index](GenerationOutcome o) {
        std::lock_guard<std::mutex> lk(inbox->mu);
        inbox->items.emplace_back(index, std::move(o));
        inbox->cv.notify_one();
      });
      t.task.resume_kv.reset();  // the target holds what it needs
    }
    if (summary_.interrupted > 0 && in_flight == 0) break;
    {
      std::unique_lock<std::mutex> lk(inbox_->mu);
      inbox_->cv.wait_for(lk, tick, [&] { return !inbox_->items.empty(); });
      batch.assign(std::make_move_iterator(inbox_->items.begin()),
                   std::make_move_iterator(inbox_->items.end()));
      inbox_->items.clear();
      reports.assign(std::make_move_iterator(inbox_->tokens.begin()),
                     std::make_move_iterator(inbox_->tokens.end()));
      inbox_->tokens.clear();
    }
    for (auto& [index, report] : reports) on_tokens(index, report);
    STRATA_RETURN_IF_ERROR(commit_hidden(batch));
    for (auto& [index, outcome] : batch) {
      --in_flight;
      STRATA_RETURN_IF_ERROR(handle(index, outcome));
    }
    // One fdatasync per batch of lines: a kill never tears more than the line being written,
    // and a power loss loses at most this batch (which resumes).
    if (!batch.empty()) {
      for (Sink& s : sinks_) {
        STRATA_RETURN_IF_ERROR(s.results_log->sync());
        STRATA_RETURN_IF_ERROR(s.failures_log->sync());
        if (s.partial_log) STRATA_RETURN_IF_ERROR(s.partial_log->sync());
        STRATA_RETURN_IF_ERROR(compact_kv_if_wasteful(s));
      }
    }
    STRATA_RETURN_IF_ERROR(checkpoint(/*force=*/false));
    report_progress(false);
    for (Sink& s : sinks_) s.lock->heartbeat();
  }
  summary_.interrupted += int64_t(tasks_.size() - next);
  summary_.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  summary_.complete = summary_.interrupted == 0;
  report_progress(true);
  STRATA_RETURN_IF_ERROR(finish_sinks());
  return std::move(summary_);
}

}  // namespace

int64_t JobSummary::failed() const {
  int64_t n = 0;
  for (const auto& d : datasets) n += d.failed;
  return n;
}

nlohmann::json JobSummary::to_json() const {
  nlohmann::json ds = nlohmann::json::array();
  for (const auto& d : datasets) {
    ds.push_back({{"name", d.name},
                  {"total", d.total},
                  {"done", d.done_before + d.done},
                  {"done_this_run", d.done},
                  {"failed", d.failed},
                  {"prompt_tokens_this_run", d.prompt_tokens},
                  {"completion_tokens_this_run", d.completion_tokens}});
  }
  return {{"datasets", ds},
          {"seconds_this_run", seconds},
          {"complete", complete},
          {"interrupted", interrupted}};
}

StatusOr<std::vector<std::shared_ptr<OutputLock>>> lock_job_outputs(
    const std::vector<Dataset>& datasets, const JobOptions& options) {
  std::vector<std::shared_ptr<OutputLock>> locks;
  if (options.output_file.empty() && options.output_dir.empty()) return locks;
  if (!options.output_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.output_dir, ec);
    if (ec)
      return internal_error("cannot create --output-dir '{}': {}", options.output_dir,
                            ec.message());
  }
  std::set<std::string> paths;
  for (const Dataset& d : datasets) paths.insert(results_path_of(d, options));
  for (const std::string& p : paths) {
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<OutputLock> lock, OutputLock::acquire(p));
    locks.push_back(std::move(lock));
  }
  return locks;
}

StatusOr<JobSummary> run_job(const std::vector<Dataset>& datasets, PromptTarget& target,
                             const JobOptions& options) {
  Job job(datasets, target, options);
  return job.run();
}

}  // namespace strata
