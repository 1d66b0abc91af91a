// HiddenStore (pipeline/hidden_store.h): records round-trip through the index and the shards, the
// shards are valid safetensors files (header offsets contiguous from the data start), uncommitted
// records are reclaimed on open (tails truncated, holes compacted into a new shard), shards roll.
#include "pipeline/hidden_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "support/temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

constexpr int kAux = 3;
constexpr int64_t kHidden = 8;

CapturedRecord make_record(int tokens, float seed, DType dtype) {
  auto states = std::make_shared<CapturedStates>(dtype);
  std::vector<float> row(size_t((kAux + 1) * kHidden));
  CapturedRecord r;
  for (int p = 0; p < tokens; ++p) {
    for (size_t i = 0; i < row.size(); ++i) row[i] = seed + float(p) * 0.5f + float(i) * 0.25f;
    states->put(p, row.data(), DType::kF32, int64_t(row.size()));
    r.input_ids.push_back(100 + p);
    r.loss_mask.push_back(p % 2);
  }
  r.states = states;
  return r;
}

std::string read_bytes(const std::string& path, int64_t offset, int64_t n) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(offset);
  std::string s(size_t(n), '\0');
  in.read(s.data(), n);
  return s;
}

nlohmann::json index_lines(const std::string& dir) {
  nlohmann::json out = nlohmann::json::array();
  std::ifstream in(dir + "/index.jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The safetensors header of a shard, checked: 8-byte length, JSON, tensors cover the data
// region back to back (what strict readers require).
nlohmann::json check_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  std::string text(size_t(len), '\0');
  in.read(text.data(), std::streamsize(len));
  nlohmann::json h = nlohmann::json::parse(text);
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& [name, t] : h.items())
    if (name != "__metadata__")
      spans.emplace_back(t["data_offsets"][0].get<int64_t>(), t["data_offsets"][1].get<int64_t>());
  std::sort(spans.begin(), spans.end());
  int64_t at = 0;
  for (const auto& [b, e] : spans) {
    EXPECT_EQ(b, at) << path << ": a hole or overlap in the data";
    at = e;
  }
  EXPECT_EQ(int64_t(fs::file_size(path)), int64_t(8 + len) + at)
      << path << ": bytes after the last tensor";
  return h;
}

TEST(HiddenStore, RecordsRoundTripAndShardsAreValidSafetensors) {
  testing::TempDir tmp;
  const std::string dir = tmp.str() + "/hidden/out";
  auto committed = [](const std::string&, const std::string&) { return true; };
  auto store = HiddenStore::open(dir, {{"x", 1}}, committed);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  const CapturedRecord a = make_record(5, 1.0f, DType::kBF16),
                       b = make_record(3, -2.0f, DType::kBF16);
  ASSERT_TRUE((*store)->append("d", "a", a, kAux, kHidden).ok());
  ASSERT_TRUE((*store)->append("d", "b", b, kAux, kHidden).ok());
  ASSERT_TRUE((*store)->close().ok());
  const nlohmann::json idx = index_lines(dir);
  ASSERT_EQ(idx.size(), 2u);
  const nlohmann::json& t = idx[1]["tensors"];
  EXPECT_EQ(t["aux_hidden_state"]["shape"], nlohmann::json({3, kAux * kHidden}));
  EXPECT_EQ(t["hidden_state"]["shape"], nlohmann::json({3, kHidden}));
  EXPECT_EQ(t["aux_hidden_state"]["dtype"], "BF16");
  const std::string shard = dir + "/" + idx[1]["shard"].get<std::string>();
  // The final-norm block of b's row 2 is the last kHidden values of its row, in bf16.
  const std::string fin =
      read_bytes(shard, t["hidden_state"]["offset"], t["hidden_state"]["nbytes"]);
  for (int64_t i = 0; i < kHidden; ++i) {
    uint16_t v;
    std::memcpy(&v, fin.data() + 2 * (2 * kHidden + i), 2);
    EXPECT_EQ(v, f32_to_bf16(-2.0f + 2 * 0.5f + float(kAux * kHidden + i) * 0.25f));
  }
  const std::string ids = read_bytes(shard, t["input_ids"]["offset"], t["input_ids"]["nbytes"]);
  EXPECT_EQ(std::memcmp(ids.data(), b.input_ids.data(), 12), 0);
  const nlohmann::json h = check_safetensors(shard);
  EXPECT_TRUE(h.contains("d/a/aux_hidden_state") && h.contains("d/b/loss_mask"));
  // A reopened store with a different meta is refused.
  EXPECT_FALSE(HiddenStore::open(dir, {{"x", 2}}, committed).ok());
}

