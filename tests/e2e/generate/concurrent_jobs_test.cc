// Two and three `strata generate` jobs on one --output (a Slurm array with a wrong index, a user
// re-running a command in a second terminal): one job owns the output, the others are refused at
// once naming the holder, and the owner finishes with every id exactly once and a true .done.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "pipeline/output_lock.h"
#include "pipeline/output_log.h"
#include "support/child_process.h"
#include "support/shared_prompts.h"

namespace strata {
namespace {

using testing_support::Child;
using testing_support::read_file;
using testing_support::wait_for_text;

constexpr int kPrompts = 48;

class ConcurrentJobs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("strata_concurrent_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    input_ = (dir_ / "define.jsonl").string();
    output_ = (dir_ / "out.jsonl").string();
    ids_ = testing_support::write_shared_prompts(input_, "define", kPrompts);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Child spawn(const std::string& log_name) {
    return Child::spawn(
        {STRATA_BINARY, "generate", "--model-path",
         std::string(STRATA_SHARED_DIR) + "/models/house-llama", "--input", "define=" + input_,
         "--output", output_, "--max-new-tokens", "12", "--temperature", "0",
         // Small waves: the job lasts long enough for the others to collide with it.
         "--concurrency", "2", "--no-progress"},
        log(log_name));
  }
  std::string log(const std::string& name) const { return (dir_ / (name + ".log")).string(); }

  // The output holds every id exactly once and .done says complete with all of them.
  void expect_complete_output() {
    auto scan = scan_output(output_);
    ASSERT_TRUE(scan.ok()) << scan.status().message();
    EXPECT_EQ(scan->records, kPrompts);
    EXPECT_TRUE(scan->duplicates.empty());
    EXPECT_EQ(scan->torn_bytes, 0);
    for (const auto& id : ids_) EXPECT_TRUE(scan->contains("define", id)) << id;
    ASSERT_TRUE(std::filesystem::exists(output_ + ".done"));
    auto done = nlohmann::json::parse(read_file(output_ + ".done"));
    EXPECT_EQ(done["complete"], true);
    EXPECT_EQ(done["datasets"][0]["done"], kPrompts);
  }

  std::filesystem::path dir_;
  std::string input_, output_;
  std::vector<std::string> ids_;
};

TEST_F(ConcurrentJobs, SecondJobIsRefusedAtOnceAndTheFirstCompletes) {
  Child first = spawn("first");
  // Until the first job holds the lock (its record names its pid).
  const std::string holder = "\"pid\":" + std::to_string(first.pid());
  ASSERT_FALSE(wait_for_text(first, dir_.string(), output_ + ".lock", holder))
      << read_file(log("first"));
  Child second = spawn("second");
  auto rc2 = second.wait_for(60000);
  ASSERT_TRUE(rc2.has_value()) << "the second job was not refused";
  EXPECT_EQ(*rc2, 1) << read_file(log("second"));
  const std::string msg = read_file(log("second"));
  EXPECT_NE(msg.find("being written by another job: pid " + std::to_string(first.pid()) +
                     " on host " + local_host_name()),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("KV cache"), std::string::npos) << "refused only after loading the model:\n"
                                                     << msg;
  auto rc1 = first.wait_for(300000);
  ASSERT_TRUE(rc1.has_value());
  EXPECT_EQ(*rc1, 0) << read_file(log("first"));
  expect_complete_output();
}

TEST_F(ConcurrentJobs, ThreeJobsStartedTogetherOneOwnsTheOutput) {
  std::vector<Child> jobs;
  for (int i = 0; i < 3; ++i) jobs.push_back(spawn("job" + std::to_string(i)));
  int ok = 0, refused = 0;
  for (int i = 0; i < 3; ++i) {
    auto rc = jobs[size_t(i)].wait_for(300000);
    ASSERT_TRUE(rc.has_value()) << i;
    const std::string text = read_file(log("job" + std::to_string(i)));
    if (*rc == 0) {
      ++ok;
    } else {
      EXPECT_EQ(*rc, 1) << text;
      EXPECT_NE(text.find("being written by another job: pid "), std::string::npos) << text;
      ++refused;
    }
  }
  EXPECT_EQ(ok, 1);
  EXPECT_EQ(refused, 2);
  expect_complete_output();
  // Once the owner is gone the output is free: the same command resumes (nothing left) and says so.
  Child again = spawn("again");
  auto rc = again.wait_for(120000);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 0) << read_file(log("again"));
  expect_complete_output();
}

}  // namespace
}  // namespace strata
