// SGLang's multi-node flags (dist/node_launch.h): which ranks a node starts and with what
// environment, the refusals, and the supervisor of a node's rank processes (run with /bin/sh
// stand-ins: it passes the environment, stops the others when one fails, forwards SIGTERM and
// kills what outlives the grace period).
#include "dist/node_launch.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

namespace strata {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::map<std::string, std::string> env_of(const RankProcess& p) {
  return {p.set_env.begin(), p.set_env.end()};
}

TEST(NodeLaunchTest, EachNodeStartsItsSliceOfTheRanks) {
  auto plan = plan_node_ranks({.nnodes = 2, .node_rank = 1, .dist_init_addr = "10.0.0.1:29500"}, 16,
                              Device::kCuda, "ab12");
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  ASSERT_EQ(plan->size(), 8u);
  for (int i = 0; i < 8; ++i) {
    const RankProcess& p = (*plan)[size_t(i)];
    EXPECT_EQ(p.rank, 8 + i);
    EXPECT_EQ(p.local_rank, i);
    auto env = env_of(p);
    EXPECT_EQ(env["RANK"], std::to_string(8 + i));
    EXPECT_EQ(env["WORLD_SIZE"], "16");
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(i));
    EXPECT_EQ(env["NCCL_COMM_ID"], "10.0.0.1:29500");
    EXPECT_EQ(env["STRATA_NCCL_ID"], "ab12");
    EXPECT_EQ(p.unset_env, launcher_rank_variables());
  }
  auto node0 = plan_node_ranks({.nnodes = 4, .node_rank = 0, .dist_init_addr = "[::1]:1"}, 8,
                               Device::kCuda, "");
  ASSERT_TRUE(node0.ok()) << node0.status().to_string();
  EXPECT_EQ(node0->front().rank, 0);  // rank 0 (HTTP) is on node 0
  EXPECT_EQ(node0->size(), 2u);
  EXPECT_FALSE(env_of(node0->front()).contains("STRATA_NCCL_ID"));
  auto one =
      plan_node_ranks({.nnodes = 1, .node_rank = 0, .dist_init_addr = ""}, 8, Device::kCpu, "");
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->empty());  // one node: nothing to start, serve in-process
}

TEST(NodeLaunchTest, RefusalsSayWhy) {
  const std::pair<NodeLaunchFlags, std::string> cases[] = {
      {{.nnodes = 0, .node_rank = 0, .dist_init_addr = "h:1"}, "--nnodes must be >= 1"},
      {{.nnodes = 2, .node_rank = 2, .dist_init_addr = "h:1"},
       "--node-rank 2 is not in [0, --nnodes 2)"},
      {{.nnodes = 2, .node_rank = -1, .dist_init_addr = "h:1"}, "--node-rank -1"},
      {{.nnodes = 3, .node_rank = 0, .dist_init_addr = "h:1"}, "does not split over --nnodes 3"},
      {{.nnodes = 2, .node_rank = 0, .dist_init_addr = ""}, "needs --dist-init-addr"},
  };
  for (const auto& [flags, needle] : cases) {
    auto plan = plan_node_ranks(flags, 8, Device::kCuda, "");
    ASSERT_FALSE(plan.ok()) << needle;
    EXPECT_NE(plan.status().message().find(needle), std::string::npos) << plan.status().to_string();
  }
  auto cpu =
      plan_node_ranks({.nnodes = 2, .node_rank = 0, .dist_init_addr = "h:1"}, 8, Device::kCpu, "");
  ASSERT_FALSE(cpu.ok());
  EXPECT_NE(cpu.status().message().find("--device cuda"), std::string::npos)
      << cpu.status().to_string();
  for (const char* ok : {"node0:29500", "10.1.2.3:1", "[fe80::1]:65535"})
    EXPECT_TRUE(check_dist_init_addr(ok).ok()) << ok;
  for (const char* bad : {"node0", ":29500", "node0:", "node0:0", "node0:70000", "a:b:1",
                          "node0:29x", "[::1:5", "::1:5"})
    EXPECT_FALSE(check_dist_init_addr(bad).ok()) << bad;
}

class NodeSupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata_node_launch_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::vector<RankProcess> two_ranks() {
    auto plan = plan_node_ranks({.nnodes = 2, .node_rank = 1, .dist_init_addr = "h:1"}, 4,
                                Device::kCuda, "beef");
    EXPECT_TRUE(plan.ok());
    return *plan;
  }
  std::vector<std::string> sh(const std::string& script) { return {"/bin/sh", "-c", script}; }
  fs::path dir_;
};

TEST_F(NodeSupervisorTest, RanksGetTheirEnvironmentAndNotTheLaunchers) {
  ::setenv("SLURM_PROCID", "7", 1);
  const int code = run_rank_processes(
      sh("echo \"$RANK $WORLD_SIZE $LOCAL_RANK $STRATA_NCCL_ID ${SLURM_PROCID:-none}\" > " +
         dir_.string() + "/rank_$RANK"),
      two_ranks());
  ::unsetenv("SLURM_PROCID");
  EXPECT_EQ(code, 0);
  for (int r : {2, 3}) {
    std::ifstream in(dir_ / ("rank_" + std::to_string(r)));
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, std::to_string(r) + " 4 " + std::to_string(r - 2) + " beef none");
  }
}

TEST_F(NodeSupervisorTest, ARankThatFailsStopsTheOthers) {
  const auto begin = Clock::now();
  const int code = run_rank_processes(
      sh("if [ \"$LOCAL_RANK\" = 1 ]; then exit 3; fi; exec sleep 60"), two_ranks());
  EXPECT_EQ(code, 3);
  EXPECT_LT(Clock::now() - begin, std::chrono::seconds(20));
}

// The supervisor runs in a child of the test (it blocks SIGTERM in its process).
int supervise_in_child(const std::vector<std::string>& argv, const std::vector<RankProcess>& plan,
                       double grace_s, const fs::path& started, int* wait_status) {
  const pid_t pid = ::fork();
  if (pid == 0) std::_Exit(run_rank_processes(argv, plan, grace_s));
  for (int i = 0;
       i < 200 && !(fs::exists(started.string() + "_2") && fs::exists(started.string() + "_3"));
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::kill(pid, SIGTERM);
  ::waitpid(pid, wait_status, 0);
  return WIFEXITED(*wait_status) ? WEXITSTATUS(*wait_status) : -1;
}

TEST_F(NodeSupervisorTest, SigtermReachesEveryRank) {
  const fs::path started = dir_ / "started";
  const fs::path stopped = dir_ / "stopped";
  int status = 0;
  const int code =
      supervise_in_child(sh("trap 'echo > " + stopped.string() + "_$RANK; exit 0' TERM; echo > " +
                            started.string() + "_$RANK; while :; do sleep 0.05; done"),
                         two_ranks(), 30, started, &status);
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(fs::exists(stopped.string() + "_2"));
  EXPECT_TRUE(fs::exists(stopped.string() + "_3"));
}

TEST_F(NodeSupervisorTest, RanksThatIgnoreSigtermAreKilledAfterTheGrace) {
  const fs::path started = dir_ / "started";
  const auto begin = Clock::now();
  int status = 0;
  const int code = supervise_in_child(
      sh("trap '' TERM; echo > " + started.string() + "_$RANK; while :; do sleep 0.05; done"),
      two_ranks(), 1, started, &status);
  EXPECT_EQ(code, 128 + SIGKILL);
  EXPECT_LT(Clock::now() - begin, std::chrono::seconds(20));
}

}  // namespace
}  // namespace strata