TEST(HiddenStore, UncommittedRecordsAreReclaimedOnOpen) {
  testing::TempDir tmp;
  const std::string dir = tmp.str() + "/h";
  {
    auto store = HiddenStore::open(dir, {}, [](auto&, auto&) { return true; });
    ASSERT_TRUE(store.ok());
    for (const char* id : {"a", "b", "c", "d"})
      ASSERT_TRUE((*store)->append("d", id, make_record(4, 1.0f, DType::kF32), kAux, kHidden).ok());
    // No close(): a killed job.
  }
  // "d" (the tail) and "b" (between kept ones) never committed.
  std::set<std::string> keep = {"a", "c"};
  auto store =
      HiddenStore::open(dir, {}, [&](auto&, const std::string& id) { return keep.count(id) > 0; });
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_EQ((*store)->reclaimed(), 2);
  EXPECT_TRUE((*store)->contains("d", "a") && (*store)->contains("d", "c"));
  EXPECT_FALSE((*store)->contains("d", "b") || (*store)->contains("d", "d"));
  const nlohmann::json idx = index_lines(dir);
  ASSERT_EQ(idx.size(), 2u);
  int shards = 0;
  for (const auto& f : fs::directory_iterator(dir))
    if (f.path().filename().string().rfind("shard-", 0) == 0) ++shards;
  EXPECT_EQ(shards, 1);  // the old shard with the hole is gone
  const std::string shard = dir + "/" + idx[1]["shard"].get<std::string>();
  check_safetensors(shard);
  // c's states moved intact: its input ids read back at the new offset.
  const auto& t = idx[1]["tensors"]["input_ids"];
  const std::string ids = read_bytes(shard, t["offset"], t["nbytes"]);
  const std::vector<int32_t> want = {100, 101, 102, 103};
  EXPECT_EQ(std::memcmp(ids.data(), want.data(), 16), 0);
  // Appends go on after the kept records, and the shard stays valid.
  ASSERT_TRUE((*store)->append("d", "e", make_record(2, 0.0f, DType::kF32), kAux, kHidden).ok());
  ASSERT_TRUE((*store)->close().ok());
  check_safetensors(shard);
}

TEST(HiddenStore, ShardsRollOverAtTheSizeLimit) {
  testing::TempDir tmp;
  const std::string dir = tmp.str() + "/h";
  auto store = HiddenStore::open(
      dir, {}, [](auto&, auto&) { return true; }, /*shard_bytes=*/1000);
  ASSERT_TRUE(store.ok());
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(
        (*store)
            ->append("d", std::to_string(i), make_record(6, 1.0f, DType::kBF16), kAux, kHidden)
            .ok());
  ASSERT_TRUE((*store)->close().ok());
  std::set<std::string> shards;
  for (const auto& line : index_lines(dir)) shards.insert(line["shard"].get<std::string>());
  EXPECT_GE(shards.size(), 2u);
  for (const auto& s : shards) check_safetensors(dir + "/" + s);
}

TEST(HiddenStore, Eagle3DefaultLayersFollowSpecForge) {
  EXPECT_EQ(eagle3_default_layers(32), (std::vector<int>{1, 15, 28}));  // Llama-3.1-8B
  EXPECT_EQ(eagle3_default_layers(61), (std::vector<int>{1, 29, 57}));  // DeepSeek-V3 / Kimi-K2
  EXPECT_EQ(eagle3_default_layers(8), (std::vector<int>{1, 3, 4}));     // house-llama
}

TEST(HiddenStore, HiddenDirIsBesideTheResults) {
  EXPECT_EQ(hidden_dir_for("/data/run/out.jsonl"), "/data/run/hidden/out");
  EXPECT_EQ(hidden_dir_for("out"), "hidden/out");
}

}  // namespace
}  // namespace strata
