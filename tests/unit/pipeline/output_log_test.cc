// The resume scanner and the append-only log: torn tails, duplicate ids, missing files,
// corruption, and a randomized kill-at-any-byte check.
#include "pipeline/output_log.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace strata {
namespace {

class OutputLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("strata_output_log_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "out.jsonl").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(path_, std::ios::binary) << text; }
  std::string read() {
    std::ifstream in(path_, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static std::string rec(const std::string& id, const std::string& ds = "a") {
    return nlohmann::json({{"id", id}, {"meta", {{"dataset", ds}}}, {"text", "x\ny"}}).dump() +
           "\n";
  }
  std::filesystem::path dir_;
  std::string path_;
};

// One key rule for the scan, the job and `strata verify`: id as a string or an integer's decimal
// text; dataset from meta.dataset, else a top-level "dataset" (failures), else the default.
TEST(RecordKey, IdAndDatasetByTheJobsRule) {
  std::string dataset, id;
  using J = nlohmann::json;
  ASSERT_TRUE(record_key(J{{"id", "q7"}, {"meta", {{"dataset", "m"}}}}, "def", dataset, id));
  EXPECT_EQ(dataset, "m");
  EXPECT_EQ(id, "q7");
  ASSERT_TRUE(record_key(J{{"id", 42}, {"dataset", "f"}}, "def", dataset, id));
  EXPECT_EQ(dataset, "f");
  EXPECT_EQ(id, "42");
  ASSERT_TRUE(record_key(J{{"id", -3}}, "def", dataset, id));
  EXPECT_EQ(dataset, "def");
  EXPECT_EQ(id, "-3");
  // A meta object decides even without a dataset: the default, not the top-level one.
  ASSERT_TRUE(
      record_key(J{{"id", "a"}, {"meta", {{"x", 1}}}, {"dataset", "f"}}, "def", dataset, id));
  EXPECT_EQ(dataset, "def");
  EXPECT_FALSE(record_key(J{{"id", 1.5}}, "def", dataset, id));
  EXPECT_FALSE(record_key(J{{"id", nullptr}}, "def", dataset, id));
  EXPECT_FALSE(record_key(J{{"text", "no id"}}, "def", dataset, id));
  EXPECT_FALSE(record_key(J::array({1, 2}), "def", dataset, id));
}

TEST_F(OutputLogTest, MissingFileIsEmpty) {
  auto s = scan_output(path_);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_FALSE(s->exists);
  EXPECT_EQ(s->records, 0);
  EXPECT_EQ(s->valid_bytes, 0);
  EXPECT_TRUE(s->first_record.is_null());
  // Opening a log on a missing file creates it.
  auto log = AppendLog::open(path_, 0);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE((*log)->append(R"({"id":"1"})").ok());
  log->reset();
  EXPECT_EQ(read(), "{\"id\":\"1\"}\n");
}

TEST_F(OutputLogTest, CompleteLinesAndKeysPerDataset) {
  write(rec("1", "a") + rec("2", "a") + rec("1", "b") +
        R"({"id":7,"dataset":"c"})"
        "\n" +
        R"({"id":"9"})"
        "\n");
  auto s = scan_output(path_, {.default_dataset = "dflt"});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->records, 5);
  EXPECT_EQ(s->torn_bytes, 0);
  EXPECT_TRUE(s->duplicates.empty());
  EXPECT_EQ(s->count("a"), 2);
  EXPECT_TRUE(s->contains("b", "1"));
  EXPECT_FALSE(s->contains("b", "2"));
  EXPECT_TRUE(s->contains("c", "7"));     // integer id, top-level dataset (failures layout)
  EXPECT_TRUE(s->contains("dflt", "9"));  // no dataset: the default
  EXPECT_EQ(s->first_record["id"], "1");
}

TEST_F(OutputLogTest, TornTailIsDroppedAndTruncatedOnOpen) {
  const std::string good = rec("1") + rec("2");
  const std::string torn = rec("3").substr(0, 10);
  write(good + torn);
  auto s = scan_output(path_);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->records, 2);
  EXPECT_EQ(s->valid_bytes, int64_t(good.size()));
  EXPECT_EQ(s->torn_bytes, int64_t(torn.size()));
  EXPECT_FALSE(s->contains("a", "3"));
  auto log = AppendLog::open(path_, s->valid_bytes);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE((*log)->append(rec("3").substr(0, rec("3").size() - 1)).ok());
  ASSERT_TRUE((*log)->sync().ok());
  EXPECT_EQ(read(), good + rec("3"));
}

TEST_F(OutputLogTest, TornTailThatIsValidJsonStillCountsAsTorn) {
  // A write cut exactly before its '\n' leaves a parseable line; it must still be redone,
  // since the writer never finished it.
  const std::string line = rec("2");
  write(rec("1") + line.substr(0, line.size() - 1));
  auto s = scan_output(path_);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->records, 1);
  EXPECT_FALSE(s->contains("a", "2"));
  EXPECT_EQ(s->torn_bytes, int64_t(line.size() - 1));
}

