// --verify over the outputs of sharded jobs (made by the real runner, against a fake target):
// complete shards verify; a missing shard, a lost line, a line copied into another shard, a
// record of another input and a failed prompt are each found and named.
#include "pipeline/verify.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "pipeline/runner.h"
#include "pipeline/shard.h"
#include "support/resumable_target.h"
#include "support/temp_dir.h"

namespace strata {
namespace {

// Answers every prompt at once; fails the ids in `fail_ids`.
class InstantTarget : public PromptTarget {
 public:
  std::set<std::string> fail_ids;
  std::string model_name() const override { return "fake-model"; }
  int max_in_flight() const override { return 8; }
  void start(const GenerationTask& task, OutcomeCallback done) override {
    GenerationOutcome o;
    if (fail_ids.count(task.record->id)) {
      o.kind = OutcomeKind::kFailed;
      o.error = "HTTP 400: too long";
    } else {
      o.text = "answer to " + task.record->id;
      o.completion_tokens = 2;
      o.finish_reason = "stop";
    }
    done(std::move(o));
  }
};

// Ids "<name>-<i>": unique across the datasets.
Dataset make_dataset(const std::string& name, int n) {
  return testing::conversation_dataset(name, n, name + "-");
}

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : lines) out << l << "\n";
}

class VerifyTest : public ::testing::Test {
 protected:
  // Runs shard k of `shards` into DIR/shard-k/ (one file per dataset), as a task of an array would.
  void run_shard(int k, int shards, InstantTarget& target) {
    std::vector<Dataset> ds = inputs_;
    const ShardSpec spec{.index = k, .count = shards};
    keep_shard(ds, spec);
    JobOptions o;
    o.progress = false;
    o.output_dir = substitute_shard(dir_.file("shard-{shard}"), spec);
    o.shard = spec.label();
    auto s = run_job(ds, target, o);
    ASSERT_TRUE(s.ok()) << s.status().message();
  }
  void run_all(int shards) {
    InstantTarget t;
    for (int k = 0; k < shards; ++k) run_shard(k, shards, t);
  }
  VerifyReport verify(const std::vector<std::string>& paths) {
    auto r = verify_outputs(inputs_, paths);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : VerifyReport{};
  }
  static std::string summary(const VerifyReport& r) {
    std::string text;
    for (const auto& l : format_verify_report(r)) text += l + "\n";
    return text;
  }

  testing::TempDir dir_{"strata_verify"};
  std::vector<Dataset> inputs_ = {make_dataset("a", 300), make_dataset("b", 120)};
};

TEST_F(VerifyTest, CompleteShardsVerifyFromTheParentOrEachDirectory) {
  run_all(4);
  VerifyReport r = verify({dir_.str()});
  EXPECT_TRUE(r.ok()) << summary(r);
  ASSERT_EQ(r.files.size(), 8u);  // 4 shards x 2 datasets
  ASSERT_EQ(r.datasets.size(), 2u);
  EXPECT_EQ(r.datasets[0].done, 300);
  EXPECT_EQ(r.datasets[1].done, 120);
  for (const auto& f : r.files) {
    EXPECT_TRUE(f.done) << f.path;
    EXPECT_FALSE(f.shard.empty()) << f.path;
  }
  EXPECT_NE(summary(r).find("shards 0/4 1/4 2/4 3/4"), std::string::npos) << summary(r);
  EXPECT_NE(summary(r).find("OK: all 420 ids"), std::string::npos);
  // The same, naming each shard's directory.
  std::vector<std::string> dirs;
  for (int k = 0; k < 4; ++k) dirs.push_back(dir_.file("shard-" + std::to_string(k)));
  EXPECT_TRUE(verify(dirs).ok());
  // And naming the files of one dataset only covers that dataset: the other is missing.
  std::vector<std::string> files;
  for (int k = 0; k < 4; ++k) files.push_back(dir_.file("shard-" + std::to_string(k) + "/a.jsonl"));
  r = verify(files);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.datasets[0].done, 300);
  EXPECT_EQ(r.datasets[1].missing, 120);
}

TEST_F(VerifyTest, AShardThatNeverRanIsMissing) {
  InstantTarget t;
  for (int k : {0, 1, 3}) run_shard(k, 4, t);
  VerifyReport r = verify({dir_.str()});
  EXPECT_FALSE(r.ok());
  int64_t expected_missing = 0;
  for (const auto& d : inputs_)
    for (const auto& rec : d.records) expected_missing += shard_of(rec.id, 4) == 2;
  EXPECT_GT(expected_missing, 0);
  EXPECT_EQ(r.datasets[0].missing + r.datasets[1].missing, expected_missing);
  EXPECT_EQ(r.datasets[0].duplicated + r.datasets[1].duplicated, 0);
  ASSERT_FALSE(r.missing_examples.empty());
  EXPECT_NE(summary(r).find("NOT VERIFIED"), std::string::npos);
}

