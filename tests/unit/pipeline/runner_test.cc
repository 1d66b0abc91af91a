// The batch job against a fake prompt target: resume after interruption, exactly-once, failures and
// --retry-failures, settings check, per-dataset files, repair of a damaged output, progress.
#include "pipeline/runner.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <set>

#include "pipeline/checkpoint.h"
#include "pipeline/output_log.h"
#include "support/resumable_target.h"
#include "support/temp_dir.h"

namespace strata {
namespace {

// Completes tasks deterministically: text "<id>|<seed>". Fails ids in `fail_ids`; after
// `interrupt_after` starts every task ends kInterrupted (a server that went away).
class FakeTarget : public PromptTarget {
 public:
  std::set<std::string> fail_ids;
  int64_t interrupt_after = -1;
  bool async = false;
  int in_flight = 4;
  std::vector<std::string> started;

  ~FakeTarget() override {
    for (auto& f : futures_) f.wait();
  }
  std::string model_name() const override { return "fake-model"; }
  int max_in_flight() const override { return in_flight; }
  void start(const GenerationTask& task, OutcomeCallback done) override {
    started.push_back(task.dataset + "/" + task.record->id);
    GenerationOutcome o;
    if (interrupt_after >= 0 && int64_t(started.size()) > interrupt_after) {
      o.kind = OutcomeKind::kInterrupted;
      o.error = "server gone";
    } else if (fail_ids.count(task.record->id)) {
      o.kind = OutcomeKind::kFailed;
      o.error = "HTTP 400: prompt too long";
      o.http_status = 400;
    } else {
      o.text = task.record->id + "|" + std::to_string(task.seed);
      o.prompt_tokens = 3;
      o.completion_tokens = 5;
      o.finish_reason = "length";
    }
    if (async) {
      futures_.push_back(std::async(std::launch::async, [done, o] { done(o); }));
    } else {
      done(o);
    }
  }

