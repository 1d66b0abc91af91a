// The in-process communicator: sums in rank order (bit-identical on every rank, whatever the
// thread timing), gathers, broadcasts, and an abort that releases ranks instead of hanging.
#include "backend/cpu/comm_local.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "dist/tp_driver.h"

namespace strata {
namespace {

// Runs fn(comm) on one thread per rank.
void run_ranks(int n, const std::function<void(Communicator&)>& fn) {
  auto comms = make_local_comm_group(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(*comms[size_t(r)]); });
  for (auto& t : threads) t.join();
}

TEST(LocalComm, AllReduceSumsInRankOrderOnEveryRank) {
  for (int n : {1, 2, 3, 4, 8}) {
    // Values whose float sum depends on the order: rank r adds 10^(±r)-scaled terms.
    std::vector<std::vector<float>> in(static_cast<size_t>(n));
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::uniform_real_distribution<float> u(-1, 1);
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < 257; ++i) in[size_t(r)].push_back(u(rng) * (r % 2 ? 1e7f : 1e-3f));
    std::vector<float> expected(257, 0.0f);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < expected.size(); ++i) expected[i] += in[size_t(r)][i];
    for (int trial = 0; trial < 3; ++trial) {
      std::vector<std::vector<float>> out = in;
      run_ranks(n, [&](Communicator& c) {
        if ((c.rank() + trial) % 2) std::this_thread::yield();  // vary who arrives first
        std::vector<float>& mine = out[size_t(c.rank())];
        c.all_reduce_sum(Tensor::make(mine.data(), DType::kF32, {257}));
        c.all_reduce_sum(Tensor::make(mine.data(), DType::kF32, {0}));  // empty is fine
      });
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(std::memcmp(out[size_t(r)].data(), expected.data(), expected.size() * 4), 0)
            << "rank " << r << " of " << n;
    }
  }
}

TEST(LocalComm, AllReduceBf16RoundsTheFloat32SumOnce) {
  std::vector<std::vector<uint16_t>> v(3, std::vector<uint16_t>(4));
  const float vals[3] = {1.0f, 1.0f / 256, 1.0f / 256};  // bf16 pairwise would lose the small terms
  for (int r = 0; r < 3; ++r)
    for (auto& x : v[size_t(r)]) x = f32_to_bf16(vals[r]);
  run_ranks(3, [&](Communicator& c) {
    c.all_reduce_sum(Tensor::make(v[size_t(c.rank())].data(), DType::kBF16, {4}));
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(bf16_to_f32(v[size_t(r)][0]), round_to_bf16(1.0f + 2.0f / 256));
}

TEST(LocalComm, AllGatherPlacesRankRAtRowR) {
  const int n = 4;
  std::vector<std::vector<float>> out(n, std::vector<float>(size_t(n) * 3));
  run_ranks(n, [&](Communicator& c) {
    float mine[3] = {float(c.rank()), float(c.rank()) + 0.5f, -float(c.rank())};
    c.all_gather(Tensor::make(mine, DType::kF32, {1, 3}),
                 Tensor::make(out[size_t(c.rank())].data(), DType::kF32, {n, 1, 3}));
  });
  for (int r = 0; r < n; ++r)
    for (int s = 0; s < n; ++s) {
      EXPECT_EQ(out[size_t(r)][size_t(s) * 3], float(s));
      EXPECT_EQ(out[size_t(r)][size_t(s) * 3 + 1], float(s) + 0.5f);
    }
}

TEST(LocalComm, BroadcastCopiesRootBytesAndBarrierJoins) {
  std::vector<std::vector<uint8_t>> got(3);
  run_ranks(3, [&](Communicator& c) {
    std::vector<uint8_t> bytes;
    if (c.rank() == 1) bytes = {1, 2, 3, 250};
    ASSERT_TRUE(c.broadcast_bytes(bytes, 1).ok());
    ASSERT_TRUE(c.barrier().ok());
    std::vector<uint8_t> none = {9};
    if (c.rank() != 0) none = {7, 7, 7};
    ASSERT_TRUE(c.broadcast_bytes(none, 0).ok());  // root 0 overwrites what the others held
    bytes.insert(bytes.end(), none.begin(), none.end());
    got[size_t(c.rank())] = bytes;
  });
  for (const auto& g : got) EXPECT_EQ(g, (std::vector<uint8_t>{1, 2, 3, 250, 9}));
}

TEST(LocalComm, AbortReleasesEveryWaitingRank) {
  // Ranks 1..3 wait in a broadcast rank 0 never joins; rank 0 fails instead. Nobody hangs, and
  // every rank sees rank 0's reason.
  std::vector<Status> seen(4);
  run_ranks(4, [&](Communicator& c) {
    if (c.rank() == 0) {
      c.abort(internal_error("rank 0 could not load its weights"));
      seen[0] = c.status();
      return;
    }
    std::vector<uint8_t> bytes;
    seen[size_t(c.rank())] = c.broadcast_bytes(bytes, 0);
    float x = 1;
    c.all_reduce_sum(Tensor::make(&x, DType::kF32, {1}));  // returns at once, x untouched
    EXPECT_EQ(x, 1.0f);
    EXPECT_FALSE(c.barrier().ok());
  });
  for (const Status& s : seen) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("could not load"), std::string::npos) << s.to_string();
  }
}

TEST(LaunchRank, ReadsLauncherVariables) {
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  auto lr = launch_rank_from_env();
  ASSERT_TRUE(lr.ok()) << lr.status().to_string();
  EXPECT_EQ(lr->rank, 3);
  EXPECT_EQ(lr->size, 8);
  EXPECT_EQ(lr->local_rank, 1);
  setenv("OMPI_COMM_WORLD_RANK", "9", 1);
  EXPECT_FALSE(launch_rank_from_env().ok());  // rank beyond size
  // The engine's view: the launcher's size must be --tp-size, and ranks of several processes need
  // NCCL (cuda); no silent clamping.
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  std::string id_file;
  auto wrong_size = tp_launch_from_env(4, Device::kCuda, &id_file);
  ASSERT_FALSE(wrong_size.ok());
  EXPECT_NE(wrong_size.status().message().find("--tp-size 8"), std::string::npos)
      << wrong_size.status().message();
  auto on_cpu = tp_launch_from_env(8, Device::kCpu, &id_file);
  ASSERT_FALSE(on_cpu.ok());
  EXPECT_NE(on_cpu.status().message().find("--device cuda"), std::string::npos);
  setenv("STRATA_NCCL_ID_FILE", "/shared/job/nccl.id", 1);
  auto ok = tp_launch_from_env(8, Device::kCuda, &id_file);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  ASSERT_TRUE(ok->has_value());
  EXPECT_EQ((*ok)->rank, 1);
  EXPECT_EQ(id_file, "/shared/job/nccl.id");
  unsetenv("STRATA_NCCL_ID_FILE");
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
}

}  // namespace
}  // namespace strata
