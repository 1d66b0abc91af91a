// KV checkpoints (pipeline/kv_checkpoint.h): the side file's blocks, restarts, header check, torn
// and corrupt tails, compaction; and the job: rows reported by a target are written before the
// lines that name them, a resumed record gets exactly those rows and the tokens they cover, and a
// record whose rows were lost (torn tail) or made with another layout falls back to every token
// with no rows, the others keeping theirs.
#include "pipeline/kv_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "pipeline/checkpoint.h"
#include "pipeline/runner.h"
#include "support/resumable_target.h"
#include "support/temp_dir.h"

namespace strata {
namespace {

constexpr int32_t kPage = 4;
constexpr int64_t kRowBytes = 3;  // odd on purpose: rows are bytes, not words

KvRowsLayout layout(const std::string& header = "{\"model\":\"m1\"}") {
  return KvRowsLayout{.header = header, .page_size = kPage, .page_bytes = kPage * kRowBytes};
}

// Row r of record `tag`: bytes that name both, so a misplaced row shows.
KvRows rows_of(int tag, int64_t first, int64_t n) {
  KvRows k{.first_row = first, .rows = n};
  for (int64_t r = first; r < first + n; ++r)
    for (int64_t b = 0; b < kRowBytes; ++b)
      k.bytes.push_back(std::byte(uint8_t(tag * 37 + r * 5 + b)));
  return k;
}

TEST(KvCheckpointFile, BlocksConcatenateRestartsReplaceAndTheHeaderMustMatch) {
  testing::TempDir dir("strata_kvfile");
  const std::string path = dir.file("out.jsonl.partial.kv");
  const PartialKey a{"d", "a"}, b{"d", "b"};
  {
    auto f = KvCheckpointFile::open(path, layout());
    ASSERT_TRUE(f.ok()) << f.status().message();
    ASSERT_TRUE((*f)->append(a, rows_of(1, 0, 8)).ok());
    ASSERT_TRUE((*f)->append(b, rows_of(2, 0, 4)).ok());
    ASSERT_TRUE((*f)->append(a, rows_of(1, 8, 4)).ok());
    ASSERT_TRUE((*f)->append(b, rows_of(3, 0, 8)).ok());  // b restarted: its rows are replaced
    EXPECT_FALSE((*f)->append(a, rows_of(1, 16, 4)).ok()) << "a gap is refused";
    ASSERT_TRUE((*f)->sync().ok());
    EXPECT_EQ((*f)->rows(a), 12);
    EXPECT_EQ((*f)->rows(b), 8);
  }
  auto f = KvCheckpointFile::open(path, layout());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->rows(a), 12);
  EXPECT_EQ((*f)->rows(b), 8);
  auto ra = (*f)->read(a, 12);
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ((*ra)->bytes, rows_of(1, 0, 12).bytes);
  auto rb = (*f)->read(b, 4);
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ((*rb)->bytes, rows_of(3, 0, 4).bytes);
  EXPECT_FALSE((*f)->read(b, 12).ok());
  f->reset();

  // Another model, dtype or layout: every row is dropped, never loaded.
  auto other = KvCheckpointFile::open(path, layout("{\"model\":\"m2\"}"));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->rows(a), 0);
  EXPECT_EQ((*other)->rows(b), 0);
}

TEST(KvCheckpointFile, TornOrCorruptTailsCostOnlyTheRowsInThem) {
  testing::TempDir dir("strata_kvfile");
  const std::string path = dir.file("out.jsonl.partial.kv");
  const PartialKey a{"d", "a"}, b{"d", "b"};
  int64_t before_last = 0;
  {
    auto f = KvCheckpointFile::open(path, layout());
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->append(a, rows_of(1, 0, 8)).ok());
    ASSERT_TRUE((*f)->append(b, rows_of(2, 0, 8)).ok());
    before_last = (*f)->file_bytes();
    ASSERT_TRUE((*f)->append(b, rows_of(2, 8, 4)).ok());
    ASSERT_TRUE((*f)->sync().ok());
  }
  const int64_t full = int64_t(std::filesystem::file_size(path));
  for (int64_t cut : {int64_t(1), int64_t(7), full - before_last - 1}) {
    std::filesystem::copy_file(path, path + ".torn",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(path + ".torn", uint64_t(full - cut));
    auto f = KvCheckpointFile::open(path + ".torn", layout());
    ASSERT_TRUE(f.ok());
    EXPECT_EQ((*f)->rows(a), 8) << "cut " << cut;
    EXPECT_EQ((*f)->rows(b), 8) << "cut " << cut << ": the torn block only";
    EXPECT_EQ((*f)->dropped_torn_bytes(), full - cut - before_last);
    EXPECT_EQ(int64_t(std::filesystem::file_size(path + ".torn")), before_last)
        << "the tail is cut off";
    ASSERT_TRUE((*f)->append(b, rows_of(2, 8, 4)).ok())
        << "and appends continue after the good blocks";
  }
  // A flipped payload byte in the last block: its checksum rejects it.
  {
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(full - 2);
    io.put('\x55' ^ char(io.peek()));
  }
  auto f = KvCheckpointFile::open(path, layout());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->rows(a), 8);
  EXPECT_EQ((*f)->rows(b), 8);
}