 private:
  std::vector<std::future<void>> futures_;
};

using testing::conversation_dataset;
using testing::ResumableTarget;

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

class RunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("strata_runner_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    opts_.output_file = (dir_ / "out.jsonl").string();
    opts_.progress = false;
    opts_.sampling.params.seed = 11;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  JobOptions opts_;
};

TEST_F(RunnerTest, MemoryModeKeepsInputOrderAndAppendsTheAnswer) {
  JobOptions o = opts_;
  o.output_file.clear();
  FakeTarget b;
  b.async = true;
  std::vector<Dataset> ds{conversation_dataset("d", 9)};
  auto s = run_job(ds, b, o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->records.size(), 9u);
  for (int i = 0; i < 9; ++i) {
    const auto& r = s->records[i];
    EXPECT_EQ(r["id"], "p" + std::to_string(i));
    ASSERT_EQ(r["conversations"].size(), 2u);
    EXPECT_EQ(r["conversations"][1]["role"], "assistant");
    EXPECT_EQ(
        r["conversations"][1]["content"],
        "p" + std::to_string(i) + "|" + std::to_string(prompt_seed(11, "p" + std::to_string(i))));
    EXPECT_EQ(r["meta"]["dataset"], "d");
    EXPECT_EQ(r["meta"]["model"], "fake-model");
    EXPECT_EQ(r["meta"]["sampling"]["seed"], 11);
    EXPECT_EQ(r["meta"]["completion_tokens"], 5);
    EXPECT_EQ(r["meta"]["finish_reason"], "length");
  }
  EXPECT_TRUE(s->complete);
}

TEST_F(RunnerTest, InterruptedRunResumesExactlyOnce) {
  std::vector<Dataset> ds{conversation_dataset("a", 20), conversation_dataset("b", 15)};
  for (int round = 0; round < 6; ++round) {
    FakeTarget b;
    b.interrupt_after = 7;
    b.async = round % 2 == 1;
    auto s = run_job(ds, b, opts_);
    ASSERT_TRUE(s.ok()) << s.status().message();
    const bool done = 7 * (round + 1) >= 35;
    EXPECT_EQ(s->complete, done) << round;
    EXPECT_EQ(std::filesystem::exists(opts_.output_file + ".done"), done) << round;
    EXPECT_EQ(int64_t(read_lines(opts_.output_file).size()), std::min(35, 7 * (round + 1)));
  }
  std::map<std::string, int> seen;
  for (const auto& r : read_lines(opts_.output_file)) {
    ++seen[r["meta"]["dataset"].get<std::string>() + "/" + r["id"].get<std::string>()];
    EXPECT_EQ(r["meta"]["seed"], prompt_seed(11, r["id"]));
  }
  EXPECT_EQ(seen.size(), 35u);
  for (const auto& [k, n] : seen) EXPECT_EQ(n, 1) << k;
  // A run on a finished output starts nothing.
  FakeTarget b;
  auto s = run_job(ds, b, opts_);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(b.started.empty());
  EXPECT_TRUE(s->complete);
  EXPECT_EQ(s->datasets[0].done_before, 20);
}

TEST_F(RunnerTest, FailuresAreRecordedNotRetriedUnlessAsked) {
  std::vector<Dataset> ds{conversation_dataset("a", 10)};
  {
    FakeTarget b;
    b.fail_ids = {"p3", "p7"};
    auto s = run_job(ds, b, opts_);
    ASSERT_TRUE(s.ok());
    EXPECT_TRUE(s->complete);
    EXPECT_EQ(s->failed(), 2);
    EXPECT_EQ(read_lines(opts_.output_file).size(), 8u);
    auto f = read_lines(opts_.output_file + ".failures.jsonl");
    ASSERT_EQ(f.size(), 2u);
    EXPECT_EQ(f[0]["id"], "p3");
    EXPECT_EQ(f[0]["dataset"], "a");
    EXPECT_EQ(f[0]["http_status"], 400);
    EXPECT_NE(f[0]["error"].get<std::string>().find("prompt too long"), std::string::npos);
  }
  {
    FakeTarget b;  // would succeed now, but failures are not retried by default
    auto s = run_job(ds, b, opts_);
    ASSERT_TRUE(s.ok());
    EXPECT_TRUE(b.started.empty());
    EXPECT_EQ(s->failed(), 2);
  }
  {
    JobOptions o = opts_;
    o.retry_failures = true;
    FakeTarget b;
    auto s = run_job(ds, b, o);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(b.started, (std::vector<std::string>{"a/p3", "a/p7"}));
    EXPECT_EQ(s->failed(), 0);
    EXPECT_EQ(read_lines(opts_.output_file).size(), 10u);
  }
  FakeTarget b;
  auto s = run_job(ds, b, opts_);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->failed(), 0);  // done wins over an old failure record
}

TEST_F(RunnerTest, ResumingWithOtherSettingsIsRefused) {
  std::vector<Dataset> ds{conversation_dataset("a", 6)};
  FakeTarget b;
  b.interrupt_after = 3;
  ASSERT_TRUE(run_job(ds, b, opts_).ok());
  JobOptions o = opts_;
  o.sampling.params.temperature = 0.8f;
  FakeTarget b2;
  auto s = run_job(ds, b2, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("--allow-mixed-settings"), std::string::npos);
  o.allow_mixed_settings = true;
  s = run_job(ds, b2, o);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->complete);
}

