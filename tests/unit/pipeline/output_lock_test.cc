// Exclusive ownership of an output (output_lock.h): a second lock on the same output is refused
// naming the holder, a released lock is free again, another host's live heartbeat refuses even
// when flock grants the lock, and a job whose file lost records on disk writes no .done.
#include "pipeline/output_lock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pipeline/runner.h"
#include "support/temp_dir.h"

namespace strata {
namespace {

using testing::TempDir;

TEST(OutputLock, SecondLockIsRefusedNamingTheHolder) {
  TempDir dir("strata_lock");
  const std::string out = dir.file("out.jsonl");
  auto first = OutputLock::acquire(out);
  ASSERT_TRUE(first.ok()) << first.status().message();
  // flock belongs to the open file description: a second open in this process conflicts too.
  auto second = OutputLock::acquire(out);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  const std::string& msg = second.status().message();
  EXPECT_NE(msg.find("being written by another job"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pid " + std::to_string(::getpid())), std::string::npos) << msg;
  EXPECT_NE(msg.find("on host " + local_host_name()), std::string::npos) << msg;
  first->reset();
  auto third = OutputLock::acquire(out);
  EXPECT_TRUE(third.ok()) << third.status().message();
  // The released holder left its record marked released, and the new one rewrote it.
  auto record = nlohmann::json::parse(std::ifstream(out + ".lock"));
  EXPECT_EQ(record["pid"], int64_t(::getpid()));
  EXPECT_EQ(record["released"], false);
}

TEST(OutputLock, AnotherHostsLiveHeartbeatRefusesAStaleOneDoesNot) {
  TempDir dir("strata_lock");
  const std::string out = dir.file("out.jsonl");
  const int64_t now = int64_t(std::time(nullptr));
  auto record = [&](int64_t heartbeat, bool released) {
    return nlohmann::json{{"pid", 4242},
                          {"host", "some-other-node"},
                          {"started", now - 100},
                          {"heartbeat", heartbeat},
                          {"released", released}}
        .dump();
  };
  dir.write("out.jsonl.lock", record(now - 2, false));
  auto live = OutputLock::acquire(out);
  ASSERT_FALSE(live.ok());
  EXPECT_NE(live.status().message().find("pid 4242 on host some-other-node"), std::string::npos)
      << live.status().message();
  EXPECT_NE(live.status().message().find("not shared between hosts"), std::string::npos);
  dir.write("out.jsonl.lock", record(now - 2, true));  // that job finished
  EXPECT_TRUE(OutputLock::acquire(out).ok());
  dir.write("out.jsonl.lock", record(now - 3600, false));  // that job died an hour ago
  EXPECT_TRUE(OutputLock::acquire(out).ok());
}

// Completes every task at once; the first start() cuts records out of the results file on disk,
// as a second writer's compaction would.
class DamagingTarget : public PromptTarget {
 public:
  std::string results_path;
  int started = 0;
  std::string model_name() const override { return "fake-model"; }
  int max_in_flight() const override { return 1; }
  void start(const GenerationTask& task, OutcomeCallback done) override {
    if (++started == 4) std::filesystem::resize_file(results_path, 0);
    GenerationOutcome o;
    o.text = "x";
    o.completion_tokens = 1;
    o.finish_reason = "length";
    done(o);
  }
};

Dataset small_dataset(int n) {
  Dataset d{.name = "d"};
  for (int i = 0; i < n; ++i) {
    auto r = parse_prompt_line(
        nlohmann::json({{"id", "p" + std::to_string(i)}, {"prompt", "q"}}).dump(), i + 1, "d");
    EXPECT_TRUE(r.ok());
    d.records.push_back(*r);
  }
  return d;
}

TEST(OutputLock, DoneIsWrittenOnlyWhenTheFileHoldsEveryId) {
  TempDir dir("strata_lock");
  JobOptions o;
  o.output_file = dir.file("out.jsonl");
  o.progress = false;
  std::vector<Dataset> ds{small_dataset(6)};
  DamagingTarget b;
  b.results_path = o.output_file;
  auto s = run_job(ds, b, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(s.status().message().find("holds 3 of 6 prompts"), std::string::npos)
      << s.status().message();
  EXPECT_FALSE(std::filesystem::exists(o.output_file + ".done"));
  // The same command again finishes what is missing.
  DamagingTarget again;
  again.started = 100;
  auto s2 = run_job(ds, again, o);
  ASSERT_TRUE(s2.ok()) << s2.status().message();
  EXPECT_TRUE(std::filesystem::exists(o.output_file + ".done"));
}

TEST(OutputLock, AJobOnALockedOutputIsRefusedBeforeItStarts) {
  TempDir dir("strata_lock");
  JobOptions o;
  o.output_file = dir.file("out.jsonl");
  o.progress = false;
  std::vector<Dataset> ds{small_dataset(3)};
  auto held = lock_job_outputs(ds, o);
  ASSERT_TRUE(held.ok());
  DamagingTarget b;
  b.results_path = o.output_file;
  b.started = 100;
  auto s = run_job(ds, b, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.started, 100) << "no prompt may start on a refused output";
  // With the lock handed over, the same job runs.
  o.held_locks = *held;
  auto s2 = run_job(ds, b, o);
  ASSERT_TRUE(s2.ok()) << s2.status().message();
  EXPECT_EQ(b.started, 103);
}

}  // namespace
}  // namespace strata