TEST(KvCheckpointFile, CompactionKeepsOnlyWhatIsListed) {
  testing::TempDir dir("strata_kvfile");
  const std::string path = dir.file("out.jsonl.partial.kv");
  const PartialKey a{"d", "a"}, b{"d", "b"}, c{"d", "c"};
  auto f = KvCheckpointFile::open(path, layout());
  ASSERT_TRUE(f.ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*f)->append(a, rows_of(1, 4 * i, 4)).ok());
  ASSERT_TRUE((*f)->append(b, rows_of(2, 0, 16)).ok());
  ASSERT_TRUE((*f)->append(c, rows_of(3, 0, 8)).ok());
  const int64_t before = (*f)->file_bytes();
  ASSERT_TRUE((*f)->compact({{a, 12}, {c, 8}}).ok());
  EXPECT_LT((*f)->file_bytes(), before);
  EXPECT_EQ((*f)->rows(a), 12);
  EXPECT_EQ((*f)->rows(b), 0);
  EXPECT_EQ((*f)->rows(c), 8);
  ASSERT_TRUE((*f)->append(a, rows_of(1, 12, 4)).ok());
  f->reset();
  auto again = KvCheckpointFile::open(path, layout());
  ASSERT_TRUE(again.ok());
  auto ra = (*again)->read(a, 16);
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ((*ra)->bytes, rows_of(1, 0, 16).bytes);
  EXPECT_EQ((*again)->rows(c), 8);
}

// Reports tokens and, like the engine, the KV rows of each page once it is full (rows of
// prompt + output, the last token's row only after the next token): prompt 3 tokens, token i of
// prompt pN is 1000 N + i, row bytes rows_of(N, ...). Tasks in `interrupt` stop after
// `tokens_before_interrupt` tokens, as after a kill.
class KvTarget : public testing::ResumableTarget {
 public:
  std::string header = "{\"model\":\"m1\"}";
  KvTarget() {
    tokens_before_interrupt = 11;
    total_tokens = 20;
  }
  std::optional<KvRowsLayout> kv_rows_layout(std::string*) const override { return layout(header); }

 protected:
  void after_token(const GenerationTask& task, int n, int i, int64_t* exported) override {
    const int64_t full = (3 + i) / kPage * kPage;  // rows computed: prompt + the first i outputs
    if (task.export_kv && full > *exported) {
      task.on_tokens(
          TokenReport{.kv = std::make_shared<KvRows>(rows_of(n, *exported, full - *exported))});
      *exported = full;
    }
  }
};

class KvCheckpointJob : public ::testing::Test {
 protected:
  void SetUp() override {
    opts_.output_file = dir_.file("out.jsonl");
    opts_.progress = false;
    opts_.sampling.params.seed = 11;
    opts_.checkpoint_tokens = 1;
  }
  // Two records interrupted after 11 tokens: 13 rows computed, 12 saved (3 pages), which cover
  // the prompt and the first 10 outputs: the mark says 10 tokens, draws 10.
  void interrupted_run() {
    KvTarget t;
    t.interrupt = {"p0", "p1"};
    auto s = run_job(ds_, t, opts_);
    ASSERT_TRUE(s.ok()) << s.status().message();
    ASSERT_FALSE(s->complete);
  }
  std::vector<Dataset> ds_{[] {
    Dataset d{.name = "d"};
    for (int i = 0; i < 2; ++i) {
      auto r = parse_prompt_line(
          nlohmann::json({{"id", "p" + std::to_string(i)}, {"prompt", "q"}}).dump(), i + 1, "d");
      EXPECT_TRUE(r.ok());
      d.records.push_back(*r);
    }
    return d;
  }()};
  testing::TempDir dir_{"strata_kvjob"};
  JobOptions opts_;
};