TEST_F(RunnerTest, OutputDirWritesOneFilePerDataset) {
  JobOptions o = opts_;
  o.output_file.clear();
  o.output_dir = (dir_ / "outdir").string();
  std::vector<Dataset> ds{conversation_dataset("define", 5),
                          conversation_dataset("explain", 4)};  // same ids p0..
  FakeTarget b;
  b.interrupt_after = 6;
  ASSERT_TRUE(run_job(ds, b, o).ok());
  FakeTarget b2;
  auto s = run_job(ds, b2, o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(b2.started.size(), 3u);
  EXPECT_EQ(read_lines(o.output_dir + "/define.jsonl").size(), 5u);
  EXPECT_EQ(read_lines(o.output_dir + "/explain.jsonl").size(), 4u);
  EXPECT_TRUE(std::filesystem::exists(o.output_dir + "/define.jsonl.done"));
  auto done = nlohmann::json::parse(std::ifstream(o.output_dir + "/explain.jsonl.done"));
  EXPECT_EQ(done["datasets"][0]["name"], "explain");
  EXPECT_EQ(done["datasets"][0]["done"], 4);
  EXPECT_EQ(done["complete"], true);
}

TEST_F(RunnerTest, SameIdInTwoDatasetsOfOneFileIsTwoRecords) {
  std::vector<Dataset> ds{conversation_dataset("a", 3), conversation_dataset("b", 3)};
  FakeTarget b;
  ASSERT_TRUE(run_job(ds, b, opts_).ok());
  EXPECT_EQ(read_lines(opts_.output_file).size(), 6u);
}

TEST_F(RunnerTest, RepairsTornTailAndDuplicatesBeforeResuming) {
  std::vector<Dataset> ds{conversation_dataset("a", 5)};
  FakeTarget b;
  b.interrupt_after = 3;
  ASSERT_TRUE(run_job(ds, b, opts_).ok());
  auto lines = read_lines(opts_.output_file);
  ASSERT_EQ(lines.size(), 3u);
  {
    std::ofstream out(opts_.output_file, std::ios::app);
    out << lines[1].dump() << "\n" << lines[0].dump().substr(0, 17);  // a duplicate and a torn tail
  }
  FakeTarget b2;
  auto s = run_job(ds, b2, opts_);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(b2.started.size(), 2u);
  auto after = scan_output(opts_.output_file);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->records, 5);
  EXPECT_TRUE(after->duplicates.empty());
  EXPECT_EQ(after->torn_bytes, 0);
}

TEST_F(RunnerTest, DuplicateDatasetNamesAreAnError) {
  std::vector<Dataset> ds{conversation_dataset("a", 1), conversation_dataset("a", 1)};
  FakeTarget b;
  EXPECT_EQ(run_job(ds, b, opts_).status().code(), StatusCode::kInvalidArgument);
}

TEST(Progress, FormatsPerDatasetTotalsTokensRatesAndEta) {
  ProgressSnapshot p;
  p.datasets = {{.name = "define",
                 .total = 100,
                 .done_before = 10,
                 .done = 20,
                 .running = 3,
                 .generated_tokens = 1500},
                {.name = "explain", .total = 50, .done = 5, .failed = 1, .generated_tokens = 500}};
  p.elapsed_s = 10;
  p.gen_tokens_per_s = 100;
  p.prompt_tokens_per_s = 40;
  p.window_s = 8;
  p.tokens_left = 4400;
  const std::string line = format_progress(p);
  EXPECT_NE(line.find("define 30/100 1500 tok"), std::string::npos) << line;
  EXPECT_NE(line.find("explain 6/50 (1 failed) 500 tok"), std::string::npos) << line;
  EXPECT_NE(line.find("total 36/150 (24.0%) 3 running"), std::string::npos) << line;
  EXPECT_NE(line.find("2000 tok generated"), std::string::npos) << line;
  EXPECT_NE(line.find("gen 100 tok/s · prompt 40 tok/s (last 8s)"), std::string::npos) << line;
  EXPECT_NE(line.find("ETA 44s"), std::string::npos) << line;  // 4,400 tokens left at 100/s
  p.gen_tokens_per_s = 0;
  EXPECT_NE(format_progress(p).find("ETA ?"), std::string::npos);
  EXPECT_EQ(format_duration(3725), "1h02m");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(2 * 86400 + 7200), "2d02h");
}

TEST(Progress, NamesTheShardAndTheTargetsState) {
  ProgressSnapshot p;
  p.datasets = {{.name = "define", .total = 10, .done = 4}};
  EXPECT_EQ(format_progress(p).rfind("[generate] define 4/10", 0), 0u) << format_progress(p);
  p.shard = "2/8";
  p.target_note = "replicas 1/2 up";
  const std::string line = format_progress(p);
  EXPECT_EQ(line.rfind("[generate shard 2/8] define 4/10", 0), 0u) << line;
  EXPECT_NE(line.find("tok generated · replicas 1/2 up · gen"), std::string::npos) << line;
}

