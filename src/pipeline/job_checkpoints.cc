// Checkpoints of a job's unfinished prompts (checkpoint.h) and their KV rows (kv_checkpoint.h):
// the side files are opened and trimmed when the job starts, appended as tokens and rows arrive,
// synced rows before the lines that name them, and compacted when finished records dominate.
#include <algorithm>
#include <filesystem>
#include <span>

#include "core/log.h"
#include "pipeline/job.h"

namespace strata::generate_job {

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

// What an interrupted task made is kept for the next run: its KV rows synced before the line
// naming them.
Status Job::keep_for_resume(Task& t) {
  STRATA_RETURN_IF_ERROR(save_kv_rows(t));
  if (!sinks_.empty() && sinks_[t.sink].kv_file)
    STRATA_RETURN_IF_ERROR(sinks_[t.sink].kv_file->sync());
  return save_partial(t);
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

}  // namespace strata::generate_job
