// The in-process communicator's collectives for decode context parallelism (arch/dcp.h):
// all_to_all hands rank j's chunk r to rank r, and split() makes groups of consecutive ranks
// whose collectives stay inside the group.
#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "backend/cpu/comm_local.h"

namespace strata {
namespace {

void run_ranks(int n, const std::function<void(Communicator&)>& fn) {
  auto comms = make_local_comm_group(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(*comms[size_t(r)]); });
  for (auto& t : threads) t.join();
}

TEST(LocalCommDcp, AllToAllSendsChunkKToRankK) {
  for (int n : {1, 2, 3, 4}) {
    const int chunk = 5;
    std::vector<std::vector<float>> out(static_cast<size_t>(n));
    run_ranks(n, [&](Communicator& c) {
      const int r = c.rank();
      std::vector<float> in(size_t(n * chunk));
      for (int k = 0; k < n; ++k)
        for (int i = 0; i < chunk; ++i) in[size_t(k * chunk + i)] = float(100 * r + 10 * k + i);
      std::vector<float>& mine = out[size_t(r)];
      mine.assign(size_t(n * chunk), -1.0f);
      c.all_to_all(Tensor::make(in.data(), DType::kF32, {n, chunk}),
                   Tensor::make(mine.data(), DType::kF32, {n, chunk}));
    });
    for (int r = 0; r < n; ++r)
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < chunk; ++i)
          EXPECT_EQ(out[size_t(r)][size_t(j * chunk + i)], float(100 * j + 10 * r + i))
              << "rank " << r << " from rank " << j << " of " << n;
  }
}

TEST(LocalCommDcp, SplitMakesGroupsOfConsecutiveRanks) {
  const int n = 4, group = 2;
  std::vector<float> sums(static_cast<size_t>(n)), gathered(static_cast<size_t>(n * group));
  std::vector<int> ranks(static_cast<size_t>(n)), sizes(static_cast<size_t>(n));
  run_ranks(n, [&](Communicator& c) {
    auto sub = c.split(group);
    ASSERT_TRUE(sub.ok()) << sub.status().to_string();
    Communicator& g = **sub;
    ranks[size_t(c.rank())] = g.rank();
    sizes[size_t(c.rank())] = g.size();
    float x = float(1 << c.rank());
    g.all_reduce_sum(Tensor::make(&x, DType::kF32, {1}));
    sums[size_t(c.rank())] = x;
    float mine = float(c.rank());
    g.all_gather(Tensor::make(&mine, DType::kF32, {1}),
                 Tensor::make(gathered.data() + c.rank() * group, DType::kF32, {group}));
    c.barrier();  // the parent still works
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ranks[size_t(r)], r % group);
    EXPECT_EQ(sizes[size_t(r)], group);
    const int first = r / group * group;
    EXPECT_EQ(sums[size_t(r)], float((1 << first) + (1 << (first + 1)))) << "rank " << r;
    EXPECT_EQ(gathered[size_t(r * group)], float(first));
    EXPECT_EQ(gathered[size_t(r * group + 1)], float(first + 1));
  }
}

TEST(LocalCommDcp, SplitRefusesSizesThatDoNotDivide) {
  run_ranks(4, [&](Communicator& c) {
    auto sub = c.split(3);
    EXPECT_FALSE(sub.ok());
  });
}

}  // namespace
}  // namespace strata