TEST_F(KvCheckpointJob, AResumedRecordGetsItsRowsAndTheTokensTheyCover) {
  interrupted_run();
  const std::string kv = opts_.output_file + ".partial.kv";
  ASSERT_TRUE(std::filesystem::exists(kv));
  KvTarget t;
  auto s = run_job(ds_, t, opts_);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(s->complete);
  ASSERT_EQ(t.resumed.size(), 2u);
  for (int n : {0, 1}) {
    const auto& r = t.resumed["p" + std::to_string(n)];
    ASSERT_EQ(r.tokens.size(), 10u) << "the tokens the rows cover, not the 11 checkpointed";
    EXPECT_EQ(r.tokens.back(), 1000 * n + 9);
    EXPECT_EQ(r.draws, 10u);
    ASSERT_TRUE(r.kv != nullptr);
    EXPECT_EQ(r.kv->rows, 12);
    EXPECT_EQ(r.kv->bytes, rows_of(n, 0, 12).bytes) << "the exact bytes reported";
    EXPECT_EQ(r.export_from, 12);
  }
  EXPECT_FALSE(std::filesystem::exists(kv)) << "a complete job leaves no KV rows";
  EXPECT_FALSE(std::filesystem::exists(opts_.output_file + ".partial.jsonl"));
}

TEST_F(KvCheckpointJob, RowsOfAnotherLayoutAreNeverLoaded) {
  interrupted_run();
  KvTarget t;
  t.header = "{\"model\":\"m2\"}";
  auto s = run_job(ds_, t, opts_);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(s->complete);
  ASSERT_EQ(t.resumed.size(), 2u);
  for (const auto& [id, r] : t.resumed) {
    EXPECT_EQ(r.tokens.size(), 11u) << id << ": every checkpointed token, prefilled";
    EXPECT_EQ(r.draws, 11u);
    EXPECT_EQ(r.kv, nullptr) << id;
    EXPECT_EQ(r.export_from, 0) << id << ": its rows are exported again from row 0";
  }
}

TEST_F(KvCheckpointJob, ATornSideFileCostsOnlyTheRecordWhoseRowsItHeld) {
  interrupted_run();
  // p1's rows were written last (3 pages in blocks of 1..2 pages): cut into its last block.
  const std::string kv = opts_.output_file + ".partial.kv";
  std::filesystem::resize_file(kv, std::filesystem::file_size(kv) - 5);
  KvTarget t;
  auto s = run_job(ds_, t, opts_);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(t.resumed.size(), 2u);
  ASSERT_TRUE(t.resumed["p0"].kv != nullptr);
  EXPECT_EQ(t.resumed["p0"].tokens.size(), 10u);
  EXPECT_EQ(t.resumed["p0"].kv->bytes, rows_of(0, 0, 12).bytes);
  EXPECT_EQ(t.resumed["p1"].kv, nullptr);
  EXPECT_EQ(t.resumed["p1"].tokens.size(), 11u);
  EXPECT_EQ(t.resumed["p1"].export_from, 0);
}

TEST_F(KvCheckpointJob, OffWritesNoSideFileAndOnRefusesATargetWithoutRows) {
  JobOptions o = opts_;
  o.checkpoint_kv = JobOptions::CheckpointKv::kOff;
  KvTarget t;
  t.interrupt = {"p0", "p1"};
  ASSERT_TRUE(run_job(ds_, t, o).ok());
  EXPECT_FALSE(std::filesystem::exists(opts_.output_file + ".partial.kv"));
  class NoRows : public KvTarget {
    std::optional<KvRowsLayout> kv_rows_layout(std::string* why) const override {
      *why = "tensor parallel";
      return std::nullopt;
    }
  } no_rows;
  o.checkpoint_kv = JobOptions::CheckpointKv::kOn;
  auto s = run_job(ds_, no_rows, o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("tensor parallel"), std::string::npos)
      << s.status().message();
}

}  // namespace
}  // namespace strata