TEST(Progress, RateWindowForgetsWhatIsOlderThanTheWindow) {
  RateWindow w(10);
  EXPECT_EQ(w.rate(), 0);
  w.add(0, 0);
  w.add(5, 5000);  // a burst at the start
  for (int t = 6; t <= 30; ++t) w.add(t, 5000 + 100.0 * (t - 5));
  EXPECT_NEAR(w.rate(), 100, 1e-9);  // the burst fell out of the window
  EXPECT_NEAR(w.span_s(), 10, 1e-9);
}

TEST_F(RunnerTest, UnfinishedPromptsResumeFromTheirCheckpoints) {
  std::vector<Dataset> ds{conversation_dataset("a", 4)};
  JobOptions o = opts_;
  o.checkpoint_tokens = 1;
  const std::string partial = opts_.output_file + ".partial.jsonl";
  {
    ResumableTarget b;
    b.interrupt = {"p1", "p2"};
    auto s = run_job(ds, b, o);
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_FALSE(s->complete);
    EXPECT_EQ(s->datasets[0].generated_tokens, 12 * 2 + 5 * 2);  // counted as produced
    ASSERT_TRUE(std::filesystem::exists(partial));
  }
  auto partials = read_partials(
      partial,
      settings_fingerprint(
          nlohmann::json{{"model", "fake-model"}, {"sampling", o.sampling.to_json()}}.dump()));
  ASSERT_TRUE(partials.ok());
  ASSERT_EQ(partials->size(), 2u);
  EXPECT_EQ(partials->at({"a", "p1"}).tokens, (std::vector<int32_t>{1000, 1001, 1002, 1003, 1004}));
  EXPECT_EQ(partials->at({"a", "p2"}).rng_draws, 5u);
  {
    ResumableTarget b;  // runs to the end this time
    auto s = run_job(ds, b, o);
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_TRUE(s->complete);
    EXPECT_EQ(b.resumed.size(), 2u);
    EXPECT_EQ(b.resumed["p2"].tokens, (std::vector<int32_t>{2000, 2001, 2002, 2003, 2004}));
    EXPECT_EQ(s->datasets[0].generated_tokens, 7 * 2);  // only what this run made
  }
  EXPECT_FALSE(std::filesystem::exists(partial)) << "a complete job leaves no checkpoints";
  std::map<std::string, std::string> text;
  for (const auto& r : read_lines(opts_.output_file))
    text[r["id"]] = r["conversations"][1]["content"];
  EXPECT_EQ(text["p1"], "p1 from 5");
  EXPECT_EQ(text["p0"], "p0 from 0");
}

TEST(Checkpoints, DeltasConcatenateRestartsReplaceGapsDropAndOtherSettingsAreIgnored) {
  testing::TempDir dir("strata_ckpt");
  const std::string path = dir.file("out.jsonl.partial.jsonl");
  const std::vector<int32_t> a = {1, 2, 3}, b = {4, 5}, c = {9};
  std::string text =
      partial_line({"d", "x"}, 0, a, 3, 7, "S") + "\n" + partial_line({"d", "x"}, 3, b, 5, 7, "S") +
      "\n" + partial_line({"d", "y"}, 0, a, 3, 7, "S") + "\n" +
      partial_line({"d", "y"}, 1, c, 2, 7, "S") + "\n" +  // y restarted after 1 token
      partial_line({"d", "z"}, 0, a, 3, 7, "S") + "\n" + partial_line({"d", "z"}, 5, c, 6, 7, "S") +
      "\n" +  // a lost line: z starts over
      partial_line({"d", "w"}, 0, a, 3, 7, "OTHER") + "\n" + "{\"dataset\":\"d\",\"id\":\"x\",\"fr";
  dir.write("out.jsonl.partial.jsonl", text);
  auto p = read_partials(path, "S");
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ(p->at({"d", "x"}).tokens, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(p->at({"d", "x"}).rng_draws, 5u);
  EXPECT_EQ(p->at({"d", "x"}).prompt_tokens, 7);
  EXPECT_EQ(p->at({"d", "y"}).tokens, (std::vector<int32_t>{1, 9}));
  ASSERT_TRUE(rewrite_partials(path, *p, "S").ok());
  auto again = read_partials(path, "S");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->at({"d", "x"}).tokens, p->at({"d", "x"}).tokens);
  ASSERT_TRUE(rewrite_partials(path, {}, "S").ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace strata
