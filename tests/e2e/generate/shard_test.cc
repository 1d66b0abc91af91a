// `strata generate --shard K/N` as the tasks of a scheduler array would run it: 4 shards of a
// 2,000-prompt file, run separately (two at a time, like tasks on two nodes) with the in-process
// engine on house-llama, one of them killed with SIGKILL mid-output and resumed by the same
// command; `strata generate --verify` fails while a shard is missing and passes at the end.
// Prompts are the words of prompts-define as raw completions (a few tokens each) and 2 new tokens,
// so the 2,000 prompts cost this CPU seconds, not minutes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "pipeline/output_log.h"
#include "support/child_process.h"

namespace strata {
namespace {

using testing_support::Child;
using testing_support::count_lines;
using testing_support::file_contains;
using testing_support::read_file;
using testing_support::wait_for_lines;

constexpr int kPrompts = 2000;
constexpr int kShards = 4;
constexpr int kKilled = 2;
constexpr int kWaitMs = 120000;

// The quoted word of each "What does the word \"X\" mean?" as a raw prompt, with its id.
void write_prompts(const std::string& path) {
  std::ifstream in(std::string(STRATA_SHARED_DIR) + "/data/prompts-define.jsonl");
  std::ofstream out(path);
  std::string line;
  for (int i = 0; i < kPrompts && std::getline(in, line); ++i) {
    const auto j = nlohmann::json::parse(line);
    const std::string q = j["conversations"][0]["content"];
    const size_t a = q.find('"'), b = q.rfind('"');
    const std::string word = a != std::string::npos && b > a ? q.substr(a + 1, b - a - 1) : q;
    out << nlohmann::json({{"id", j["id"]}, {"prompt", word}}).dump() << "\n";
  }
}

class ShardE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("strata_shard_e2e_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    input_ = (dir_ / "words.jsonl").string();
    write_prompts(input_);
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }
  // The command every task of the array runs; only --shard differs.
  std::vector<std::string> shard_cmd(int k) const {
    return {STRATA_BINARY, "generate", "--model-path",
            std::string(STRATA_SHARED_DIR) + "/models/house-llama", "--input", "define=" + input_,
            "--output-dir", (dir_ / "out" / "shard-{shard}").string(), "--shard",
            std::to_string(k) + "/" + std::to_string(kShards), "--max-new-tokens", "2",
            // Small waves, so records land all through the run and the kill falls mid-output.
            "--concurrency", "16", "--progress-interval", "0.5"};
  }
  std::string results(int k) const {
    return (dir_ / "out" / ("shard-" + std::to_string(k)) / "define.jsonl").string();
  }
  std::string log(int k) const { return (dir_ / ("log-" + std::to_string(k) + ".txt")).string(); }
  // Runs `strata generate --verify` on the outputs; returns (exit status, its output).
  std::pair<int, std::string> verify() const {
    const std::string out = (dir_ / "verify.txt").string();
    std::filesystem::remove(out);
    Child v = Child::spawn({STRATA_BINARY, "generate", "--input", "define=" + input_, "--verify",
                            (dir_ / "out").string()},
                           out);
    const int rc = v.wait_for(kWaitMs).value_or(-1);
    return {rc, read_file(out)};
  }
  void expect_finished(Child& c, int k) {
    auto rc = c.wait_for(kWaitMs);
    ASSERT_TRUE(rc.has_value()) << "shard " << k << " hung";
    ASSERT_EQ(*rc, 0) << read_file(log(k));
  }

