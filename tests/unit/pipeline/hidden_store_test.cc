// HiddenStore (pipeline/hidden_store.h): records round-trip through the index and their files,
// which are valid safetensors files (header offsets contiguous from the data start); rows streamed
// while a record is generated store what whole rows in memory store; uncommitted records are
// reclaimed on open; group commits keep order and exactly-once under kill -9; a failed write (a
// full disk) fails the commit before its index line.
#include "pipeline/hidden_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
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

// The record files in `dir`.
std::set<std::string> record_files(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& f : fs::directory_iterator(dir))
    if (f.path().extension() == ".safetensors") out.insert(f.path().filename().string());
  return out;
}

// Every tensor of an index entry, as bytes.
std::map<std::string, std::string> entry_bytes(const std::string& dir, const nlohmann::json& e) {
  std::map<std::string, std::string> out;
  for (const auto& [name, t] : e["tensors"].items())
    out[name] = read_bytes(dir + "/" + e["shard"].get<std::string>(), t["offset"], t["nbytes"]);
  return out;
}

TEST(HiddenStore, RecordsRoundTripAndFilesAreValidSafetensors) {
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
  EXPECT_NE(idx[0]["shard"], idx[1]["shard"]);  // a file per record
  const nlohmann::json& t = idx[1]["tensors"];
  EXPECT_EQ(t["aux_hidden_state"]["shape"], nlohmann::json({3, kAux * kHidden}));
  EXPECT_EQ(t["hidden_state"]["shape"], nlohmann::json({3, kHidden}));
  EXPECT_EQ(t["aux_hidden_state"]["dtype"], "BF16");
  const std::string file = dir + "/" + idx[1]["shard"].get<std::string>();
  // The final-norm block of b's row 2 is the last kHidden values of its row, in bf16.
  const std::string fin =
      read_bytes(file, t["hidden_state"]["offset"], t["hidden_state"]["nbytes"]);
  for (int64_t i = 0; i < kHidden; ++i) {
    uint16_t v;
    std::memcpy(&v, fin.data() + 2 * (2 * kHidden + i), 2);
    EXPECT_EQ(v, f32_to_bf16(-2.0f + 2 * 0.5f + float(kAux * kHidden + i) * 0.25f));
  }
  // Its aux blocks: row 1, aux value 5.
  const std::string aux =
      read_bytes(file, t["aux_hidden_state"]["offset"], t["aux_hidden_state"]["nbytes"]);
  uint16_t v;
  std::memcpy(&v, aux.data() + 2 * (kAux * kHidden + 5), 2);
  EXPECT_EQ(v, f32_to_bf16(-2.0f + 0.5f + 5 * 0.25f));
  const std::string ids = read_bytes(file, t["input_ids"]["offset"], t["input_ids"]["nbytes"]);
  EXPECT_EQ(std::memcmp(ids.data(), b.input_ids.data(), 12), 0);
  const nlohmann::json h = check_safetensors(file);
  EXPECT_TRUE(h.contains("d/b/aux_hidden_state") && h.contains("d/b/loss_mask"));
  check_safetensors(dir + "/" + idx[0]["shard"].get<std::string>());
  // A reopened store with a different meta is refused.
  EXPECT_FALSE(HiddenStore::open(dir, {{"x", 2}}, committed).ok());
}

// The engine's path: rows written as they are computed (out of order, some twice, converted from
// float32), their aux blocks streamed to the record's file, only the final-norm blocks in memory;
// the stored record is byte for byte what a record kept whole in memory stores.
TEST(HiddenStore, StreamedRecordsEqualRecordsKeptInMemory) {
  testing::TempDir tmp;
  const std::string dir = tmp.str() + "/h";
  auto store = HiddenStore::open(dir, {}, [](auto&, auto&) { return true; });
  ASSERT_TRUE(store.ok());
  const int tokens = 7;
  const CapturedRecord whole = make_record(tokens, 3.0f, DType::kBF16);
  std::shared_ptr<CapturedStates> states =
      (*store)->begin_record("d", "s", kAux, kHidden, DType::kBF16, /*rows=*/4);
  ASSERT_NE(states->spill(), nullptr);
  std::vector<float> row(size_t((kAux + 1) * kHidden));
  for (int p : {0, 1, 2, 6, 3, 4, 5, 6}) {  // 6 first with garbage, then again (a recomputation)
    const bool junk = p == 6 && !states->has(6);
    for (size_t i = 0; i < row.size(); ++i)
      row[i] = (junk ? -9.0f : 3.0f) + float(p) * 0.5f + float(i) * 0.25f;
    states->put(p, row.data(), DType::kF32, int64_t(row.size()));
  }
  // Memory holds the final-norm blocks only.
  EXPECT_EQ(states->spilled_bytes(), int64_t(kAux * kHidden * 2));
  CapturedRecord streamed{
      .input_ids = whole.input_ids, .loss_mask = whole.loss_mask, .states = states};
  ASSERT_TRUE((*store)->append("d", "s", streamed, kAux, kHidden).ok());
  ASSERT_TRUE((*store)->append("d", "w", whole, kAux, kHidden).ok());
  const nlohmann::json idx = index_lines(dir);
  ASSERT_EQ(idx.size(), 2u);
  EXPECT_EQ(entry_bytes(dir, idx[0]), entry_bytes(dir, idx[1]));
  EXPECT_EQ(idx[0]["tensors"]["aux_hidden_state"]["offset"],
            idx[1]["tensors"]["aux_hidden_state"]["offset"]);  // same names' length: same layout
  check_safetensors(dir + "/" + idx[0]["shard"].get<std::string>());
}

