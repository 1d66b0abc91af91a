// --shard: the hash is stable (pinned values), shards are disjoint and cover every record, the
// split is balanced within a stated bound, editing a file moves no other record, and --shard auto
// reads Slurm's and Kubernetes' variables.
#include "pipeline/shard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

namespace strata {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

Dataset dataset_of(const std::vector<std::string>& ids) {
  Dataset d{.name = "d"};
  for (const auto& id : ids) {
    PromptRecord r;
    r.id = id;
    r.prompt = "x";
    d.records.push_back(std::move(r));
  }
  return d;
}

std::vector<std::string> numbered_ids(const std::string& prefix, int n) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) ids.push_back(prefix + std::to_string(i));
  return ids;
}

// The hash is a file format: a shard computed by one build must be the shard of every other.
// The values below were computed with Python from the formula written in shard.h.
TEST(ShardHash, PinnedValues) {
  EXPECT_EQ(shard_hash(""), 0x56c17c0639edb1e7ull);
  EXPECT_EQ(shard_hash("define-00000"), 0x5ef41cb56c06b4aaull);
  EXPECT_EQ(shard_hash("define-00001"), 0x3f5d5100801686f2ull);
  EXPECT_EQ(shard_hash("prompt-0"), 0x596a4acbefe4fe52ull);
  EXPECT_EQ(shard_of("", 4), 3);
  EXPECT_EQ(shard_of("define-00000", 4), 2);
}

TEST(Shard, DisjointAndCoveringForEveryCount) {
  const std::vector<std::string> ids = numbered_ids("define-", 2000);
  for (int n : {1, 2, 3, 4, 7, 16}) {
    std::map<std::string, int> seen;
    for (int k = 0; k < n; ++k) {
      std::vector<Dataset> ds = {dataset_of(ids)};
      keep_shard(ds, ShardSpec{.index = k, .count = n});
      for (const auto& r : ds[0].records) {
        ++seen[r.id];
        EXPECT_EQ(shard_of(r.id, n), k);
      }
    }
    ASSERT_EQ(seen.size(), ids.size()) << n << " shards";
    for (const auto& [id, times] : seen) EXPECT_EQ(times, 1) << id << " in " << n << " shards";
  }
}

// Counts are binomial(n, 1/N); every shard must be within 4 standard deviations of n/N (a fair
// split breaks that with probability < 1e-4 per shard). Checked on sequential ids, the worst case
// for a weak hash, and on the ids of the shipped prompt file layout.
TEST(Shard, BalancedWithinFourSigma) {
  for (const std::string prefix : {"define-", "p", "conv_"}) {
    for (int n : {2, 4, 8, 10}) {
      const int total = 20000;
      std::vector<int> counts(size_t(n), 0);
      for (const auto& id : numbered_ids(prefix, total)) ++counts[size_t(shard_of(id, n))];
      const double mean = double(total) / n, sigma = std::sqrt(total * (1.0 / n) * (1 - 1.0 / n));
      for (int k = 0; k < n; ++k)
        EXPECT_LE(std::abs(counts[size_t(k)] - mean), 4 * sigma)
            << prefix << " shard " << k << "/" << n << ": " << counts[size_t(k)] << " of " << total;
    }
  }
}

// Inserting records does not move the others: the reason the hash is of the id.
TEST(Shard, EditingTheFileMovesNoOtherRecord) {
  std::vector<std::string> ids = numbered_ids("q", 500);
  std::map<std::string, int> before;
  for (const auto& id : ids) before[id] = shard_of(id, 4);
  ids.insert(ids.begin(), "new-first");
  ids.erase(ids.begin() + 100);
  std::vector<Dataset> ds = {dataset_of(ids)};
  keep_shard(ds, ShardSpec{.index = 2, .count = 4});
  for (const auto& r : ds[0].records) {
    if (r.id == "new-first") continue;
    EXPECT_EQ(before.at(r.id), 2) << r.id;
  }
}

TEST(ShardSpec, ParsesExplicitShards) {
  const EnvLookup none = env_of({});
  auto s = parse_shard_spec("3/4", none);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->index, 3);
  EXPECT_EQ(s->count, 4);
  EXPECT_EQ(s->label(), "3/4");
  for (const char* bad : {"4/4", "-1/4", "1/0", "1", "a/b", "1/4x", "", "/4", "1/"})
    EXPECT_FALSE(parse_shard_spec(bad, none).ok()) << bad;
  EXPECT_NE(parse_shard_spec("4/4", none).status().message().find("0..3"), std::string::npos);
}

TEST(ShardSpec, AutoFromSlurmArray) {
  auto s = parse_shard_spec("auto", env_of({{"SLURM_ARRAY_TASK_ID", "2"},
                                            {"SLURM_ARRAY_TASK_COUNT", "8"},
                                            {"SLURM_ARRAY_TASK_MIN", "0"}}));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->label(), "2/8");
  // --array=1-8: ids 1..8 become shards 0..7.
  s = parse_shard_spec("auto", env_of({{"SLURM_ARRAY_TASK_ID", "8"},
                                       {"SLURM_ARRAY_TASK_COUNT", "8"},
                                       {"SLURM_ARRAY_TASK_MIN", "1"}}));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->label(), "7/8");
  // --array=0-15:4 (a step): id 12 of 4 tasks is refused.
  EXPECT_FALSE(parse_shard_spec("auto", env_of({{"SLURM_ARRAY_TASK_ID", "12"},
                                                {"SLURM_ARRAY_TASK_COUNT", "4"},
                                                {"SLURM_ARRAY_TASK_MIN", "0"}}))
                   .ok());
  // auto/N must agree with Slurm's count.
  EXPECT_FALSE(parse_shard_spec("auto/4", env_of({{"SLURM_ARRAY_TASK_ID", "1"},
                                                  {"SLURM_ARRAY_TASK_COUNT", "8"}}))
                   .ok());
  EXPECT_FALSE(parse_shard_spec(
                   "auto", env_of({{"SLURM_ARRAY_TASK_ID", "x"}, {"SLURM_ARRAY_TASK_COUNT", "8"}}))
                   .ok());
}

TEST(ShardSpec, AutoFromKubernetesIndexedJob) {
  auto s = parse_shard_spec("auto/6", env_of({{"JOB_COMPLETION_INDEX", "5"}}));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->label(), "5/6");
  auto no_count = parse_shard_spec("auto", env_of({{"JOB_COMPLETION_INDEX", "5"}}));
  ASSERT_FALSE(no_count.ok());
  EXPECT_NE(no_count.status().message().find("auto/N"), std::string::npos);
  auto nothing = parse_shard_spec("auto/6", env_of({}));
  ASSERT_FALSE(nothing.ok());
  EXPECT_NE(nothing.status().message().find("JOB_COMPLETION_INDEX"), std::string::npos);
  EXPECT_FALSE(parse_shard_spec("auto/6", env_of({{"JOB_COMPLETION_INDEX", "6"}})).ok());
}

TEST(ShardSpec, SubstitutesOutputPaths) {
  const ShardSpec s{.index = 3, .count = 8};
  EXPECT_EQ(substitute_shard("out/shard-{shard}-of-{shards}.jsonl", s), "out/shard-3-of-8.jsonl");
  EXPECT_EQ(substitute_shard("out/{shard}/{shard}", s), "out/3/3");
  EXPECT_EQ(substitute_shard("plain.jsonl", s), "plain.jsonl");
  EXPECT_EQ(substitute_shard("{shar}{", s), "{shar}{");
}

}  // namespace
}  // namespace strata
