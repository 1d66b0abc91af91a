// Preemption-safe long generations: `strata generate` killed with SIGKILL again and again while
// its records are still being generated (none finishes between two kills at first) still
// finishes, continuing each unfinished record from its checkpoint, and writes exactly the output
// of an uninterrupted run, with greedy and with seeded sampling. CI size: 3 records of 240 tokens,
// a checkpoint every 16 tokens; bench/preemption_soak.sh runs 4,000-token records killed every 5 s.
// KV checkpoints are on (the default): the last run loads the records' KV rows and decodes on.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "support/child_process.h"
#include "support/shared_prompts.h"

namespace strata {
namespace {

using testing_support::Child;
using testing_support::count_lines;
using testing_support::kill_at_moments;
using testing_support::read_file;
using testing_support::runs_to_end;
using testing_support::wait_for_lines;

// id -> (generated text, completion tokens)
std::map<std::string, std::pair<std::string, int>> read_results(const std::string& path) {
  std::map<std::string, std::pair<std::string, int>> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    out[j["id"]] = {j["conversations"].back()["content"],
                    j["meta"]["completion_tokens"].get<int>()};
  }
  return out;
}

class Preemption : public ::testing::TestWithParam<const char*> {};

TEST_P(Preemption, KilledAgainAndAgainFinishesWithTheUninterruptedOutput) {
  const std::string temperature = GetParam();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("strata_preempt_" + std::to_string(::getpid()) + "_" + temperature);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string input = (dir / "explain.jsonl").string(),
                    reference = (dir / "reference.jsonl").string(),
                    output = (dir / "out.jsonl").string(), partial = output + ".partial.jsonl",
                    log = (dir / "log.txt").string();
  testing_support::write_shared_prompts(input, "explain", 3);
  auto command = [&](const std::string& out) {
    return std::vector<std::string>{STRATA_BINARY,
                                    "generate",
                                    "--model-path",
                                    testing_support::house_llama_path(),
                                    "--input",
                                    "explain=" + input,
                                    "--output",
                                    out,
                                    "--max-new-tokens",
                                    "240",
                                    "--ignore-eos",
                                    "--temperature",
                                    temperature,
                                    "--seed",
                                    "11",
                                    "--checkpoint-tokens",
                                    "16",
                                    "--checkpoint-interval",
                                    "0.3",
                                    "--no-progress"};
  };
  ASSERT_TRUE(runs_to_end(command(reference), (dir / "reference.log").string()));

  std::mt19937 rng(std::random_device{}());
  const unsigned seed = rng();
  rng.seed(seed);
  int kills = 0;
  // A kill once 1-3 more checkpoint lines landed (plus up to 150 ms, to hit writes too). A run
  // that has already written every record is let finish: killed between its last record and its
  // exit, it would leave the last run nothing to resume, and that run's totals are what show
  // whether KV rows were loaded.
  auto moment = [&](Child& c, int) -> std::optional<int> {
    const int64_t target = count_lines(partial) + 1 + int64_t(rng() % 3);
    std::optional<int> rc = wait_for_lines(c, dir.string(), partial, target);
    if (!rc) rc = c.wait_for(int(rng() % 150));
    if (!rc && count_lines(output) >= 3) rc = c.wait_for(300000);
    return rc;
  };
  ASSERT_TRUE(kill_at_moments(command(output), log, 8, moment, &kills));
  ASSERT_TRUE(runs_to_end(command(output), log));
  EXPECT_GE(kills, 3) << "the job finished before it could be killed 3 times (seed " << seed << ")";
  EXPECT_NE(read_file(log).find("from their checkpoints"), std::string::npos) << read_file(log);
  // The run that finished (the only one that exits, so logs its engine's totals) loaded KV rows.
  const std::string text = read_file(log);
  long loaded = -1;
  for (size_t at = text.find(" tokens not recomputed)"); at != std::string::npos;
       at = text.find(" tokens not recomputed)", at + 1)) {
    const size_t open = text.rfind(", ", at);
    loaded = std::max(loaded, std::stol(text.substr(open + 2, at - open - 2)));
  }
  EXPECT_GT(loaded, 0) << "no run loaded checkpointed KV rows:\n" << text;
  EXPECT_FALSE(std::filesystem::exists(partial)) << "a complete job leaves no checkpoints";
  const auto want = read_results(reference), got = read_results(output);
  ASSERT_EQ(want.size(), 3u);
  EXPECT_EQ(got.size(), want.size());
  for (const auto& [id, w] : want) {
    ASSERT_TRUE(got.count(id)) << id;
    EXPECT_EQ(got.at(id).second, 240) << id;
    EXPECT_EQ(got.at(id).first, w.first)
        << id << " differs from the uninterrupted run (kill seed " << seed << ")";
  }
  std::printf("temperature %s: %d kills, output identical to the uninterrupted run\n",
              temperature.c_str(), kills);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(GreedyAndSeeded, Preemption, ::testing::Values("0", "0.8"),
                         [](const auto& info) {
                           return std::string(info.param) == "0" ? "greedy" : "seeded";
                         });

}  // namespace
}  // namespace strata
