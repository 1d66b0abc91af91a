// The host KV tier's flags through the real binary: invalid or contradictory values are one clear
// error and a non-zero exit, a flag that does not apply is logged as such, and the startup log
// states the host tier's capacity in tokens.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;

namespace {

const std::string kHouse = std::string(STRATA_SHARED_DIR) + "/models/house-llama";

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

CliRun generate(const std::string& flags) {
  const fs::path dir =
      fs::temp_directory_path() / ("strata_hicache_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string out = (dir / "stdout").string(), err = (dir / "stderr").string();
  const std::string cmd = std::string(STRATA_BINARY) + " generate --model-path " + kHouse +
                          " --prompt 'The kernel' --max-new-tokens 2 " + flags + " >" + out +
                          " 2>" + err;
  const int status = std::system(cmd.c_str());
  CliRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  std::ifstream o(out), e(err);
  r.out.assign(std::istreambuf_iterator<char>(o), {});
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  fs::remove_all(dir);
  return r;
}

void expect_error(const std::string& flags, const std::string& needle) {
  SCOPED_TRACE(flags);
  const CliRun r = generate(flags);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find(needle), std::string::npos) << r.out << r.err;
}

TEST(HicacheCli, BadValuesAreErrors) {
  expect_error("--hicache-size 1 --hicache-ratio 2", "--hicache-ratio");
  expect_error("--hicache-size 0", "--hicache-size must be > 0");
  expect_error("--hicache-ratio -1", "--hicache-ratio must be > 0");
  expect_error("--hicache-write-policy write_back", "--enable-hierarchical-cache");
  expect_error("--hicache-io-backend direct", "--enable-hierarchical-cache");
  expect_error("--enable-hierarchical-cache --hicache-write-policy write_around",
               "--hicache-write-policy");
  expect_error("--enable-hierarchical-cache --hicache-io-backend dma", "--hicache-io-backend");
}

TEST(HicacheCli, StartsAndLogsCapacity) {
  const CliRun r = generate(
      "--hicache-ratio 3 --hicache-write-policy write_back --hicache-io-backend kernel "
      "--max-total-tokens 256");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string log = r.out + r.err;
  EXPECT_NE(log.find("Host KV tier: 768 tokens"), std::string::npos) << log;
  EXPECT_NE(log.find("write policy write_back"), std::string::npos) << log;
  EXPECT_NE(log.find("--hicache-io-backend kernel does not apply on the cpu backend"),
            std::string::npos)
      << log;
}

}  // namespace
