// Hidden-state capture of a job (JobOptions::capture, hidden_store.h): the store beside each
// results file, the room it needs, and each record's tensors committed before its results line.
#include <cstdio>
#include <map>

#include "pipeline/job.h"

namespace strata::generate_job {

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

// A finished capture record's tensors, appended to the sink's store before its results line.
Status Job::commit_hidden(Sink& s, const Task& t, const GenerationOutcome& o) {
  if (!o.hidden)
    return internal_error("{} id {}: the target returned no hidden states", t.task.dataset,
                          t.task.record->id);
  return s.hidden->append(t.task.dataset, t.task.record->id, *o.hidden,
                          int(options_.capture.layers.size()), options_.capture.hidden_size);
}

Status Job::commit_hidden_group(const std::vector<std::pair<size_t, GenerationOutcome>>& batch) {
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

}  // namespace strata::generate_job