TEST_F(OutputLogTest, DuplicatesAreReportedAndCompactedKeepingTheFirst) {
  const std::string first1 =
      nlohmann::json({{"id", "1"}, {"meta", {{"dataset", "a"}}}, {"v", 1}}).dump() + "\n";
  const std::string again1 =
      nlohmann::json({{"id", "1"}, {"meta", {{"dataset", "a"}}}, {"v", 2}}).dump() + "\n";
  write(first1 + rec("2") + again1 + rec("1", "b") + rec("2") + rec("3") + "{\"id\":");
  auto s = scan_output(path_);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->records, 6);
  ASSERT_EQ(s->duplicates.size(), 2u);
  EXPECT_EQ(s->duplicates[0].offset, int64_t((first1 + rec("2")).size()));
  EXPECT_EQ(s->duplicates[0].length, int64_t(again1.size()));
  ASSERT_TRUE(compact_output(path_, *s).ok());
  EXPECT_EQ(read(), first1 + rec("2") + rec("1", "b") + rec("3"));
  auto again = scan_output(path_);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->duplicates.empty());
  EXPECT_EQ(again->records, 4);
  EXPECT_EQ(again->torn_bytes, 0);
}

TEST_F(OutputLogTest, KeepRecordsKeepsTheLastOfEachKey) {
  write(R"({"id":"1","dataset":"a","error":"first"})"
        "\n"
        R"({"id":"1","dataset":"a","error":"second"})"
        "\n");
  auto s = scan_output(path_, {.keep_records = true});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->last_records["a"]["1"]["error"], "second");
}

TEST_F(OutputLogTest, CorruptCompleteLineIsDataLoss) {
  write(rec("1") + "not json\n" + rec("2"));
  auto s = scan_output(path_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(s.status().message().find("line 2"), std::string::npos) << s.status().message();
  write(rec("1") + R"({"no_id":1})"
                   "\n");
  EXPECT_EQ(scan_output(path_).status().code(), StatusCode::kDataLoss);
  write(R"([1,2])"
        "\n");
  EXPECT_EQ(scan_output(path_).status().code(), StatusCode::kDataLoss);
}

TEST_F(OutputLogTest, EmptyFileAndBlankLines) {
  write("");
  auto s = scan_output(path_);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->exists);
  EXPECT_EQ(s->records, 0);
  write("\n" + rec("1") + "\n");
  s = scan_output(path_);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->records, 1);
  EXPECT_EQ(s->torn_bytes, 0);
}

// A writer killed after any byte: whatever prefix of the byte stream reached the file, the
// scan recovers exactly the records whose line was complete, and appending after it yields a
// file where every key appears once.
TEST_F(OutputLogTest, KillAtEveryByteRecoversExactlyTheCompleteRecords) {
  std::mt19937 rng(7);
  std::vector<std::string> lines;
  std::string all;
  for (int i = 0; i < 12; ++i) {
    std::string text(rng() % 40, 'a' + char(rng() % 26));
    lines.push_back(
        nlohmann::json({{"id", std::to_string(i)}, {"meta", {{"dataset", "d"}}}, {"t", text}})
            .dump());
    all += lines.back() + "\n";
  }
  for (size_t cut = 0; cut <= all.size(); ++cut) {
    write(all.substr(0, cut));
    auto s = scan_output(path_);
    ASSERT_TRUE(s.ok()) << cut;
    size_t complete = 0, bytes = 0;
    while (complete < lines.size() && bytes + lines[complete].size() + 1 <= cut)
      bytes += lines[complete++].size() + 1;
    ASSERT_EQ(s->records, int64_t(complete)) << cut;
    ASSERT_EQ(s->valid_bytes, int64_t(bytes)) << cut;
    if (cut % 5 != 0 && cut != all.size() - 1)
      continue;  // resuming fsyncs: every 5th cut is enough
    // Resume: append the missing records.
    {
      auto log = AppendLog::open(path_, s->valid_bytes);
      ASSERT_TRUE(log.ok());
      for (size_t i = 0; i < lines.size(); ++i) {
        if (!s->contains("d", std::to_string(i))) {
          ASSERT_TRUE((*log)->append(lines[i]).ok());
        }
      }
    }
    ASSERT_EQ(read(), all) << cut;
  }
}

TEST_F(OutputLogTest, WriteFileAtomic) {
  const std::string p = (dir_ / "x.done").string();
  ASSERT_TRUE(write_file_atomic(p, "one").ok());
  ASSERT_TRUE(write_file_atomic(p, "two").ok());
  std::ifstream in(p);
  std::string s;
  std::getline(in, s);
  EXPECT_EQ(s, "two");
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
}

}  // namespace
}  // namespace strata
