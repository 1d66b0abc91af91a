#include "pipeline/verify.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "pipeline/output_log.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

constexpr size_t kExamples = 5;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A results file by its name: FILE.jsonl, not one of the job's side files beside it.
bool looks_like_results(const fs::path& p) {
  const std::string name = p.filename().string();
  return ends_with(name, ".jsonl") && !ends_with(name, ".failures.jsonl") &&
         !ends_with(name, ".partial.jsonl");
}

// Calls fn(json) for each complete line; returns whether the file ends in a torn line.
template <typename Fn>
StatusOr<bool> for_each_line(const std::string& path, Fn fn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot read '{}'", path);
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (in.eof()) return !line.empty();  // no '\n' after it: an interrupted write
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return data_loss("{} line {}: not JSON", path, n);
    STRATA_RETURN_IF_ERROR(fn(j, n));
  }
  return false;
}

// True when the file's first record is a job's result (it carries "meta"), or the file is empty.
bool is_job_output(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    return j.is_object() && j.contains("meta") && j["meta"].is_object();
  }
  return true;
}

struct Seen {
  std::vector<size_t> result_files;  // index into report.files, once per result line
  size_t failure_file = SIZE_MAX;    // a failures file that holds it
};

class Verifier {
 public:
  explicit Verifier(const std::vector<Dataset>& inputs) {
    for (const Dataset& d : inputs)
      for (const PromptRecord& r : d.records) seen_[d.name][r.id];
  }

  Status add_file(const std::string& path) {
    VerifiedFile f{.path = path};
    const size_t index = report_.files.size();
    const std::string stem = fs::path(path).stem().string();
    STRATA_ASSIGN_OR_RETURN(f.torn,
                            for_each_line(path, [&](const nlohmann::json& j, int64_t n) -> Status {
                              std::string dataset, id;
                              if (!record_key(j, stem, dataset, id))
                                return data_loss("{} line {}: a record without an \"id\"", path, n);
                              ++f.results;
                              if (Seen* s = find(dataset, id, path))
                                s->result_files.push_back(index);
                              return Status();
                            }));
    const std::string failures = path + ".failures.jsonl";
    std::error_code ec;
    if (fs::exists(failures, ec)) {
      STRATA_ASSIGN_OR_RETURN(
          bool torn, for_each_line(failures, [&](const nlohmann::json& j, int64_t n) -> Status {
            std::string dataset, id;
            if (!record_key(j, stem, dataset, id))
              return data_loss("{} line {}: a record without an \"id\"", failures, n);
            ++f.failures;
            if (Seen* s = find(dataset, id, failures)) s->failure_file = index;
            return Status();
          }));
      f.torn = f.torn || torn;
    }
    const std::string done = path + ".done";
    if (fs::exists(done, ec)) {
      f.done = true;
      std::ifstream in(done);
      nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("shard") && j["shard"].is_string())
        f.shard = j["shard"].get<std::string>();
    }
    report_.files.push_back(std::move(f));
    return Status();
  }

  void skip(const std::string& path) { report_.skipped.push_back(path); }

  VerifyReport finish(const std::vector<Dataset>& inputs) {
    for (const Dataset& d : inputs) {
      VerifiedDataset& v = report_.datasets.emplace_back(VerifiedDataset{.name = d.name});
      for (const PromptRecord& r : d.records) {
        const Seen& s = seen_[d.name][r.id];
        ++v.total;
        const std::string key = d.name + "/" + r.id;
        if (s.result_files.size() == 1) {
          ++v.done;
        } else if (s.result_files.size() > 1) {
          ++v.duplicated;
          std::string where;
          for (size_t f : s.result_files)
            where += (where.empty() ? "" : ", ") + report_.files[f].path;
          example(report_.duplicate_examples,
                  fmt::format("{} {}x ({})", key, s.result_files.size(), where));
        } else if (s.failure_file != SIZE_MAX) {
          ++v.failed;
          example(report_.failed_examples,
                  fmt::format("{} ({}.failures.jsonl)", key, report_.files[s.failure_file].path));
        } else {
          ++v.missing;
          example(report_.missing_examples, key);
        }
      }
    }
    return std::move(report_);
  }

 private:
  static void example(std::vector<std::string>& list, std::string text) {
    if (list.size() < kExamples) list.push_back(std::move(text));
  }

  // The input record's slot, or null (counted foreign) when the input has no such id.
  Seen* find(const std::string& dataset, const std::string& id, const std::string& where) {
    auto d = seen_.find(dataset);
    if (d != seen_.end()) {
      auto r = d->second.find(id);
      if (r != d->second.end()) return &r->second;
    }
    ++report_.foreign;
    example(report_.foreign_examples, fmt::format("{}/{} ({})", dataset, id, where));
    return nullptr;
  }

  std::map<std::string, std::unordered_map<std::string, Seen>> seen_;
  VerifyReport report_;
};

}  // namespace