TEST_F(VerifyTest, LostLinesDuplicatesAndForeignRecordsAreNamed) {
  run_all(3);
  const std::string f0 = dir_.file("shard-0/a.jsonl"), f1 = dir_.file("shard-1/a.jsonl");
  std::vector<std::string> l0 = read_lines(f0), l1 = read_lines(f1);
  ASSERT_GE(l0.size(), 3u);
  const std::string lost_id = nlohmann::json::parse(l0.back())["id"];
  const std::string copied_id = nlohmann::json::parse(l0.front())["id"];
  l0.pop_back();             // a lost line
  l1.push_back(l0.front());  // a line copied into another shard
  nlohmann::json foreign = nlohmann::json::parse(l0[1]);
  foreign["id"] = "not-in-input";  // a record of another input file
  l1.push_back(foreign.dump());
  write_lines(f0, l0);
  write_lines(f1, l1);

  VerifyReport r = verify({dir_.str()});
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.datasets[0].missing, 1);
  EXPECT_EQ(r.datasets[0].duplicated, 1);
  EXPECT_EQ(r.datasets[0].done, 298);
  EXPECT_EQ(r.datasets[1].done, 120);
  EXPECT_EQ(r.foreign, 1);
  const std::string text = summary(r);
  EXPECT_NE(text.find("missing: a/" + lost_id), std::string::npos) << text;
  EXPECT_NE(text.find("duplicated: a/" + copied_id + " 2x"), std::string::npos) << text;
  EXPECT_NE(text.find("a/not-in-input"), std::string::npos) << text;
}

TEST_F(VerifyTest, FailedPromptsCountAsFailedNotMissingUntilRetried) {
  InstantTarget failing;
  failing.fail_ids = {"a-7", "b-3"};
  for (int k = 0; k < 2; ++k) run_shard(k, 2, failing);
  VerifyReport r = verify({dir_.str()});
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.datasets[0].failed, 1);
  EXPECT_EQ(r.datasets[1].failed, 1);
  EXPECT_EQ(r.datasets[0].missing + r.datasets[1].missing, 0);
  EXPECT_NE(summary(r).find("failed: a/a-7"), std::string::npos) << summary(r);

  // --retry-failures on the shard that holds them: the result supersedes the failure record.
  InstantTarget healthy;
  for (int k = 0; k < 2; ++k) {
    std::vector<Dataset> ds = inputs_;
    keep_shard(ds, ShardSpec{.index = k, .count = 2});
    JobOptions o;
    o.progress = false;
    o.retry_failures = true;
    o.output_dir = dir_.file("shard-" + std::to_string(k));
    ASSERT_TRUE(run_job(ds, healthy, o).ok());
  }
  r = verify({dir_.str()});
  EXPECT_TRUE(r.ok()) << summary(r);
}

TEST_F(VerifyTest, TornTailsAndNonOutputFilesAreReportedAndBadPathsRefused) {
  run_all(2);
  // A killed, never resumed task leaves a torn last line: noted, and that record is missing.
  const std::string f = dir_.file("shard-1/b.jsonl");
  std::vector<std::string> lines = read_lines(f);
  lines.back().resize(lines.back().size() / 2);
  {
    std::ofstream out(f, std::ios::trunc);
    for (size_t i = 0; i + 1 < lines.size(); ++i) out << lines[i] << "\n";
    out << lines.back();  // no newline
  }
  // An input file copied beside the outputs is skipped, not counted.
  std::filesystem::copy_file(dir_.file("shard-0/a.jsonl"), dir_.file("copy.jsonl"));
  dir_.write("input.jsonl", "{\"id\":\"a-1\",\"prompt\":\"x\"}\n");
  VerifyReport r = verify({dir_.str()});
  EXPECT_EQ(r.datasets[1].missing, 1);
  int64_t in_shard0 = 0;
  for (const auto& rec : inputs_[0].records) in_shard0 += shard_of(rec.id, 2) == 0;
  EXPECT_EQ(r.datasets[0].duplicated, in_shard0);  // the copy of shard 0's file
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_NE(summary(r).find("torn last line"), std::string::npos) << summary(r);

  EXPECT_FALSE(verify_outputs(inputs_, {dir_.file("nope")}).ok());
  EXPECT_FALSE(verify_outputs(inputs_, {dir_.file("input.jsonl")}).ok());
  EXPECT_FALSE(verify_outputs(inputs_, {}).ok());
}

}  // namespace
}  // namespace strata