TEST(HiddenStore, UncommittedRecordsAreReclaimedOnOpen) {
  testing::TempDir tmp;
  const std::string dir = tmp.str() + "/h";
  std::map<std::string, std::map<std::string, std::string>> stored;
  {
    auto store = HiddenStore::open(dir, {}, [](auto&, auto&) { return true; });
    ASSERT_TRUE(store.ok());
    for (const char* id : {"a", "b", "c", "d"})
      ASSERT_TRUE((*store)->append("d", id, make_record(4, 1.0f, DType::kF32), kAux, kHidden).ok());
    // A record in flight: rows streamed, never committed.
    auto states = (*store)->begin_record("d", "e", kAux, kHidden, DType::kF32, 4);
    std::vector<float> row(size_t((kAux + 1) * kHidden), 1.0f);
    states->put(0, row.data(), DType::kF32, int64_t(row.size()));
    for (const auto& e : index_lines(dir)) stored[e["id"]] = entry_bytes(dir, e);
    EXPECT_EQ(record_files(dir).size(), 5u);
    // No close(): a killed job.
  }
  // "d" (the last) and "b" (between kept ones) never committed (their results lines were lost).
  std::set<std::string> keep = {"a", "c"};
  auto store =
      HiddenStore::open(dir, {}, [&](auto&, const std::string& id) { return keep.count(id) > 0; });
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_EQ((*store)->reclaimed(), 2);
  EXPECT_TRUE((*store)->contains("d", "a") && (*store)->contains("d", "c"));
  EXPECT_FALSE((*store)->contains("d", "b") || (*store)->contains("d", "d"));
  const nlohmann::json idx = index_lines(dir);
  ASSERT_EQ(idx.size(), 2u);
  // Only the kept records' files are left, untouched.
  std::set<std::string> named;
  for (const auto& e : idx) {
    named.insert(e["shard"].get<std::string>());
    EXPECT_EQ(entry_bytes(dir, e), stored[e["id"]]);
    check_safetensors(dir + "/" + e["shard"].get<std::string>());
  }
  EXPECT_EQ(record_files(dir), named);
  // New records take new file names.
  ASSERT_TRUE((*store)->append("d", "f", make_record(2, 0.0f, DType::kF32), kAux, kHidden).ok());
  ASSERT_TRUE((*store)->close().ok());
  const nlohmann::json after = index_lines(dir);
  ASSERT_EQ(after.size(), 3u);
  EXPECT_EQ(named.count(after[2]["shard"].get<std::string>()), 0u);
  check_safetensors(dir + "/" + after[2]["shard"].get<std::string>());
}

// A group's records are indexed in the order given, each once (a record given twice, or one
// already stored, is not written again).
TEST(HiddenStore, GroupCommitIndexesEachRecordOnceInOrder) {
  testing::TempDir tmp;
  const std::string dir = tmp.str() + "/h";
  auto store = HiddenStore::open(dir, {}, [](auto&, auto&) { return true; });
  ASSERT_TRUE(store.ok());
  std::vector<CapturedRecord> recs;
  for (int i = 0; i < 12; ++i) recs.push_back(make_record(3 + i, float(i), DType::kBF16));
  std::vector<HiddenStore::Pending> group;
  for (int i = 0; i < 12; ++i) group.push_back({"d", std::to_string(i), &recs[size_t(i)]});
  group.push_back({"d", "3", &recs[3]});
  ASSERT_TRUE((*store)->commit(group, kAux, kHidden).ok());
  ASSERT_TRUE((*store)->commit({{"d", "5", &recs[5]}, {"e", "5", &recs[5]}}, kAux, kHidden).ok());
  const nlohmann::json idx = index_lines(dir);
  ASSERT_EQ(idx.size(), 13u);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(idx[size_t(i)]["id"], std::to_string(i));
    EXPECT_EQ(idx[size_t(i)]["tokens"], 3 + i);
    check_safetensors(dir + "/" + idx[size_t(i)]["shard"].get<std::string>());
  }
  EXPECT_EQ(idx[12]["dataset"], "e");
  EXPECT_EQ(record_files(dir).size(), 13u);
}