bool VerifyReport::ok() const {
  if (foreign > 0) return false;
  for (const auto& d : datasets)
    if (d.failed + d.missing + d.duplicated > 0) return false;
  return true;
}

StatusOr<VerifyReport> verify_outputs(const std::vector<Dataset>& inputs,
                                      const std::vector<std::string>& paths) {
  if (paths.empty())
    return invalid_argument("--verify: give the shards' output files or directories");
  Verifier v(inputs);
  std::set<std::string>
      files;  // sorted, each once (a directory and a file in it may both be named)
  std::vector<std::string> skipped;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (auto it = fs::recursive_directory_iterator(p, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (!it->is_regular_file(ec) || !looks_like_results(it->path())) continue;
        const std::string path = fs::weakly_canonical(it->path()).string();
        if (is_job_output(path))
          files.insert(path);
        else
          skipped.push_back(path);
      }
      if (ec) return internal_error("--verify: reading '{}': {}", p, ec.message());
    } else if (fs::is_regular_file(p, ec)) {
      if (!is_job_output(p))
        return invalid_argument("--verify: '{}' is not an output of strata generate (no \"meta\")",
                                p);
      files.insert(fs::weakly_canonical(p).string());
    } else {
      return not_found("--verify: '{}' does not exist", p);
    }
  }
  for (const std::string& s : skipped)
    if (!files.count(s)) v.skip(s);
  if (files.empty()) return not_found("--verify: no results files (*.jsonl) under the given paths");
  for (const std::string& f : files) STRATA_RETURN_IF_ERROR(v.add_file(f));
  return v.finish(inputs);
}

std::vector<std::string> format_verify_report(const VerifyReport& r) {
  std::vector<std::string> lines;
  int64_t done_files = 0, torn_files = 0;
  std::set<std::string> shards;
  for (const auto& f : r.files) {
    done_files += f.done;
    torn_files += f.torn;
    if (!f.shard.empty()) shards.insert(f.shard);
  }
  std::string shard_list;
  for (const auto& s : shards) shard_list += (shard_list.empty() ? "" : " ") + s;
  lines.push_back(fmt::format(
      "{} results files, {} finished (.done){}{}", r.files.size(), done_files,
      torn_files ? fmt::format(", {} with a torn last line (killed, not resumed)", torn_files) : "",
      shard_list.empty() ? "" : "; shards " + shard_list));
  for (const auto& s : r.skipped)
    lines.push_back(fmt::format("skipped {}: not an output of strata generate", s));
  int64_t total = 0, bad = 0;
  for (const auto& d : r.datasets) {
    lines.push_back(fmt::format("{}: {} ids: {} done, {} failed, {} missing, {} duplicated", d.name,
                                d.total, d.done, d.failed, d.missing, d.duplicated));
    total += d.total;
    bad += d.failed + d.missing + d.duplicated;
  }
  auto list = [&](const char* what, const std::vector<std::string>& examples) {
    for (const auto& e : examples) lines.push_back(fmt::format("  {}: {}", what, e));
  };
  list("missing", r.missing_examples);
  list("duplicated", r.duplicate_examples);
  list("failed", r.failed_examples);
  if (r.foreign > 0) {
    lines.push_back(fmt::format(
        "{} records are not in the input (another input file, or one edited since)", r.foreign));
    list("not in the input", r.foreign_examples);
  }
  if (r.ok()) {
    lines.push_back(
        fmt::format("OK: all {} ids of {} dataset(s) appear exactly once across {} files", total,
                    r.datasets.size(), r.files.size()));
  } else {
    lines.push_back(fmt::format(
        "NOT VERIFIED: {} of {} ids are failed, missing or duplicated, {} records foreign (run the "
        "missing "
        "shards, resume killed ones with the same command, or --retry-failures for failed ones)",
        bad, total, r.foreign));
  }
  return lines;
}

}  // namespace strata
