#include "pipeline/runner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>

#include "core/log.h"
#include "pipeline/job.h"

namespace strata {
namespace generate_job {
namespace {

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
    nlohmann::json answer = {{"role", "assistant"}, {"content", o.text}};
    // The name the chat templates of thinking models (DeepSeek, Kimi, Qwen3) render it from.
    if (!o.reasoning.empty()) answer["reasoning_content"] = o.reasoning;
    // OpenAI's layout: the calls, and content null unless the model wrote more than white space.
    if (o.tool_calls.is_array() && !o.tool_calls.empty()) {
      answer["tool_calls"] = o.tool_calls;
      if (o.text.find_first_not_of(" \n\t\r") == std::string::npos) answer["content"] = nullptr;
    }
    conv.push_back(std::move(answer));
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

}  // namespace

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
    return keep_for_resume(tm);
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
  // Tensors durable first: the results line below is the record's commit (hidden_store.h).
  if (o.kind == OutcomeKind::kDone && s.hidden) STRATA_RETURN_IF_ERROR(commit_hidden(s, t, o));
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
  if (n > 0) last_token_ = Clock::now();
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
  if (options_.capture.enabled && generated_ > 0)  // what capture adds after generation ends
    LOG_INFO("hidden-state capture: the job ended {:.2f} s after its last generated token",
             std::chrono::duration<double>(Clock::now() - last_token_).count());
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
    STRATA_RETURN_IF_ERROR(commit_hidden_group(batch));
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

}  // namespace generate_job

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
  for (const Dataset& d : datasets) paths.insert(generate_job::results_path_of(d, options));
  for (const std::string& p : paths) {
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<OutputLock> lock, OutputLock::acquire(p));
    locks.push_back(std::move(lock));
  }
  return locks;
}

StatusOr<JobSummary> run_job(const std::vector<Dataset>& datasets, PromptTarget& target,
                             const JobOptions& options) {
  generate_job::Job job(datasets, target, options);
  return job.run();
}

}  // namespace strata