// kill -9 at any moment of a job that commits groups of records (streamed and in memory) and
// then writes their results lines, as the runner does: a reopened store keeps exactly the records
// whose results line was written, each with its tensors intact, and no other file.
TEST(HiddenStore, GroupCommitSurvivesKillNine) {
  testing::TempDir tmp;
  const std::string dir = tmp.str() + "/h", results = tmp.str() + "/results.txt";
  auto committed_ids = [&] {
    std::set<std::string> ids;
    std::ifstream in(results);
    std::string line;
    while (std::getline(in, line))
      if (!in.eof()) ids.insert(line);  // a line without '\n' is torn
    return ids;
  };
  // Six kills at 20-95 ms; on a loaded machine a child may commit nothing that fast, so further
  // rounds, each later, run until some record is committed (the check below needs one).
  for (int round = 0; round < 6 || (committed_ids().empty() && round < 16); ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {  // the job: groups of 5 records, the results lines after each commit
      const std::set<std::string> done = committed_ids();
      auto store = HiddenStore::open(
          dir, {}, [&](auto&, const std::string& id) { return done.count(id) > 0; });
      if (!store.ok()) ::_exit(2);
      std::ofstream out(results, std::ios::app);
      for (int g = 0;; ++g) {
        std::vector<CapturedRecord> recs;
        std::vector<HiddenStore::Pending> group;
        for (int i = 0; i < 5; ++i) {
          const std::string id = fmt::format("{}-{}-{}", round, g, i);
          const int tokens = 20 + i;
          CapturedRecord r = make_record(tokens, float(g + i), DType::kBF16);
          if (i % 2 == 0) {  // streamed
            auto states = (*store)->begin_record("d", id, kAux, kHidden, DType::kBF16, tokens);
            for (int p = 0; p < tokens; ++p) states->put_row(p, *r.states);
            r.states = states;
          }
          recs.push_back(std::move(r));
        }
        for (int i = 0; i < 5; ++i)
          group.push_back({"d", fmt::format("{}-{}-{}", round, g, i), &recs[size_t(i)]});
        if (!(*store)->commit(group, kAux, kHidden).ok()) ::_exit(3);
        for (const auto& p : group) out << p.id << "\n" << std::flush;
      }
    }
    ::usleep(useconds_t(20000 + 15000 * round));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the job stopped by itself: " << status;
  }
  const std::set<std::string> done = committed_ids();
  auto store =
      HiddenStore::open(dir, {}, [&](auto&, const std::string& id) { return done.count(id) > 0; });
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_GT(done.size(), 0u);
  EXPECT_EQ((*store)->records(), int64_t(done.size()));
  std::set<std::string> named;
  for (const auto& e : index_lines(dir)) {
    named.insert(e["shard"].get<std::string>());
    check_safetensors(dir + "/" + e["shard"].get<std::string>());
    // Its tensors are the record's: ids 100.., and the aux value of the last row.
    const std::string id = e["id"];
    const int g = std::stoi(id.substr(id.find('-') + 1)), i = id.back() - '0';
    const CapturedRecord want = make_record(20 + i, float(g + i), DType::kBF16);
    testing::TempDir check;
    auto ref = HiddenStore::open(check.str(), {}, [](auto&, auto&) { return true; });
    ASSERT_TRUE((*ref)->append("d", id, want, kAux, kHidden).ok());
    EXPECT_EQ(entry_bytes(dir, e), entry_bytes(check.str(), index_lines(check.str())[0])) << id;
  }
  EXPECT_EQ(record_files(dir), named);
}

// A write that fails while a record streams (the disk full: here the file size limit) fails its
// commit with the error, before any index line; the reopened store has no trace of it.
TEST(HiddenStore, AFullDiskFailsTheCommitCleanly) {
  testing::TempDir tmp;
  const std::string dir = tmp.str() + "/h";
  {
    ASSERT_TRUE(HiddenStore::open(dir, {}, [](auto&, auto&) { return true; }).ok());
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // writes past the limit then fail with EFBIG
    auto store = HiddenStore::open(dir, {}, [](auto&, auto&) { return true; });
    if (!store.ok()) ::_exit(2);
    if (!(*store)->append("d", "small", make_record(2, 1.0f, DType::kF32), kAux, kHidden).ok())
      ::_exit(3);
    struct rlimit rl {
      .rlim_cur = 64 << 10, .rlim_max = RLIM_INFINITY
    };
    if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) ::_exit(4);
    CapturedRecord big = make_record(1000, 1.0f, DType::kF32);  // 1000 x 96 B of aux
    auto states = (*store)->begin_record("d", "big", kAux, kHidden, DType::kF32, 1000);
    for (int p = 0; p < 1000; ++p) states->put_row(p, *big.states);
    big.states = states;
    const Status st = (*store)->append("d", "big", big, kAux, kHidden);
    if (st.ok()) ::_exit(5);
    if (st.message().find("File too large") == std::string::npos) ::_exit(6);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  const nlohmann::json idx = index_lines(dir);
  ASSERT_EQ(idx.size(), 1u);
  EXPECT_EQ(idx[0]["id"], "small");
  auto store = HiddenStore::open(dir, {}, [](auto&, auto&) { return true; });
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->records(), 1);
  EXPECT_EQ(record_files(dir).size(), 1u);  // the failed record's file is gone
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
