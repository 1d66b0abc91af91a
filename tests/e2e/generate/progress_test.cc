// Progress for long jobs: 8 prompts x 2,000 tokens; before any prompt finishes, the progress line
// already counts generated tokens, and the count grows from line to line (the running requests'
// tokens, as produced). Prints how long after the start the count first moved.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "support/child_process.h"
#include "support/shared_prompts.h"

namespace strata {
namespace {

using testing_support::Child;
using testing_support::read_file;

// The generated-token counts of the progress lines that show 0 of 8 prompts finished.
std::vector<int64_t> counts_before_any_finished(const std::string& log) {
  static const std::regex line_re(R"(total 0/8 \(0\.0%\).* (\d+) tok generated)");
  std::vector<int64_t> out;
  std::istringstream in(log);
  std::string line;
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, line_re)) out.push_back(std::stoll(m[1]));
  return out;
}

TEST(GenerateProgress, TokenCountMovesBeforeAnyPromptFinishes) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("strata_progress_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string input = (dir / "define.jsonl").string(), log = (dir / "log.txt").string();
  testing_support::write_shared_prompts(input, "define", 8);
  const auto start = std::chrono::steady_clock::now();
  Child job =
      Child::spawn({STRATA_BINARY, "generate", "--model-path", testing_support::house_llama_path(),
                    "--input", "define=" + input, "--output", (dir / "out.jsonl").string(),
                    "--max-new-tokens", "2000", "--ignore-eos", "--progress-interval", "0.25"},
                   log);
  // Three lines with a growing count while no prompt has finished.
  auto moving = [&] {
    const auto counts = counts_before_any_finished(read_file(log));
    int rises = 0;
    for (size_t i = 1; i < counts.size(); ++i)
      rises += counts[i] > counts[i - 1] && counts[i - 1] > 0;
    return rises >= 2;
  };
  auto rc = testing_support::wait_until(job, dir.string(), moving);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(rc.has_value()) << "the job ended first:\n" << read_file(log);
  job.kill9();
  const std::string text = read_file(log);
  std::printf("the token count moved (3 growing lines, 0/8 finished) %.2f s after the start\n",
              seconds);
  EXPECT_NE(text.find("running"), std::string::npos) << text;
  EXPECT_NE(text.find("ETA "), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