  std::filesystem::path dir_;
  std::string input_;
};

TEST_F(ShardE2E, FourShardsOneKilledAndResumedVerifyExactlyOnce) {
  // Tasks 0 and 2 start together; 2 is killed once its output holds some records.
  Child t0 = Child::spawn(shard_cmd(0), log(0));
  Child t2 = Child::spawn(shard_cmd(kKilled), log(kKilled));
  std::filesystem::create_directories(dir_ / "out" / "shard-2");
  ASSERT_FALSE(
      wait_for_lines(t2, (dir_ / "out" / "shard-2").string(), results(kKilled), 40).has_value())
      << "shard 2 ended before it could be killed:\n"
      << read_file(log(kKilled));
  t2.kill9();
  auto scan = scan_output(results(kKilled));
  ASSERT_TRUE(scan.ok()) << scan.status().message();
  const int64_t at_kill = scan->records;
  EXPECT_TRUE(scan->duplicates.empty());
  EXPECT_FALSE(std::filesystem::exists(results(kKilled) + ".done"));
  expect_finished(t0, 0);

  // Two shards never ran and one is half done: --verify says so and fails.
  auto [rc_missing, text_missing] = verify();
  EXPECT_EQ(rc_missing, 1) << text_missing;
  EXPECT_NE(text_missing.find("NOT VERIFIED"), std::string::npos) << text_missing;
  EXPECT_NE(text_missing.find("missing: define/"), std::string::npos) << text_missing;

  Child t1 = Child::spawn(shard_cmd(1), log(1));
  Child t3 = Child::spawn(shard_cmd(3), log(3));
  expect_finished(t1, 1);
  expect_finished(t3, 3);
  // The killed task, run again by the same command, resumes.
  Child again = Child::spawn(shard_cmd(kKilled), log(kKilled));
  expect_finished(again, kKilled);
  EXPECT_TRUE(file_contains(log(kKilled), "resuming")) << read_file(log(kKilled));

  auto [rc, text] = verify();
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("OK: all 2000 ids"), std::string::npos) << text;
  EXPECT_NE(text.find("shards 0/4 1/4 2/4 3/4"), std::string::npos) << text;

  // Each task's files and progress name its shard; the shards add up to the input, each a fair
  // part.
  int64_t total = 0;
  for (int k = 0; k < kShards; ++k) {
    const int64_t n = count_lines(results(k));
    total += n;
    EXPECT_GT(n, kPrompts / kShards - 120) << "shard " << k;
    EXPECT_LT(n, kPrompts / kShards + 120) << "shard " << k;
    const auto done = nlohmann::json::parse(read_file(results(k) + ".done"));
    EXPECT_EQ(done["shard"], std::to_string(k) + "/4");
    EXPECT_TRUE(file_contains(log(k), "[generate shard " + std::to_string(k) + "/4]"))
        << read_file(log(k));
  }
  EXPECT_EQ(total, kPrompts);
  EXPECT_GT(at_kill, 0);
  EXPECT_LT(at_kill, count_lines(results(kKilled))) << "the kill came after shard 2 had finished";
}

// Mistakes in the sharding flags are refused with a line that names them, before a model loads.
TEST_F(ShardE2E, BadShardAndVerifyFlagsNameThemselves) {
  auto run = [&](std::vector<std::string> args) {
    const std::string out = (dir_ / "flags.txt").string();
    std::filesystem::remove(out);
    args.insert(args.begin(), {STRATA_BINARY, "generate", "--model-path", "/nonexistent/model"});
    Child c = Child::spawn(args, out);
    const int rc = c.wait_for(kWaitMs).value_or(-1);
    return std::make_pair(rc, read_file(out));
  };
  const std::string in = "define=" + input_, out_dir = (dir_ / "o-{shard}").string();
  auto [rc, text] = run({"--input", in, "--shard", "4/4", "--output-dir", out_dir});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(text.find("shards are numbered 0..3"), std::string::npos) << text;
  std::tie(rc, text) = run({"--input", in, "--output-dir", out_dir});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(text.find("{shard} in --output/--output-dir needs --shard"), std::string::npos) << text;
  std::tie(rc, text) = run({"--input", in, "--shard", "auto", "--output-dir", out_dir});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(text.find("SLURM_ARRAY_TASK_ID"), std::string::npos) << text;
  std::tie(rc, text) = run({"--prompt", "hi", "--verify", dir_.string()});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(text.find("--verify checks the outputs of --input datasets"), std::string::npos)
      << text;
  std::tie(rc, text) = run({"--input", in, "--verify", (dir_ / "nothing-here").string()});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(text.find("does not exist"), std::string::npos) << text;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "o-4")) << "a refused job left an output directory";
}

}  // namespace
}  // namespace strata
