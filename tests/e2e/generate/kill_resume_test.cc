// `strata generate` killed with SIGKILL at random moments, again and again, then resumed by
// the same command: the output must hold every prompt id exactly once, as whole lines.
// In-process engine on house-llama, a few hundred prompts of prompts-define, few new tokens.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "pipeline/output_log.h"
#include "support/child_process.h"
#include "support/shared_prompts.h"

namespace strata {
namespace {

using testing_support::Child;
using testing_support::count_lines;
using testing_support::house_llama_path;
using testing_support::kill_at_moments;
using testing_support::read_file;
using testing_support::runs_to_end;
using testing_support::wait_for_lines;
using testing_support::write_shared_prompts;

constexpr int kPrompts = 240;
constexpr int kKills = 12;

TEST(GenerateKillResume, SigkillAtRandomMomentsYieldsEveryIdExactlyOnce) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("strata_kill_resume_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string input = (dir / "define.jsonl").string(), output = (dir / "out.jsonl").string(),
                    log = (dir / "log.txt").string();
  const std::vector<std::string> ids = write_shared_prompts(input, "define", kPrompts);
  ASSERT_EQ(int(ids.size()), kPrompts);
  const std::vector<std::string> cmd = {
      STRATA_BINARY, "generate", "--model-path", house_llama_path(), "--input", "define=" + input,
      "--output", output, "--max-new-tokens", "4", "--temperature", "0.8", "--seed", "5",
      // Small waves, so records land all through the run.
      "--concurrency", "8"};

  // Kill moments follow the generator's own progress, so they are random on any machine speed:
  // two kills at a random moment of startup (loading, scanning, truncating), the others once
  // the output has grown by a random 1..20 records, plus a random 0..200 ms so that some land
  // in the middle of a write.
  std::mt19937 rng(std::random_device{}());
  const unsigned seed = rng();
  rng.seed(seed);
  int kills = 0;
  std::vector<int64_t> records_after_kill;
  auto moment = [&](Child& c, int k) -> std::optional<int> {
    if (k % 6 == 0) return c.wait_for(int(rng() % 600));
    const int64_t target = count_lines(output) + 1 + int64_t(rng() % 20);
    const std::optional<int> rc = wait_for_lines(c, dir.string(), output, target);
    return rc ? rc : c.wait_for(int(rng() % 200));
  };
  ASSERT_TRUE(kill_at_moments(cmd, log, kKills, moment, &kills, [&] {
    auto scan = scan_output(output);
    ASSERT_TRUE(scan.ok()) << scan.status().message();
    EXPECT_TRUE(scan->duplicates.empty()) << "after kill " << kills;
    records_after_kill.push_back(scan->records);
  }));
  ASSERT_TRUE(runs_to_end(cmd, log, 100000));
  EXPECT_GE(kills, 10) << "the job finished too fast to be killed 10 times (seed " << seed << ")";

  auto scan = scan_output(output);
  ASSERT_TRUE(scan.ok()) << scan.status().message();
  EXPECT_EQ(scan->torn_bytes, 0);
  EXPECT_TRUE(scan->duplicates.empty());
  EXPECT_EQ(scan->records, kPrompts);
  std::map<std::string, int> count;
  std::ifstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    ++count[j["id"]];
    const auto& conv = j["conversations"];
    ASSERT_EQ(conv.size(), 2u) << line;
    EXPECT_EQ(conv[1]["role"], "assistant");
    EXPECT_EQ(j["meta"]["dataset"], "define");
    EXPECT_EQ(j["meta"]["model"], "house-llama");
    EXPECT_GT(j["meta"]["completion_tokens"].get<int>(), 0);
    EXPECT_LE(j["meta"]["completion_tokens"].get<int>(), 4);
  }
  for (const auto& id : ids) EXPECT_EQ(count[id], 1) << id;
  EXPECT_EQ(count.size(), ids.size());
  EXPECT_TRUE(std::filesystem::exists(output + ".done"));
  // Progress was made between kills (the resume does not restart from scratch).
  int grew = 0;
  for (size_t i = 1; i < records_after_kill.size(); ++i)
    grew += records_after_kill[i] > records_after_kill[i - 1];
  EXPECT_GE(grew, 5) << "kill seed " << seed;
  std::printf("kills: %d, records after each kill:", kills);
  for (auto n : records_after_kill) std::printf(" %lld", (long long)n);
  std::printf(" (seed %u)\n", seed);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
